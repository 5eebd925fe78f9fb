/* SPDX-License-Identifier: MIT */
/*
 * An attacker's tool, for tests/attack/tuple_check.sh: preloaded ahead of
 * libwsd-preload.so, it makes getsockname() report the local port in
 * WSD_FORGE_PORT for every IPv4 or IPv6 socket, so the attacker's own
 * switch names another program's TCP connection in its connect request.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>

int getsockname(int fd, struct sockaddr *sa, socklen_t *len)
{
	int (*real)(int, struct sockaddr *, socklen_t *) =
		(int (*)(int, struct sockaddr *, socklen_t *))dlsym(RTLD_NEXT, "getsockname");
	const char *forge = getenv("WSD_FORGE_PORT");
	int r = real(fd, sa, len);

	if (r == 0 && forge && sa->sa_family == AF_INET)
		((struct sockaddr_in *)sa)->sin_port = htons((uint16_t)atoi(forge));
	else if (r == 0 && forge && sa->sa_family == AF_INET6)
		((struct sockaddr_in6 *)sa)->sin6_port = htons((uint16_t)atoi(forge));
	return r;
}

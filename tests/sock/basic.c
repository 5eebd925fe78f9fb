/* SPDX-License-Identifier: MIT */
/*
 * The basic exchange over 127.0.0.1 and ::1: addresses as both ends see
 * them, the socket options a program reads back, read/write/send/recv/
 * sendto/recvfrom, FIONREAD, a 1 MiB transfer, EOF after close.  Then
 * the same from a one-shot server, which closes its listener as soon as it
 * has accepted (as iperf3 -1 does): the connection must still upgrade.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/sock/common.h"

#define BIG (1u << 20)

static int port_of(const struct sockaddr_storage *ss)
{
	return ntohs(ss->ss_family == AF_INET6 ? ((const struct sockaddr_in6 *)ss)->sin6_port
					       : ((const struct sockaddr_in *)ss)->sin_port);
}

static const char *addr_of(const struct sockaddr_storage *ss)
{
	static char buf[INET6_ADDRSTRLEN];
	const void *a = ss->ss_family == AF_INET6
		? (const void *)&((const struct sockaddr_in6 *)ss)->sin6_addr
		: (const void *)&((const struct sockaddr_in *)ss)->sin_addr;

	return inet_ntop(ss->ss_family, a, buf, sizeof(buf)) ? buf : "?";
}

static void show_names(int fd, const char *who)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	char what[64];

	snprintf(what, sizeof(what), "%s getsockname", who);
	EXPECT(0, what, getsockname(fd, (struct sockaddr *)&ss, &len));
	say("  %s %s len %u", famname(ss.ss_family), addr_of(&ss), (unsigned)len);
	len = sizeof(ss);
	snprintf(what, sizeof(what), "%s getpeername", who);
	EXPECT(0, what, getpeername(fd, (struct sockaddr *)&ss, &len));
	say("  %s %s len %u", famname(ss.ss_family), addr_of(&ss), (unsigned)len);
}

static void show_opts(int fd, int family)
{
	int v;
	socklen_t len = sizeof(v);

	EXPECT(0, "getsockopt SO_TYPE", getsockopt(fd, SOL_SOCKET, SO_TYPE, &v, &len));
	CHECK(v == SOCK_STREAM, "SO_TYPE %d", v);
	len = sizeof(v);
	EXPECT(0, "getsockopt SO_DOMAIN", getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &v, &len));
	CHECK(v == family, "SO_DOMAIN %d", v);
	len = sizeof(v);
	EXPECT(0, "getsockopt SO_ERROR", getsockopt(fd, SOL_SOCKET, SO_ERROR, &v, &len));
	say("  SO_ERROR %d", v);
	len = sizeof(v);
	EXPECT(0, "getsockopt SO_ACCEPTCONN", getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &v, &len));
	say("  SO_ACCEPTCONN %d", v);
	v = 1;
	EXPECT(0, "setsockopt TCP_NODELAY 1",
	       setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &v, sizeof(v)));
	len = sizeof(v);
	EXPECT(0, "getsockopt TCP_NODELAY", getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &v, &len));
	say("  TCP_NODELAY %d", v);
}

struct how {
	int family;
	bool oneshot;        /* close the listener right after accept */
};

static void server(struct peer *ctl, void *arg)
{
	struct how *how = arg;
	int family = how->family, port, lfd, fd, v;
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	char buf[2048], *big = malloc(BIG), *want = malloc(BIG);

	lfd = t_listen(family, &port);
	ctl_send(ctl, port);
	v = 0;
	len = sizeof(v);
	EXPECT(0, "listener SO_ACCEPTCONN", getsockopt(lfd, SOL_SOCKET, SO_ACCEPTCONN, &v, &len));
	say("  SO_ACCEPTCONN %d", v);
	len = sizeof(ss);
	fd = accept(lfd, (struct sockaddr *)&ss, &len);
	CHECK(fd >= 0, "accept: %s", ename(errno));
	say("accept: %s %s len %u", famname(ss.ss_family), addr_of(&ss), (unsigned)len);
	if (how->oneshot)
		EXPECT(0, "close listener (one-shot)", close(lfd));
	/* the client's port as it saw it, against the address accept gave */
	CHECK(port_of(&ss) == ctl_recv(ctl), "accept's peer port is not the client's port");
	show_names(fd, "server");
	show_opts(fd, family);
	warmup(fd, false);

	EXPECT(4, "read 4", read(fd, buf, 4));
	CHECK(!memcmp(buf, "ping", 4), "read the wrong bytes");
	EXPECT(5, "write 5", write(fd, "pong!", 5));

	recv_all(fd, big, BIG);
	pattern(want, BIG, 7, 0);
	CHECK(!memcmp(big, want, BIG), "1 MiB arrived changed");
	say("1 MiB received, checksum %016llx", (unsigned long long)csum(CSUM_INIT, big, BIG));

	/* 1000 bytes in one send arrive as one unit: FIONREAD sees all of them */
	ctl_recv(ctl);
	struct pollfd pfd = { .fd = fd, .events = POLLIN };

	EXPECT(1, "poll POLLIN", poll(&pfd, 1, -1));
	EXPECT(0, "ioctl FIONREAD", ioctl(fd, FIONREAD, &v));
	say("  FIONREAD %d", v);
	len = sizeof(ss);
	memset(&ss, 0xff, sizeof(ss));
	EXPECT(1000, "recvfrom 1000 with an address", recvfrom(fd, buf, sizeof(buf), 0,
							      (struct sockaddr *)&ss, &len));
	/* a connected stream names no source: the kernel writes back length 0 */
	say("  recvfrom address length %u", (unsigned)len);
	pattern(want, 1000, 8, 0);
	CHECK(!memcmp(buf, want, 1000), "recvfrom data");
	EXPECT(0, "ioctl FIONREAD", ioctl(fd, FIONREAD, &v));
	say("  FIONREAD %d", v);

	EXPECT(0, "recv after the client closed", recv(fd, buf, sizeof(buf), 0));
	EXPECT(0, "read after the client closed", read(fd, buf, sizeof(buf)));
	EXPECT(0, "close", close(fd));
	if (!how->oneshot)
		EXPECT(0, "close listener", close(lfd));
	free(big);
	free(want);
}

static void run(int family, bool oneshot)
{
	struct how how = { family, oneshot };
	struct peer b;
	int port, fd;
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	char buf[2048], *big = malloc(BIG);

	say("== %s%s", famname(family), oneshot ? ", one-shot server" : "");
	peer_start(&b, "server", server, &how);
	port = ctl_recv(&b);
	fd = t_connect(family, port);
	MUST(getsockname(fd, (struct sockaddr *)&ss, &len));
	ctl_send(&b, port_of(&ss));
	len = sizeof(ss);
	MUST(getpeername(fd, (struct sockaddr *)&ss, &len));
	CHECK(port_of(&ss) == port, "getpeername's port is not the listener's");
	show_names(fd, "client");
	show_opts(fd, family);
	warmup(fd, true);

	EXPECT(4, "write 4", write(fd, "ping", 4));
	EXPECT(5, "recv 5", recv(fd, buf, 5, 0));
	CHECK(!memcmp(buf, "pong!", 5), "recv the wrong bytes");

	pattern(big, BIG, 7, 0);
	EXPECT(BIG, "send 1 MiB", send(fd, big, BIG, 0));

	pattern(buf, 1000, 8, 0);
	/* sendto on a connected stream: no address, as most programs call it */
	EXPECT(1000, "sendto 1000", sendto(fd, buf, 1000, 0, NULL, 0));
	ctl_send(&b, 1);
	EXPECT(0, "close", close(fd));
	peer_end(&b);
	free(big);
}

int main(int argc, char **argv)
{
	t_init(argc, argv);
	run(AF_INET, false);
	run(AF_INET6, false);
	run(AF_INET, true);
	t_exit();
}

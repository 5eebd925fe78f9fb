/* SPDX-License-Identifier: MIT */
/*
 * The squatters of namesquat_check.sh: each picks a free TCP port P,
 * binds the registry name "\0wsd-nd.P" before any server takes P, writes
 * P to PORTFILE and holds the name until STOPFILE exists (60 s at most).
 *
 *   namesquat full PORTFILE STOPFILE
 *        listens with the smallest backlog, fills it with connections of
 *        its own and never accepts: a blocking connect to the name waits
 *        for as long as the squatter lives.  Prints "full: N queued"
 *   namesquat silent PORTFILE STOPFILE
 *        accepts every connection and never answers nor closes it.
 *        Prints "silent: N connections"
 *
 * Every wait is bounded; each program exits by itself.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define HELD_MAX 256

static __attribute__((noreturn)) void die(const char *what)
{
	perror(what);
	exit(1);
}

static long long now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/*
 * A TCP socket bound to a free loopback port below the ephemeral range,
 * and the port: free for the server to take after us, and not one the
 * kernel hands to another program's bind(0) meanwhile.
 */
static int free_port(int *port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int lo = 32768, hi, fd;
	FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");

	if (f) {
		if (fscanf(f, "%d %d", &lo, &hi) != 2 || lo < 2048 || lo > 65535)
			lo = 32768;
		fclose(f);
	}
	for (int i = 0, base = lo / 2, n = lo - lo / 2; i < n; i++) {
		*port = base + (int)((getpid() * 7919u + 17u + (unsigned)i) % (unsigned)n);
		a.sin_port = htons((unsigned short)*port);
		fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			break;
		if (!bind(fd, (struct sockaddr *)&a, sizeof(a)))
			return fd;
		close(fd);
	}
	die("no free port below the ephemeral range");
}

static socklen_t reg_name(struct sockaddr_un *un, int port)
{
	memset(un, 0, sizeof(*un));
	un->sun_family = AF_UNIX;
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 +
			   (size_t)snprintf(un->sun_path + 1, sizeof(un->sun_path) - 1,
					    "wsd-nd.%d", port));
}

int main(int argc, char **argv)
{
	struct sockaddr_un un;
	socklen_t ul;
	int port, probe, ls, full, n = 0, held[HELD_MAX];
	long long end = now_ms() + 60000;
	FILE *f;

	if (argc != 4 || (strcmp(argv[1], "full") && strcmp(argv[1], "silent"))) {
		fprintf(stderr, "usage: namesquat full|silent PORTFILE STOPFILE\n");
		return 2;
	}
	full = !strcmp(argv[1], "full");
	probe = free_port(&port);
	ul = reg_name(&un, port);
	ls = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (ls < 0 || bind(ls, (struct sockaddr *)&un, ul) || listen(ls, full ? 0 : 64))
		die("registry name");
	close(probe);
	if (full) {
		/* backlog 0 still queues one: connect until the kernel says EAGAIN */
		while (n < 8) {
			int c = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);

			if (c < 0)
				die("socket");
			if (connect(c, (struct sockaddr *)&un, ul) < 0) {
				if (errno != EAGAIN)
					die("filling the backlog");
				close(c);
				break;
			}
			held[n++] = c;
		}
		if (n == 8)
			die("the backlog did not fill");
	}
	f = fopen(argv[2], "w");
	if (!f || fprintf(f, "%d\n", port) < 0 || fclose(f))
		die(argv[2]);
	while (access(argv[3], F_OK) != 0 && now_ms() < end) {
		struct pollfd p = { .fd = ls, .events = POLLIN };

		if (full || poll(&p, 1, 100) <= 0) {
			if (full)
				poll(NULL, 0, 100);
			continue;
		}
		{
			int c = accept4(ls, NULL, NULL, SOCK_CLOEXEC);

			if (c >= 0 && n < HELD_MAX)
				held[n++] = c;   /* held open, never answered */
			else if (c >= 0)
				close(c);
		}
	}
	printf(full ? "full: %d queued\n" : "silent: %d connections\n", n);
	while (n > 0)
		close(held[--n]);
	return 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * The three programs of tests/attack/tuple_check.sh: a host that is not a
 * connection's TCP peer names that connection's 4-tuple to the server's
 * switch and tries to take it over.
 *
 *   tuple server PORTFILE [ADDR]   echo server (each byte xor 0x5a), a
 *                                  thread per connection; writes its port
 *   tuple client PORT LOCALFILE STOPFILE [ADDR]
 *                                  the victim, a plain program: 64-byte
 *                                  calls every 10 ms until STOPFILE exists,
 *                                  each answer checked; writes its local
 *                                  port first; exits 0 when all were right
 *   tuple attack PORT [ADDR [SECONDS]]
 *                                  its own connection to the server: bytes,
 *                                  then more every 100 ms for SECONDS
 *                                  (default 2) while its switch upgrades
 *                                  (naming the victim's tuple), reading what
 *                                  comes back; "reading" at half time
 *
 * ADDR: the server's IPv4 address (default 127.0.0.1).
 * Every wait is bounded; each program exits by itself.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MSG 64

static void die(const char *what)
{
	fprintf(stderr, "tuple: %s: %s\n", what, strerror(errno));
	exit(2);
}

static int64_t now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static const char *addr = "127.0.0.1";

static int dial(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	if (inet_pton(AF_INET, addr, &a.sin_addr) != 1)
		die(addr);
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)))
		die("connect");
	return fd;
}

/* Read exactly n bytes within ms; 0, or -1 on the end, an error or the time. */
static int read_all(int fd, char *p, size_t n, int ms)
{
	int64_t end = now_ms() + ms;

	while (n) {
		struct pollfd q = { .fd = fd, .events = POLLIN };
		int64_t left = end - now_ms();
		ssize_t k;

		if (left <= 0 || poll(&q, 1, (int)left) <= 0)
			return -1;
		k = recv(fd, p, n, MSG_DONTWAIT);
		if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR))
			return -1;
		if (k > 0) {
			p += k;
			n -= (size_t)k;
		}
	}
	return 0;
}

static void *echo(void *arg)
{
	int fd = (int)(intptr_t)arg;
	char b[4096];
	ssize_t n;

	while ((n = recv(fd, b, sizeof(b), 0)) > 0) {
		for (ssize_t i = 0; i < n; i++)
			b[i] ^= 0x5a;
		if (send(fd, b, (size_t)n, MSG_NOSIGNAL) != n)
			break;
	}
	close(fd);
	return NULL;
}

static _Noreturn void server(const char *portfile)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t al = sizeof(a);
	int one = 1, lfd = socket(AF_INET, SOCK_STREAM, 0);
	FILE *f;

	if (inet_pton(AF_INET, addr, &a.sin_addr) != 1)
		die(addr);
	if (lfd < 0 || setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
	    bind(lfd, (struct sockaddr *)&a, sizeof(a)) || listen(lfd, 16) ||
	    getsockname(lfd, (struct sockaddr *)&a, &al))
		die("listen");
	f = fopen(portfile, "w");
	if (!f || fprintf(f, "%d\n", ntohs(a.sin_port)) < 0 || fclose(f))
		die(portfile);
	alarm(300);   /* the script kills it sooner */
	for (;;) {
		int fd = accept(lfd, NULL, NULL);
		pthread_t t;

		if (fd < 0)
			die("accept");
		if (pthread_create(&t, NULL, echo, (void *)(intptr_t)fd))
			die("pthread_create");
		pthread_detach(t);
	}
}

static int client(int port, const char *localfile, const char *stopfile)
{
	struct sockaddr_in a;
	socklen_t al = sizeof(a);
	int fd = dial(port), calls = 0;
	int64_t end = now_ms() + 300000;
	FILE *f;

	if (getsockname(fd, (struct sockaddr *)&a, &al))
		die("getsockname");
	f = fopen(localfile, "w");
	if (!f || fprintf(f, "%d\n", ntohs(a.sin_port)) < 0 || fclose(f))
		die(localfile);
	while (access(stopfile, F_OK) != 0) {
		char out[MSG], in[MSG];

		if (now_ms() > end) {
			fprintf(stderr, "tuple client: no stop file in 300 s\n");
			return 1;
		}
		for (int i = 0; i < MSG; i++)
			out[i] = (char)(calls * 7 + i);
		if (send(fd, out, MSG, MSG_NOSIGNAL) != MSG)
			die("client send");
		if (read_all(fd, in, MSG, 5000)) {
			fprintf(stderr, "tuple client: call %d: no whole answer in 5 s\n", calls);
			return 1;
		}
		for (int i = 0; i < MSG; i++)
			if ((char)(in[i] ^ 0x5a) != out[i]) {
				fprintf(stderr, "tuple client: call %d: byte %d changed\n", calls, i);
				return 1;
			}
		calls++;
		usleep(10000);
	}
	printf("client: %d calls, every answer exact\n", calls);
	return calls > 0 ? 0 : 1;
}

static int attack(int port, int seconds)
{
	int fd = dial(port), ticks = seconds * 10;
	char b[4096];
	size_t got = 0;

	memset(b, 'A', sizeof(b));
	/* enough to start the upgrade (WSD_UPGRADE_BYTES), then more after it */
	if (send(fd, b, 100, MSG_NOSIGNAL) != 100)
		die("attack send");
	memset(b, 'X', sizeof(b));
	for (int t = 1; t <= ticks; t++) {
		int64_t tick_end = now_ms() + 100;
		ssize_t n;

		while (now_ms() < tick_end) {
			struct pollfd q = { .fd = fd, .events = POLLIN };

			if (poll(&q, 1, (int)(tick_end - now_ms())) <= 0)
				continue;
			n = recv(fd, b, sizeof(b), MSG_DONTWAIT);
			if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
				ticks = t;   /* the connection ended: this is the last tick */
				break;
			}
			if (n < 0)
				usleep(1000);   /* readable, but only doorbells: its switch took them */
			else
				got += (size_t)n;
		}
		memset(b, 'X', 100);
		(void)send(fd, b, 100, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (t == ticks / 2) {
			printf("attack: reading\n");
			fflush(stdout);
		}
	}
	printf("attack: read %zu bytes\n", got);
	close(fd);
	return 0;
}

int main(int argc, char **argv)
{
	if ((argc == 3 || argc == 4) && !strcmp(argv[1], "server")) {
		if (argc == 4)
			addr = argv[3];
		server(argv[2]);
	}
	if ((argc == 5 || argc == 6) && !strcmp(argv[1], "client")) {
		if (argc == 6)
			addr = argv[5];
		return client(atoi(argv[2]), argv[3], argv[4]);
	}
	if (argc >= 3 && argc <= 5 && !strcmp(argv[1], "attack")) {
		if (argc >= 4)
			addr = argv[3];
		return attack(atoi(argv[2]), argc == 5 ? atoi(argv[4]) : 2);
	}
	fprintf(stderr, "usage: tuple server PORTFILE [ADDR] | client PORT LOCALFILE STOPFILE "
			"[ADDR] | attack PORT [ADDR [SECONDS]]\n");
	return 2;
}

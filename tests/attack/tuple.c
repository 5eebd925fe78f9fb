/* SPDX-License-Identifier: MIT */
/*
 * The programs of the attack scripts (the *_check.sh beside it).  In
 * tuple_check.sh a host that is not a connection's TCP peer names that
 * connection's 4-tuple to the server's switch and tries to take it over;
 * in squat_check.sh a process holds the registry name of a port before the
 * server does; access_check.sh runs server and client as other users.
 *
 *   tuple server [-n] [-p PORT] PORTFILE [ADDR]
 *                                  echo server (each byte xor 0x5a), a
 *                                  thread per connection; writes its port;
 *                                  -n: not dumpable once it listens (no
 *                                  process of its user may read it);
 *                                  -p: on that port (default any)
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
 *   tuple squat PORTFILE STOPFILE  squatter: picks a free TCP port P, binds
 *                                  the registry name "\0wsd-nd.P" and writes
 *                                  P; speaks the shm proof as a reader of
 *                                  its connectors would (it names a TCP
 *                                  listener of its own, on another port),
 *                                  counts the descriptors it is sent (and
 *                                  then refuses the HELLO), and
 *                                  prints them when STOPFILE exists (30 s
 *                                  at most)
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
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "provider/shm/shm.h"   /* the squatter speaks the set-up messages */

#define MSG 64

static __attribute__((noreturn)) void die(const char *what)
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

		int r;

		if (left <= 0)
			return -1;
		r = poll(&q, 1, (int)left);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
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

static _Noreturn void server(const char *portfile, int port, int nodump)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	socklen_t al = sizeof(a);
	int one = 1, lfd = socket(AF_INET, SOCK_STREAM, 0);
	FILE *f;

	if (inet_pton(AF_INET, addr, &a.sin_addr) != 1)
		die(addr);
	if (lfd < 0 || setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
	    bind(lfd, (struct sockaddr *)&a, sizeof(a)) || listen(lfd, 16) ||
	    getsockname(lfd, (struct sockaddr *)&a, &al))
		die("listen");
	/* after listen, so the switch's registry is up and ours to defend */
	if (nodump && prctl(PR_SET_DUMPABLE, 0, 0, 0, 0))
		die("PR_SET_DUMPABLE");
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
	int fd = dial(port), ticks = seconds * 10, ended = 0;
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

		while (!ended && now_ms() < tick_end) {
			struct pollfd q = { .fd = fd, .events = POLLIN };

			if (poll(&q, 1, (int)(tick_end - now_ms())) <= 0)
				continue;
			n = recv(fd, b, sizeof(b), MSG_DONTWAIT);
			if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
				/*
				 * The connection ended (over verbs its ring writes fail
				 * once the server ends the channel: a reset).  The socket
				 * stays open to the last tick, for the script's wsd stat.
				 */
				printf("attack: the connection ended: %s\n",
				       n == 0 ? "end of stream" : strerror(errno));
				ended = 1;
				break;
			}
			if (n < 0)
				usleep(1000);   /* readable, but only doorbells: its switch took them */
			else
				got += (size_t)n;
		}
		if (ended) {
			int64_t left = tick_end - now_ms();

			if (left > 0)
				usleep((useconds_t)left * 1000);
		} else {
			memset(b, 'X', 100);
			(void)send(fd, b, 100, MSG_NOSIGNAL | MSG_DONTWAIT);
		}
		if (t == ticks / 2) {
			printf("attack: reading\n");
			fflush(stdout);
		}
	}
	printf("attack: read %zu bytes\n", got);
	close(fd);
	return 0;
}

/* A TCP socket on 127.0.0.1, any port, listening or only bound; its port in *port. */
static int tcp_on_any(int listening, int *port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t al = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) ||
	    (listening && listen(fd, 4)) || getsockname(fd, (struct sockaddr *)&a, &al))
		die("tcp socket");
	*port = ntohs(a.sin_port);
	return fd;
}

/*
 * A TCP socket bound to a free port below the kernel's ephemeral range,
 * and the port.  The squatter holds that port's registry name for 30 s
 * while the port itself is free: one the kernel could hand to another
 * program's bind(0) would leave a wsd server there (another test running
 * beside this one) without its registry, its connections on TCP.
 */
static int squat_port(int *port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int lo = 32768, hi, fd;
	FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");

	if (f) {
		if (fscanf(f, "%d %d", &lo, &hi) != 2 || lo < 2048 || lo > 65535)
			lo = 32768;
		fclose(f);
	}
	/* from a point of [lo/2, lo) that differs between runs */
	for (int i = 0, base = lo / 2, n = lo - lo / 2; i < n; i++) {
		*port = base + (int)((getpid() * 7919u + (unsigned)i) % (unsigned)n);
		a.sin_port = htons((uint16_t)*port);
		fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			break;
		if (!bind(fd, (struct sockaddr *)&a, sizeof(a)))
			return fd;
		close(fd);
	}
	die("squat: no free port below the ephemeral range");
}

/*
 * One message from a connector: reply as a listener that passes the
 * connector's proof would (it reads the connector's nonce, offers one of
 * its own, claims the echo right) and count descriptors.  0 at the end.
 */
static int squat_step(int c, int decoy, int *fds_got)
{
	static uint8_t mine[SHM_NONCE] = "squatter's nonce";
	union {
		char b[CMSG_SPACE(sizeof(int) * 8)];
		struct cmsghdr align;
	} u;
	struct shm_ctl m = { 0 };
	struct iovec iov = { &m, sizeof(m) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.b,
			     .msg_controllen = sizeof(u.b) };
	ssize_t n = recvmsg(c, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);

	if (n <= 0)
		return n < 0 && errno == EAGAIN ? 1 : 0;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm))
		if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
			int k = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int)), fd;

			for (int i = 0; i < k; i++) {
				memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
				close(fd);
			}
			*fds_got += k;
		}
	if (m.type == SHM_PROVE) {
		struct ucred cr;
		socklen_t cl = sizeof(cr);
		struct iovec li = { m.nonce, SHM_NONCE };
		struct iovec ri = { (void *)(uintptr_t)m.probe_addr, SHM_NONCE };

		if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cr, &cl) ||
		    process_vm_readv(cr.pid, &li, 1, &ri, 1, 0) != SHM_NONCE)
			memset(m.nonce, 0, SHM_NONCE);   /* not allowed: the connector finds out */
		m.type = SHM_PROVE_ACK;
		m.probe_addr = (uintptr_t)mine;
		m.tcp_fd = decoy;   /* a TCP listener, but not on the port dialled */
	} else if (m.type == SHM_ECHO) {
		m.type = SHM_PROVED;   /* whatever the echo */
	} else if (m.type == SHM_HELLO) {
		/* it has the descriptors; refusing now ends the connector's wait at once */
		m.type = SHM_REJECT;
		m.reason = ND_CONNECTION_REFUSED;
	} else {
		return 1;
	}
	return send(c, &m, sizeof(m), MSG_NOSIGNAL) == (ssize_t)sizeof(m);
}

static int squat(const char *portfile, const char *stopfile)
{
	struct sockaddr_un un = { .sun_family = AF_UNIX };
	struct pollfd p[17];
	int port, other, nconn = 0, conns = 0, fds_got = 0, probe, decoy, ls;
	int64_t end = now_ms() + 30000;
	socklen_t ul;
	FILE *f;

	/* a port free now, for the server to take after us */
	probe = squat_port(&port);
	decoy = tcp_on_any(1, &other);
	ls = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	ul = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 +
			 (size_t)snprintf(un.sun_path + 1, sizeof(un.sun_path) - 1,
					  "wsd-nd.%d", port));
	if (ls < 0 || bind(ls, (struct sockaddr *)&un, ul) || listen(ls, 16))
		die("squat: registry name");
	close(probe);
	f = fopen(portfile, "w");
	if (!f || fprintf(f, "%d\n", port) < 0 || fclose(f))
		die(portfile);
	p[0] = (struct pollfd){ .fd = ls, .events = POLLIN };
	while (access(stopfile, F_OK) != 0 && now_ms() < end) {
		if (poll(p, (nfds_t)(1 + nconn), 100) <= 0)
			continue;
		for (int i = nconn; i >= 1; i--)
			if (p[i].revents && !squat_step(p[i].fd, decoy, &fds_got)) {
				close(p[i].fd);
				p[i] = p[nconn--];
			}
		if ((p[0].revents & POLLIN) && nconn < 16) {
			int c = accept4(ls, NULL, NULL, SOCK_CLOEXEC);

			if (c >= 0) {
				p[++nconn] = (struct pollfd){ .fd = c, .events = POLLIN };
				conns++;
			}
		}
	}
	printf("squat: %d connections, %d descriptors\n", conns, fds_got);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 3 && !strcmp(argv[1], "server")) {
		int port = 0, nodump = 0, i = 2;

		for (; i < argc && argv[i][0] == '-'; i++) {
			if (!strcmp(argv[i], "-n"))
				nodump = 1;
			else if (!strcmp(argv[i], "-p") && i + 1 < argc)
				port = atoi(argv[++i]);
			else
				break;
		}
		if (argc - i == 1 || argc - i == 2) {
			if (argc - i == 2)
				addr = argv[i + 1];
			server(argv[i], port, nodump);
		}
	}
	if (argc == 4 && !strcmp(argv[1], "squat"))
		return squat(argv[2], argv[3]);
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
	fprintf(stderr, "usage: tuple server [-n] [-p PORT] PORTFILE [ADDR] | client PORT LOCALFILE "
			"STOPFILE [ADDR] | attack PORT [ADDR [SECONDS]] | squat PORTFILE STOPFILE\n");
	return 2;
}

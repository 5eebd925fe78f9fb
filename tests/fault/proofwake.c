/* SPDX-License-Identifier: MIT */
/*
 * The program of proofwake_check.sh: single bytes echoed on new
 * connections, the client waiting for each echo in epoll_wait, as a
 * program's event loop does.  Each round the
 * client sends its byte, lets the server answer first (its echo is the
 * server's first send, so it switches the server's direction to the ring:
 * a SWITCH record, the byte, then the proof on the stream), and only then
 * waits: its first look finds the SWITCH with the proof still to come.
 *
 *   proofwake CONNS [thread|twin|bulk]
 *
 * With "thread", the client waits in a blocking recv instead, while a
 * second thread of its polls the same socket (poll, timeout 0) every
 * 200 us, as a program's other thread asking whether it is readable does:
 * that look may read the server's proof while the receiving thread is
 * between its last look and its sleep (the test build holds it there,
 * sleep-race), and the proof is then no wake-up for it.
 *
 * With "twin", two threads of the client receive on the socket at once,
 * one byte each, and the server answers each byte with two, in one send:
 * the byte, then the byte plus one.  The first receive starts at once and
 * sleeps (the test build holds it between its last look and its sleep,
 * sleep-race); the second starts TWIN_LEAD_US later, after the server's
 * proof came (proof-delay holds it less than that), takes the proof and
 * the first byte, and leaves the second in the ring for the first
 * receive, which must wake for it: the stream carries nothing more unless
 * the server rang a doorbell after its proof.
 *
 * With "bulk", the server answers each byte with BULK bytes in one send,
 * more than a record between its SWITCH and its proof holds: the SWITCH,
 * the proof and a bell go first, the bytes after them (the test build
 * holds them back, switch-data-delay), and the client waits in a blocking
 * receive whose last look, after it armed, takes the proof and the bell
 * (the test build holds that look 100 ms between its look at the ring and
 * its read of the stream, last-look-delay, and the server answers
 * BULK_LEAD_US after the byte came: inside that window).
 * That bell was rung for its arm, and the server rings no more for it:
 * the receive must arm again before it sleeps, or it sleeps with the bytes
 * in its ring until its timeout.
 *
 * The server listens on WSD_TEST_ADDR (default 127.0.0.1: the VM rig runs
 * it across its wire).  With WSD_EXPECT_PATH set, a connection's turns go
 * on past TURNS until it has taken that path (wsd_switch_path) and made two
 * more turns there, MAX_TURNS at most: over verbs a new connection's
 * upgrade takes longer than TURNS, and the server's direction switches at
 * its first echo after it.
 *
 * Prints "ok N" after N connections of TURNS rounds each, all echoed;
 * exits 1 at the first wait that took LATE_MS or more (the echo in the ring
 * all along, nothing left to wake its waiter: something else woke it, late,
 * or its timeout did), 2 for anything else.  Each wait takes about the
 * windows below, a tenth of a second, when its wake-up comes.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TURNS 3
#define MAX_TURNS 300     /* with WSD_EXPECT_PATH: 6 s of turns or more */
#define WAIT_MS 10000
#define LATE_MS 3000      /* a wait this long slept through its wake-up */
#define LEAD_US 20000     /* the server's answer goes first by this much */
#define TWIN_LEAD_US 80000 /* twin: the second receive starts this much later */
#define BULK 16384
#define BULK_LEAD_US 150000 /* bulk: the server's answer, after the client's last look */

static bool twin, bulk;

static void die(const char *what)
{
	fprintf(stderr, "proofwake: %s: %s\n", what, strerror(errno));
	exit(2);
}

struct looker {
	int fd;
	atomic_bool stop;
};

/* the program's other thread: is the socket readable? (it never reads) */
static void *look(void *arg)
{
	struct looker *l = arg;

	while (!atomic_load(&l->stop)) {
		struct pollfd p = { .fd = l->fd, .events = POLLIN };

		(void)poll(&p, 1, 0);
		usleep(200);
	}
	return NULL;
}

/* twin: the first receive, timed */
struct first_recv {
	int fd;
	char d;
	ssize_t n;
	long ms;
};

static void *first_recv(void *arg)
{
	struct first_recv *f = arg;
	struct timespec t0, t1;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	f->n = recv(f->fd, &f->d, 1, 0);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	f->ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
	return NULL;
}

static void server(int lfd, int conns)
{
	for (int k = 0; k < conns; k++) {
		int fd = accept(lfd, NULL, NULL);
		char c;

		if (fd < 0)
			die("accept");
		/* each byte echoed, until the client closes */
		for (ssize_t n; (n = recv(fd, &c, 1, MSG_WAITALL)) != 0;) {
			if (n != 1)
				die("server recv");
			char two[2] = { c, (char)(c + 1) };
			static char block[BULK];

			if (bulk) {
				usleep(BULK_LEAD_US);
				memset(block, c, sizeof(block));
				if (send(fd, block, BULK, MSG_NOSIGNAL) != BULK)
					die("server send");
				continue;
			}
			if (send(fd, two, twin ? 2 : 1, MSG_NOSIGNAL) != (twin ? 2 : 1))
				die("server send");
		}
		close(fd);
	}
}

int main(int argc, char **argv)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int lfd, conns, status, go[2];
	const char *want = getenv("WSD_EXPECT_PATH");
	const char *(*path_of)(int) = (const char *(*)(int))dlsym(RTLD_DEFAULT, "wsd_switch_path");
	bool threads;
	pid_t pid;

	if (argc < 2 || argc > 3 || (conns = atoi(argv[1])) <= 0 ||
	    (argc == 3 && strcmp(argv[2], "thread") && strcmp(argv[2], "twin") &&
	     strcmp(argv[2], "bulk"))) {
		fprintf(stderr, "usage: proofwake CONNS [thread|twin|bulk]\n");
		return 2;
	}
	twin = argc == 3 && !strcmp(argv[2], "twin");
	bulk = argc == 3 && !strcmp(argv[2], "bulk");
	threads = argc == 3 && !twin && !bulk;
	if (getenv("WSD_TEST_ADDR") && inet_pton(AF_INET, getenv("WSD_TEST_ADDR"), &a.sin_addr) != 1) {
		fprintf(stderr, "proofwake: WSD_TEST_ADDR is not an IPv4 address\n");
		return 2;
	}
	if (want && !path_of) {
		fprintf(stderr, "proofwake: WSD_EXPECT_PATH without the switch\n");
		return 2;
	}
	/* the server forks first and listens itself: a listener shared by a fork stays on TCP */
	if (pipe(go))
		die("pipe");
	pid = fork();
	if (pid < 0)
		die("fork");
	if (!pid) {
		lfd = socket(AF_INET, SOCK_STREAM, 0);
		if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof(a)) || listen(lfd, 64) ||
		    getsockname(lfd, (struct sockaddr *)&a, &len) ||
		    write(go[1], &a, sizeof(a)) != (ssize_t)sizeof(a))
			die("listen");
		server(lfd, conns);
		_exit(0);
	}
	if (read(go[0], &a, sizeof(a)) != (ssize_t)sizeof(a))
		die("the server did not listen");
	for (int k = 0; k < conns; k++) {
		struct epoll_event ev = { .events = EPOLLIN };
		struct timeval tv = { .tv_sec = WAIT_MS / 1000 };
		int fd = socket(AF_INET, SOCK_STREAM, 0), ep = epoll_create1(0);
		struct looker l = { .fd = fd };
		pthread_t t;

		if (fd < 0 || ep < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) ||
		    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) ||
		    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)))
			die("connect");
		if (threads && (errno = pthread_create(&t, NULL, look, &l)))
			die("pthread_create");
		for (int i = 0, there = 0; i < TURNS || (want && there < 2); i++) {
			char c = (char)(k + i), d = 0;
			struct timespec t0, t1;
			ssize_t n;
			long ms;

			if (send(fd, &c, 1, MSG_NOSIGNAL) != 1)
				die("send");
			if (twin) {
				struct first_recv f = { .fd = fd };
				pthread_t r;

				if ((errno = pthread_create(&r, NULL, first_recv, &f)))
					die("pthread_create");
				usleep(TWIN_LEAD_US);
				clock_gettime(CLOCK_MONOTONIC, &t0);
				n = recv(fd, &d, 1, 0);
				clock_gettime(CLOCK_MONOTONIC, &t1);
				ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
				pthread_join(r, NULL);
				/* either may be the one left asleep: the roles follow the timing */
				if (f.n <= 0 || f.ms >= LATE_MS || n <= 0 || ms >= LATE_MS) {
					printf("connection %d, turn %d: the first recv returned %d after %ld ms, "
					       "the second %d after %ld ms\n", k, i, (int)f.n, f.ms, (int)n, ms);
					fflush(stdout);
					kill(pid, SIGKILL);
					return 1;
				}
				if (n != 1 || (d != c && d != (char)(c + 1)) ||
				    f.d != (char)(d == c ? c + 1 : c))
					die("the two bytes");
				goto turned;
			}
			if (bulk) {
				static char got[BULK];

				/* at once: armed before the server's proof comes */
				clock_gettime(CLOCK_MONOTONIC, &t0);
				n = recv(fd, got, BULK, MSG_WAITALL);
				clock_gettime(CLOCK_MONOTONIC, &t1);
				ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
				if (n != BULK || ms >= LATE_MS) {
					printf("connection %d, turn %d: recv returned %d of %d bytes after "
					       "%ld ms\n", k, i, (int)n, BULK, ms);
					fflush(stdout);
					kill(pid, SIGKILL);
					return 1;
				}
				for (int j = 0; j < BULK; j++)
					if (got[j] != c)
						die("the block");
				goto turned;
			}
			usleep(LEAD_US);
			clock_gettime(CLOCK_MONOTONIC, &t0);
			n = threads ? recv(fd, &d, 1, 0) : epoll_wait(ep, &ev, 1, WAIT_MS);
			clock_gettime(CLOCK_MONOTONIC, &t1);
			if (n < 0 && !(threads && errno == EAGAIN))
				die(threads ? "recv" : "epoll_wait");
			ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
			if (n <= 0 || ms >= LATE_MS) {
				printf("connection %d, turn %d: %s returned %d after %ld ms\n",
				       k, i, threads ? "recv" : "epoll_wait", (int)n, ms);
				fflush(stdout);
				kill(pid, SIGKILL);
				return 1;
			}
			if (!threads)
				n = recv(fd, &d, 1, MSG_DONTWAIT);
			if (n != 1 || d != c)
				die("the echo");
turned:
			if (want && !strcmp(path_of(fd), want))
				there++;
			if (want && i + 1 == MAX_TURNS) {
				printf("connection %d: path %s after %d turns, not %s\n", k,
				       path_of(fd), MAX_TURNS, want);
				fflush(stdout);
				kill(pid, SIGKILL);
				return 1;
			}
		}
		if (threads) {
			atomic_store(&l.stop, true);
			pthread_join(t, NULL);
		}
		close(ep);
		close(fd);
	}
	if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status))
		die("the server");
	printf("ok %d\n", conns);
	return 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * wsd bench's many-connection workers (bench_scale.c runs them; the rest
 * are in bench_work.c, whose helpers these use):
 *
 *   hold-srv HOST N SECS                answer up to N connections, echo 64 B
 *   hold-cli HOST PORT N SECS           open N connections, 64 B each way on
 *                                       each, again once all are open; wait
 *                                       (see hold_cli)
 *   msg-srv  HOST CONNS SIZE            echo SIZE-byte requests on CONNS
 *   msg-cli  HOST PORT CONNS SIZE WARM_MS RUN_MS
 *                                       one request outstanding per connection
 *
 * hold-cli opens its connections within 0.4 SECS and lets the switch move
 * them until 0.8 SECS at most, then asks the server how many of its own
 * are on shm or verbs (a "COUNT" message: the server prints "ready ...")
 * and prints "ready conns K of N accel A pid P err E".  Both then stay
 * until SIGTERM (or SECS + 10 s: alarm), so that the bench can read their
 * descriptors and memory from /proc.  Each raises its descriptor limit to
 * 2 N + 100 first.  The msg workers run one thread on epoll each.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "wsd/bench.h"

#define HOLD_MSG 64

/* Room for 2 n + 100 descriptors: both limits if allowed (root), else the hard one. */
static void raise_nofile(int n)
{
	rlim_t need = 2 * (rlim_t)n + 100;
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur >= need)
		return;
	if (setrlimit(RLIMIT_NOFILE,
		      &(struct rlimit){ need, rl.rlim_max > need ? rl.rlim_max : need })) {
		rl.rlim_cur = rl.rlim_max;
		(void)setrlimit(RLIMIT_NOFILE, &rl);
	}
}

static volatile sig_atomic_t stop, waiting;

/* A worker that waits ends its wait; one still busy (the bench gave up on it) at once. */
static void on_term(int sig)
{
	(void)sig;
	if (!waiting)
		_exit(3);
	stop = 1;
}

/* SIGTERM ends the wait; SIGALRM (the default action) a worker that hangs. */
static void bound(int secs)
{
	struct sigaction sa = { .sa_handler = on_term };

	sigaction(SIGTERM, &sa, NULL);
	alarm((unsigned)secs);
}

static int epoll_add(int ep, int fd)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.fd = fd };

	return epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
}

/* How many of fds[0..n) (-1: closed) are on shm or verbs. */
static int count_fast(const int *fds, int n)
{
	int k = 0;

	for (int i = 0; i < n; i++)
		k += fds[i] >= 0 && bench_fast(bench_path_of(fds[i]));
	return k;
}

/* One HOLD_MSG message each way on fd, the client's side: 0, or an errno value. */
static int ask(int fd, const char *what)
{
	char b[HOLD_MSG] = { 0 };

	snprintf(b, sizeof(b), "%s", what);
	errno = 0;
	if (bench_full(fd, b, sizeof(b), true) || bench_full(fd, b, sizeof(b), false))
		return errno ? errno : ECONNRESET;      /* 0: the end of the stream */
	return 0;
}

/*
 * The server: one thread on epoll, accepting and echoing.  When accept
 * fails for want of descriptors it stops listening, so that the client's
 * next connection is refused rather than left waiting.  It ends when every
 * connection it took has closed, or at SIGTERM.
 */
static int hold_srv(char **a, int n)
{
	int want = n > 2 ? atoi(a[1]) : 0, secs = n > 2 ? atoi(a[2]) : 0;
	int lfd, ep, open = 0, taken = 0, err = 0, *fds;

	if (want < 1 || secs < 1 || !(fds = malloc(sizeof(*fds) * (size_t)want)))
		return 2;
	raise_nofile(want);
	bound(secs + 10);
	waiting = 1;    /* its loop looks at stop */
	lfd = bench_listen_on(a[0], 4096);
	if ((ep = epoll_create1(EPOLL_CLOEXEC)) < 0 || epoll_add(ep, lfd))
		bench_fail("epoll");
	while (!stop && (!taken || open)) {
		struct epoll_event ev[64];
		int k = epoll_wait(ep, ev, 64, 100);

		for (int i = 0; i < k; i++) {
			int fd = ev[i].data.fd;
			char b[HOLD_MSG];

			if (fd == lfd) {
				int c = accept(lfd, NULL, NULL);

				if (c >= 0 && taken < want && !epoll_add(ep, c)) {
					fds[taken++] = c;
					open++;
					continue;
				}
				if (c < 0 && (errno == EINTR || errno == EAGAIN ||
					      errno == ECONNABORTED))
					continue;
				err = c < 0 ? errno : EMFILE;
				if (c >= 0)
					close(c);
				epoll_ctl(ep, EPOLL_CTL_DEL, lfd, NULL);
				close(lfd);
				lfd = -1;
				continue;
			}
			if (bench_full(fd, b, sizeof(b), false)) {
				epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
				close(fd);
				for (int j = 0; j < taken; j++)
					if (fds[j] == fd)
						fds[j] = -1;
				open--;
				continue;
			}
			if (!strcmp(b, "COUNT")) {
				printf("ready conns %d accel %d pid %d err %d\n", open,
				       count_fast(fds, taken), (int)getpid(), err);
				fflush(stdout);
			}
			bench_full(fd, b, sizeof(b), true);
		}
	}
	return 0;
}

/* The client: see the top of the file. */
static int hold_cli(char **a, int n)
{
	int want = n > 3 ? atoi(a[2]) : 0, secs = n > 3 ? atoi(a[3]) : 0, k = 0, err = 0;
	int io = 0, fast = 0, *fds;
	double t0 = bench_now();
	bool plain;

	if (want < 1 || secs < 1 || !(fds = malloc(sizeof(*fds) * (size_t)want)))
		return 2;
	raise_nofile(want);
	bound(secs + 10);
	for (; k < want && bench_now() - t0 < 0.4 * secs; k++) {
		fds[k] = bench_try_connect(a[0], atoi(a[1]));
		err = fds[k] < 0 ? errno : ask(fds[k], "HELLO");
		if (err) {
			if (fds[k] >= 0)
				close(fds[k]);
			break;
		}
	}
	/*
	 * Once all are open, 64 B each way again on each connection not on shm
	 * or verbs, every 0.2 s: a switch that waits for a connection to age
	 * moves it at its next call, and one that has made the new path ready
	 * moves the data over at the next call.  Until all are moved, or none
	 * was for 2 s, or 0.8 SECS; plain, once.
	 */
	plain = !k || !strcmp(bench_path_of(fds[0]), "none");
	for (double seen = bench_now(); !io; usleep(200000)) {
		int now;

		for (int i = 0; i < k && !io; i++)
			if (!bench_fast(bench_path_of(fds[i])))
				io = ask(fds[i], "AGAIN");
		now = count_fast(fds, k);
		if (now != fast)
			seen = bench_now();
		fast = now;
		if (plain || fast == k || bench_now() - seen > 2.0 || bench_now() - t0 > 0.8 * secs)
			break;
	}
	if (!io && k)
		io = ask(fds[0], "COUNT");
	err = io ? io : err;
	printf("ready conns %d of %d accel %d pid %d err %d\n", k, want, fast, (int)getpid(), err);
	fflush(stdout);
	waiting = 1;
	while (!stop)
		usleep(20000);
	return 0;
}

int bench_work_hold(bool server, char **a, int n)
{
	return server ? hold_srv(a, n) : hold_cli(a, n);
}

/* ---- aggregate messages over CONNS connections ------------------------------------- */

/* The server echoes until every connection it took has closed. */
static int msg_srv(char **a, int n)
{
	int conns = n > 2 ? atoi(a[1]) : 0, lfd, ep, open = 0, taken = 0;
	size_t size = n > 2 ? (size_t)atoll(a[2]) : 0;
	unsigned long long served = 0;
	char *buf = malloc(size ? size : 1);

	if (conns < 1 || !size || !buf)
		return 2;
	alarm(120);     /* a worker that hangs ends, and the bench says so */
	lfd = bench_listen_on(a[0], 1024);
	if ((ep = epoll_create1(EPOLL_CLOEXEC)) < 0 || epoll_add(ep, lfd))
		bench_fail("epoll");
	while (taken < conns || open) {
		struct epoll_event ev[64];
		int k = epoll_wait(ep, ev, 64, -1);

		if (k < 0 && errno != EINTR)
			bench_fail("epoll_wait");
		for (int i = 0; i < k; i++) {
			int fd = ev[i].data.fd;

			if (fd == lfd) {
				int c = accept(lfd, NULL, NULL);

				if (c < 0 || epoll_add(ep, c))
					bench_fail("accept");
				taken++;
				open++;
			} else if (bench_full(fd, buf, size, false)) {
				epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
				close(fd);
				open--;
			} else if (bench_full(fd, buf, size, true)) {
				bench_fail("answer");
			} else {
				served++;
			}
		}
	}
	printf("served %llu\n", served);
	free(buf);
	return 0;
}

/*
 * The client sends a request on every connection and, in one epoll loop,
 * the next as each answer comes.  The warm-up lasts WARM_MS, and then until
 * every connection is on shm or verbs (2 s at most); the answers of the
 * RUN_MS after it are counted.  "path P" is the connections' common path,
 * "mixed" when they differ.
 */
static int msg_cli(char **a, int n)
{
	int conns = n > 5 ? atoi(a[2]) : 0, ep, outstanding = 0, *fds;
	size_t size = n > 5 ? (size_t)atoll(a[3]) : 0;
	double warm = n > 5 ? atoi(a[4]) / 1e3 : 0, run = n > 5 ? atoi(a[5]) / 1e3 : 0;
	double t0 = bench_now(), start = 0, end = 0, checked = 0;
	unsigned long long msgs = 0;
	char *buf = malloc(size ? size : 1);
	const char *path = "none";

	if (conns < 1 || !size || !buf || !(fds = malloc(sizeof(*fds) * (size_t)conns)))
		return 2;
	memset(buf, 0x5a, size);
	alarm(120);
	if ((ep = epoll_create1(EPOLL_CLOEXEC)) < 0)
		bench_fail("epoll");
	for (int i = 0; i < conns; i++) {
		if ((fds[i] = bench_try_connect(a[0], atoi(a[1]))) < 0 || epoll_add(ep, fds[i]))
			bench_fail("connect");
		if (bench_full(fds[i], buf, size, true))
			bench_fail("request");
		outstanding++;
	}
	while (outstanding) {
		struct epoll_event ev[64];
		double t = bench_now();
		int k;

		if (!start && t - t0 >= warm && t - checked >= 0.01) {
			int fast = count_fast(fds, conns);

			checked = t;
			if (fast == conns || t - t0 > 2.0 || !strcmp(bench_path_of(fds[0]), "none"))
				start = t;
		}
		if (start && !end && t - start >= run) {
			end = t;
			path = bench_path_of(fds[0]);
			for (int i = 1; i < conns; i++)
				if (strcmp(path, bench_path_of(fds[i])))
					path = "mixed";
		}
		k = epoll_wait(ep, ev, 64, 1000);
		if (k < 0 && errno != EINTR)
			bench_fail("epoll_wait");
		for (int i = 0; i < k; i++) {
			if (bench_full(ev[i].data.fd, buf, size, false))
				bench_fail("answer");
			msgs += start && !end;
			if (end)
				outstanding--;
			else if (bench_full(ev[i].data.fd, buf, size, true))
				bench_fail("request");
		}
	}
	for (int i = 0; i < conns; i++)
		close(fds[i]);
	printf("msgs %llu secs %.6f path %s\n", msgs, end - start, path);
	free(fds);
	free(buf);
	return 0;
}

int bench_work_msg(bool server, char **a, int n)
{
	return server ? msg_srv(a, n) : msg_cli(a, n);
}

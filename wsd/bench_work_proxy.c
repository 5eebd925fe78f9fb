/* SPDX-License-Identifier: MIT */
/*
 * wsd bench's splicing proxy, a worker of the apps section:
 *
 *   splice-proxy HOST PORT    accept one connection on HOST, connect to
 *                             HOST:PORT, move the bytes both ways
 *
 * Each direction is a thread that moves its bytes socket -> pipe -> socket
 * with splice(2), the kernel never copying them to user memory, as haproxy
 * and other proxies do; at a side's end of stream it ends the other side's
 * with shutdown(SHUT_WR).  It prints "port N" once it listens and, when
 * both directions have ended, "bytes UP DOWN path CLIENT SERVER": the bytes
 * each way and the paths of its two connections.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "wsd/bench.h"

#define PIPE_SIZE (1 << 20)     /* a proxy tuned for bulk (haproxy's tune.pipesize) */

struct leg {
	pthread_t th;
	int from, to;
	unsigned long long bytes;
	int err;                /* errno of the call that failed, 0 at a clean end */
};

/* All n bytes of the pipe out to the socket; false at an error (l->err). */
static bool drain_pipe(struct leg *l, int in, ssize_t n)
{
	while (n > 0) {
		ssize_t k = splice(in, NULL, l->to, NULL, (size_t)n, SPLICE_F_MOVE);

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0) {
			l->err = k ? errno : EPIPE;
			return false;
		}
		n -= k;
	}
	return true;
}

static void *pump(void *arg)
{
	struct leg *l = arg;
	int p[2];

	if (pipe2(p, O_CLOEXEC))
		bench_fail("pipe");
	(void)fcntl(p[1], F_SETPIPE_SZ, PIPE_SIZE);     /* the default 64 KiB if refused */
	for (;;) {
		ssize_t n = splice(l->from, NULL, p[1], NULL, PIPE_SIZE, SPLICE_F_MOVE);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			l->err = errno;
		if (n <= 0 || !drain_pipe(l, p[0], n))
			break;
		l->bytes += (unsigned long long)n;
	}
	shutdown(l->to, SHUT_WR);
	close(p[0]);
	close(p[1]);
	return NULL;
}

int bench_work_proxy(bool server, char **a, int n)
{
	struct leg up = { 0 }, down = { 0 };
	int lfd, cfd, sfd;

	(void)server;
	if (n < 2)
		return 2;
	lfd = bench_listen_on(a[0], 1);
	if ((cfd = accept(lfd, NULL, NULL)) < 0)
		bench_fail("accept");
	close(lfd);
	if ((sfd = bench_try_connect(a[0], atoi(a[1]))) < 0)
		bench_fail("connect");
	up = (struct leg){ .from = cfd, .to = sfd };
	down = (struct leg){ .from = sfd, .to = cfd };
	if (pthread_create(&up.th, NULL, pump, &up) || pthread_create(&down.th, NULL, pump, &down))
		bench_fail("thread");
	pthread_join(up.th, NULL);
	pthread_join(down.th, NULL);
	printf("bytes %llu %llu path %s %s\n", up.bytes, down.bytes, bench_path_of(cfd),
	       bench_path_of(sfd));
	close(cfd);
	close(sfd);
	if (up.err || down.err) {
		errno = up.err ? up.err : down.err;
		bench_fail("splice");
	}
	return 0;
}

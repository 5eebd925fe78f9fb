/* SPDX-License-Identifier: MIT */
/*
 * wsd bench's workers: the programs it measures, run plain or under
 * `wsd run` (`wsd bench-worker ROLE ARGS...`).  Ordinary socket programs:
 * nothing here knows about wsd.  A server prints "port N" once it listens,
 * and each worker prints one result line before it exits.
 *
 *   tput-srv HOST STREAMS CPU              count what STREAMS connections send
 *   tput-cli HOST PORT SIZE STREAMS WARM_MS RUN_MS CPU
 *   lat-srv  HOST SIZE CPU                 echo SIZE-byte messages
 *   lat-cli  HOST PORT SIZE COUNT CPU      round trips, p50, p99 and mean
 *   conn-srv HOST COUNT                    answer COUNT short connections
 *   conn-cli HOST PORT COUNT               connect, 64 B each way, close
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "wsd/cmd.h"

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + t.tv_nsec / 1e9;
}

static unsigned long long cpu_us(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return (unsigned long long)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000ull +
	       (unsigned long long)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

static void pin(int cpu)
{
	cpu_set_t set;

	if (cpu < 0)
		return;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	(void)sched_setaffinity(0, sizeof(set), &set);
}

static _Noreturn void fail(const char *what)
{
	fprintf(stderr, "wsd bench-worker: %s: %s\n", what, strerror(errno));
	exit(1);
}

/* The path the switch gives fd ("tcp", "shm", "verbs"), "none" without the switch. */
static const char *path_of(int fd)
{
	const char *(*fn)(int) = (const char *(*)(int))dlsym(RTLD_DEFAULT, "wsd_switch_path");
	const char *p = fn ? fn(fd) : NULL;

	return p ? p : "none";
}

/*
 * Under `wsd run` the switch moves a connection some milliseconds after its
 * traffic starts (longer on a loaded machine): the warm-up lasts until it
 * has (2 s at most), so that a wsd figure is the accelerated one.
 */
static bool warm_enough(int fd, double t0, double warm)
{
	double t = now_s() - t0;
	const char *p;

	if (t < warm)
		return false;
	p = path_of(fd);
	return t > 2.0 || !strcmp(p, "none") || !strcmp(p, "shm") || !strcmp(p, "verbs");
}

static int listen_on(const char *host)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t len = sizeof(a);
	int one = 1, fd = socket(AF_INET, SOCK_STREAM, 0);

	if (fd < 0 || inet_pton(AF_INET, host, &a.sin_addr) != 1)
		fail("listen address");
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) || listen(fd, 1024) ||
	    getsockname(fd, (struct sockaddr *)&a, &len))
		fail("listen");
	printf("port %d\n", ntohs(a.sin_port));
	fflush(stdout);
	return fd;
}

static int connect_to(const char *host, int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	int one = 1, fd = socket(AF_INET, SOCK_STREAM, 0);

	if (fd < 0 || inet_pton(AF_INET, host, &a.sin_addr) != 1)
		fail("peer address");
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)))
		fail("connect");
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return fd;
}

static int full(int fd, void *buf, size_t len, bool out)
{
	for (size_t done = 0; done < len;) {
		ssize_t n = out ? send(fd, (char *)buf + done, len - done, MSG_NOSIGNAL) :
				  recv(fd, (char *)buf + done, len - done, 0);

		if (n <= 0) {
			if (n < 0 && errno == EINTR)
				continue;
			return -1;
		}
		done += (size_t)n;
	}
	return 0;
}

/* ---- throughput ------------------------------------------------------------------- */

struct stream {
	pthread_t th;
	int fd;
	const char *path;               /* at the end of the measured part */
	size_t size;
	double warm, run;               /* seconds */
	unsigned long long bytes;       /* received, or sent in the measured part */
	double secs;
};

static void *drain_stream(void *arg)
{
	struct stream *s = arg;
	size_t cap = 4u << 20;
	char *buf = malloc(cap);
	ssize_t n;

	if (!buf)
		fail("memory");
	while ((n = recv(s->fd, buf, cap, 0)) > 0 || (n < 0 && errno == EINTR))
		if (n > 0)
			s->bytes += (unsigned long long)n;
	free(buf);
	return NULL;
}

static void *fill_stream(void *arg)
{
	struct stream *s = arg;
	char *buf = malloc(s->size);
	double t0 = now_s(), start = 0, t;

	if (!buf)
		fail("memory");
	memset(buf, 0x5a, s->size);
	for (;;) {
		t = now_s();
		if (!start && warm_enough(s->fd, t0, s->warm))
			start = now_s();
		if (start && t - start >= s->run)
			break;
		if (full(s->fd, buf, s->size, true))
			fail("send");
		if (start)
			s->bytes += s->size;
	}
	s->secs = t - start;
	s->path = path_of(s->fd);
	shutdown(s->fd, SHUT_WR);
	while (recv(s->fd, buf, s->size, 0) > 0)
		;
	free(buf);
	return NULL;
}

static int tput(bool server, char **a, int n)
{
	int streams = atoi(a[server ? 1 : 3]), lfd = -1;
	struct stream s[16] = { 0 };
	unsigned long long bytes = 0;
	double secs = 0;

	if (streams < 1 || streams > 16 || n < (server ? 3 : 7))
		return 2;
	pin(atoi(a[server ? 2 : 6]));
	if (server)
		lfd = listen_on(a[0]);
	for (int i = 0; i < streams; i++) {
		if (server) {
			if ((s[i].fd = accept(lfd, NULL, NULL)) < 0)
				fail("accept");
		} else {
			s[i].fd = connect_to(a[0], atoi(a[1]));
			s[i].size = (size_t)atoll(a[2]);
			s[i].warm = atoi(a[4]) / 1e3;
			s[i].run = atoi(a[5]) / 1e3;
		}
		if (pthread_create(&s[i].th, NULL, server ? drain_stream : fill_stream, &s[i]))
			fail("thread");
	}
	for (int i = 0; i < streams; i++) {
		pthread_join(s[i].th, NULL);
		bytes += s[i].bytes;
		secs = s[i].secs > secs ? s[i].secs : secs;
		close(s[i].fd);
	}
	printf("bytes %llu secs %.6f cpu_us %llu path %s\n", bytes, secs, cpu_us(),
	       server ? "-" : s[0].path);
	return 0;
}

/* ---- round trips ------------------------------------------------------------------- */

static int cmp_double(const void *x, const void *y)
{
	double a = *(const double *)x, b = *(const double *)y;

	return a < b ? -1 : a > b;
}

static int lat(bool server, char **a, int n)
{
	size_t size = (size_t)atoll(a[server ? 1 : 2]);
	char *buf = malloc(size ? size : 1);
	int fd;

	if (!buf || n < (server ? 3 : 5))
		return 2;
	pin(atoi(a[server ? 2 : 4]));
	if (server) {
		int lfd = listen_on(a[0]);

		if ((fd = accept(lfd, NULL, NULL)) < 0)
			fail("accept");
		while (!full(fd, buf, size, false))
			if (full(fd, buf, size, true))
				break;
		printf("cpu_us %llu\n", cpu_us());
	} else {
		int count = atoi(a[3]);
		double *rt = calloc((size_t)count, sizeof(*rt)), t0 = now_s(), sum = 0;

		if (!rt || count < 1)
			return 2;
		fd = connect_to(a[0], atoi(a[1]));
		memset(buf, 1, size);
		/* the warm-up lets the switch upgrade the connection first */
		while (!warm_enough(fd, t0, 0.2))
			if (full(fd, buf, size, true) || full(fd, buf, size, false))
				fail("warm-up");
		for (int i = 0; i < count; i++) {
			double t = now_s();

			if (full(fd, buf, size, true) || full(fd, buf, size, false))
				fail("round trip");
			rt[i] = (now_s() - t) * 1e6;
		}
		qsort(rt, (size_t)count, sizeof(*rt), cmp_double);
		for (int i = 0; i < count; i++)
			sum += rt[i];
		printf("p50 %.3f p99 %.3f mean %.3f path %s\n", rt[count / 2],
		       rt[count * 99 / 100], sum / count, path_of(fd));
		free(rt);
	}
	close(fd);
	free(buf);
	return 0;
}

/* ---- short-lived connections ------------------------------------------------------- */

static int conn(bool server, char **a, int n)
{
	char b[64] = "GET";
	int count;

	if (n < (server ? 2 : 3))
		return 2;
	count = atoi(a[server ? 1 : 2]);
	if (server) {
		int lfd = listen_on(a[0]);

		for (int i = 0; i < count; i++) {
			int fd = accept(lfd, NULL, NULL);

			if (fd < 0)
				fail("accept");
			if (!full(fd, b, 64, false))
				full(fd, b, 64, true);
			close(fd);
		}
		printf("served %d\n", count);
	} else {
		double t0 = now_s();

		for (int i = 0; i < count; i++) {
			int fd = connect_to(a[0], atoi(a[1]));

			if (full(fd, b, 64, true) || full(fd, b, 64, false))
				fail("request");
			close(fd);
		}
		printf("rate %.1f\n", count / (now_s() - t0));
	}
	return 0;
}

int cmd_bench_worker(int argc, char **argv)
{
	static const struct { const char *name; int (*fn)(bool, char **, int); bool server; } roles[] = {
		{ "tput-srv", tput, true }, { "tput-cli", tput, false },
		{ "lat-srv", lat, true },   { "lat-cli", lat, false },
		{ "conn-srv", conn, true }, { "conn-cli", conn, false },
	};

	if (argc < 2)
		return 2;
	for (size_t i = 0; i < sizeof(roles) / sizeof(roles[0]); i++)
		if (!strcmp(argv[1], roles[i].name))
			return roles[i].fn(roles[i].server, argv + 2, argc - 2);
	fprintf(stderr, "wsd bench-worker: unknown role %s\n", argv[1]);
	return 2;
}

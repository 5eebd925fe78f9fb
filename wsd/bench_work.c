/* SPDX-License-Identifier: MIT */
/*
 * wsd bench's workers: the programs it measures, run plain or under
 * `wsd run` (`wsd bench-worker ROLE ARGS...`).  Ordinary socket programs
 * that ask the switch, when it is there, only which path a connection took
 * (wsd_switch_path) and, the connection-rate client, the bytes its
 * connections moved (its own statistics file).  A server prints "port N"
 * once it listens, and each worker prints one result line before it exits.
 *
 *   tput-srv HOST STREAMS CPU [cold]       count what STREAMS connections send
 *   tput-cli HOST PORT SIZE STREAMS WARM_MS RUN_MS CPU [cold]
 *
 * tput-cli sends SIZE bytes at a time from one buffer it reuses, and
 * tput-srv receives into a 4 MiB buffer it never reads: UCX's tag_bw
 * measures the same way.  With cold, the client walks a 256 MiB source in
 * order instead (SIZE must divide it) and the server receives into a 1 MiB
 * buffer and reads every byte it gets, as a program that uses its data
 * does; both print the 64-bit sum of the stream's words, which must agree.
 *   lat-srv  HOST SIZE CPU                 echo SIZE-byte messages
 *   lat-cli  HOST PORT SIZE COUNT CPU      round trips, p50, p99 and mean
 *   conn-srv HOST COUNT                    answer COUNT short connections (0: until BYE)
 *   conn-cli HOST PORT COUNT [RUN_MS [keep]]  connect, 64 B each way, close
 *
 * and the many-connection ones of bench_work_scale.c (hold-*, msg-*), and
 * the apps section's splice-proxy (bench_work_proxy.c).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "switch/stat.h"
#include "wsd/bench.h"
#include "wsd/cmd.h"

double bench_now(void)
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

bool bench_pin(int cpu)
{
	cpu_set_t set;

	if (cpu < 0)
		return true;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	return sched_setaffinity(0, sizeof(set), &set) == 0;
}

void bench_fail(const char *what)
{
	fprintf(stderr, "wsd bench-worker: %s: %s\n", what, strerror(errno));
	exit(1);
}

static const char *(*switch_path)(int);

static void find_switch_path(void)
{
	switch_path = (const char *(*)(int))dlsym(RTLD_DEFAULT, "wsd_switch_path");
}

const char *bench_path_of(int fd)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	const char *p;

	/* looked up once: the connection-rate client asks at every close */
	pthread_once(&once, find_switch_path);
	p = switch_path ? switch_path(fd) : NULL;
	return p ? p : "none";
}

bool bench_fast(const char *path)
{
	return !strcmp(path, "shm") || !strcmp(path, "verbs");
}

/*
 * Under `wsd run` the switch moves a connection some milliseconds after its
 * traffic starts (longer on a loaded machine): the warm-up lasts until it
 * has (2 s at most), so that a wsd figure is the accelerated one.
 */
static bool warm_enough(int fd, double t0, double warm)
{
	double t = bench_now() - t0;
	const char *p;

	if (t < warm)
		return false;
	p = bench_path_of(fd);
	return t > 2.0 || !strcmp(p, "none") || bench_fast(p);
}

int bench_listen_on(const char *host, int backlog)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t len = sizeof(a);
	int one = 1, fd = socket(AF_INET, SOCK_STREAM, 0);

	if (fd < 0 || inet_pton(AF_INET, host, &a.sin_addr) != 1)
		bench_fail("listen address");
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) || listen(fd, backlog) ||
	    getsockname(fd, (struct sockaddr *)&a, &len))
		bench_fail("listen");
	printf("port %d\n", ntohs(a.sin_port));
	fflush(stdout);
	return fd;
}

int bench_try_connect(const char *host, int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	int one = 1, fd = socket(AF_INET, SOCK_STREAM, 0), err;

	if (fd < 0)
		return -1;
	if (inet_pton(AF_INET, host, &a.sin_addr) != 1)
		bench_fail("peer address");
	if (connect(fd, (struct sockaddr *)&a, sizeof(a))) {
		err = errno;
		close(fd);
		errno = err;
		return -1;
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return fd;
}

static int connect_to(const char *host, int port)
{
	int fd = bench_try_connect(host, port);

	if (fd < 0)
		bench_fail("connect");
	return fd;
}

int bench_full(int fd, void *buf, size_t len, bool out)
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
	bool cold;                      /* the 256 MiB source, every byte read */
	double warm, run;               /* seconds */
	unsigned long long bytes;       /* received, or sent in the measured part */
	double secs;
	uint64_t sum;                   /* cold: of the stream's 64-bit words */
};

/* One 64-bit word at p, aligned or not (a receive may end anywhere). */
static inline uint64_t word_at(const uint8_t *p)
{
	uint64_t v;

	memcpy(&v, p, sizeof(v));
	return v;
}

/* The sum of n bytes' 64-bit words, n a multiple of 8. */
static uint64_t word_sum(const void *p, size_t n)
{
	const uint8_t *w = p;
	uint64_t a = 0, b = 0, c = 0, d = 0;
	size_t i = 0;

	for (; i + 32 <= n; i += 32) {
		a += word_at(w + i);
		b += word_at(w + i + 8);
		c += word_at(w + i + 16);
		d += word_at(w + i + 24);
	}
	for (; i + 8 <= n; i += 8)
		a += word_at(w + i);
	return a + b + c + d;
}

/* Cold: add n received bytes to the sum, a word split between receives carried over. */
static void sum_received(struct stream *s, const uint8_t *p, size_t n, uint8_t carry[8],
			 size_t *held)
{
	uint64_t w;

	while (*held && n) {
		carry[(*held)++] = *p++;
		n--;
		if (*held == 8) {
			memcpy(&w, carry, 8);
			s->sum += w;
			*held = 0;
		}
	}
	s->sum += word_sum(p, n & ~(size_t)7);
	memcpy(carry, p + (n & ~(size_t)7), n & 7);
	*held = n & 7;
}

static void *drain_stream(void *arg)
{
	struct stream *s = arg;
	size_t cap = s->cold ? 1u << 20 : 4u << 20, held = 0;
	char *buf = malloc(cap);
	uint8_t carry[8];
	ssize_t n;

	if (!buf)
		bench_fail("memory");
	while ((n = recv(s->fd, buf, cap, 0)) > 0 || (n < 0 && errno == EINTR)) {
		if (n <= 0)
			continue;
		s->bytes += (unsigned long long)n;
		if (s->cold)
			sum_received(s, (const uint8_t *)buf, (size_t)n, carry, &held);
	}
	free(buf);
	return NULL;
}

#define COLD_SOURCE (256u << 20)

/*
 * Cold: the 256 MiB source, its words all different, and the sum of each
 * SIZE-byte message of it (sums[COLD_SOURCE / size]).
 */
static uint8_t *cold_source(size_t size, uint64_t **sums)
{
	uint8_t *src = mmap(NULL, COLD_SOURCE, PROT_READ | PROT_WRITE,
			    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uint64_t x = 0x9e3779b97f4a7c15ull;

	if (src == MAP_FAILED || !size || size % 8 || COLD_SOURCE % size ||
	    !(*sums = malloc(COLD_SOURCE / size * sizeof(**sums))))
		bench_fail("cold source");
	for (size_t i = 0; i < COLD_SOURCE / 8; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		((uint64_t *)src)[i] = x;
	}
	for (size_t i = 0; i < COLD_SOURCE / size; i++)
		(*sums)[i] = word_sum(src + i * size, size);
	return src;
}

static void *fill_stream(void *arg)
{
	struct stream *s = arg;
	uint64_t *sums = NULL;
	uint8_t *src = s->cold ? cold_source(s->size, &sums) : malloc(s->size), *buf = src;
	double t0 = bench_now(), start = 0, t;
	size_t at = 0;

	if (!buf)
		bench_fail("memory");
	if (!s->cold)
		memset(buf, 0x5a, s->size);
	for (;;) {
		t = bench_now();
		if (!start && warm_enough(s->fd, t0, s->warm))
			start = bench_now();
		if (start && t - start >= s->run)
			break;
		if (s->cold) {
			buf = src + at;
			s->sum += sums[at / s->size];
			at = (at + s->size) % COLD_SOURCE;
		}
		if (bench_full(s->fd, buf, s->size, true))
			bench_fail("send");
		if (start)
			s->bytes += s->size;
	}
	s->secs = t - start;
	s->path = bench_path_of(s->fd);
	shutdown(s->fd, SHUT_WR);
	while (recv(s->fd, src, s->size, 0) > 0)
		;
	if (s->cold) {
		munmap(src, COLD_SOURCE);
		free(sums);
	} else {
		free(src);
	}
	return NULL;
}

static int tput(bool server, char **a, int n)
{
	int streams = atoi(a[server ? 1 : 3]), lfd = -1;
	struct stream s[16] = { 0 };
	unsigned long long bytes = 0;
	double secs = 0;
	uint64_t sum = 0;
	bool cold;

	if (streams < 1 || streams > 16 || n < (server ? 3 : 7))
		return 2;
	cold = n > (server ? 3 : 7) && !strcmp(a[server ? 3 : 7], "cold");
	bench_pin(atoi(a[server ? 2 : 6]));
	if (server)
		lfd = bench_listen_on(a[0], 1024);
	for (int i = 0; i < streams; i++) {
		if (server) {
			if ((s[i].fd = accept(lfd, NULL, NULL)) < 0)
				bench_fail("accept");
		} else {
			s[i].fd = connect_to(a[0], atoi(a[1]));
			s[i].size = (size_t)atoll(a[2]);
			s[i].warm = atoi(a[4]) / 1e3;
			s[i].run = atoi(a[5]) / 1e3;
		}
		s[i].cold = cold;
		if (pthread_create(&s[i].th, NULL, server ? drain_stream : fill_stream, &s[i]))
			bench_fail("thread");
	}
	for (int i = 0; i < streams; i++) {
		pthread_join(s[i].th, NULL);
		bytes += s[i].bytes;
		secs = s[i].secs > secs ? s[i].secs : secs;
		sum += s[i].sum;
		close(s[i].fd);
	}
	printf("bytes %llu secs %.6f cpu_us %llu", bytes, secs, cpu_us());
	if (cold)
		printf(" sum %016llx", (unsigned long long)sum);
	printf(" path %s\n", server ? "-" : s[0].path);
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
	bench_pin(atoi(a[server ? 2 : 4]));
	if (server) {
		int lfd = bench_listen_on(a[0], 1024);

		if ((fd = accept(lfd, NULL, NULL)) < 0)
			bench_fail("accept");
		while (!bench_full(fd, buf, size, false))
			if (bench_full(fd, buf, size, true))
				break;
		printf("cpu_us %llu\n", cpu_us());
	} else {
		int count = atoi(a[3]);
		double *rt = calloc((size_t)count, sizeof(*rt)), t0 = bench_now(), sum = 0;

		if (!rt || count < 1)
			return 2;
		fd = connect_to(a[0], atoi(a[1]));
		memset(buf, 1, size);
		/* the warm-up lets the switch upgrade the connection first */
		while (!warm_enough(fd, t0, 0.2))
			if (bench_full(fd, buf, size, true) || bench_full(fd, buf, size, false))
				bench_fail("warm-up");
		for (int i = 0; i < count; i++) {
			double t = bench_now();

			if (bench_full(fd, buf, size, true) || bench_full(fd, buf, size, false))
				bench_fail("round trip");
			rt[i] = (bench_now() - t) * 1e6;
		}
		qsort(rt, (size_t)count, sizeof(*rt), cmp_double);
		for (int i = 0; i < count; i++)
			sum += rt[i];
		printf("p50 %.3f p99 %.3f mean %.3f path %s\n", rt[count / 2],
		       rt[count * 99 / 100], sum / count, bench_path_of(fd));
		free(rt);
	}
	close(fd);
	free(buf);
	return 0;
}

/* ---- short-lived connections ------------------------------------------------------- */

/*
 * The bytes a connection moved, read from this process's own statistics
 * file (switch/stat.h) just before it closes: the switch frees its slot at
 * the close.  Without the switch, or a layout this does not know, nothing.
 */
struct bytes_seen {
	const struct wsd_stat_file *f;
	size_t len;
	bool tried;
	unsigned long long fast, all;   /* through the ring or RDMA; in all */
};

/*
 * Our own statistics file: the one our switch mapped (its name is
 * wsd-stat.PID, or an alternate one when another user held that), found
 * in /proc/self/maps, not taken by name, where anyone may put a file.
 * Its descriptor, or -1.
 */
static int own_stat_file(void)
{
	char want[64], *line = NULL;
	size_t cap = 0, wl;
	int sfd = -1;
	FILE *m = fopen("/proc/self/maps", "re");

	if (!m)
		return -1;
	snprintf(want, sizeof(want), WSD_STAT_DIR "/" WSD_STAT_PREFIX "%d", (int)getpid());
	wl = strlen(want);
	while (sfd < 0 && getline(&line, &cap, m) > 0) {
		char *at = strstr(line, want);
		unsigned long long ino;
		struct stat st;

		if (!at || (at[wl] != '\n' && at[wl] != '.') ||
		    sscanf(line, "%*s %*s %*s %*s %llu", &ino) != 1)
			continue;
		at[strcspn(at, "\n")] = '\0';
		sfd = open(at, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
		if (sfd >= 0 && (fstat(sfd, &st) || st.st_ino != (ino_t)ino ||
				 st.st_uid != geteuid())) {
			close(sfd);
			sfd = -1;
		}
	}
	free(line);
	fclose(m);
	return sfd;
}

static void count_bytes(struct bytes_seen *b, int fd)
{
	struct sockaddr_storage me;
	socklen_t mel = sizeof(me);
	size_t room;
	uint32_t hi;
	uint16_t port;

	if (!b->tried) {
		struct stat st;
		int sfd;

		b->tried = true;
		sfd = own_stat_file();
		if (sfd >= 0 && !fstat(sfd, &st) && (size_t)st.st_size >= sizeof(*b->f)) {
			void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, sfd, 0);

			if (m != MAP_FAILED) {
				b->f = m;
				b->len = (size_t)st.st_size;
			}
		}
		if (sfd >= 0)
			close(sfd);
		if (b->f && (b->f->magic != WSD_STAT_MAGIC || b->f->version != WSD_STAT_VERSION)) {
			munmap((void *)b->f, b->len);
			b->f = NULL;
		}
	}
	if (!b->f)
		return;
	room = (b->len - offsetof(struct wsd_stat_file, slots)) / sizeof(b->f->slots[0]);
	hi = atomic_load(&b->f->hiwater);
	if (hi > room) {
		/* the table grew past what we mapped: mapped again at the next call */
		munmap((void *)b->f, b->len);
		b->f = NULL;
		b->tried = false;
		return;
	}
	/* the slot of this connection: its fd and its local port (a number is reused) */
	if (getsockname(fd, (struct sockaddr *)&me, &mel) || (me.ss_family != AF_INET &&
							   me.ss_family != AF_INET6))
		return;
	port = ntohs(me.ss_family == AF_INET ? ((struct sockaddr_in *)&me)->sin_port :
					       ((struct sockaddr_in6 *)&me)->sin6_port);
	for (uint32_t i = 0; i < hi && i < b->f->nslots && i < room; i++) {
		const struct wsd_stat_slot *sl = &b->f->slots[i];
		unsigned long long fast, slow;

		if (!sl->used || sl->fd != fd || sl->listening || sl->local.port != port)
			continue;
		fast = atomic_load_explicit(&sl->copy_tx, memory_order_relaxed) +
		       atomic_load_explicit(&sl->copy_rx, memory_order_relaxed) +
		       atomic_load_explicit(&sl->zcopy_tx, memory_order_relaxed) +
		       atomic_load_explicit(&sl->zcopy_rx, memory_order_relaxed);
		slow = atomic_load_explicit(&sl->tcp_tx, memory_order_relaxed) +
		       atomic_load_explicit(&sl->tcp_rx, memory_order_relaxed);
		b->fast += fast;
		b->all += fast + slow;
		return;
	}
}

/*
 * The server answers COUNT connections, or with COUNT 0 until one asks
 * "BYE".  The client makes COUNT connections, or with RUN_MS as many as it
 * can in that time (then the "BYE" one), and prints their rate, how many
 * were on shm or verbs when it closed them and the bytes that went by the
 * ring or RDMA (its own counters; the bookkeeping's time is not counted).
 * With "keep", it first holds one connection ("KEEP", which the server
 * echoes on a thread of its own) that it warms until it is accelerated, or
 * 2 s: the channel between the two processes exists for the short ones.
 */
static void *keep_echo(void *arg)
{
	int fd = (int)(intptr_t)arg;
	char b[64];

	while (!bench_full(fd, b, 64, false) && !bench_full(fd, b, 64, true))
		;
	close(fd);
	return NULL;
}

static int keep_open(const char *host, int port)
{
	int fd = connect_to(host, port);
	char b[64] = "KEEP";
	double t0 = bench_now();

	do {
		if (bench_full(fd, b, 64, true) || bench_full(fd, b, 64, false))
			bench_fail("keep");
	} while (!bench_fast(bench_path_of(fd)) && bench_now() - t0 < 2);
	return fd;
}

static int conn(bool server, char **a, int n)
{
	char b[64] = "GET";
	int count, keep = -1;

	if (n < (server ? 2 : 3))
		return 2;
	count = atoi(a[server ? 1 : 2]);
	if (server) {
		int lfd = bench_listen_on(a[0], 1024), served = 0;

		for (bool bye = false; !bye && (!count || served < count); served++) {
			int fd = accept(lfd, NULL, NULL);

			if (fd < 0)
				bench_fail("accept");
			if (!bench_full(fd, b, 64, false)) {
				pthread_t th;

				bye = !strcmp(b, "BYE");
				bench_full(fd, b, 64, true);
				if (!strcmp(b, "KEEP") &&
				    !pthread_create(&th, NULL, keep_echo, (void *)(intptr_t)fd)) {
					pthread_detach(th);
					served--;
					continue;
				}
			}
			close(fd);
		}
		printf("served %d\n", served);
	} else {
		double run = n > 3 ? atoi(a[3]) / 1e3 : 0, t0 = bench_now(), book = 0, t = t0;
		struct bytes_seen bytes = { 0 };
		int done = 0, fast = 0;

		if (n > 4 && !strcmp(a[4], "keep")) {
			keep = keep_open(a[0], atoi(a[1]));
			t0 = t = bench_now();
		}

		for (; run ? t - t0 < run : done < count; done++) {
			int fd = connect_to(a[0], atoi(a[1]));
			double t1;

			if (bench_full(fd, b, 64, true) || bench_full(fd, b, 64, false))
				bench_fail("request");
			t1 = bench_now();
			fast += bench_fast(bench_path_of(fd));
			count_bytes(&bytes, fd);
			t = bench_now();
			book += t - t1;
			close(fd);
		}
		t = bench_now() - t0 - book;
		if (run) {
			int fd = connect_to(a[0], atoi(a[1]));

			strcpy(b, "BYE");
			if (bench_full(fd, b, 64, true) || bench_full(fd, b, 64, false))
				bench_fail("request");
			close(fd);
		}
		if (keep >= 0)
			close(keep);
		printf("rate %.1f accel %d of %d bytes %llu of %llu\n", done / t, fast, done,
		       bytes.fast, bytes.all);
	}
	return 0;
}

int cmd_bench_worker(int argc, char **argv)
{
	static const struct { const char *name; int (*fn)(bool, char **, int); bool server; } roles[] = {
		{ "tput-srv", tput, true }, { "tput-cli", tput, false },
		{ "lat-srv", lat, true },   { "lat-cli", lat, false },
		{ "conn-srv", conn, true }, { "conn-cli", conn, false },
		{ "hold-srv", bench_work_hold, true }, { "hold-cli", bench_work_hold, false },
		{ "msg-srv", bench_work_msg, true },   { "msg-cli", bench_work_msg, false },
		{ "splice-proxy", bench_work_proxy, true },
	};

	if (argc < 2)
		return 2;
	for (size_t i = 0; i < sizeof(roles) / sizeof(roles[0]); i++)
		if (!strcmp(argv[1], roles[i].name))
			return roles[i].fn(roles[i].server, argv + 2, argc - 2);
	fprintf(stderr, "wsd bench-worker: unknown role %s\n", argv[1]);
	return 2;
}

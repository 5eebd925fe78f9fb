/* SPDX-License-Identifier: MIT */
/*
 * wsd bench's stream section: one 1 MiB stream, server on CPU 0 and
 * client on CPU 1, measured two ways, and this machine's memcpy limit for
 * each, in the same run.  From one reused buffer into a receiver that
 * never reads its data, as UCX's tag_bw does, so the two compare; and from
 * a 256 MiB source walked in order into a receiver that reads every byte,
 * which the caches cannot flatter.  The sums the two workers print of the
 * cold stream must agree.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "wsd/bench.h"

#define MIB (1u << 20)
#define SOURCE (256u * MIB)

/* One core's memcpy of 1 MiB messages for about secs, in MB/s: from one buffer, or walking src. */
static double memcpy_rate(const uint8_t *src, size_t span, uint8_t *dst, double secs)
{
	double t0 = bench_now(), t;
	unsigned long long n = 0;
	size_t at = 0;

	do {
		for (int i = 0; i < 16; i++, n++) {
			memcpy(dst, src + at, MIB);
			__asm__ __volatile__("" : : "r"(dst) : "memory");
			at = (at + MIB) % span;
		}
		t = bench_now() - t0;
	} while (t < secs);
	return (double)n * MIB / t / 1e6;
}

/*
 * The memcpy limits on CPU 1, where the client runs: hot (one 1 MiB
 * source, again and again) and cold (src, the 256 MiB source, walked in
 * order), MB/s, medians of rounds.
 */
static void memcpy_limits(const uint8_t *src, int rounds, double secs, double out[2])
{
	uint8_t *dst = malloc(MIB);
	double v[2][BENCH_MAXR];

	out[0] = out[1] = 0;
	if (!dst)
		return;
	memset(dst, 0, MIB);
	if (bench_pin(1)) {
		for (int r = 0; r < rounds; r++) {
			v[0][r] = memcpy_rate(src, MIB, dst, secs);
			v[1][r] = memcpy_rate(src, SOURCE, dst, secs);
		}
		out[0] = bench_median(v[0], rounds);
		out[1] = bench_median(v[1], rounds);
	}
	free(dst);
}

/* ---- the two CPUs without wsd: a cache line's round trip, and a plain copy ------------ */

/*
 * Two threads, the consumer on CPU 0 (the server's), the producer on CPU 1
 * (the client's), sharing one word for the round trip, or a 1 MiB buffer
 * in 64 KiB slots for the copy: the producer copies the 256 MiB source
 * into it in order, the consumer reads every word of each slot, copying
 * the slot out first (two copies, as through a ring) or not (one copy, as
 * when the sender writes into the receiver's buffer).
 */
#define SLOT (64u << 10)
#define SLOTS 16u
#define TRIPS 100000

struct duo {
	_Atomic uint64_t word __attribute__((aligned(64)));
	_Atomic uint64_t head __attribute__((aligned(64)));   /* bytes the producer put */
	_Atomic uint64_t tail __attribute__((aligned(64)));   /* bytes the consumer took */
	_Atomic bool stop;
	bool two;
	double secs;
	const uint8_t *src;
	uint8_t *ring, *dst;
};

static void *trip_cpu1(void *arg)
{
	struct duo *d = arg;

	if (bench_pin(1))
		for (uint64_t i = 1; i < 2 * TRIPS; i += 2) {
			while (atomic_load_explicit(&d->word, memory_order_acquire) != i)
				;
			atomic_store_explicit(&d->word, i + 1, memory_order_release);
		}
	return NULL;
}

/* ns a cache line takes from CPU 0 to CPU 1 and back, or 0; the caller's affinity kept. */
static double round_trip_ns(void)
{
	struct duo d = { 0 };
	cpu_set_t was;
	pthread_t t;
	double t0, ns = 0;

	if (sched_getaffinity(0, sizeof(was), &was))
		return 0;
	if (bench_pin(0) && !pthread_create(&t, NULL, trip_cpu1, &d)) {
		t0 = bench_now();
		for (uint64_t i = 0; i < 2 * TRIPS; i += 2) {
			while (atomic_load_explicit(&d.word, memory_order_acquire) != i)
				;
			atomic_store_explicit(&d.word, i + 1, memory_order_release);
		}
		ns = (bench_now() - t0) * 1e9 / TRIPS;
		pthread_join(t, NULL);
	}
	(void)sched_setaffinity(0, sizeof(was), &was);
	return ns;
}

static void *copy_producer(void *arg)
{
	struct duo *d = arg;
	uint64_t at = 0;

	if (!bench_pin(1)) {
		atomic_store(&d->stop, true);
		return NULL;
	}
	for (;;) {
		while (at - atomic_load_explicit(&d->tail, memory_order_acquire) >= SLOTS * SLOT)
			if (atomic_load_explicit(&d->stop, memory_order_relaxed))
				return NULL;
		memcpy(d->ring + at % (SLOTS * SLOT), d->src + at % SOURCE, SLOT);
		at += SLOT;
		atomic_store_explicit(&d->head, at, memory_order_release);
	}
}

/* The consumer's MB/s over about d->secs, or 0. */
static double copy_rate(struct duo *d)
{
	uint64_t at = 0, sum = 0;
	pthread_t t;
	double t0;

	atomic_store(&d->head, 0);
	atomic_store(&d->tail, 0);
	atomic_store(&d->stop, false);
	if (pthread_create(&t, NULL, copy_producer, d))
		return 0;
	t0 = bench_now();
	do {
		for (int i = 0; i < 16; i++) {
			const uint64_t *w = (const uint64_t *)(d->ring + at % (SLOTS * SLOT));

			while (atomic_load_explicit(&d->head, memory_order_acquire) < at + SLOT)
				if (atomic_load_explicit(&d->stop, memory_order_relaxed))
					goto out;
			if (d->two) {
				memcpy(d->dst + at % MIB, w, SLOT);
				w = (const uint64_t *)(d->dst + at % MIB);
			}
			for (size_t k = 0; k < SLOT / 8; k++)
				sum += w[k];
			at += SLOT;
			atomic_store_explicit(&d->tail, at, memory_order_release);
		}
	} while (bench_now() - t0 < d->secs);
out:
	t0 = bench_now() - t0;
	atomic_store(&d->stop, true);
	pthread_join(t, NULL);
	__asm__ __volatile__("" : : "r"(sum));
	return t0 > 0 ? (double)at / t0 / 1e6 : 0;
}

/*
 * Two threads moving src, the 256 MiB source, from CPU 1 to CPU 0 with
 * every word read there: with one copy and with two, MB/s, medians of
 * rounds.  A plain yardstick of what the CPUs' placement does to copies
 * through shared memory, not a limit (wsd's ring can beat it).
 */
static void thread_limits(const uint8_t *src, int rounds, double secs, double out[2])
{
	struct duo *d = aligned_alloc(64, sizeof(*d));
	double v[2][BENCH_MAXR];

	out[0] = out[1] = 0;
	if (!d)
		return;
	memset(d, 0, sizeof(*d));
	d->src = src;
	d->ring = malloc(SLOTS * SLOT);
	d->dst = malloc(MIB);
	d->secs = secs;
	if (d->ring && d->dst && bench_pin(0)) {
		memset(d->ring, 0, SLOTS * SLOT);
		memset(d->dst, 0, MIB);
		for (int r = 0; r < rounds; r++)
			for (int k = 0; k < 2; k++) {
				d->two = k;
				v[k][r] = copy_rate(d);
			}
		out[0] = bench_median(v[0], rounds);
		out[1] = bench_median(v[1], rounds);
	}
	free(d->ring);
	free(d->dst);
	free(d);
}

/*
 * The yardsticks without wsd, from one 256 MiB source: the memcpy limits
 * and the two-thread copies.  Each pins the calling thread; the caller's
 * affinity comes back after.
 */
static void limits(const struct bench_opts *o, struct bench_stream_res *res)
{
	uint8_t *src = mmap(NULL, SOURCE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
			    0);
	cpu_set_t was;

	if (src == MAP_FAILED)
		return;
	if (!sched_getaffinity(0, sizeof(was), &was)) {
		memset(src, 0x5a, SOURCE);
		memcpy_limits(src, o->rounds, o->run_ms / 1e3, res->memcpy);
		thread_limits(src, o->rounds, o->run_ms / 1e3, res->threads);
		(void)sched_setaffinity(0, sizeof(was), &was);
	}
	munmap(src, SOURCE);
}

void bench_stream(const struct bench_opts *o, const char *host, struct bench_stream_res *res)
{
	static const char *const modes[2] = { "hot", "cold" };
	static const char *const what[2] = { "one 1 MiB buffer, reused", "256 MiB source, all read" };
	char warm[16], run[16], so[256], co[256];

	snprintf(warm, sizeof(warm), "%d", o->warm_ms);
	snprintf(run, sizeof(run), "%d", o->run_ms * 2);
	memset(res, 0, sizeof(*res));
	res->trip[0] = round_trip_ns();
	limits(o, res);
	printf("\n== 1 MiB, one stream, server on cpu 0, client on cpu 1, MB/s (median of %d)\n",
	       o->rounds);
	printf("   %-26s %9s %9s %7s %9s %8s\n", "source", "plain", "wsd", "ratio", "memcpy",
	       "of it");
	for (int m = 0; m < 2; m++) {
		char *srv[] = { "tput-srv", (char *)host, "1", "0", (char *)modes[m], NULL };
		char *cli[] = { "tput-cli", (char *)host, "PORT", "1048576", "1", warm, run, "1",
				(char *)modes[m], NULL };
		double v[2][BENCH_MAXR];

		for (int r = 0; r < o->rounds; r++)
			for (int w = 0; w < 2; w++) {
				unsigned long long b = 0, cs = 0, ss = 0;
				double secs = 0;

				v[w][r] = 0;
				if (!bench_pair(o, w, srv, cli, so, co) ||
				    sscanf(co, "bytes %llu secs %lf", &b, &secs) != 2)
					continue;
				bench_check_path(&res->off_path, w, co);
				if (m == 1) {
					const char *a = strstr(co, " sum "), *b2 = strstr(so, " sum ");

					if (!a || !b2 || sscanf(a, " sum %llx", &cs) != 1 ||
					    sscanf(b2, " sum %llx", &ss) != 1 || cs != ss) {
						fprintf(stderr, "wsd bench: the cold stream (%s) "
								"arrived changed: sums %s and %s\n",
							w ? "wsd" : "plain", a ? a + 5 : "none",
							b2 ? b2 + 5 : "none");
						bench_failures++;
						continue;
					}
				}
				v[w][r] = secs > 0 ? b / secs / 1e6 : 0;
			}
		res->mbs[m][0] = bench_median(v[0], o->rounds);
		res->mbs[m][1] = bench_median(v[1], o->rounds);
		printf("   %-26s %9.0f %9.0f %7.2f %9.0f %8.2f\n", what[m], res->mbs[m][0],
		       res->mbs[m][1], bench_ratio(res->mbs[m][1], res->mbs[m][0]), res->memcpy[m],
		       bench_ratio(res->mbs[m][1], res->memcpy[m]));
		fflush(stdout);
	}
	res->trip[1] = round_trip_ns();
	printf("   without wsd, two threads from CPU 1 to CPU 0: the 256 MiB source, all read,\n"
	       "   %.0f MB/s by one copy, %.0f by two; a cache line's round trip %.0f ns before,"
	       " %.0f after\n", res->threads[0], res->threads[1], res->trip[0], res->trip[1]);
}

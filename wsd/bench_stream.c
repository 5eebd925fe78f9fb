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
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "wsd/bench.h"

#define MIB (1u << 20)
#define SOURCE (256u * MIB)

/* One core's memcpy of 1 MiB messages for about secs, in MB/s: from one buffer, or walking src. */
static double memcpy_rate(uint8_t *src, size_t span, uint8_t *dst, double secs)
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
 * source, again and again) and cold (the 256 MiB source walked in order),
 * MB/s, medians of rounds.
 */
static void memcpy_limits(int rounds, double secs, double out[2])
{
	uint8_t *src = mmap(NULL, SOURCE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
			    0);
	uint8_t *dst = malloc(MIB);
	double v[2][BENCH_MAXR];
	cpu_set_t was, one;

	out[0] = out[1] = 0;
	if (src == MAP_FAILED || !dst) {
		free(dst);
		if (src != MAP_FAILED)
			munmap(src, SOURCE);
		return;
	}
	memset(src, 0x5a, SOURCE);
	memset(dst, 0, MIB);
	CPU_ZERO(&one);
	CPU_SET(1, &one);
	if (sched_getaffinity(0, sizeof(was), &was) == 0 &&
	    sched_setaffinity(0, sizeof(one), &one) == 0) {
		for (int r = 0; r < rounds; r++) {
			v[0][r] = memcpy_rate(src, MIB, dst, secs);
			v[1][r] = memcpy_rate(src, SOURCE, dst, secs);
		}
		out[0] = bench_median(v[0], rounds);
		out[1] = bench_median(v[1], rounds);
		(void)sched_setaffinity(0, sizeof(was), &was);
	}
	munmap(src, SOURCE);
	free(dst);
}

void bench_stream(const struct bench_opts *o, const char *host, struct bench_stream_res *res)
{
	static const char *const modes[2] = { "hot", "cold" };
	static const char *const what[2] = { "one 1 MiB buffer, reused", "256 MiB source, all read" };
	char warm[16], run[16], so[256], co[256];

	snprintf(warm, sizeof(warm), "%d", o->warm_ms);
	snprintf(run, sizeof(run), "%d", o->run_ms * 2);
	memset(res, 0, sizeof(*res));
	memcpy_limits(o->rounds, o->run_ms / 1e3, res->memcpy);
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
}

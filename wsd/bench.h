/* SPDX-License-Identifier: MIT */
/* wsd bench's parts: the orchestrator (bench.c) and the outside yardsticks (bench_ext.c). */
#ifndef WSD_BENCH_H
#define WSD_BENCH_H

#include <limits.h>
#include <stdbool.h>

#define BENCH_MAXR 9            /* rounds at most */

/* The median of v[0..n) (sorts v). */
double bench_median(double *v, int n);

/* iperf3 -l 1M plain and under `wsd run` (self is the wsd program): Gbit/s each. */
void bench_iperf3(const char *self, int rounds, int secs, double out[2]);

/* ucx_perftest over shared memory: tag_bw at 1 MiB (MB/s), tag_lat at 64 B (us one way). */
void bench_ucx(int rounds, double *bw_mbs, double *lat_us);

#endif

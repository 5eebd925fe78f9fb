/* SPDX-License-Identifier: MIT */
/*
 * What bench_nd.c and bench_nd_spi.c share: the sizes and counts, the
 * helpers (failing, the clock, pinning, the data pattern, quantiles), the
 * process pairs, the endpoints and the nd_ep_read round, all defined in
 * bench_nd.c; and the SPI benches that main calls, in bench_nd_spi.c.
 */
#ifndef WSD_TESTS_BENCH_ND_H
#define WSD_TESTS_BENCH_ND_H

#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "wsd/nd.h"

#define MIB (1u << 20)
#define WIN_LEN (16u * MIB)         /* the peer's window; reads cycle through it */
#define NSLOT 4                     /* local 1 MiB buffers = reads outstanding */
#define ROUNDS 5
#define ROUND_READS 200             /* 1 MiB reads per round */
#define MSG 64
#define NRECV 8                     /* receives kept posted per side */
#define NSEND 8                     /* send buffers per side */
#define WARM 1000
#define ITERS_X 20000               /* cross-core round trips */
#define ROUNDS_X 5                  /* ... in this many A/B rounds */
#define ITERS_1 5000                /* one-core round trips */
#define PHASE_NS (15 * 1000000000LL) /* no measurement may run longer */

/* Where read i of a round lands, and where in the window it comes from. */
#define SLOT(s, i) ((s)->buf + (size_t)((i) % NSLOT) * MIB)
#define WOFF(i) ((uint64_t)(i) * MIB % WIN_LEN)

#define TRY(what, call) do { nd_status st_ = (call); \
	if (st_ != ND_SUCCESS) fail("%s: %s", what, nd_strstatus(st_)); } while (0)

/* Ping-pong message i is 64 bytes of pattern; the reply is its complement. */
#define MSG_FILL(m, i, flip) pat_do(m, (uint64_t)(i) * 8, MSG, flip, 0)
#define MSG_OK(m, i, flip) pat_do(m, (uint64_t)(i) * 8, MSG, flip, 1)

#define SPI_ROUNDS_X 5              /* 7: alternating rounds of each kind */
#define SPI_ITERS_X 2000            /* 7: round trips per round, after WARM */

/* ---- shared state and helpers (bench_nd.c) ----------------------------- */

extern int cpu_a, cpu_b, one_cpu;   /* the cores the pairs run on */
extern double nd_read_gbs;          /* 1's median nd_ep_read GB/s, quoted in 6 */

/* Report on stderr and exit 1 (the peer too, if one is up). */
void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
int64_t now_ns(void);
/* Run on one core; cpu < 0 restores the mask we started with. */
void pin(int cpu);
/* Fill or check len bytes as the pattern from word w on, each word xored with flip. */
int pat_do(uint8_t *buf, uint64_t w, size_t len, uint64_t flip, int check);
/* The q quantile of v[0..n) (sorts v). */
double quantile(double *v, int n, double q);

/* ---- process pairs ------------------------------------------------------ */

struct peer {
	pid_t pid;
	int rd, wr;         /* pipes from and to the child */
};

typedef int (*child_fn)(const struct sockaddr_in *sa, int rd, int wr, void *arg);

struct sockaddr_in next_addr(void);
/* Fork a child running fn; return once it has written its ready byte. */
void spawn(struct peer *p, child_fn fn, const struct sockaddr_in *sa, void *arg);
/* Tell the child we are done (EOF on its pipe) and check how it ended. */
void reap(struct peer *p);
/* Child: block until the parent closes our pipe. */
int wait_parent(int rd);

/* ---- endpoints ---------------------------------------------------------- */

struct side {
	struct nd_adapter *ad;
	struct nd_cq *cq;
	struct nd_ep *ep;
	uint8_t *buf;
	struct nd_mr *mr;
};

/* Open an endpoint over a registered buffer of len bytes, then connect it
 * (wr < 0) or, in the child, listen, tell the parent by wr, and accept. */
void side_open(struct side *s, size_t len, uint32_t mr_flags,
	       const struct sockaddr_in *sa, int wr);
void side_close(struct side *s);
/* The next result, by busy polling or by nd_cq_wait (see bench_nd.c). */
struct nd_result next_result(struct side *s, int use_wait, int64_t deadline);
/* One round of 1 MiB nd_ep_reads, depth (<= NSLOT) outstanding, each into
 * slot i % depth; GB/s. */
double read_round_nd_depth(struct side *s, const struct nd_mw_descriptor *d,
			   unsigned depth);

/* ---- 6, 7: the SPI benches (bench_nd_spi.c) ------------------------------ */

struct spp_cfg {
	int use_port;           /* notified through a completion port, else polled */
	int iters;
};

/* 6: the median of the rounds' WSPRdmaRead / nd_ep_read ratios. */
double bench_spi_read(void);
/* 7: rtt[] gets c->iters round trips (ns) after WARM unrecorded ones. */
void spi_pingpong(const struct spp_cfg *c, double *rtt);

#endif

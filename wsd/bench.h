/* SPDX-License-Identifier: MIT */
/*
 * wsd bench's parts: the orchestrator (bench.c), the outside yardsticks
 * (bench_ext.c), the many-connection section (bench_scale.c), the real
 * programs (bench_apps.c), and the workers it runs (bench_work.c,
 * bench_work_scale.c, bench_work_proxy.c).
 */
#ifndef WSD_BENCH_H
#define WSD_BENCH_H

#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <sys/types.h>

#define BENCH_MAXR 9            /* rounds at most */

/* --only's sections (all when none is named) */
enum {
	BENCH_TPUT = 1 << 0, BENCH_RTT = 1 << 1, BENCH_BUSY = 1 << 2, BENCH_CONN = 1 << 3,
	BENCH_EXT = 1 << 4, BENCH_SCALE = 1 << 5, BENCH_STREAM = 1 << 6,
	/* the apps section's rows: run only when named (slow, and outside programs) */
	BENCH_APPS_NGINX = 1 << 7, BENCH_APPS_PG = 1 << 8, BENCH_APPS_SPLICE = 1 << 9,
	BENCH_APPS = BENCH_APPS_NGINX | BENCH_APPS_PG | BENCH_APPS_SPLICE,
};

struct bench_opts {
	int rounds, warm_ms, run_ms, lat_count, conn_count;
	const char *transport, *peer, *svg;
	int ctl_port;
	bool quick;
	unsigned only;          /* BENCH_ bits */
};

/* ---- the orchestrator's helpers (bench.c) ---- */

/* A worker: its output lines, from a pipe or from the peer's --serve. */
struct bench_proc {
	pid_t pid;              /* 0 for a remote one */
	FILE *out;
};

extern int bench_failures;      /* measurements that did not run */

/* Start `wsd bench-worker ARGS...` here, plain or under `wsd run`. */
int bench_spawn(struct bench_proc *p, bool wsd, const char *transport, char *const args[]);
/* ...with env ("NAME=VALUE", or NULL) in its environment. */
int bench_spawn_env(struct bench_proc *p, bool wsd, const char *transport, const char *env,
		    char *const args[]);
/* The next line from a worker, without its newline; false at its end. */
bool bench_next_line(struct bench_proc *p, char *buf, size_t len);
/* ...before the deadline (bench_now's clock); its stream must be unbuffered. */
bool bench_line_by(struct bench_proc *p, char *buf, size_t len, double deadline);
/* SIGTERM, then SIGKILL if it has not gone by the deadline; reaped. */
void bench_end_worker(struct bench_proc *p, double deadline);
/*
 * One measurement: a server (here or on the peer), then the client here
 * with "PORT" in its arguments replaced.  The lines each printed last.
 */
bool bench_pair(const struct bench_opts *o, bool wsd, char *srv[], char *cli[], char *srv_out,
		char *cli_out);
/*
 * ...with each side plain or under wsd run on its own, and srv_env
 * ("NAME=VALUE", or NULL) in the server's environment; here only (no --peer).
 */
bool bench_pair_as(const struct bench_opts *o, bool srv_wsd, bool cli_wsd, const char *srv_env,
		   char *srv[], char *cli[], char *srv_out, char *cli_out);
/* A wsd run's client line ends in " path P": count it in *off_path unless P is shm or verbs. */
void bench_check_path(int *off_path, int wsd, const char *line);
/* The median of v[0..n) (sorts v). */
double bench_median(double *v, int n);
/* wsd / TCP, or 0 when either is missing. */
double bench_ratio(double wsd, double plain);
/*
 * "bench: NAME V (target CMP TARGET) MET|MISSED|NOT MEASURED": met when V
 * is on the target's side and also holds (the target's other condition).
 */
void bench_judge(const char *name, bool measured, bool also, double v, const char *cmp,
		 double target, const char *unit);
/* The same, measured when V > 0. */
void bench_verdict(const char *name, double v, const char *cmp, double target, const char *unit);

/* A port nobody listens on now on 127.0.0.1 (the kernel's choice), 0 if none. */
int bench_free_port(void);
/* prog is a command the shell finds. */
bool bench_have(const char *prog);

/* iperf3 -l 1M plain and under `wsd run` (self is the wsd program): Gbit/s each. */
void bench_iperf3(const char *self, int rounds, int secs, double out[2]);

/* ucx_perftest over shared memory: tag_bw at 1 MiB (MB/s), tag_lat at 64 B (us one way). */
void bench_ucx(int rounds, double *bw_mbs, double *lat_us);

/* ---- one 1 MiB stream, reused buffer and cold source (bench_stream.c) ---- */

struct bench_stream_res {
	double mbs[2][2];       /* [reused buffer, 256 MiB source][plain, wsd] MB/s */
	double memcpy[2];       /* one core's memcpy of the same: [hot, cold] MB/s */
	double threads[2];      /* two threads, CPU 1 to 0, cold source: [one copy, two] MB/s */
	double trip[2];         /* a cache line's round trip CPU 0-1, ns: [before, after] */
	int off_path;           /* wsd runs whose connection took another path */
};

/* Measure and print the section. */
void bench_stream(const struct bench_opts *o, const char *host, struct bench_stream_res *res);

/* ---- many connections (bench_scale.c) ---- */

struct bench_scale;
/* Measure and print the section; the results for bench_scale_verdicts (free them there). */
struct bench_scale *bench_scale(const struct bench_opts *o, const char *host);
void bench_scale_verdicts(struct bench_scale *s);

/* ---- real programs (bench_apps.c) ---- */

/* One row: plain and wsd in turns. */
struct bench_app_row {
	bool measured;          /* every round gave both figures */
	double v[2];            /* [plain, wsd] medians */
	int fast, all;          /* the wsd runs' server connections on shm or verbs, of all */
};

struct bench_apps_res {
	struct bench_app_row nginx, pgbench, splice;
};

/* Measure and print the rows named (BENCH_APPS_ bits); self is the wsd program. */
void bench_apps(const struct bench_opts *o, const char *self, unsigned rows,
		struct bench_apps_res *res);
void bench_apps_verdicts(const struct bench_apps_res *res, unsigned rows);

/* ---- the workers' helpers (bench_work.c) ---- */

double bench_now(void);                 /* CLOCK_MONOTONIC, seconds */
bool bench_pin(int cpu);                /* this thread on cpu alone (cpu < 0: as it is) */
void bench_fail(const char *what) __attribute__((noreturn));
/* The path the switch gives fd ("tcp", "shm", "verbs"), "none" without the switch. */
const char *bench_path_of(int fd);
bool bench_fast(const char *path);      /* shm or verbs */
/* Listen on host, any port, and print "port N". */
int bench_listen_on(const char *host, int backlog);
/* A connected TCP_NODELAY socket, or -1 (errno set). */
int bench_try_connect(const char *host, int port);
/* Send (out) or receive all of buf: 0, or -1 at an error or the end of the stream. */
int bench_full(int fd, void *buf, size_t len, bool out);

/* the many-connection workers (bench_work_scale.c) */
int bench_work_hold(bool server, char **a, int n);
int bench_work_msg(bool server, char **a, int n);
/* the apps section's splicing proxy (bench_work_proxy.c) */
int bench_work_proxy(bool server, char **a, int n);

#endif

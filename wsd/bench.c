/* SPDX-License-Identifier: MIT */
/*
 * wsd bench: the same workloads over kernel TCP and through wsd, pair by
 * pair (plain, wsd, plain, wsd ...), medians and ratios, an SVG chart.
 * The programs measured are wsd's bench workers (bench_work.c), run plain
 * or under `wsd run`; with --peer their servers run on another host, in
 * `wsd bench --serve` there.  wsd(1) documents the options and the output.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "wsd/bench.h"
#include "wsd/cmd.h"

#define CTL_PORT 47801
#define MAXR BENCH_MAXR

static char self[PATH_MAX];
int bench_failures;

int bench_spawn(struct bench_proc *p, bool wsd, const char *transport, char *const args[])
{
	return bench_spawn_env(p, wsd, transport, NULL, args);
}

int bench_spawn_env(struct bench_proc *p, bool wsd, const char *transport, const char *env,
		    char *const args[])
{
	char *argv[32];
	int fds[2], n = 0;

	if (pipe2(fds, O_CLOEXEC))
		return -1;
	argv[n++] = self;
	if (wsd) {
		argv[n++] = "run";
		argv[n++] = "--";
		argv[n++] = self;
	}
	argv[n++] = "bench-worker";
	for (int i = 0; args[i] && n < 31; i++)
		argv[n++] = args[i];
	argv[n] = NULL;
	p->pid = fork();
	if (p->pid < 0)
		return -1;
	if (p->pid == 0) {
		dup2(fds[1], 1);
		if (transport)
			setenv("WSD_TRANSPORT", transport, 1);
		if (!wsd)
			unsetenv("LD_PRELOAD");
		if (env)
			putenv((char *)env);
		execv(self, argv);
		_exit(127);
	}
	close(fds[1]);
	p->out = fdopen(fds[0], "r");
	return p->out ? 0 : -1;
}

/* A server on the peer: its --serve runs the worker and passes its lines on. */
static int remote(struct bench_proc *p, const struct bench_opts *o, bool wsd,
		  char *const args[])
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)o->ctl_port) };
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	char line[512];
	size_t len = 0;

	if (fd < 0 || inet_pton(AF_INET, o->peer, &a.sin_addr) != 1 ||
	    connect(fd, (struct sockaddr *)&a, sizeof(a))) {
		fprintf(stderr, "wsd bench: no wsd bench --serve at %s:%d: %s\n", o->peer,
			o->ctl_port, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	len = (size_t)snprintf(line, sizeof(line), "%s %s", wsd ? "wsd" : "plain",
			       o->transport ? o->transport : "-");
	for (int i = 0; args[i] && len < sizeof(line) - 64; i++)
		len += (size_t)snprintf(line + len, sizeof(line) - len, " %s", args[i]);
	len += (size_t)snprintf(line + len, sizeof(line) - len, "\n");
	if (write(fd, line, len) != (ssize_t)len) {
		close(fd);
		return -1;
	}
	p->pid = 0;
	p->out = fdopen(fd, "r");
	return p->out ? 0 : -1;
}

/* The next line from a worker, without its newline; false at its end. */
bool bench_next_line(struct bench_proc *p, char *buf, size_t len)
{
	if (!fgets(buf, (int)len, p->out))
		return false;
	buf[strcspn(buf, "\n")] = 0;
	return true;
}

static bool reap(struct bench_proc *p)
{
	int st = 0;

	fclose(p->out);
	if (!p->pid)
		return true;
	return waitpid(p->pid, &st, 0) == p->pid && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* The worker's next line before the deadline (its stream is unbuffered). */
bool bench_line_by(struct bench_proc *p, char *buf, size_t len, double deadline)
{
	struct pollfd pfd = { .fd = fileno(p->out), .events = POLLIN };
	double left = deadline - bench_now();

	return left > 0 && poll(&pfd, 1, (int)(left * 1000) + 1) > 0 &&
	       bench_next_line(p, buf, len);
}

/* SIGTERM, then SIGKILL if it has not gone by the deadline. */
void bench_end_worker(struct bench_proc *p, double deadline)
{
	if (p->pid <= 0)
		return;
	kill(p->pid, SIGTERM);
	while (waitpid(p->pid, NULL, WNOHANG) == 0) {
		if (bench_now() > deadline) {
			kill(p->pid, SIGKILL);
			waitpid(p->pid, NULL, 0);
			break;
		}
		usleep(10000);
	}
	fclose(p->out);
	p->pid = 0;
}

/*
 * One measurement: a server (here or on the peer), then the client here
 * with "PORT" in its arguments replaced.  The lines each printed last.
 */
bool bench_pair(const struct bench_opts *o, bool wsd, char *srv[], char *cli[], char *srv_out,
		char *cli_out)
{
	return bench_pair_as(o, wsd, wsd, NULL, srv, cli, srv_out, cli_out);
}

bool bench_pair_as(const struct bench_opts *o, bool srv_wsd, bool cli_wsd, const char *srv_env,
		   char *srv[], char *cli[], char *srv_out, char *cli_out)
{
	struct bench_proc s, c;
	char line[256], port[16] = "";
	char *args[16];
	bool wsd = cli_wsd, ok;

	line[0] = 0;
	ok = !(o->peer ? remote(&s, o, srv_wsd, srv) :
			 bench_spawn_env(&s, srv_wsd, o->transport, srv_env, srv));
	if (!ok || !bench_next_line(&s, line, sizeof(line)) ||
	    sscanf(line, "port %15s", port) != 1) {
		/* what it said instead of its port; a server on the peer said the rest there */
		fprintf(stderr, "wsd bench: the %s %s server did not start: %s%s\n",
			srv_wsd ? "wsd" : "plain", srv[0], line[0] ? "it said: " : "no line",
			line);
		if (ok && s.pid > 0)
			kill(s.pid, SIGKILL);   /* not left waiting for a client */
		if (ok)
			reap(&s);
		bench_failures++;
		return false;
	}
	for (int i = 0; (args[i] = cli[i]); i++)
		if (!strcmp(cli[i], "PORT"))
			args[i] = port;
	ok = !bench_spawn(&c, wsd, o->transport, args);
	cli_out[0] = srv_out[0] = 0;
	while (ok && bench_next_line(&c, line, 256))
		strcpy(cli_out, line);
	ok = reap(&c) && ok && cli_out[0];
	while (bench_next_line(&s, line, sizeof(line)))
		strcpy(srv_out, line);
	ok = reap(&s) && ok && srv_out[0];
	if (!ok) {
		fprintf(stderr, "wsd bench: %s (%s) failed\n", cli[0], wsd ? "wsd" : "plain");
		bench_failures++;
	}
	return ok;
}

static int cmp_double(const void *x, const void *y)
{
	double a = *(const double *)x, b = *(const double *)y;

	return a < b ? -1 : a > b;
}

double bench_median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n ? v[n / 2] : 0;
}

static const char *human(double bytes, char *buf, size_t len)
{
	if (bytes >= 1 << 20)
		snprintf(buf, len, "%g MiB", bytes / (1 << 20));
	else if (bytes >= 1024)
		snprintf(buf, len, "%g KiB", bytes / 1024);
	else
		snprintf(buf, len, "%g B", bytes);
	return buf;
}

/* ---- the workloads ------------------------------------------------------------------- */

static const long sizes[] = { 64, 1024, 16384, 65536, 262144, 1 << 20, 4 << 20 };
#define NSIZES (int)(sizeof(sizes) / sizeof(sizes[0]))

struct results {
	double tput[2][NSIZES][2];      /* [streams 1, 4][size][plain, wsd] MB/s */
	double cpu_gib[2];              /* ms of CPU per GiB, both ends, 1 MiB, 1 stream */
	double rtt[2][3][2][2];         /* [across, one core][64, 1K, 64K][plain, wsd][p50, p99] */
	bool rtt_done[2];
	double busy[2][3];              /* 64 B across cores, a busy loop on cpu 0:
					   [plain, wsd][p50, p99, mean] */
	bool busy_done;
	double conn[2];                 /* connections/s */
	double iperf3[2];               /* Gbit/s, -l 1M */
	double ucx_bw, ucx_lat;         /* ucx_perftest tag_bw 1 MiB MB/s, tag_lat 64 B us */
	struct bench_stream_res stream;  /* 1 MiB, pinned: reused buffer and cold source */
	struct bench_apps_res apps;     /* real programs */
	int off_path;                   /* wsd runs whose connection took another path */
};

/* A wsd run's client reports its connection's path: count the ones not accelerated. */
void bench_check_path(int *off_path, int wsd, const char *line)
{
	const char *p = strstr(line, " path ");

	if (wsd && (!p || !bench_fast(p + 6))) {
		(*off_path)++;
		fprintf(stderr, "wsd bench: a wsd run was not accelerated: %s\n", line);
	}
}

static void measure_tput(const struct bench_opts *o, const char *host, struct results *res)
{
	static const int streams[2] = { 1, 4 };
	char sz[24], st[8], warm[16], run[16], so[256], co[256];

	snprintf(warm, sizeof(warm), "%d", o->warm_ms);
	snprintf(run, sizeof(run), "%d", o->run_ms);
	for (int k = 0; k < 2; k++) {
		printf("\n== throughput, %d stream%s, MB/s (median of %d; plain and wsd in turns)\n",
		       streams[k], streams[k] > 1 ? "s" : "", o->rounds);
		printf("   %-9s %10s %10s %7s\n", "message", "plain", "wsd", "ratio");
		snprintf(st, sizeof(st), "%d", streams[k]);
		for (int i = 0; i < NSIZES; i++) {
			double v[2][MAXR], cpu[2][MAXR];
			char *srv[] = { "tput-srv", (char *)host, st, "-1", NULL };
			char *cli[] = { "tput-cli", (char *)host, "PORT", sz, st, warm, run, "-1",
					NULL };

			snprintf(sz, sizeof(sz), "%ld", sizes[i]);
			for (int r = 0; r < o->rounds; r++)
				for (int w = 0; w < 2; w++) {
					unsigned long long b = 0, sb = 0, cc = 0, sc = 0;
					double secs = 0;

					v[w][r] = cpu[w][r] = 0;
					if (!bench_pair(o, w, srv, cli, so, co) ||
					    sscanf(co, "bytes %llu secs %lf cpu_us %llu", &b, &secs,
						   &cc) != 3 ||
					    sscanf(so, "bytes %llu secs %*f cpu_us %llu", &sb, &sc) != 2)
						continue;
					bench_check_path(&res->off_path, w, co);
					v[w][r] = secs > 0 ? b / secs / 1e6 : 0;
					cpu[w][r] = sb ? (cc + sc) / 1e3 / (sb / 1073741824.0) : 0;
				}
			res->tput[k][i][0] = bench_median(v[0], o->rounds);
			res->tput[k][i][1] = bench_median(v[1], o->rounds);
			if (k == 0 && sizes[i] == 1 << 20) {
				res->cpu_gib[0] = bench_median(cpu[0], o->rounds);
				res->cpu_gib[1] = bench_median(cpu[1], o->rounds);
			}
			{
				char h[32];

				printf("   %-9s %10.0f %10.0f %7.2f\n",
				       human((double)sizes[i], h, sizeof(h)), res->tput[k][i][0],
				       res->tput[k][i][1],
				       res->tput[k][i][0] ? res->tput[k][i][1] / res->tput[k][i][0]
							  : 0);
			}
			fflush(stdout);
		}
	}
}

static void measure_rtt(const struct bench_opts *o, const char *host, struct results *res)
{
	static const char *const lsz[3] = { "64", "1024", "65536" };
	static const char *const cpus[2][2] = { { "0", "1" }, { "0", "0" } };
	char cnt[16], so[256], co[256];
	cpu_set_t set;
	int ncpu = sched_getaffinity(0, sizeof(set), &set) ? 1 : CPU_COUNT(&set);

	snprintf(cnt, sizeof(cnt), "%d", o->lat_count);
	for (int p = 0; p < 2; p++) {
		if (p == 0 && ncpu < 2)
			continue;        /* across cores needs two */
		res->rtt_done[p] = true;
		printf("\n== round trip, us (median of %d; %s)\n", o->rounds,
		       p ? "both ends on cpu 0" : "ends on cpu 0 and cpu 1");
		printf("   %-9s %10s %10s %10s %10s %7s\n", "message", "plain p50", "p99",
		       "wsd p50", "p99", "ratio");
		for (int i = 0; i < 3; i++) {
			double v[2][2][MAXR];
			char *srv[] = { "lat-srv", (char *)host, (char *)lsz[i], (char *)cpus[p][0],
					NULL };
			char *cli[] = { "lat-cli", (char *)host, "PORT", (char *)lsz[i], cnt,
					(char *)cpus[p][1], NULL };

			for (int r = 0; r < o->rounds; r++)
				for (int w = 0; w < 2; w++) {
					v[w][0][r] = v[w][1][r] = 0;
					if (bench_pair(o, w, srv, cli, so, co) &&
					    sscanf(co, "p50 %lf p99 %lf", &v[w][0][r], &v[w][1][r]) == 2)
						bench_check_path(&res->off_path, w, co);
				}
			for (int w = 0; w < 2; w++)
				for (int q = 0; q < 2; q++)
					res->rtt[p][i][w][q] = bench_median(v[w][q], o->rounds);
			{
				char h[32];
				double (*x)[2] = res->rtt[p][i];

				printf("   %-9s %10.2f %10.2f %10.2f %10.2f %7.2f\n",
				       human(atof(lsz[i]), h, sizeof(h)), x[0][0], x[0][1], x[1][0],
				       x[1][1], x[0][0] ? x[1][0] / x[0][0] : 0);
			}
			fflush(stdout);
		}
	}
}

/* A process that keeps cpu 0 busy until it is killed. */
static pid_t busy_loop(void)
{
	pid_t pid = fork();

	if (pid == 0) {
		/* never outlives the bench */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() == 1)
			_exit(0);
		bench_pin(0);
		for (;;)
			__asm__ volatile("" ::: "memory");
	}
	return pid;
}

/*
 * 64-byte round trips across cores while another program keeps cpu 0
 * busy, as on a loaded machine: a spinning end shares its CPU with it.
 * The mean shows what a lost time slice costs.
 */
static void measure_busy(const struct bench_opts *o, const char *host, struct results *res)
{
	char cnt[16], so[256], co[256];
	double v[2][3][MAXR];
	char *srv[] = { "lat-srv", (char *)host, "64", "0", NULL };
	char *cli[] = { "lat-cli", (char *)host, "PORT", "64", cnt, "1", NULL };
	cpu_set_t set;

	if (o->peer || sched_getaffinity(0, sizeof(set), &set) || CPU_COUNT(&set) < 2 ||
	    !CPU_ISSET(0, &set))
		return;
	snprintf(cnt, sizeof(cnt), "%d", o->lat_count);
	printf("\n== round trip, 64 B, ends on cpu 0 and cpu 1, a busy loop on cpu 0, us "
	       "(median of %d)\n", o->rounds);
	printf("   %-9s %10s %10s %10s %10s %10s %10s\n", "", "plain p50", "p99", "mean",
	       "wsd p50", "p99", "mean");
	for (int r = 0; r < o->rounds; r++)
		for (int w = 0; w < 2; w++) {
			pid_t hog = busy_loop();

			v[w][0][r] = v[w][1][r] = v[w][2][r] = 0;
			if (hog > 0 && bench_pair(o, w, srv, cli, so, co) &&
			    sscanf(co, "p50 %lf p99 %lf mean %lf", &v[w][0][r], &v[w][1][r],
				   &v[w][2][r]) == 3)
				bench_check_path(&res->off_path, w, co);
			if (hog > 0) {
				kill(hog, SIGKILL);
				waitpid(hog, NULL, 0);
			}
		}
	for (int w = 0; w < 2; w++)
		for (int q = 0; q < 3; q++)
			res->busy[w][q] = bench_median(v[w][q], o->rounds);
	res->busy_done = true;
	printf("   %-9s %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f\n", "64 B", res->busy[0][0],
	       res->busy[0][1], res->busy[0][2], res->busy[1][0], res->busy[1][1],
	       res->busy[1][2]);
	fflush(stdout);
}

static void measure_conn(const struct bench_opts *o, const char *host, struct results *res)
{
	char cnt[16], so[256], co[256];
	double v[2][MAXR];
	char *srv[] = { "conn-srv", (char *)host, cnt, NULL };
	char *cli[] = { "conn-cli", (char *)host, "PORT", cnt, NULL };

	snprintf(cnt, sizeof(cnt), "%d", o->conn_count);
	for (int r = 0; r < o->rounds; r++)
		for (int w = 0; w < 2; w++) {
			v[w][r] = 0;
			if (bench_pair(o, w, srv, cli, so, co))
				sscanf(co, "rate %lf", &v[w][r]);
		}
	res->conn[0] = bench_median(v[0], o->rounds);
	res->conn[1] = bench_median(v[1], o->rounds);
	printf("\n== short-lived connections (connect, 64 B each way, close), per second\n");
	printf("   %10s %10s %7s\n   %10.0f %10.0f %7.2f\n", "plain", "wsd", "ratio", res->conn[0],
	       res->conn[1], res->conn[0] ? res->conn[1] / res->conn[0] : 0);
}

/* ---- verdicts and the chart ------------------------------------------------------------- */

/* wsd / TCP, or 0 when either is missing. */
double bench_ratio(double wsd, double plain)
{
	return plain > 0 && wsd > 0 ? wsd / plain : 0;
}

void bench_judge(const char *name, bool measured, bool also, double v, const char *cmp,
		 double target, const char *unit)
{
	bool met = also && (!strcmp(cmp, ">=") ? v >= target : v <= target);

	printf("bench: %s %.2f%s (target %s %.2f%s) %s\n", name, v, unit, cmp, target, unit,
	       measured ? (met ? "MET" : "MISSED") : "NOT MEASURED");
}

void bench_verdict(const char *name, double v, const char *cmp, double target, const char *unit)
{
	bench_judge(name, v > 0, true, v, cmp, target, unit);
}

/* The verdicts of the sections that ran (BENCH_ bits). */
static void verdicts(const struct results *res, unsigned ran)
{
	int mib = 5;     /* sizes[5] is 1 MiB */

	printf("\n");
	if (ran & BENCH_TPUT)
		bench_verdict("tput_1MiB_1stream_ratio",
			res->tput[0][mib][0] ? res->tput[0][mib][1] / res->tput[0][mib][0] : 0, ">=",
			3, "");
	if (res->rtt_done[0])
		bench_verdict("rtt_64B_across_cores_p50_one_way_us", res->rtt[0][0][1][0] / 2,
			"<=", 2, " us");
	if (ran & BENCH_RTT)
		bench_verdict("rtt_64B_one_core_p50_ratio",
			res->rtt[1][0][0][0] ? res->rtt[1][0][1][0] / res->rtt[1][0][0][0] : 0, "<=",
			1, "");
	if (ran & BENCH_CONN)
		bench_verdict("short_lived_connections_ratio",
			res->conn[0] ? res->conn[1] / res->conn[0] : 0, ">=", 0.8, "");
	if (ran & BENCH_TPUT)
		printf("bench: cpu_ms_per_GiB plain %.1f wsd %.1f\n", res->cpu_gib[0],
		       res->cpu_gib[1]);
	/* a wsd figure means something only if its connection was accelerated */
	if (ran & (BENCH_TPUT | BENCH_RTT | BENCH_BUSY | BENCH_STREAM))
		printf("bench: wsd_runs_not_accelerated %d\n", res->off_path + res->stream.off_path);
	if (ran & BENCH_TPUT)
		bench_verdict("cpu_per_GiB_ratio",
			res->cpu_gib[0] ? res->cpu_gib[1] / res->cpu_gib[0] : 0, "<=", 0.5, "");
	if (ran & BENCH_STREAM) {
		printf("bench: memcpy_1MiB_one_core_MBps hot %.0f cold %.0f\n", res->stream.memcpy[0],
		       res->stream.memcpy[1]);
		printf("bench: two_threads_cold_MBps one_copy %.0f two_copies %.0f\n",
		       res->stream.threads[0], res->stream.threads[1]);
		printf("bench: cpu0_cpu1_round_trip_ns before %.0f after %.0f\n", res->stream.trip[0],
		       res->stream.trip[1]);
		bench_verdict("stream_1MiB_reused_ratio",
			      bench_ratio(res->stream.mbs[0][1], res->stream.mbs[0][0]), ">=", 3, "");
		bench_verdict("stream_1MiB_cold_vs_memcpy_cold",
			      bench_ratio(res->stream.mbs[1][1], res->stream.memcpy[1]), ">=", 0.9,
			      "");
	}
	if (ran & BENCH_EXT)
		bench_verdict("iperf3_1M_ratio", bench_ratio(res->iperf3[1], res->iperf3[0]), ">=",
			      3, "");
	if ((ran & BENCH_EXT) && (ran & BENCH_STREAM))
		bench_verdict("stream_1MiB_reused_vs_ucx_tag_bw",
			      bench_ratio(res->stream.mbs[0][1], res->ucx_bw), ">=", 1, "");
	if (res->ucx_lat > 0)
		printf("bench: rtt_64B_across_cores_p50_one_way_us wsd %.3f ucx_tag_lat %.3f\n",
		       res->rtt[0][0][1][0] / 2, res->ucx_lat);
	if (res->busy_done)
		printf("bench: rtt_64B_busy_cpu_mean_us plain %.2f wsd %.2f ratio %.2f\n",
		       res->busy[0][2], res->busy[1][2],
		       bench_ratio(res->busy[1][2], res->busy[0][2]));
}


/* The second panel: round trips (p50), connections, CPU per GiB. */
static void svg_latency(FILE *f, const struct results *res, int w, int left, int top)
{
	static const char *const names[] = { "64 B", "1 KiB", "64 KiB", "connections", "CPU/GiB" };
	const int ph = 200, gw = (w - left - 20) / 5;
	double v[5][2], max = 2.5;

	for (int i = 0; i < 3; i++)
		for (int p = 0; p < 2; p++)
			v[i][p] = bench_ratio(res->rtt[p][i][1][0], res->rtt[p][i][0][0]);
	v[3][0] = bench_ratio(res->conn[1], res->conn[0]);
	v[4][0] = bench_ratio(res->cpu_gib[1], res->cpu_gib[0]);
	v[3][1] = v[4][1] = -1;
	for (int i = 0; i < 5; i++)
		for (int p = 0; p < 2; p++)
			if (v[i][p] > max)
				max = v[i][p];
	fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"15\">wsd / kernel TCP: round trip p50 "
		   "(blue: across CPUs, orange: one CPU), others</text>\n",
		left, top - 14);
	for (double y = 0; y <= max; y += 0.5) {
		int py = top + ph - (int)(y / max * ph);

		fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\"/>\n", left, py,
			w - 20, py, y == 1 ? "#555" : "#ddd");
		fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%.1f</text>\n", left - 6,
			py + 4, y);
	}
	for (int i = 0; i < 5; i++) {
		for (int p = 0; p < 2; p++) {
			int bh;

			if (v[i][p] < 0)
				continue;
			bh = (int)(v[i][p] / max * ph);
			fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\">"
				   "<title>%.2f</title></rect>\n",
				left + i * gw + 8 + p * (gw - 16) / 2, top + ph - bh, (gw - 16) / 2 - 2, bh,
				i > 2 ? "#999" : p ? "#f28e2b" : "#4e79a7", v[i][p]);
		}
		fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%s</text>\n",
			left + i * gw + gw / 2, top + ph + 18, names[i]);
	}
}

/* Bars of wsd's throughput ratio by message size, one and four streams; then svg_latency. */
static int write_svg(const char *path, const struct results *res)
{
	const int w = 760, h = 680, left = 60, top = 40, ph = 260, gw = (w - left - 20) / NSIZES;
	double max = 3.5;
	FILE *f = fopen(path, "w");

	if (!f)
		return -1;
	for (int k = 0; k < 2; k++)
		for (int i = 0; i < NSIZES; i++)
			if (res->tput[k][i][0] && res->tput[k][i][1] / res->tput[k][i][0] > max)
				max = res->tput[k][i][1] / res->tput[k][i][0];
	fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
		   "font-family=\"sans-serif\" font-size=\"12\">\n", w, h);
	fprintf(f, "<text x=\"%d\" y=\"20\" font-size=\"15\">wsd throughput / kernel TCP, by "
		   "message size (blue: 1 stream, orange: 4 streams)</text>\n", left);
	for (double y = 0; y <= max; y += 0.5) {
		int py = top + ph - (int)(y / max * ph);

		fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\"%s/>\n", left,
			py, w - 20, py, y == 1 || y == 3 ? "#555" : "#ddd",
			y == 3 ? " stroke-dasharray=\"6,3\"" : "");
		fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%.1f</text>\n", left - 6,
			py + 4, y);
	}
	for (int i = 0; i < NSIZES; i++) {
		char lbl[32];

		for (int k = 0; k < 2; k++) {
			double r = res->tput[k][i][0] ? res->tput[k][i][1] / res->tput[k][i][0] : 0;
			int bh = (int)(r / max * ph);

			fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\">"
				   "<title>%.2f</title></rect>\n",
				left + i * gw + 8 + k * (gw - 16) / 2, top + ph - bh, (gw - 16) / 2 - 2,
				bh, k ? "#f28e2b" : "#4e79a7", r);
		}
		fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%s</text>\n",
			left + i * gw + gw / 2, top + ph + 18, human((double)sizes[i], lbl,
								      sizeof(lbl)));
	}
	fprintf(f, "<text x=\"%d\" y=\"%d\">dashed: the 3x target; solid: kernel TCP</text>\n",
		left, top + ph + 40);
	svg_latency(f, res, w, left, top + ph + 90);
	fprintf(f, "</svg>\n");
	return fclose(f);
}

/* ---- --serve: the peer's half ------------------------------------------------------------ */

/* Only the servers run on request: --serve starts nothing else. */
static bool is_server(const char *role)
{
	return !strcmp(role, "tput-srv") || !strcmp(role, "lat-srv") || !strcmp(role, "conn-srv") ||
	       !strcmp(role, "msg-srv");
}

static int serve(const struct bench_opts *o)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)o->ctl_port) };
	int one = 1, lfd = socket(AF_INET, SOCK_STREAM, 0);

	signal(SIGPIPE, SIG_IGN);
	setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof(a)) || listen(lfd, 8)) {
		fprintf(stderr, "wsd bench --serve: port %d: %s\n", o->ctl_port, strerror(errno));
		return 1;
	}
	printf("wsd bench: serving on port %d\n", o->ctl_port);
	fflush(stdout);
	for (;;) {
		char line[512], out[256], *args[24], *save = NULL, *tok, *variant, *tp;
		int fd = accept(lfd, NULL, NULL), n = 0;
		FILE *in;
		struct bench_proc p;

		if (fd < 0 || !(in = fdopen(dup(fd), "r")))
			continue;
		if (!fgets(line, sizeof(line), in)) {
			fclose(in);
			close(fd);
			continue;
		}
		fclose(in);
		variant = strtok_r(line, " \n", &save);
		tp = strtok_r(NULL, " \n", &save);
		while (n < 23 && (tok = strtok_r(NULL, " \n", &save)))
			args[n++] = tok;
		args[n] = NULL;
		/* our half listens on every address: the peer connects from afar */
		if (n > 1)
			args[1] = "0.0.0.0";
		if (variant && tp && n && is_server(args[0]) &&
		    !bench_spawn(&p, !strcmp(variant, "wsd"), strcmp(tp, "-") ? tp : NULL, args)) {
			while (bench_next_line(&p, out, sizeof(out)))
				if (dprintf(fd, "%s\n", out) < 0)
					break;
			reap(&p);
		}
		close(fd);
	}
}

/* ---- the command ------------------------------------------------------------------------- */

/* --only's comma-separated section names as BENCH_ bits; 0 for a name not known. */
static unsigned sections(const char *list)
{
	/* apps:ROW runs one of the apps section's rows (a quick check needs one alone) */
	static const struct {
		const char *name;
		unsigned bits;
	} names[] = {
		{ "tput", BENCH_TPUT },   { "rtt", BENCH_RTT },       { "busy", BENCH_BUSY },
		{ "conn", BENCH_CONN },   { "ext", BENCH_EXT },       { "scale", BENCH_SCALE },
		{ "stream", BENCH_STREAM }, { "apps", BENCH_APPS },
		{ "apps:nginx", BENCH_APPS_NGINX }, { "apps:pgbench", BENCH_APPS_PG },
		{ "apps:splice", BENCH_APPS_SPLICE },
	};
	unsigned bits = 0;
	char buf[128], *save = NULL;

	snprintf(buf, sizeof(buf), "%s", list);
	for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		unsigned b = 0;

		for (unsigned i = 0; i < sizeof(names) / sizeof(names[0]); i++)
			if (!strcmp(t, names[i].name))
				b = names[i].bits;
		if (!b)
			return 0;
		bits |= b;
	}
	return bits;
}

static int usage(void)
{
	fprintf(stderr, "usage: wsd bench [--quick] [--rounds N] [--transport shm|verbs|auto]\n"
			"                 [--peer ADDRESS] [--port N] [--svg FILE]\n"
			"                 [--only tput,stream,rtt,busy,conn,ext,scale,apps]\n"
			"       wsd bench --serve [--port N]\n");
	return 2;
}

int cmd_bench(int argc, char **argv)
{
	struct bench_opts o = { .rounds = 3, .warm_ms = 150, .run_ms = 400, .lat_count = 5000,
				.conn_count = 2000, .svg = "wsd-bench.svg", .ctl_port = CTL_PORT };
	bool serving = false;
	struct results res = { 0 };
	struct bench_scale *scale = NULL;
	const char *host;
	unsigned ran;
	ssize_t n;

	for (int i = 1; i < argc; i++) {
		bool more = i + 1 < argc;

		if (!strcmp(argv[i], "--quick")) {
			o.rounds = 1;
			o.warm_ms = 100;
			o.run_ms = 150;
			o.lat_count = 1000;
			o.conn_count = 300;
			o.quick = true;
		} else if (!strcmp(argv[i], "--only") && more) {
			if (!(o.only = sections(argv[++i])))
				return usage();
		} else if (!strcmp(argv[i], "--rounds") && more) {
			o.rounds = atoi(argv[++i]);
		} else if (!strcmp(argv[i], "--transport") && more) {
			o.transport = argv[++i];
		} else if (!strcmp(argv[i], "--peer") && more) {
			o.peer = argv[++i];
		} else if (!strcmp(argv[i], "--port") && more) {
			o.ctl_port = atoi(argv[++i]);
		} else if (!strcmp(argv[i], "--svg") && more) {
			o.svg = argv[++i];
		} else if (!strcmp(argv[i], "--serve")) {
			serving = true;
		} else {
			return usage();
		}
	}
	if (o.rounds < 1 || o.rounds > MAXR || o.ctl_port <= 0 || o.ctl_port > 65535)
		return usage();
	if (o.transport && strcmp(o.transport, "shm") && strcmp(o.transport, "verbs") &&
	    strcmp(o.transport, "auto"))
		return usage();
	n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n <= 0)
		return 1;
	self[n] = 0;
	if (serving)
		return serve(&o);
	host = o.peer ? o.peer : "127.0.0.1";
	printf("wsd bench: kernel TCP and wsd (%s), %s, pair by pair\n",
	       o.transport ? o.transport : "the provider's choice",
	       o.peer ? o.peer : "on this host");
	/* apps only when named: it is slow and runs outside programs */
	ran = o.only ? o.only : ~(unsigned)BENCH_APPS;
	if (ran & BENCH_TPUT)
		measure_tput(&o, host, &res);
	if (ran & BENCH_STREAM)
		bench_stream(&o, host, &res.stream);
	if (ran & BENCH_RTT)
		measure_rtt(&o, host, &res);
	if (ran & BENCH_BUSY)
		measure_busy(&o, host, &res);
	if (ran & BENCH_CONN)
		measure_conn(&o, host, &res);
	if ((ran & BENCH_EXT) && !o.peer) {     /* on this host only */
		bench_iperf3(self, o.rounds, o.run_ms >= 400 ? 2 : 1, res.iperf3);
		bench_ucx(o.rounds, &res.ucx_bw, &res.ucx_lat);
	}
	if (ran & BENCH_SCALE)
		scale = bench_scale(&o, host);
	if (ran & BENCH_APPS)
		bench_apps(&o, self, ran & BENCH_APPS, &res.apps);
	verdicts(&res, ran);
	bench_scale_verdicts(scale);
	bench_apps_verdicts(&res.apps, ran & BENCH_APPS);
	/* the chart needs every section but the scale one: not with --only */
	if (!o.only) {
		if (write_svg(o.svg, &res))
			fprintf(stderr, "wsd bench: cannot write %s\n", o.svg);
		else
			printf("bench: chart written to %s\n", o.svg);
	}
	if (bench_failures)
		fprintf(stderr, "wsd bench: %d measurements did not run\n", bench_failures);
	return bench_failures ? 1 : 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * wsd bench's many-connection section: what N connections between one
 * client process and one server process cost in descriptors and memory,
 * connections made one after another per second, and requests per second
 * over 1 to 64 connections at once; each plain and under `wsd run` in the
 * same run, with the ratios and verdicts.  The workers are
 * bench_work_scale.c's (and conn-* of bench_work.c); wsd(1) documents the
 * output.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wsd/bench.h"

#define HOLD_BUDGET 60          /* seconds for all the descriptor and memory runs */

static const int hold_n[2] = { 1000, 10000 };
static const int hold_cap[2] = { 12, 30 };      /* seconds a run may take */
static const long msg_size[2] = { 64, 16384 };
static const int msg_conns[4] = { 1, 4, 16, 64 };

/* Connections one after another: per second, plain and wsd; wsd's share on shm or verbs. */
struct conn_rate {
	double rate[2];
	int fast, all;                          /* on shm or verbs at the close, of all */
	unsigned long long bytes_fast, bytes_all;
};

/* One descriptor-and-memory run: [0] the client, [1] the server. */
struct hold {
	bool done;
	int conns, want, err;
	int accel[2];           /* on shm or verbs; -1: not known */
	long fds[2], pss_kb[2];
	char why[96];           /* when not done */
};

struct bench_scale {
	struct hold hold[2][2];                 /* [N][plain, wsd] */
	bool hold_tried[2];
	struct conn_rate conn, conn_keep;       /* alone, and beside a held connection */
	/* kept on TCP: to a plain server, and to one whose policy says tcp */
	struct conn_rate conn_plain, conn_policy;
	bool conn_tried, kept_tried;
	double msg[2][4][2];                    /* [size][conns][plain, wsd] requests/s */
	bool msg_tried;
	int off_path;                           /* wsd message runs not all on shm or verbs */
};

/* ---- descriptors and memory ---------------------------------------------------------- */

static long count_fds(int pid)
{
	char name[64];
	struct dirent *e;
	long n = 0;
	DIR *d;

	snprintf(name, sizeof(name), "/proc/%d/fd", pid);
	if (!(d = opendir(name)))
		return -1;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

/* Proportional set size in kB: smaps_rollup's Pss line, or smaps' summed. */
static long pss_kb(int pid)
{
	static const char *const files[2] = { "smaps_rollup", "smaps" };
	char name[64], line[256];
	long sum = -1, kb;

	for (int i = 0; i < 2 && sum < 0; i++) {
		FILE *f;

		snprintf(name, sizeof(name), "/proc/%d/%s", pid, files[i]);
		if (!(f = fopen(name, "r")))
			continue;
		while (fgets(line, sizeof(line), f))
			if (sscanf(line, "Pss: %ld kB", &kb) == 1)
				sum = (sum < 0 ? 0 : sum) + kb;
		fclose(f);
	}
	return sum;
}

/*
 * N connections held between a hold-srv and a hold-cli here, plain or under
 * `wsd run`, given secs: their descriptors and memory once both wait.
 */
static void hold_once(const struct bench_opts *o, bool wsd, int n, int secs, struct hold *h)
{
	char nb[16], sb[16], port[16], line[256];
	char *srv[] = { "hold-srv", "127.0.0.1", nb, sb, NULL };
	char *cli[] = { "hold-cli", "127.0.0.1", port, nb, sb, NULL };
	struct bench_proc s = { 0 }, c = { 0 };
	double deadline = bench_now() + secs;
	int pid[2];

	memset(h, 0, sizeof(*h));
	h->accel[0] = h->accel[1] = -1;
	snprintf(nb, sizeof(nb), "%d", n);
	snprintf(sb, sizeof(sb), "%d", secs);
	if (bench_spawn(&s, wsd, o->transport, srv) || setvbuf(s.out, NULL, _IONBF, 0) ||
	    !bench_line_by(&s, line, sizeof(line), deadline) || sscanf(line, "port %15s", port) != 1) {
		snprintf(h->why, sizeof(h->why), "the server did not start");
		bench_failures++;
		goto out;
	}
	if (bench_spawn(&c, wsd, o->transport, cli) || setvbuf(c.out, NULL, _IONBF, 0)) {
		snprintf(h->why, sizeof(h->why), "the client did not start");
		bench_failures++;
		goto out;
	}
	if (!bench_line_by(&c, line, sizeof(line), deadline) ||
	    sscanf(line, "ready conns %d of %d accel %d pid %d err %d", &h->conns, &h->want,
		   &h->accel[0], &pid[0], &h->err) != 5) {
		snprintf(h->why, sizeof(h->why), "no answer in %d s", secs);
		goto out;
	}
	/* the server counts its own when the client asks, before the client's line */
	if (!h->conns || !bench_line_by(&s, line, sizeof(line), bench_now() + 2) ||
	    sscanf(line, "ready conns %*d accel %d pid %d", &h->accel[1], &pid[1]) != 2) {
		snprintf(h->why, sizeof(h->why), "the server did not answer");
		goto out;
	}
	for (int p = 0; p < 2; p++) {
		h->fds[p] = count_fds(pid[p]);
		h->pss_kb[p] = pss_kb(pid[p]);
	}
	/* a connection left on TCP: its row of wsd stat says why (its reason) */
	if (wsd && (h->accel[0] < h->conns || h->accel[1] < h->conns)) {
		char cmd[192];

		snprintf(cmd, sizeof(cmd), "/proc/%d/exe stat | awk 'NR == 1 || ($6 != \"shm\" && "
			 "$6 != \"verbs\" && $7 != \"listener\")' >&2", (int)getpid());
		fprintf(stderr, "wsd bench: %d connections, not all on shm or verbs:\n", h->conns);
		if (system(cmd) != 0)
			fprintf(stderr, "wsd bench: wsd stat failed\n");
	}
	h->done = h->fds[0] > 0 && h->fds[1] > 0 && h->pss_kb[0] >= 0 && h->pss_kb[1] >= 0;
	if (!h->done)
		snprintf(h->why, sizeof(h->why), "/proc could not be read");
out:
	bench_end_worker(&c, bench_now() + 5);
	bench_end_worker(&s, bench_now() + 5);
}

static void print_hold(const struct hold *h, int n)
{
	static const char *const who[2] = { "client", "server" };

	for (int w = 0; w < 2; w++)
		if (!h[w].done)
			printf("   %6d   %s: not measured (%s)\n", n, w ? "wsd" : "plain", h[w].why);
	if (!h[0].done || !h[1].done)
		return;
	for (int p = 0; p < 2; p++) {
		char acc[32] = "-";

		if (h[1].accel[p] >= 0)
			snprintf(acc, sizeof(acc), "%d of %d", h[1].accel[p], h[1].conns);
		printf("   %6d   %-7s %9ld %9ld %9ld %10.1f %10.1f %10.1f   %s\n", n, who[p],
		       h[0].fds[p], h[1].fds[p], h[1].fds[p] - h[0].fds[p], h[0].pss_kb[p] / 1024.0,
		       h[1].pss_kb[p] / 1024.0, (h[1].pss_kb[p] - h[0].pss_kb[p]) / 1024.0, acc);
	}
	if (h[1].accel[0] > 0 && h[1].accel[1] > 0)
		printf("   %6d   more per connection on shm/verbs: client %.1f fds %.0f KiB, "
		       "server %.1f fds %.0f KiB\n", n,
		       (double)(h[1].fds[0] - h[0].fds[0]) / h[1].accel[0],
		       (double)(h[1].pss_kb[0] - h[0].pss_kb[0]) / h[1].accel[0],
		       (double)(h[1].fds[1] - h[0].fds[1]) / h[1].accel[1],
		       (double)(h[1].pss_kb[1] - h[0].pss_kb[1]) / h[1].accel[1]);
	for (int w = 0; w < 2; w++)
		if (h[w].conns < n)
			printf("   (the %s client opened %d of %d connections: %s)\n",
			       w ? "wsd" : "plain", h[w].conns, n,
			       h[w].err ? strerror(h[w].err) : "out of time");
}

static void measure_hold(const struct bench_opts *o, struct bench_scale *sc)
{
	double end = bench_now() + HOLD_BUDGET;

	printf("\n== %d and %d connections between one client and one server process: "
	       "descriptors and PSS (one run each, on this host)\n", hold_n[0], hold_n[1]);
	printf("   (64 B each way on each connection, and once all are open again every 0.2 s "
	       "on those not yet moved;\n   then both processes wait and /proc is read)\n");
	if (o->peer) {
		printf("   not measured: both processes must be on this host (not with --peer)\n");
		return;
	}
	printf("   %6s   %-7s %9s %9s %9s %10s %10s %10s   %s\n", "conns", "process", "fds plain",
	       "wsd", "more", "MiB plain", "wsd", "more", "wsd on shm/verbs");
	for (int i = 0; i < 2; i++) {
		if (o->quick && i) {
			printf("   %6d   not measured (--quick)\n", hold_n[i]);
			continue;
		}
		sc->hold_tried[i] = true;
		for (int w = 0; w < 2; w++) {
			int secs = (int)(end - bench_now());

			secs = secs < hold_cap[i] ? secs : hold_cap[i];
			if (secs < 3) {
				memset(&sc->hold[i][w], 0, sizeof(sc->hold[i][w]));
				snprintf(sc->hold[i][w].why, sizeof(sc->hold[i][w].why),
					 "out of time: %d s for these runs", HOLD_BUDGET);
				continue;
			}
			hold_once(o, w, hold_n[i], secs, &sc->hold[i][w]);
		}
		print_hold(sc->hold[i], hold_n[i]);
		fflush(stdout);
	}
}

/* ---- connections one after another ---------------------------------------------------- */

/*
 * One row: plain and wsd in turns; keep: beside a connection held (a
 * channel exists).  kept: the connections stay on TCP, and the wsd turn
 * runs the client under wsd against a plain server (KEPT_PLAIN) or both
 * under wsd with the server's policy file saying "default tcp"
 * (KEPT_POLICY, conf its path).
 */
enum { KEPT_NONE, KEPT_PLAIN, KEPT_POLICY };

static void conn_row(const struct bench_opts *o, const char *host, const char *ms, bool keep,
		     int kept, const char *conf, struct conn_rate *cr)
{
	static const char *const label[] = { "alone", "to a plain one", "policy: tcp" };
	char so[256], co[256];
	char *srv[] = { "conn-srv", (char *)host, "0", NULL };
	char *cli[] = { "conn-cli", (char *)host, "PORT", "0", (char *)ms,
			keep ? "keep" : NULL, NULL };
	double v[2][BENCH_MAXR];

	for (int r = 0; r < o->rounds; r++)
		for (int w = 0; w < 2; w++) {
			unsigned long long bf = 0, ba = 0;
			int f = 0, all = 0;

			v[w][r] = 0;
			if (!bench_pair_as(o, w && kept != KEPT_PLAIN, w, w && kept == KEPT_POLICY ?
					   conf : NULL, srv, cli, so, co) ||
			    sscanf(co, "rate %lf accel %d of %d bytes %llu of %llu", &v[w][r], &f,
				   &all, &bf, &ba) != 5 || !w)
				continue;
			cr->fast += f;
			cr->all += all;
			cr->bytes_fast += bf;
			cr->bytes_all += ba;
		}
	cr->rate[0] = bench_median(v[0], o->rounds);
	cr->rate[1] = bench_median(v[1], o->rounds);
	{
		char acc[32], bytes[48] = "not known (no statistics file)";

		snprintf(acc, sizeof(acc), "%d of %d", cr->fast, cr->all);
		if (cr->bytes_all)
			snprintf(bytes, sizeof(bytes), "%llu of %llu (%.0f%%)", cr->bytes_fast,
				 cr->bytes_all, 100.0 * cr->bytes_fast / cr->bytes_all);
		printf("   %-15s %10.0f %10.0f %7.2f   %-22s %s\n", keep ? "beside one held" :
		       label[kept], cr->rate[0], cr->rate[1], bench_ratio(cr->rate[1], cr->rate[0]),
		       acc, bytes);
	}
	fflush(stdout);
}

static void measure_conn_rate(const struct bench_opts *o, const char *host, struct bench_scale *sc)
{
	char ms[16];

	snprintf(ms, sizeof(ms), "%d", o->quick ? 300 : 1000);
	sc->conn_tried = true;
	printf("\n== connections one after another for %s ms (connect, 64 B each way, close), "
	       "per second (median of %d);\n   alone, and beside one connection the client "
	       "holds to the same server (a channel\n   between the two processes exists, "
	       "so a connection's first bytes may go by it)\n", ms, o->rounds);
	printf("   %-15s %10s %10s %7s   %-22s %s\n", "", "plain", "wsd", "ratio",
	       "wsd: fast at close", "wsd: bytes by shm/verbs");
	conn_row(o, host, ms, false, KEPT_NONE, NULL, &sc->conn);
	conn_row(o, host, ms, true, KEPT_NONE, NULL, &sc->conn_keep);
	if (o->peer)
		return;
	/* kept on TCP: what wsd costs a connection it cannot move (a policy file of our own) */
	{
		char path[] = "/tmp/wsd-bench-conf.XXXXXX", env[64];
		int fd = mkstemp(path);

		printf("   connections kept on TCP: the wsd turn runs the client under wsd against "
		       "a plain\n   server, then both under wsd with the server's policy "
		       "\"default tcp\"\n");
		if (fd < 0 || write(fd, "default tcp\n", 12) != 12) {
			printf("   (no policy file: %s)\n", strerror(errno));
			if (fd >= 0)
				close(fd);
			unlink(path);
			return;
		}
		close(fd);
		snprintf(env, sizeof(env), "WSD_CONF=%s", path);
		sc->kept_tried = true;
		conn_row(o, host, ms, false, KEPT_PLAIN, NULL, &sc->conn_plain);
		conn_row(o, host, ms, false, KEPT_POLICY, env, &sc->conn_policy);
		unlink(path);
	}
}

/* ---- requests over many connections at once --------------------------------------------- */

static void measure_msgs(const struct bench_opts *o, const char *host, struct bench_scale *sc)
{
	char sz[16], cs[16], warm[16], run[16], so[256], co[256];
	char *srv[] = { "msg-srv", (char *)host, cs, sz, NULL };
	char *cli[] = { "msg-cli", (char *)host, "PORT", cs, sz, warm, run, NULL };

	snprintf(warm, sizeof(warm), "%d", o->warm_ms);
	snprintf(run, sizeof(run), "%d", o->run_ms);
	sc->msg_tried = true;
	printf("\n== requests over C connections at once, all answered per second (median of "
	       "%d)\n   (request and answer of the same size, one outstanding per connection; "
	       "one thread on epoll\n   in each process; the answers of %s ms after the warm-up)\n",
	       o->rounds, run);
	printf("   %-9s %5s %12s %12s %7s\n", "message", "C", "plain", "wsd", "ratio");
	for (int i = 0; i < 2; i++)
		for (int k = 0; k < 4; k++) {
			double v[2][BENCH_MAXR];

			snprintf(sz, sizeof(sz), "%ld", msg_size[i]);
			snprintf(cs, sizeof(cs), "%d", msg_conns[k]);
			for (int r = 0; r < o->rounds; r++)
				for (int w = 0; w < 2; w++) {
					unsigned long long msgs = 0;
					double secs = 0;

					v[w][r] = 0;
					if (!bench_pair(o, w, srv, cli, so, co) ||
					    sscanf(co, "msgs %llu secs %lf", &msgs, &secs) != 2)
						continue;
					bench_check_path(&sc->off_path, w, co);
					v[w][r] = secs > 0 ? msgs / secs : 0;
				}
			sc->msg[i][k][0] = bench_median(v[0], o->rounds);
			sc->msg[i][k][1] = bench_median(v[1], o->rounds);
			printf("   %-9s %5d %12.0f %12.0f %7.2f\n", i ? "16 KiB" : "64 B",
			       msg_conns[k], sc->msg[i][k][0], sc->msg[i][k][1],
			       bench_ratio(sc->msg[i][k][1], sc->msg[i][k][0]));
			fflush(stdout);
		}
}

struct bench_scale *bench_scale(const struct bench_opts *o, const char *host)
{
	struct bench_scale *sc = calloc(1, sizeof(*sc));

	if (!sc)
		return NULL;
	measure_hold(o, sc);
	measure_conn_rate(o, host, sc);
	measure_msgs(o, host, sc);
	return sc;
}

/* ---- verdicts ----------------------------------------------------------------------------- */

void bench_scale_verdicts(struct bench_scale *sc)
{
	const struct hold *h = sc ? sc->hold[1] : NULL;
	bool held = h && h[0].done && h[1].done;
	int n = hold_n[1], fast = 0;
	double fds = 0, mib = 0, low = 0;

	if (!sc)
		return;
	if (held) {
		fast = h[1].accel[0] < h[1].accel[1] ? h[1].accel[0] : h[1].accel[1];
		for (int p = 0; p < 2; p++) {
			double f = (double)(h[1].fds[p] - h[0].fds[p]);
			double m = (h[1].pss_kb[p] - h[0].pss_kb[p]) / 1024.0;

			fds = p && fds > f ? fds : f;
			mib = p && mib > m ? mib : m;
		}
		printf("bench: scale_10k_on_fast_path client %d server %d of %d\n", h[1].accel[0],
		       h[1].accel[1], n);
	}
	/* the descriptor and memory targets hold at 10,000 connections all moved */
	bench_judge("scale_10k_fast_path_share", held, true, (double)fast / n, ">=", 1, "");
	bench_judge("scale_10k_more_fds_per_process", held,
		    fast == n && h[0].conns == n, fds, "<=", 16, "");
	bench_judge("scale_10k_more_pss_per_process", held,
		    fast == n && h[0].conns == n, mib, "<=", 64, " MiB");
	if (sc->conn_tried) {
		const struct conn_rate *c = &sc->conn, *k = &sc->conn_keep;

		bench_verdict("scale_connection_rate_ratio", bench_ratio(c->rate[1], c->rate[0]),
			      ">=", 1, "");
		printf("bench: scale_connections_fast_at_close %d of %d\n", c->fast, c->all);
		bench_verdict("scale_connection_rate_beside_held_ratio",
			      bench_ratio(k->rate[1], k->rate[0]), ">=", 1, "");
		printf("bench: scale_connections_beside_held_fast_at_close %d of %d\n", k->fast,
		       k->all);
		bench_verdict("scale_connection_bytes_by_channel_share",
			      c->bytes_all ? (double)c->bytes_fast / c->bytes_all : 0, ">=", 0.99, "");
		bench_verdict("scale_connection_beside_held_bytes_by_channel_share",
			      k->bytes_all ? (double)k->bytes_fast / k->bytes_all : 0, ">=", 0.99, "");
	}
	if (sc->kept_tried) {
		bench_verdict("scale_connection_rate_to_plain_server_ratio",
			      bench_ratio(sc->conn_plain.rate[1], sc->conn_plain.rate[0]), ">=", 0.97,
			      "");
		bench_verdict("scale_connection_rate_policy_tcp_ratio",
			      bench_ratio(sc->conn_policy.rate[1], sc->conn_policy.rate[0]), ">=",
			      0.97, "");
	}
	if (sc->msg_tried) {
		for (int k = 1; k < 4; k++) {
			double r = bench_ratio(sc->msg[0][k][1], sc->msg[0][k][0]);

			low = k == 1 || r < low ? r : low;
		}
		bench_verdict("scale_msgs_64B_4to64_conns_min_ratio", low, ">=", 4, "");
		printf("bench: scale_wsd_runs_not_accelerated %d\n", sc->off_path);
	}
	free(sc);
}

/* SPDX-License-Identifier: MIT */
/*
 * wsd bench's outside yardsticks, on this host only: iperf3 -l 1M run
 * plain and under `wsd run` at both ends (in turns), and UCX's
 * ucx_perftest over its shared-memory transports, the best a library that
 * owns both ends does.  Each is skipped, with a line saying so, when its
 * program is not installed.  wsd(1) describes the lines printed.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "wsd/bench.h"

/* A port nobody listens on now (the kernel's choice). */
int bench_free_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0), port = 0;

	if (fd >= 0 && !bind(fd, (struct sockaddr *)&a, sizeof(a)) &&
	    !getsockname(fd, (struct sockaddr *)&a, &len))
		port = ntohs(a.sin_port);
	if (fd >= 0)
		close(fd);
	return port;
}

bool bench_have(const char *prog)
{
	char cmd[256];

	snprintf(cmd, sizeof(cmd), "command -v %s >/dev/null 2>&1", prog);
	return system(cmd) == 0;
}

/* The last line of cmd's output holding key, or false. */
static bool run_for(const char *cmd, const char *key, char *line, size_t len)
{
	FILE *f = popen(cmd, "r");
	char buf[1024];
	bool found = false;

	if (!f)
		return false;
	while (fgets(buf, sizeof(buf), f))
		if (strstr(buf, key)) {
			snprintf(line, len, "%s", buf);
			found = true;
		}
	return pclose(f) == 0 && found;
}

/*
 * One iperf3 -l 1M run, server pinned to CPU 0 and client to CPU 1, both
 * plain or both under `wsd run`: the receiver's bits per second, or 0.
 */
static double iperf3_once(const char *self, bool wsd, int secs)
{
	char pre[PATH_MAX + 16] = "", srv[PATH_MAX + 128], cli[PATH_MAX + 160], line[1024];
	int port = bench_free_port();
	FILE *s;
	double bps = 0;
	const char *p;

	if (!port)
		return 0;
	if (wsd)
		snprintf(pre, sizeof(pre), "'%s' run -- ", self);
	snprintf(srv, sizeof(srv), "exec timeout 60 %siperf3 -s -1 -B 127.0.0.1 -p %d -A 0 "
		 ">/dev/null 2>&1", pre, port);
	s = popen(srv, "r");
	if (!s)
		return 0;
	usleep(300000);   /* iperf3 -s needs a moment to listen */
	snprintf(cli, sizeof(cli), "timeout 60 %siperf3 -c 127.0.0.1 -p %d -A 1 -t %d -l 1M -J "
		 "2>/dev/null | tr -d ' \\n' | sed 's/\"sum_received\"/\\n&/' | tail -n 1", pre,
		 port, secs);
	if (run_for(cli, "bits_per_second", line, sizeof(line)) &&
	    (p = strstr(line, "\"bits_per_second\":")))
		bps = atof(p + strlen("\"bits_per_second\":"));
	pclose(s);
	return bps;
}

void bench_iperf3(const char *self, int rounds, int secs, double out[2])
{
	double v[2][BENCH_MAXR];

	out[0] = out[1] = 0;
	printf("\n== iperf3 -l 1M, one stream, server on cpu 0, client on cpu 1, Gbit/s "
	       "(median of %d)\n", rounds);
	if (!bench_have("iperf3")) {
		printf("   not measured: iperf3 is not installed (./build.sh installs it)\n");
		return;
	}
	for (int r = 0; r < rounds; r++)
		for (int w = 0; w < 2; w++)
			v[w][r] = iperf3_once(self, w, secs) / 1e9;
	out[0] = bench_median(v[0], rounds);
	out[1] = bench_median(v[1], rounds);
	printf("   %10s %10s %7s\n   %10.2f %10.2f %7.2f\n", "plain", "wsd", "ratio", out[0],
	       out[1], out[0] > 0 ? out[1] / out[0] : 0);
}

/*
 * One ucx_perftest test between two processes on this host, shared memory
 * and cross-memory attach (UCX_TLS=posix,cma,self), server on CPU 0 and
 * client on CPU 1: the "Final:" line's fields, or false.
 */
static bool ucx_once(const char *test, long size, long iters, double f[8])
{
	char srv[256], cli[256], line[1024];
	int port = bench_free_port();
	FILE *s;
	bool ok;

	if (!port)
		return false;
	snprintf(srv, sizeof(srv), "UCX_TLS=posix,cma,self exec timeout 60 ucx_perftest -c 0 "
		 "-p %d >/dev/null 2>&1", port);
	s = popen(srv, "r");
	if (!s)
		return false;
	usleep(300000);
	snprintf(cli, sizeof(cli), "UCX_TLS=posix,cma,self timeout 60 ucx_perftest -c 1 -p %d "
		 "127.0.0.1 -t %s -s %ld -n %ld 2>/dev/null", port, test, size, iters);
	ok = run_for(cli, "Final:", line, sizeof(line)) &&
	     sscanf(line, " Final: %lf %lf %lf %lf %lf %lf %lf %lf", &f[0], &f[1], &f[2], &f[3],
		    &f[4], &f[5], &f[6], &f[7]) == 8;
	pclose(s);
	return ok;
}

void bench_ucx(int rounds, double *bw_mbs, double *lat_us)
{
	double bw[BENCH_MAXR], lat[BENCH_MAXR], f[8];

	*bw_mbs = *lat_us = 0;
	printf("\n== UCX ucx_perftest, shared memory (posix,cma), cpu 0 and cpu 1 "
	       "(median of %d)\n", rounds);
	if (!bench_have("ucx_perftest")) {
		printf("   not measured: ucx_perftest is not installed (ucx-utils; "
		       "./build.sh installs it)\n");
		return;
	}
	for (int r = 0; r < rounds; r++) {
		/* its bandwidth is in MiB/s: ours are in MB/s */
		bw[r] = ucx_once("tag_bw", 1 << 20, 2000, f) ? f[5] * 1.048576 : 0;
		lat[r] = ucx_once("tag_lat", 64, 100000, f) ? f[1] : 0;
	}
	*bw_mbs = bench_median(bw, rounds);
	*lat_us = bench_median(lat, rounds);
	printf("   tag_bw 1 MiB %.0f MB/s, tag_lat 64 B p50 %.3f us one way\n", *bw_mbs, *lat_us);
}

/* SPDX-License-Identifier: MIT */
/*
 * Short-lived connections: connect, a 64-byte request and answer, close,
 * N times in a row against a forked server, and the rate printed.  Run it
 * plain and under `wsd run` (tests/sock/connrate_bench.sh does, in turns):
 * the switch must not make such connections dearer (it upgrades lazily, so
 * these never leave TCP; what it costs is its bookkeeping).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 2000, one = 1;
	int l = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t al = sizeof(a);
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, 4);
	bind(l, (void *)&a, sizeof(a)); listen(l, 128); getsockname(l, (void *)&a, &al);
	pid_t p = fork();
	if (!p) {
		char b[64];
		for (int i = 0; i < n; i++) {
			int s = accept(l, NULL, NULL);
			/* the client sees a short answer as one: nothing to do here */
			if (read(s, b, 64) > 0 && write(s, b, 64) != 64)
				perror("write");
			close(s);
		}
		_exit(0);
	}
	char b[64] = "GET";
	double t0 = now();
	for (int i = 0; i < n; i++) {
		int c = socket(AF_INET, SOCK_STREAM, 0);
		if (connect(c, (void *)&a, sizeof(a))) { perror("connect"); return 1; }
		if (write(c, b, 64) != 64) { perror("write"); return 1; }
		size_t got = 0; while (got < 64) { ssize_t r = read(c, b + got, 64 - got); if (r <= 0) break; got += r; }
		close(c);
	}
	double t1 = now();
	waitpid(p, NULL, 0);
	printf("%.0f\n", n / (t1 - t0));
	return 0;
}

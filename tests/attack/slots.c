/* SPDX-License-Identifier: MIT */
/*
 * An attacker that holds the proof slots of a wsd server's shm registry
 * (the abstract unix socket "\0wsd-nd.PORT", wsd-protocol(7)): it
 * connects and says nothing, from several processes, and connects again
 * as the registry closes its connections, so that the slots stay full.
 * For tests/attack/slots_check.sh.
 *
 *   slots PORT PROCS CONNS STOPFILE
 *
 * PROCS processes keep CONNS connections each (a connection closed or
 * refused is made again 100 ms later, so the attack stays polite to the
 * machine's CPUs), until STOPFILE exists or 20 s have passed.  Prints
 * "holding" once every process has made its first round, and at the end
 * one line per process: "connects N closed M".
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_CONNS 64
#define AGAIN_MS 100
#define LIMIT_MS 20000

static int64_t now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static int dial(int port)
{
	struct sockaddr_un un = { .sun_family = AF_UNIX };
	int n = snprintf(un.sun_path + 1, sizeof(un.sun_path) - 1, "wsd-nd.%d", port);
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -1;
	if (connect(fd, (struct sockaddr *)&un,
		    (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n)) < 0) {
		close(fd);   /* EAGAIN: the backlog is full; asked again later */
		return -1;
	}
	return fd;
}

static void hold(int port, int conns, const char *stop, int ready)
{
	struct pollfd p[MAX_CONNS];
	int64_t again[MAX_CONNS] = { 0 }, end = now_ms() + LIMIT_MS;
	long connects = 0, closed = 0;

	for (int i = 0; i < conns; i++) {
		p[i].fd = dial(port);
		p[i].events = POLLIN;
		connects += p[i].fd >= 0;
		if (p[i].fd < 0)
			again[i] = now_ms() + AGAIN_MS;
	}
	(void)!write(ready, "x", 1);
	close(ready);
	while (now_ms() < end && access(stop, F_OK) != 0) {
		int64_t t = now_ms();

		for (int i = 0; i < conns; i++)
			if (p[i].fd < 0 && t >= again[i]) {
				p[i].fd = dial(port);
				connects += p[i].fd >= 0;
				if (p[i].fd < 0)
					again[i] = t + AGAIN_MS;
			}
		if (poll(p, (nfds_t)conns, 20) <= 0)
			continue;
		for (int i = 0; i < conns; i++)
			if (p[i].fd >= 0 && p[i].revents) {
				/* a REJECT or the end: the slot is gone, take another later */
				close(p[i].fd);
				p[i].fd = -1;
				again[i] = now_ms() + AGAIN_MS;
				closed++;
			}
	}
	printf("connects %ld closed %ld\n", connects, closed);
}

int main(int argc, char **argv)
{
	int port, procs, conns, ready[2];
	char c;

	if (argc != 5 || (port = atoi(argv[1])) <= 0 || (procs = atoi(argv[2])) <= 0 ||
	    (conns = atoi(argv[3])) <= 0 || conns > MAX_CONNS) {
		fprintf(stderr, "usage: slots PORT PROCS CONNS STOPFILE\n");
		return 2;
	}
	if (pipe(ready))
		return 2;
	setvbuf(stdout, NULL, _IOLBF, 0);
	for (int i = 0; i < procs; i++) {
		pid_t pid = fork();

		if (pid == 0) {
			close(ready[0]);
			hold(port, conns, argv[4], ready[1]);
			_exit(0);
		}
		if (pid < 0)
			return 2;
	}
	close(ready[1]);
	for (int i = 0; i < procs; i++)
		if (read(ready[0], &c, 1) != 1)
			break;
	printf("holding\n");
	while (wait(NULL) > 0 || errno == EINTR)
		;
	return 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * The programs of the fault scripts (the check scripts beside it): one stream,
 * one way, every byte of it from a seeded generator so that the receiver
 * checks each byte it is given against the byte that belongs there.
 *
 *   stream send PORTFILE SEED BYTES   listens on 127.0.0.1, writes its port,
 *                                     accepts one connection ("accepted") and
 *                                     sends the stream; "sent N" and 0 when all went,
 *                                     "sent N error E" and 0 when the peer
 *                                     went away (EPIPE, ECONNRESET, EIO)
 *   stream recv PORT SEED BYTES       connects and takes the stream; "upgraded
 *                                     at N" once wsd_switch_path() says shm
 *                                     (under wsd run), then "received N" with
 *                                     "complete", "eof" or "reset"/"eio"; 0
 *                                     for those, 1 at the first wrong byte
 *                                     ("mismatch at N"), 2 for anything else
 *
 * With STREAM_HOLD=FILE set, each prints "holding" at its end and keeps
 * its socket open until FILE exists (20 s at most), for a look with wsd
 * stat.  STREAM_PAUSE_US=N: the sender sleeps N us after each 256 KiB, so
 * that a slow handshake still finds the stream flowing.  Neither waits for anything unbounded of its own: the scripts kill what
 * outlives its deadline (a hang is what they look for).  A signal from the
 * provider's threads may interrupt a call: EINTR is retried.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/fault/fault.h"

#define CHUNK (256u << 10)

static const char *err_name(int e)
{
	switch (e) {
	case EPIPE: return "EPIPE";
	case ECONNRESET: return "ECONNRESET";
	case EIO: return "EIO";
	default: return strerror(e);
	}
}

/* The end's status, after STREAM_HOLD's wait. */
static int hold(int status)
{
	const char *f = getenv("STREAM_HOLD");

	if (f && *f) {
		printf("holding\n");
		for (int i = 0; i < 2000 && access(f, F_OK); i++)
			usleep(10000);
	}
	return status;
}

static int do_send(const char *portfile, uint64_t seed, uint64_t total)
{
	static uint8_t buf[CHUNK];
	uint64_t sent = 0;
	useconds_t pause_us = getenv("STREAM_PAUSE_US") ? (useconds_t)atol(getenv("STREAM_PAUSE_US")) : 0;
	int ls, fd;

	ls = listen_portfile(portfile, 1, "stream send");
	if (ls < 0)
		return 2;
	do {
		fd = accept(ls, NULL, NULL);
	} while (fd < 0 && errno == EINTR);
	if (fd < 0) {
		perror("stream send: accept");
		return 2;
	}
	close(ls);
	printf("accepted\n");
	while (sent < total) {
		size_t n = total - sent < CHUNK ? (size_t)(total - sent) : CHUNK, off = 0;

		fill(seed, sent, buf, n);
		while (off < n) {
			ssize_t r = send(fd, buf + off, n - off, MSG_NOSIGNAL);

			if (r < 0 && errno == EINTR)
				continue;
			if (r < 0) {
				int e = errno;

				printf("sent %llu error %s\n", (unsigned long long)(sent + off),
				       err_name(e));
				return hold(e == EPIPE || e == ECONNRESET || e == EIO ? 0 : 2);
			}
			off += (size_t)r;
		}
		sent += n;
		if (pause_us)
			usleep(pause_us);
	}
	printf("sent %llu\n", (unsigned long long)sent);
	return hold(0);
}

static int do_recv(const char *port, uint64_t seed, uint64_t total)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
				 .sin_port = htons((uint16_t)atoi(port)) };
	const char *(*path_of)(int) = (const char *(*)(int))dlsym(RTLD_DEFAULT, "wsd_switch_path");
	static uint8_t buf[CHUNK], want[CHUNK];
	uint64_t got = 0, next_look = 0;
	int fd = socket(AF_INET, SOCK_STREAM, 0), r;
	int upgraded = 0;

	do {
		r = connect(fd, (struct sockaddr *)&a, sizeof(a));
	} while (r < 0 && errno == EINTR);
	if (r < 0) {
		perror("stream recv: connect");
		return 2;
	}
	for (;;) {
		ssize_t n = recv(fd, buf, sizeof(buf), 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			int e = n < 0 ? errno : 0;

			printf("received %llu %s\n", (unsigned long long)got,
			       n == 0 ? "eof" :
			       e == ECONNRESET ? "reset" : e == EIO ? "eio" : strerror(e));
			return hold(n == 0 || e == ECONNRESET || e == EIO ? 0 : 2);
		}
		if (got + (uint64_t)n > total) {
			printf("received %llu: more than the stream's %llu bytes\n",
			       (unsigned long long)(got + (uint64_t)n), (unsigned long long)total);
			return 1;
		}
		fill(seed, got, want, (size_t)n);
		if (memcmp(buf, want, (size_t)n)) {
			size_t i = 0;

			while (buf[i] == want[i])
				i++;
			printf("mismatch at %llu: got 0x%02x, want 0x%02x\n",
			       (unsigned long long)(got + i), buf[i], want[i]);
			return 1;
		}
		got += (uint64_t)n;
		if (got == total) {
			/* all there: the end is ours to see, not the sender's close */
			printf("received %llu complete\n", (unsigned long long)got);
			return hold(0);
		}
		/* the path, now and then: the kill scripts wait for the ring */
		if (!upgraded && path_of && got >= next_look) {
			const char *p = path_of(fd);

			next_look = got + (1u << 20);
			if (p && !strcmp(p, "shm")) {
				upgraded = 1;
				printf("upgraded at %llu\n", (unsigned long long)got);
				fflush(stdout);
			}
		}
	}
}

int main(int argc, char **argv)
{
	uint64_t seed, total;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc != 5 || (strcmp(argv[1], "send") && strcmp(argv[1], "recv"))) {
		fprintf(stderr, "usage: stream send PORTFILE SEED BYTES | recv PORT SEED BYTES\n");
		return 2;
	}
	seed = strtoull(argv[3], NULL, 0);
	total = strtoull(argv[4], NULL, 0);
	return !strcmp(argv[1], "send") ? do_send(argv[2], seed, total) :
					  do_recv(argv[2], seed, total);
}

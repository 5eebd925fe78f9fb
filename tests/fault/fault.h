/* SPDX-License-Identifier: MIT */
/*
 * What the fault programs (stream.c, fanout.c) share: the seeded stream
 * whose every byte a receiver can check, and a listener on 127.0.0.1
 * whose port is written to a file for the script.
 */
#ifndef WSD_TESTS_FAULT_FAULT_H
#define WSD_TESTS_FAULT_FAULT_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* The stream's word i: splitmix64 of (seed, i), little-endian bytes. */
static inline uint64_t word(uint64_t seed, uint64_t i)
{
	uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* The n bytes of the stream from position pos. */
static inline void fill(uint64_t seed, uint64_t pos, uint8_t *buf, size_t n)
{
	size_t k = 0;

	while (k < n) {
		uint64_t w = word(seed, (pos + k) / 8);
		unsigned off = (unsigned)((pos + k) % 8);

		if (off == 0 && n - k >= 8) {
			memcpy(buf + k, &w, 8);
			k += 8;
		} else {
			buf[k] = (uint8_t)(w >> (8 * off));
			k++;
		}
	}
}

/*
 * A socket listening on 127.0.0.1 (FAULT_LISTEN_ADDR: that IPv4 address,
 * for tests across network namespaces) with a BACKLOG, its port written to
 * PORTFILE (whole, by rename); -1 after a message naming WHO.
 */
static inline int listen_portfile(const char *portfile, int backlog, const char *who)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t alen = sizeof(a);
	char tmp[4096];
	int ls = socket(AF_INET, SOCK_STREAM, 0);
	const char *at = getenv("FAULT_LISTEN_ADDR");
	FILE *f;

	if (at && inet_pton(AF_INET, at, &a.sin_addr) != 1) {
		fprintf(stderr, "%s: FAULT_LISTEN_ADDR %s: not an IPv4 address\n", who, at);
		return -1;
	}
	if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(ls, backlog) < 0 ||
	    getsockname(ls, (struct sockaddr *)&a, &alen) < 0) {
		fprintf(stderr, "%s: listen: %s\n", who, strerror(errno));
		return -1;
	}
	snprintf(tmp, sizeof(tmp), "%s.tmp", portfile);
	f = fopen(tmp, "w");
	if (!f || fprintf(f, "%d\n", ntohs(a.sin_port)) < 0 || fclose(f) || rename(tmp, portfile)) {
		fprintf(stderr, "%s: port file: %s\n", who, strerror(errno));
		close(ls);
		return -1;
	}
	return ls;
}

#endif /* WSD_TESTS_FAULT_FAULT_H */

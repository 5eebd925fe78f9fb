/* SPDX-License-Identifier: MIT */
/* The running 64-bit checksum the demo and the test programs compare end to end. */
#ifndef WSD_CHECKSUM_H
#define WSD_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define CHECKSUM_SEED 0xcbf29ce484222325ull

static inline uint64_t checksum_step(uint64_t h, const uint8_t *p, size_t n)
{
	size_t i = 0;
	uint64_t w;

	for (; i + 8 <= n; i += 8) {
		memcpy(&w, p + i, 8);
		h = (h ^ w) * 0x100000001b3ull;
		h ^= h >> 29;
	}
	for (; i < n; i++)
		h = (h ^ p[i]) * 0x100000001b3ull;
	return h;
}

#endif

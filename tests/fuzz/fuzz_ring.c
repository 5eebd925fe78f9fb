/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer: the record walk the switch's readers use (wsd_wire_walk), over
 * a ring the fuzzer fills, and the payload checks rx_ring applies to what
 * it finds.  Input: ring size choice (1 byte), skip mask (4), start (8),
 * then the ring's bytes.  Each 16-byte slot's second 8 bytes are taken
 * XOR (its position ^ key), so that zeros make a header stamp that matches
 * and the fuzzer need not guess positions: it then reaches the length and
 * type checks, which are what a hostile peer controls.  The key is 1 (odd,
 * as every key), so that a trailer is its record's position ^ 1.
 */
#include <stdlib.h>
#include <string.h>

#include "switch/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define KEY 1ull

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint32_t ring = data && size ? (data[0] & 1 ? 32768u : 16384u) : 16384u, skip;
	uint64_t start, pos, lap;
	struct wire_ring rg;
	struct wire_rec r;
	const char *why;
	uint8_t *mem;
	unsigned sum = 0;
	int k, steps = 0;

	if (size < 13)
		return 0;
	memcpy(&skip, data + 1, 4);
	memcpy(&start, data + 5, 8);
	start &= ~15ull;                     /* the receiver's position is always on 16 */
	data += 13;
	size -= 13;
	/* exactly the ring: a read past it is the sanitizer's to see */
	mem = calloc(1, ring);
	if (!mem)
		return 0;
	memcpy(mem, data, size < ring ? size : ring);
	lap = start - start % ring;
	for (uint32_t o = 0; o < ring; o += 16) {
		uint64_t p = lap + o + (o < start % ring ? ring : 0), s;

		memcpy(&s, mem + o + 8, 8);
		s ^= p ^ KEY;
		memcpy(mem + o + 8, &s, 8);
	}
	rg = (struct wire_ring){ mem, ring, KEY };
	/* the walks of check_back, fin_pending, rx_mark... with the fuzzer's mask */
	k = wsd_wire_walk(&rg, start, start, skip, &r, &why);
	if (k > 0 && (skip & WIRE_SKIP(r.type)))
		abort();
	if (k >= 0 && (r.pos < start || r.pos - start > ring))
		abort();
	/* rx_ring's: record by record, consuming (start moves), payloads checked */
	for (pos = start; (k = wsd_wire_walk(&rg, pos, pos, WIRE_SKIP(REC_PAD), &r, &why)) > 0;
	     pos = r.next) {
		struct wsd_zc z;
		struct wsd_wzc w;
		uint64_t n, got;

		if (r.next <= r.pos || r.next - pos > ring || ++steps > (int)(ring / 16))
			abort();
		if (r.payload < mem || r.payload + r.len > mem + ring)
			abort();
		switch (r.type) {
		case REC_DATA:
			for (uint32_t i = 0; i < r.len; i++)
				sum += r.payload[i];
			break;
		case REC_ZC:
			memcpy(&z, r.payload, sizeof(z));
			if (!wsd_wire_zc_check(&z, &why) && (z.len == 0 || z.len > WIRE_ZC_MAX))
				abort();
			break;
		case REC_WZC:
			memcpy(&w, r.payload, sizeof(w));
			if (!wsd_wire_wzc_check(&w, 5, true, 4096, &got, &why) && got > 4096)
				abort();
			break;
		case REC_SPLIT: {
			struct wsd_split sp;
			int take;

			memcpy(&sp, r.payload, sizeof(sp));
			if (!wsd_wire_split_check(&sp, 5, true, 4096, &take, &why) && take &&
			    (sp.wlen > 4096 || sp.zc.len > 4096 - sp.wlen || !sp.zc.len))
				abort();
			break;
		}
		case REC_SWITCH:
		case REC_BACK:
			memcpy(&n, r.payload, sizeof(n));
			(void)wsd_wire_switch_check(n, 100, &why);
			(void)wsd_wire_back_check(n, n + 1, 3, &why);
			break;
		case REC_FIN:
			break;
		default:
			abort();     /* the walk lets no other type through */
		}
	}
	free(mem);
	return (int)(sum & 0);
}

/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer: the control words as ctl_get reads them (wsd_wire_word_get),
 * the offer block as send_posted checks it, and doorbells on the stream as
 * the drain checks them against the bells word (wsd_wire_bells_check).  Input: our bounds (tx_pos,
 * zc_sent, post_gen: 24 bytes), then the control area, read twice (the
 * second time over the fuzzer's next bytes, so values change as a peer's do).
 */
#include <stdlib.h>
#include <string.h>

#include "switch/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct wsd_ctl *ctl;
	_Atomic uint64_t seen[CW_N] = { 0 };
	uint64_t b[3];
	const char *why;

	if (size < sizeof(b))
		return 0;
	memcpy(b, data, sizeof(b));
	data += sizeof(b);
	size -= sizeof(b);
	ctl = calloc(1, sizeof(*ctl));
	if (!ctl)
		return 0;
	for (int round = 0; round < 2; round++) {
		size_t n = size < sizeof(*ctl) ? size : sizeof(*ctl);

		memcpy((void *)ctl, data, n);
		data += n;
		size -= n;
		for (int idx = 0; idx < CW_N; idx++) {
			uint64_t bound = idx == CW_CONSUMED ? b[0] : idx == CW_ZC_DONE ? b[1] :
					 idx == CW_CLAIM ? b[2] : UINT64_MAX;
			uint64_t last = seen[idx], v;
			int r = wsd_wire_word_get(ctl, idx, &seen[idx], bound, &v, &why);

			/* what the switch relies on from a value it was given */
			if (r == 0 && v != last &&
			    (((idx == CW_CONSUMED || idx == CW_ZC_DONE || idx == CW_CLAIM) &&
			      (v > bound || v < last)) ||
			     ((idx == CW_RX_READY || idx == CW_BACK_REQ) && v > 1) ||
			     (idx == CW_CLOSED && v > WSD_CLOSING_NO_PROOF) || (idx == CW_MAPPED && v > 2) ||
			     (idx == CW_BELLS && v >> 1 < last >> 1)))
				abort();
			if (r && v != last)
				abort();     /* a refused value is never handed on */
		}
		{
			/*
			 * The doorbells the stream may hold after the bells word:
			 * bytes the check passes are the next announced bells,
			 * never more than announced (the bytes: the area's start).
			 */
			uint64_t ann = wsd_bells_announced(seen[CW_BELLS]);
			uint64_t rd = b[0] % (ann + 1);
			size_t n = (size_t)(b[1] % 64);
			const uint8_t *bytes = (const uint8_t *)ctl;

			if (!wsd_wire_bells_check(bytes, n, rd, ann, &why)) {
				if (n > ann - rd)
					abort();
				for (size_t i = 0; i < n; i++)
					if (bytes[i] != (uint8_t)(rd + i + 1))
						abort();
			}
		}
		{
			struct wsd_post p;

			memcpy(&p, (const void *)&ctl->post, sizeof(p));
			if (!wsd_wire_post_check(&p, p.gen, b[0], &why) &&
			    (!p.len || p.len > WIRE_ZC_MAX || p.pos > b[0]))
				abort();
		}
	}
	free(ctl);
	return 0;
}

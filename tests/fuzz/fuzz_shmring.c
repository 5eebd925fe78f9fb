/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer: the shm transport's receive ring (provider/shm/data.c,
 * run_inbound) and the peer's window table (shm_remote_check), both
 * written by the peer.  Input: 8 bytes of the peer's head, 2 of our tail
 * (in 32-byte slots), 4 of the receive buffers' sizes (4 SGEs of up to 4
 * KiB), 8 of a token to look up, then the ring's 4096 bytes and the
 * window table's.  Each 32-byte slot's first 8 bytes (a header's stamp)
 * are taken XOR the stamp its position would have, so that zeros are
 * headers the consumer takes and the fuzzer reaches the length, op and
 * flags checks; a window's seq is made even (an odd one is waited out
 * for 200 ms, by design, which would only slow the fuzzer).  The ring and
 * every buffer are allocated exactly, so a copy past one is the
 * sanitizer's to see.
 *
 * FUZZ_SOURCES: provider/shm/ctl.c
 */
#define _GNU_SOURCE
#include <stdlib.h>

#include "provider/shm/data.c"
#include "tests/fuzz/fuzz_threads.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define RING 4096u
#define NWIN 4u
#define KEY 0x5a5a5a5a5a5a5a5bull

/* The endpoint layer, as far as run_inbound reaches into it. */
static unsigned pushed;

void wsd_cq_push(struct nd_cq *cq, const struct nd_result *r)
{
	(void)r;
	if (cq->count >= cq->depth)
		abort();    /* run_inbound checked for room first */
	cq->count++;
	pushed++;
}

bool wsd_cq_full(const struct nd_cq *cq)
{
	return cq->count >= cq->depth;
}

void wsd_ep_terminate(struct nd_ep *ep)
{
	ep->state = EP_TERMINATED;
}

void wsd_mw_unbind(struct nd_mw *mw)
{
	(void)mw;
}

void wsd_sge_to_iov(const struct nd_sge *sgl, uint32_t nsge, struct iovec *iov)
{
	for (uint32_t i = 0; i < nsge; i++)
		iov[i] = (struct iovec){ sgl[i].addr, sgl[i].length };
}

void wsd_mr_local_invalidate(struct nd_mr *mr)
{
	(void)mr;
}

void wsd_cq_detach(struct nd_cq *cq, int fd)
{
	(void)cq;
	(void)fd;
}

nd_status wsd_sgl_check(const struct nd_sge *sgl, uint32_t n, uint32_t need)
{
	(void)sgl;
	(void)n;
	(void)need;
	return ND_SUCCESS;
}

int shm_layout_intact(const struct shm_conn *c)
{
	(void)c;
	return 1;
}

void shm_sleeper_barrier(const struct shm_conn *c)
{
	(void)c;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	size_t hdr = (sizeof(struct shm_half) + NWIN * sizeof(struct shm_window) + 4095) & ~4095ul;
	struct nd_cq cq = { .depth = 8 };
	struct nd_ep ep = { .state = EP_CONNECTED, .attr = { .inbound_cq = &cq,
							     .inbound_entries = 4 } };
	struct nd_rwr rq[4];
	struct nd_sge sge[4];
	struct shm_conn c = { .sock = -1, .pidfd = -1, .peer_in_efd = -1, .peer_out_efd = -1 };
	struct shm_half *h;
	uint8_t *mem, *ring, *bufs[4];
	uint64_t head, tail, token, lap;
	uint16_t slot;
	uint8_t sizes[4];

	if (size < 22)
		return 0;
	memcpy(&head, data, 8);
	memcpy(&slot, data + 8, 2);
	memcpy(sizes, data + 10, 4);
	memcpy(&token, data + 14, 8);
	data += 22;
	size -= 22;
	mem = calloc(1, hdr + RING);
	if (!mem)
		return 0;
	h = (struct shm_half *)(void *)mem;
	ring = mem + hdr;
	memcpy(ring, data, size < RING ? size : RING);
	data += size < RING ? size : RING;
	size -= size < RING ? size : RING;
	memcpy(h->windows, data, size < NWIN * sizeof(struct shm_window) ?
	       size : NWIN * sizeof(struct shm_window));
	for (unsigned i = 0; i < NWIN; i++)
		atomic_store(&h->windows[i].seq, atomic_load(&h->windows[i].seq) & ~1ull);
	/* our position: any 32-byte slot of some lap; the peer's head near it */
	tail = (uint64_t)slot * MSG_ALIGN;
	lap = tail - tail % RING;
	head = tail + head % (2 * RING);
	atomic_store(&h->head, head);
	for (uint32_t o = 0; o < RING; o += MSG_ALIGN) {
		uint64_t pos = lap + o + (o < tail % RING ? RING : 0), s;

		memcpy(&s, ring + o, 8);
		s ^= stamp_of(KEY, pos);
		memcpy(ring + o, &s, 8);
	}
	c.map = mem;
	c.rx = h;
	c.rx_ring = ring;
	c.ring_size = RING;
	c.nwindows = NWIN;
	c.rx_key = KEY;
	c.rx_tail = tail;
	c.mws = calloc(NWIN, sizeof(*c.mws));
	for (int i = 0; i < 4; i++) {
		size_t len = (size_t)sizes[i] * 16 + 1;

		bufs[i] = malloc(len);
		sge[i] = (struct nd_sge){ bufs[i], (uint32_t)len, NULL };
		rq[i] = (struct nd_rwr){ NULL, 1, len, &sge[i] };
	}
	ep.rq = rq;
	ep.rq_tail = 4;
	ep.tpriv = &c;
	pushed = 0;
	/* twice: a streamed message goes on where the first pass stopped */
	for (int pass = 0; pass < 2 && ep.state == EP_CONNECTED; pass++) {
		run_inbound(&ep, &c);
		/*
		 * the consumer moves forward, by four messages of a ring at
		 * most (four receives), and a streamed one no further than the
		 * head the peer published
		 */
		if (c.rx_tail < tail || c.rx_tail - tail > 4 * RING ||
		    (c.in_msg && (c.cur.flags & SHM_MSG_STREAM) && c.rx_tail > head))
			abort();
		if (ep.rq_head > ep.rq_tail || pushed > 8)
			abort();
	}
	(void)shm_remote_check(&ep, (uint64_t)token, 64, token, ND_OP_FLAG_ALLOW_READ);
	for (int i = 0; i < 4; i++)
		free(bufs[i]);
	free(c.mws);
	free(mem);
	return 0;
}

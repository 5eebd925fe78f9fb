/* SPDX-License-Identifier: MIT */
/*
 * The checks of what a peer wrote (switch/wire.h, wsd-protocol(7)
 * "Validation").  Pure functions of private copies and our own state; no
 * locks, no allocation.  The record checks run once per record on the
 * receive path, so they stay a few compares.
 */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>

#include "switch/wire.h"

static int bad(const char **why, const char *what)
{
	*why = what;
	return -EPROTO;
}

static bool all_zero(const uint8_t *p, size_t n)
{
	while (n--)
		if (*p++)
			return false;
	return true;
}

/*
 * A refusal's fields past its reason: zero, but a moved one's port in seg,
 * and a policy one's word that it holds for every connection.
 */
static bool refusal_fields_ok(const struct wsd_hello *h)
{
	struct wsd_hello c = *h;

	if (h->reason == WSD_REASON_MOVED) {
		if (c.seg == 0 || c.seg > 65535)
			return false;
		c.seg = 0;
	}
	if (h->reason == WSD_REASON_POLICY && c.seg == WSD_REFUSE_EVERY)
		c.seg = 0;
	return all_zero((const uint8_t *)&c + offsetof(struct wsd_hello, ring_size),
			sizeof(c) - offsetof(struct wsd_hello, ring_size));
}

/* ---- handshake ------------------------------------------------------------------ */

int wsd_wire_hello_check(const struct wsd_hello *h, uint16_t kind, const char **why)
{
	if (h->magic != WSD_PROTO_MAGIC)
		return bad(why, "handshake: magic");
	/* another version keeps only magic, version, kind and reason where they are */
	if (h->version != WSD_PROTO_VERSION) {
		*why = "handshake: another version";
		return -EPROTONOSUPPORT;
	}
	if (h->kind == MSG_REFUSE && kind == MSG_ACCEPT) {
		if (h->reason == 0)
			return bad(why, "handshake: REFUSE without a reason");
		/* "its other fields are zero": all of the message past the reason */
		if (!refusal_fields_ok(h))
			return bad(why, "handshake: REFUSE with fields set");
		return 0;
	}
	if (h->kind != kind)
		return bad(why, "handshake: unexpected kind");
	if (h->reason != 0)
		return bad(why, "handshake: reason set");
	if (h->ring_size < WIRE_RING_MIN || h->ring_size > WIRE_RING_MAX ||
	    (h->ring_size & (h->ring_size - 1)))
		return bad(why, "handshake: ring_size not a power of two in 16384..67108864");
	/* odd, so that zeroed memory never passes for a record at position 0 */
	if (!(h->key & 1))
		return bad(why, "handshake: even key");
	if (h->pid ? h->region_fd < 0 : h->region_fd != -1)
		return bad(why, "handshake: pid and region_fd disagree");
	/* the slot: page-aligned, whole within the segment, before its tag page */
	if ((h->slot_off % WSD_SEG_PAGE) || (h->seg_len % WSD_SEG_PAGE) ||
	    (uint64_t)h->slot_off + CTL_SIZE + h->ring_size + WSD_SEG_PAGE > h->seg_len)
		return bad(why, "handshake: slot not within its segment");
	/* a challenge of zeros is none: nobody drew it at random */
	if (all_zero(h->nonce, sizeof(h->nonce)))
		return bad(why, "handshake: no challenge");
	return 0;
}

int wsd_wire_chmsg_check(const struct wsd_chmsg *m, const char **why)
{
	struct wsd_tuple t;
	const struct wsd_hello *h = &m->h;
	int r;

	if (h->magic != WSD_PROTO_MAGIC)
		return bad(why, "channel: magic");
	if (h->version != WSD_PROTO_VERSION)
		return bad(why, "channel: another version");
	if (h->kind == MSG_OPEN ? m->fd < -1 || m->flags : m->fd != 0)
		return bad(why, "channel: fd or flags out of place");
	if (m->flags & ~(h->kind == MSG_OPENED ? WSD_OPENED_HELD : 0u))
		return bad(why, "channel: unknown flags");
	switch (h->kind) {
	case MSG_OPEN:
		r = wsd_wire_tuple_check(&m->t, sizeof(m->t), &t, why);
		if (r)
			return -EPROTO;
		if (!t.client.family)
			return bad(why, "channel: OPEN naming no connection");
		return wsd_wire_hello_check(h, MSG_OPEN, why);
	case MSG_OPENED:
		if (!all_zero((const uint8_t *)&m->t, sizeof(m->t)))
			return bad(why, "channel: OPENED with a tuple");
		return wsd_wire_hello_check(h, MSG_OPENED, why);
	case MSG_DECLINE:
		if (h->reason == 0 || h->reason >= 256)
			return bad(why, "channel: DECLINE without a reason");
		if (!refusal_fields_ok(h) || !all_zero((const uint8_t *)&m->t, sizeof(m->t)))
			return bad(why, "channel: DECLINE with fields set");
		return 0;
	case MSG_SHUT:
	case MSG_MAPPED:
	case MSG_CREDIT:
		/* the segment and slot are looked up in our own tables, never trusted */
		if (h->reason || m->req || h->ring_size || h->key || h->pid || h->seg_len ||
		    h->seg_tag || !all_zero(h->desc, sizeof(h->desc)) ||
		    !all_zero(h->nonce, sizeof(h->nonce)) ||
		    !all_zero((const uint8_t *)&m->t, sizeof(m->t)) ||
		    (h->kind != MSG_SHUT && h->slot_off) || (h->kind == MSG_CREDIT && h->seg))
			return bad(why, "channel: SHUT, MAPPED or CREDIT with fields set");
		return 0;
	default:
		return bad(why, "channel: unknown kind");
	}
}

static int addr_check(const struct wsd_stat_addr *a, const char **why)
{
	if (a->family != AF_INET && a->family != AF_INET6)
		return bad(why, "tuple: address family");
	if (a->pad)
		return bad(why, "tuple: address pad");
	if (!a->port)
		return bad(why, "tuple: port 0");
	/* IPv4 in the first 4 bytes, the rest zero: compared as 16 bytes later */
	if (a->family == AF_INET && !all_zero(a->addr + 4, sizeof(a->addr) - 4))
		return bad(why, "tuple: IPv4 address with bytes past 4");
	return 0;
}

int wsd_wire_tuple_check(const void *data, uint32_t len, struct wsd_tuple *t, const char **why)
{
	int r;

	if (!data || len != sizeof(*t))
		return bad(why, "tuple: length");
	memcpy(t, data, sizeof(*t));
	if (t->magic != WSD_TUPLE_MAGIC)
		return bad(why, "tuple: magic");
	if (t->version != WSD_PROTO_VERSION) {
		/* taken, to be answered REFUSE protocol: its layout may differ */
		*why = "tuple: another version";
		return -EPROTONOSUPPORT;
	}
	if (t->pad)
		return bad(why, "tuple: pad");
	/* no client at all: a HELLO for a channel alone (wsd-protocol(7), Channels) */
	r = all_zero((const uint8_t *)&t->client, sizeof(t->client)) ? 0 :
	    addr_check(&t->client, why);
	return r ? r : addr_check(&t->server, why);
}

/* ---- records ------------------------------------------------------------------------- */

int wsd_wire_rec_check(uint32_t len, uint32_t type, uint64_t off, uint32_t ring_size,
		       const char **why)
{
	uint32_t max_data = ring_size / 4 - REC_HDR - REC_TRAILER;

	switch (type) {
	case REC_PAD:
		/* records are multiples of 16, and a PAD fills exactly to the end */
		if (!len || (len & 15u) || off + len != ring_size)
			return bad(why, "record: PAD not reaching the ring's end");
		return 0;
	case REC_DATA:
		if (max_data > 65536)
			max_data = 65536;
		if (!len || len > max_data)
			return bad(why, "record: DATA length");
		break;
	case REC_ZC:
		if (len != sizeof(struct wsd_zc))
			return bad(why, "record: ZC length");
		break;
	case REC_SWITCH:
	case REC_BACK:
		if (len != sizeof(uint64_t))
			return bad(why, "record: SWITCH or BACK length");
		break;
	case REC_FIN:
		if (len)
			return bad(why, "record: FIN length");
		break;
	case REC_WZC:
		if (len != sizeof(struct wsd_wzc))
			return bad(why, "record: WZC length");
		break;
	case REC_SPLIT:
		if (len != sizeof(struct wsd_split))
			return bad(why, "record: SPLIT length");
		break;
	default:
		return bad(why, "record: unknown type");
	}
	if (off + rec_size(len) > ring_size)
		return bad(why, "record: past the ring's end");
	return 0;
}

int wsd_wire_rec_at(const struct wire_ring *rg, uint64_t start, uint64_t pos,
		    struct wire_rec *r, const char **why)
{
	uint64_t off = pos & (rg->size - 1);
	const uint8_t *h = rg->mem + off;
	uint64_t stamp, lt, size;
	uint32_t len, type;
	int e;

	/*
	 * The stamp first (acquire): the sender writes len and type before it,
	 * so a visible stamp means they are in place.  Then len and type in one
	 * load: a second read could see another value.
	 */
	stamp = atomic_load_explicit((const _Atomic uint64_t *)(const void *)(h + 8),
				     memory_order_acquire);
	if (stamp != (pos ^ rg->key))
		return 0;
	lt = atomic_load_explicit((const _Atomic uint64_t *)(const void *)h, memory_order_relaxed);
	len = (uint32_t)lt;          /* little-endian: len, then type (wsd-protocol(7)) */
	type = (uint32_t)(lt >> 32);
	e = wsd_wire_rec_check(len, type, off, rg->size, why);
	if (e)
		return e;
	size = type == REC_PAD ? len : rec_size(len);
	/* the sender never writes past the credit we gave: a ring past our position */
	if (pos - start + size > rg->size)
		return bad(why, "record: more than a ring past the receiver's position");
	if (type != REC_PAD &&
	    atomic_load_explicit((const _Atomic uint64_t *)(const void *)(h + size - REC_TRAILER),
				 memory_order_acquire) != stamp)
		return 0;            /* still being written */
	r->pos = pos;
	r->next = pos + size;
	r->len = len;
	r->type = type;
	r->payload = h + REC_HDR;
	return 1;
}

int wsd_wire_walk(const struct wire_ring *rg, uint64_t start, uint64_t pos, uint32_t skip,
		  struct wire_rec *r, const char **why)
{
	for (;;) {
		int k = wsd_wire_rec_at(rg, start, pos, r, why);

		if (k <= 0) {
			r->pos = pos;
			r->type = 0;
			return k;
		}
		if (!(skip & WIRE_SKIP(r->type)))
			return 1;
		pos = r->next;       /* 16 bytes on at least, and never a ring past start */
	}
}

int wsd_wire_resume_check(uint32_t type, uint64_t len, uint64_t off, const char **why)
{
	if (!off)
		return 0;
	if (type != REC_DATA && type != REC_ZC)
		return bad(why, "record: a partly read record changed its type");
	if (off >= len)
		return bad(why, "record: a partly read record shrank");
	return 0;
}

int wsd_wire_switch_check(uint64_t n, uint64_t received, const char **why)
{
	/* bytes past N were doorbells, but we delivered them as data */
	if (n < received)
		return bad(why, "SWITCH: N below the bytes already received");
	return 0;
}

int wsd_wire_zc_check(const struct wsd_zc *z, const char **why)
{
	/* the descriptor is the provider's: its RDMA read checks it against the registration */
	if (!z->len || z->len > WIRE_ZC_MAX)
		return bad(why, "ZC: length");
	return 0;
}

int wsd_wire_wzc_check(const struct wsd_wzc *w, uint64_t post_gen, bool open, uint64_t room,
		       uint64_t *deliver, const char **why)
{
	*deliver = 0;
	if (!w->gen || w->gen > post_gen)
		return bad(why, "WZC: answers an offer never made");
	if (!open || w->gen != post_gen)
		return 0;            /* an offer already let go: its answer is skipped */
	if (w->len > room)
		return bad(why, "WZC: more bytes than the offered buffer");
	*deliver = w->len;
	return 0;
}

int wsd_wire_split_check(const struct wsd_split *sp, uint64_t post_gen, bool open, uint64_t room,
			 int *take, const char **why)
{
	*take = 0;
	if (!sp->gen || sp->gen > post_gen)
		return bad(why, "SPLIT: answers an offer never made");
	if (wsd_wire_zc_check(&sp->zc, why))
		return -EPROTO;
	if (!sp->wlen || sp->wlen > WIRE_ZC_MAX)
		return bad(why, "SPLIT: length written");
	if (!open || sp->gen != post_gen)
		return 0;            /* an offer already let go */
	if (sp->wlen > room || sp->zc.len > room - sp->wlen)
		return bad(why, "SPLIT: more bytes than the offered buffer");
	*take = 1;
	return 0;
}

int wsd_wire_bells_check(const uint8_t *b, size_t n, uint64_t read, uint64_t announced,
			 const char **why)
{
	if (read > announced || n > announced - read)
		return bad(why, "bells: more bytes on the stream than doorbells announced");
	for (size_t i = 0; i < n; i++)
		if (b[i] != wsd_bell_value(read + i + 1))
			return bad(why, "bells: a byte on the stream that is not the next doorbell");
	return 0;
}

int wsd_wire_back_check(uint64_t bells, uint64_t word, uint64_t bells_read, const char **why)
{
	/* word 0 is "not written yet", for the caller to wait on, never B + 1 */
	if (!word || word != bells + 1)
		return bad(why, "BACK: count differs from back_bells");
	/* we took bytes of the stream for bells that the peer says it never wrote */
	if (bells < bells_read)
		return bad(why, "BACK: fewer bells than were read");
	return 0;
}

int wsd_wire_post_check(const struct wsd_post *p, uint64_t gen, uint64_t tx_pos,
			const char **why)
{
	if (p->gen != gen)
		return bad(why, "offer: generation");
	if (!p->len || p->len > WIRE_ZC_MAX)
		return bad(why, "offer: length");
	if (p->pad)
		return bad(why, "offer: zero field set");
	/* the offerer's position is what it consumed of ours */
	if (p->pos > tx_pos)
		return bad(why, "offer: a position we have not written");
	return 0;
}

/* ---- control words ----------------------------------------------------------------- */

int wsd_wire_word_check(int idx, uint64_t v, uint64_t last, uint64_t bound, const char **why)
{
	switch (idx) {
	case CW_CONSUMED:
	case CW_ZC_DONE:
	case CW_CLAIM:
		if (v > bound)
			return bad(why, idx == CW_CONSUMED ? "consumed: beyond what we sent" :
					idx == CW_ZC_DONE ? "zc_done: beyond our ZC records" :
							    "claim: an offer never made");
		/* fall through */
	case CW_POST:
	case CW_POST_CANCEL:
		if (v < last)
			return bad(why, "control word: went back");
		return 0;
	case CW_RX_READY:
	case CW_BACK_REQ:
		return v > 1 ? bad(why, "control word: flag out of range") : 0;
	case CW_CLOSED:
		return v > WSD_CLOSING_NO_PROOF ? bad(why, "control word: flag out of range") : 0;
	case CW_MAPPED:
		return v > 2 ? bad(why, "control word: flag out of range") : 0;
	case CW_BELLS:
		/* the count only grows; the "one more on its way" bit comes and goes */
		return v >> 1 < last >> 1 ? bad(why, "bells: count went back") : 0;
	case CW_BACK_BELLS:
		/* written once */
		return last && v != last ? bad(why, "back_bells: changed") : 0;
	case CW_DATA_ARM:
	case CW_SPACE_ARM:
		return 0;            /* generations, only ever compared for a change */
	default:
		return bad(why, "control word: no such word");
	}
}

int wsd_wire_word_get(const struct wsd_ctl *ctl, int idx, _Atomic uint64_t *seen,
		      uint64_t bound, uint64_t *v, const char **why)
{
	int r = wsd_wire_word_try(ctl, idx, seen, bound, v, why);

	return r < 0 ? r : 0;
}

int wsd_wire_word_try(const struct wsd_ctl *ctl, int idx, _Atomic uint64_t *seen,
		      uint64_t bound, uint64_t *v, const char **why)
{
	/*
	 * last before the word: a value another thread took (and stored) before
	 * is then never newer than the one read here, so "went back" means the
	 * peer's word did.
	 */
	uint64_t last = atomic_load_explicit(seen, memory_order_acquire);
	uint64_t c = atomic_load_explicit(&ctl->w[idx].check, memory_order_acquire);
	uint64_t x = atomic_load_explicit(&ctl->w[idx].v, memory_order_acquire);
	int r;

	*v = last;
	if (c != ~x)
		return 0;            /* half written: the last that was whole */
	r = wsd_wire_word_check(idx, x, last, bound, why);
	if (r)
		return r;
	atomic_store_explicit(seen, x, memory_order_relaxed);
	*v = x;
	return 1;
}

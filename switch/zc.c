/* SPDX-License-Identifier: MIT */
/*
 * Zero copy.  Write-based: a receiver about to sleep offers its buffer and
 * the sender writes straight into it (post_offer, send_posted), the offer
 * withdrawn or settled as the receive leaves (post_withdraw, post_settle).
 * Read-based: the sender's buffer registered and named in a ZC record, the
 * receiver reading it by RDMA (send_zc, zc_read).  The threshold for both
 * (zc_threshold).  Locks: an offer is the receiver's, under rx_lock; its
 * answer and send_zc are under tx_lock.  It does not choose zero copy over
 * a copy: the send and receive paths do (tx.c, rx.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>
#include <string.h>

#include "switch/sess_int.h"

/* ---- write-based zero copy: a receive buffer offered ------------------------------ */

/*
 * A receiver about to sleep in a large blocking receive offers its buffer:
 * the block (generation, its ring position, length, descriptor) in the
 * sender's control area, then CW_POST.  A sender that sees it before it
 * has written anything more (its position equals the offer's) claims it
 * (CW_CLAIM), checks that the offer was not withdrawn (CW_POST_CANCEL),
 * writes its data straight into the buffer and then a WZC record.  Any
 * other record reaching the receiver first voids the offer: the sender's
 * position moved, so it will never use it.  A receiver leaving without
 * data (a signal, a timeout) withdraws the offer and then reads the claim;
 * each side writes before it reads the other's word, so at least one sees
 * the other, and a claimed offer is always answered by a WZC record (0
 * bytes when withdrawn).  wsd-protocol(7), Zero copy.
 */

/* rx_lock held: ring empty, c at a large single segment: offer it. */
void post_offer(struct wsd_sock *s, struct cursor *c)
{
	struct wsd_session *ss = s->sess;
	WSPPROC_TABLE *t = wsd_spi();
	struct wsd_post *b = (struct wsd_post *)(ss->words + 8);
	size_t len = c->iov[c->i].iov_len - c->off;
	uint8_t *buf = (uint8_t *)c->iov[c->i].iov_base + c->off;
	int err;

	if (len > (1u << 30))
		len = 1u << 30;
	ss->post_dlen = sizeof(ss->post_desc);
	if (t->lpWSPRegisterRdmaMemory(ss->ws, buf, (uint32_t)len, MEM_WRITE, ss->post_desc,
				       &ss->post_dlen, &err))
		return;
	b->gen = ++ss->post_gen;
	b->pos = ss->rx_pos;
	b->len = len;
	ss->post_len = len;
	b->pad = 0;
	memcpy(b->desc, ss->post_desc, sizeof(b->desc));
	if (rdma_writev(ss, &(WSABUFEX){ sizeof(*b), (char *)b, ss->words_handle }, 1,
			offsetof(struct wsd_ctl, post)) ||
	    put_word(ss, W_RX, CW_POST, b->gen)) {
		t->lpWSPDeregisterRdmaMemory(ss->ws, ss->post_desc, ss->post_dlen, &err);
		return;
	}
	ss->post_active = true;
}

void post_release(struct wsd_session *ss)
{
	int err;

	ss->post_active = false;
	ss->post_split = 0;
	wsd_spi()->lpWSPDeregisterRdmaMemory(ss->ws, ss->post_desc, ss->post_dlen, &err);
}

/*
 * rx_lock held: the offer ends without a WZC answer.  0, or -EINPROGRESS
 * when the sender claimed it first: its WZC record is on its way, and the
 * buffer is the sender's until it comes.
 */
int post_withdraw(struct wsd_sock *s, bool check_claim)
{
	struct wsd_session *ss = s->sess;

	if (!ss || !ss->post_active)
		return 0;
	put_word(ss, W_RX, CW_POST_CANCEL, ss->post_gen);
	if (check_claim && ctl_get(ss, CW_CLAIM) == ss->post_gen)
		return -EINPROGRESS;
	post_release(ss);
	return 0;
}

/*
 * rx_lock held: our open offer was let go unused, because a small record
 * came first (small, a program sending small messages: not one that would
 * have used it) or because the receive left without data: a miss for
 * may_post.  A large DATA record is a large send the sender put in the
 * ring instead, which says nothing of the next one.
 */
void post_missed(struct wsd_session *ss)
{
	if (ss->offer_misses < UINT32_MAX)
		ss->offer_misses++;
}

/* A blocking send splits an offer of at least this many bytes (shm). */
#define SPLIT_MIN (128u << 10)
/* On shm, by default, a receive offers a buffer of at least this many bytes. */
#define SHM_OFFER_MIN (256u << 10)

/*
 * tx_lock held, an offer of gen claimed and not withdrawn: move w->len
 * bytes from buf into it in two parts at once, the first half written by
 * us while the receiver reads the rest from our buffer (REC_SPLIT), then
 * our WZC for the first half, then wait until the receiver has read its
 * part.  1 done, 0 when it could not start (w->len goes as one part), or
 * -errno (the connection is broken).
 */
static int send_split(struct wsd_sock *s, const struct wsd_post *p, struct wsd_wzc *w,
		      uint8_t *buf)
{
	struct wsd_session *ss = s->sess;
	WSPPROC_TABLE *t = wsd_spi();
	struct wsd_split sp = { .gen = w->gen, .wlen = (w->len / 2) & ~(uint64_t)4095 };
	uint32_t dlen = sizeof(sp.zc.desc);
	WSABUFEX b = { .buf = (char *)buf, .len = (uint32_t)sp.wlen };
	int err, r;

	sp.zc.len = w->len - sp.wlen;
	/* both records fit now: the receiver waits for the second */
	if (!fits(ss, 2 * sizeof(sp), false) ||
	    t->lpWSPRegisterRdmaMemory(ss->ws, buf + sp.wlen, (uint32_t)sp.zc.len, MEM_READ,
				       sp.zc.desc, &dlen, &err))
		return 0;
	b.handle = t->lpWSPRegisterMemory(ss->ws, b.buf, b.len, MEM_READ, &err);
	if (!b.handle) {
		t->lpWSPDeregisterRdmaMemory(ss->ws, sp.zc.desc, dlen, &err);
		return 0;
	}
	r = write_record(s, REC_SPLIT, NULL, sizeof(sp), &sp);
	if (!r) {
		ss->zc_sent++;
		ring_data(s);
		r = rdma_put(ss, p->desc, &b, 1, 0);
		if (r)
			r = broken(s, r);
	}
	t->lpWSPDeregisterMemory(ss->ws, b.handle, &err);
	if (!r) {
		w->len = sp.wlen;
		r = write_record(s, REC_WZC, NULL, sizeof(*w), w);
	}
	if (!r) {
		ring_data(s);
		r = wait_room(s, 0, false, true);   /* until our buffer is read */
	}
	t->lpWSPDeregisterRdmaMemory(ss->ws, sp.zc.desc, dlen, &err);
	return r ? r : 1;
}

/*
 * tx_lock held: an offer not yet answered, made where we are.  One made
 * while our last send was still going by ring is void (the receiver lets
 * it go when it reads those records): waiting goes on for the next, which
 * comes when the receiver is back with the ring empty.  A hint only, read
 * while the receiver may be writing a newer one: send_posted checks again.
 */
static bool offer_here(struct wsd_session *ss)
{
	uint64_t gen = ctl_get(ss, CW_POST);

	return gen > ss->post_answered &&
	       __atomic_load_n(&ss->ctl->post.pos, __ATOMIC_ACQUIRE) == ss->tx_pos;
}

/* How long a large blocking send waits for the receiver's offer. */
#define LINGER_NS 100000

/*
 * tx_lock held, a blocking send of len >= SPLIT_MIN on shm: wait briefly
 * for the receiver to offer its buffer (zc_split_wanted said it pays).
 */
void zc_linger(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;
	int64_t end = wsd_spin_until(LINGER_NS);

	while (!offer_here(ss))
		if (!end || !wsd_spin_burst(end))
			return;
}

/* A blocking send of len bytes whose cost zc_split_learn keeps: large, on shm. */
bool zc_split_timed(const struct wsd_session *ss, size_t len)
{
	return ss->peer_map && len >= SPLIT_MIN && len <= WIRE_ZC_MAX && !wsd_chan_copy(ss->ch);
}

/*
 * Large blocking sends on shm go in runs of RUN_SENDS, each run one way
 * (two parts at once, or the ring), timed from the start of its first
 * send to the end of its last: the program's own time between them
 * counts for both ways alike.  A run that tries the way not chosen is
 * TRY_SENDS long, since that way may cost several times the other (two
 * parts from a source not in the caches, measured on 2026-11-27: 0.5 ms a
 * MiB against the ring's 0.06).  After one that did not win, the next
 * comes twice as many runs later, up to TRIAL_GAP_MAX; one that won resets
 * the gap.
 */
#define RUN_SENDS 16
#define TRY_SENDS 4

/*
 * tx_lock held, a blocking send that zc_split_timed starting at now: wait
 * for an offer to move it in two parts (send_split), rather than copy it
 * through the ring?  Which wins depends on the machine and on whether the
 * sender's data is in its caches (wsd-protocol(7), Zero copy).
 */
bool zc_split_wanted(struct wsd_session *ss, int64_t now)
{
	if (!ss->run_n) {
		ss->run_t0 = now;
		ss->run_win = ss->tx_win;
		/*
		 * Two parts only from an empty ring: the receiver offers once it
		 * has read what the ring holds, and a run that waited for that
		 * would time the ring's work.  Else this run goes by ring, and
		 * the next tries again.
		 */
		ss->run_split = ss->run_plan && ctl_get(ss, CW_CONSUMED) == ss->tx_pos;
	}
	return ss->run_split;
}

/*
 * tx_lock held: a send that zc_split_wanted timed moved all its len bytes
 * by now.  At a run's end: its cost in ns per MiB, and the next run's way.
 */
void zc_split_learn(struct wsd_session *ss, size_t len, int64_t now)
{
	bool was = ss->run_split, tried = was != ss->run_best || !ss->run_cost[was], best, count = true;
	uint64_t v = UINT32_MAX / 4, ns = (uint64_t)(now - ss->run_t0);

	ss->run_bytes += len;
	if (++ss->run_n < (tried ? TRY_SENDS : RUN_SENDS))
		return;
	if (now >= ss->run_t0 && ns < (UINT64_MAX >> 21) && ss->run_bytes)
		v = (ns << 20) / ss->run_bytes;
	if (v < 1)
		v = 1;
	if (v > UINT32_MAX / 4)
		v = UINT32_MAX / 4;
	/*
	 * The way in use: averaged, so that one run the machine slowed does
	 * not turn the choice; the other: a fresh measure replaces one from
	 * long ago.
	 */
	/* by ring: the window's size learns from it too, and may try another */
	if (!was) {
		uint32_t win = winsize_run(&ss->win, ss->peer_ring, WIN_MIN, ss->run_win, ss->tx_win,
					   (uint32_t)v, &count);

		if (win > ss->tx_win)
			ss->tx_win = win;
	}
	if (count)
		ss->run_cost[was] = ss->run_cost[was] && !tried ?
			(uint32_t)((3 * (uint64_t)ss->run_cost[was] + v) / 4) : (uint32_t)v;
	ss->run_n = 0;
	ss->run_bytes = 0;
	if (!ss->run_cost[!was]) {
		ss->run_plan = ss->run_best = !was;   /* the other way, measured once */
		return;
	}
	best = ss->run_cost[1] < ss->run_cost[0];
	if (tried) {
		/* the best way unchanged: the try lost */
		ss->explore_gap = trial_gap(ss->explore_gap, best == ss->run_best);
		ss->explore_in = ss->explore_gap;
	}
	ss->run_best = best;
	if (ss->explore_in) {
		ss->explore_in--;
		ss->run_plan = best;
	} else {
		ss->run_plan = !best;
	}
}

/*
 * tx_lock held: the peer offered a buffer and we wrote nothing since: put
 * up to its length of c there, in two parts at once when split (a
 * blocking send on shm: the receiver copies half).  Bytes sent, 0 when the
 * offer is not ours to use, or -errno (the connection is broken).
 */
ssize_t send_posted(struct wsd_sock *s, struct cursor *c, bool split)
{
	struct wsd_session *ss = s->sess;
	WSPPROC_TABLE *t = wsd_spi();
	uint64_t gen = ctl_get(ss, CW_POST);
	struct wsd_wzc w;
	struct wsd_post p;
	const char *why;
	WSABUFEX b;
	int err, r;

	/* (by copy we take no offer: our records reach it first, and it goes) */
	if (gen <= ss->post_answered || c->i >= c->n || wsd_chan_copy(ss->ch))
		return 0;
	memcpy(&p, (const void *)&ss->ctl->post, sizeof(p));
	if (p.gen != gen || ctl_get(ss, CW_POST) != gen)
		return 0;   /* a new offer being written: look again next time */
	ss->post_answered = gen;
	if (wsd_wire_post_check(&p, gen, ss->tx_pos, &why)) {
		protocol_fail(ss, why);
		return -ECONNRESET;
	}
	if (p.pos != ss->tx_pos || !fits(ss, sizeof(w), false) ||
	    put_word(ss, W_TX, CW_CLAIM, gen))
		return 0;   /* our records reach it first: the peer lets the offer go */
	w.gen = gen;
	w.len = c->iov[c->i].iov_len - c->off;
	if (w.len > p.len)
		w.len = p.len;
	b.buf = (char *)c->iov[c->i].iov_base + c->off;
	if (ctl_get(ss, CW_POST_CANCEL) >= gen)
		w.len = 0;  /* withdrawn, but the peer may have seen our claim: answer */
	if (split && w.len >= SPLIT_MIN) {
		uint64_t all = w.len;

		r = send_split(s, &p, &w, (uint8_t *)b.buf);
		if (r < 0)
			return r;
		if (r > 0) {
			cur_skip(c, (size_t)all);
			wsd_stat_add(s->stat, &s->stat->zcopy_tx, all);
			return (ssize_t)all;
		}
	}
	if (w.len) {
		b.len = (uint32_t)w.len;
		b.handle = t->lpWSPRegisterMemory(ss->ws, b.buf, b.len, MEM_READ, &err);
		if (!b.handle) {
			w.len = 0;
		} else {
			r = rdma_put(ss, p.desc, &b, 1, 0);
			t->lpWSPDeregisterMemory(ss->ws, b.handle, &err);
			if (r)
				return broken(s, r);
		}
	}
	r = write_record(s, REC_WZC, NULL, sizeof(w), &w);
	if (r)
		return r;
	ring_data(s);
	cur_skip(c, (size_t)w.len);
	wsd_stat_add(s->stat, &s->stat->zcopy_tx, w.len);
	return (ssize_t)w.len;
}

int zc_read(struct wsd_sock *s, struct wsd_zc *z, uint32_t at, struct cursor *c,
	    size_t n)
{
	struct wsd_session *ss = s->sess;
	WSPPROC_TABLE *t = wsd_spi();
	WSABUFEX b[WSP_MAX_BUFFERS];
	struct cursor k = *c;
	WSAOVERLAPPED ov = { .hEvent = (void *)1 };
	uint32_t nb = 0, got;
	size_t left = n;
	int err = 0, r;

	while (left && nb < WSP_MAX_BUFFERS && k.i < k.n) {
		size_t seg = k.iov[k.i].iov_len - k.off;

		if (seg > left)
			seg = left;
		b[nb].buf = (char *)k.iov[k.i].iov_base + k.off;
		b[nb].len = (uint32_t)seg;
		b[nb].handle = t->lpWSPRegisterMemory(ss->ws, b[nb].buf, b[nb].len, MEM_WRITE,
						      &err);
		if (!b[nb].handle) {
			r = -wsa_errno(err);
			goto out;
		}
		nb++;
		left -= seg;
		cur_skip(&k, seg);
	}
	r = t->lpWSPRdmaRead(ss->ws, b, nb, z->desc, sizeof(z->desc), at, &got, 0, &ov, NULL,
			     NULL, &err);
	r = rdma_done(ss->ws, &ov, r, err);
	if (r == -EFAULT) {
		/* our buffers are registered: it is the peer's descriptor the provider refused */
		protocol_fail(ss, "ZC: descriptor refused by the provider");
		r = -ECONNRESET;
	}
	if (!r)
		r = (int)(n - left);
out:
	for (uint32_t i = 0; i < nb; i++)
		t->lpWSPDeregisterMemory(ss->ws, b[i].handle, &err);
	return r;
}

/*
 * The zero-copy threshold for this session.  By default, where the sender
 * stores into a mapped ring (shm: our own sends, we mapped the peer's
 * region; an offer for the peer's, it mapped ours), no read-based zero
 * copy, and offers of 256 KiB and more, which a blocking sender answers in
 * two parts when that has been faster than the ring (zc_split_wanted).
 */
uint32_t zc_threshold(struct wsd_session *ss, bool as_receiver)
{
	const struct wsd_switch_params *p = wsd_switch_params();

	/* another user's memory is not ours, nor ours its (by copy): none at all */
	if (wsd_chan_copy(ss->ch))
		return UINT32_MAX;
	if (p->zcopy_by_path && (as_receiver ? ctl_get(ss, CW_MAPPED) == 1 : ss->peer_map != NULL))
		return as_receiver ? 4 * SHM_OFFER_MIN : UINT32_MAX;
	return p->zcopy_threshold;
}

/*
 * rx_lock held: worth offering the buffer at c to the sender (write-based
 * zero copy)?  With the default threshold on shm, where a program may
 * well receive small messages into a large buffer, an offer costs the
 * receive a registration: after four offers in a row let go unused, only
 * one chance in 32 offers, until one is used again.
 */
bool may_post(struct wsd_sock *s, const struct cursor *c, int flags)
{
	struct wsd_session *ss = s->sess;

	if ((flags & MSG_PEEK) || !ss || s->rx_mode != DIR_RING || s->rx_back || s->pre ||
	    ss->post_active || c->i >= c->n || wsd_chan_copy(ss->ch) ||
	    c->iov[c->i].iov_len - c->off < zc_threshold(ss, true) / 4)
		return false;
	if (!wsd_switch_params()->zcopy_by_path || ctl_get(ss, CW_MAPPED) != 1 ||
	    ss->offer_misses < 4)
		return true;
	return ++ss->offer_chances % 32 == 0;
}

/*
 * rx_lock held: a receive leaves with n (bytes or -errno).  An offer still
 * open is withdrawn; if the sender claimed it first, its data is on its
 * way into the buffer, which stays the sender's until its WZC record
 * comes: wait for that, and return its bytes.
 */
ssize_t post_settle(struct wsd_sock *s, struct cursor *c, int flags, ssize_t n)
{
	struct wsd_session *ss = s->sess;

	if (!ss || !ss->post_active)
		return n;
	if (post_withdraw(s, true) != -EINPROGRESS) {
		post_missed(ss);
		return n;
	}
	for (int64_t end = wsd_now_ms() + 10000; ss->post_active;) {
		struct pollfd p = { .fd = s->fd, .events = POLLIN };
		ssize_t k = rx_step(s, c, flags);

		if (k > 0) {
			/* bytes came after the error: they first, the error at the next call */
			if (n < 0 && n != -EINTR && n != -EAGAIN && n != -EBADF && !s->tcp_err) {
				s->tcp_eof = false;   /* the end the error left comes after it */
				keep_error(s, (int)-n);
			}
			return n > 0 ? n + k : k;
		}
		if ((k < 0 && k != -EAGAIN) || k == 0 || wsd_now_ms() > end) {
			/* the sender died or broke: nobody writes there any more */
			post_release(ss);
			break;
		}
		pthread_mutex_unlock(&s->rx_lock);
		real.poll(&p, 1, 1);
		pthread_mutex_lock(&s->rx_lock);
	}
	return n;
}

ssize_t send_zc(struct wsd_sock *s, const void *buf, size_t len)
{
	struct wsd_session *ss = s->sess;
	WSPPROC_TABLE *t = wsd_spi();
	struct wsd_zc z = { .len = len };
	uint32_t dlen = sizeof(z.desc);
	int err, r;

	if (t->lpWSPRegisterRdmaMemory(ss->ws, (void *)buf, (uint32_t)len, MEM_READ, z.desc,
				       &dlen, &err))
		return -wsa_errno(err);
	r = wait_room(s, sizeof(z), false, false);
	if (r == 1) {
		/* back to the stream: the caller sends it there */
		t->lpWSPDeregisterRdmaMemory(ss->ws, z.desc, dlen, &err);
		return 0;
	}
	if (!r)
		r = write_record(s, REC_ZC, NULL, sizeof(z), &z);
	if (!r) {
		ss->zc_sent++;
		ring_data(s);
		r = wait_room(s, 0, false, true);
	}
	t->lpWSPDeregisterRdmaMemory(ss->ws, z.desc, dlen, &err);
	if (r)
		return r;
	wsd_stat_add(s->stat, &s->stat->zcopy_tx, len);
	return (ssize_t)len;
}

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
 * tx_lock held: the peer offered a buffer and we wrote nothing since: put
 * up to its length of c there.  Bytes sent, 0 when the offer is not ours
 * to use, or -errno (the connection is broken).
 */
ssize_t send_posted(struct wsd_sock *s, struct cursor *c)
{
	struct wsd_session *ss = s->sess;
	WSPPROC_TABLE *t = wsd_spi();
	uint64_t gen = ctl_get(ss, CW_POST);
	struct wsd_wzc w;
	struct wsd_post p;
	const char *why;
	WSABUFEX b;
	int err, r;

	if (gen <= ss->post_answered || c->i >= c->n)
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
	if (ctl_get(ss, CW_POST_CANCEL) >= gen) {
		w.len = 0;  /* withdrawn, but the peer may have seen our claim: answer */
	} else {
		b.buf = (char *)c->iov[c->i].iov_base + c->off;
		b.len = (uint32_t)w.len;
		b.handle = t->lpWSPRegisterMemory(ss->ws, b.buf, b.len, MEM_READ, &err);
		if (!b.handle)
			w.len = 0;
		else {
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
 * The zero-copy threshold for this session: by default none where the
 * sender stores into a mapped ring (our own sends: we mapped the peer's
 * region; an offer for the peer's: it mapped ours).
 */
uint32_t zc_threshold(struct wsd_session *ss, bool as_receiver)
{
	const struct wsd_switch_params *p = wsd_switch_params();

	if (p->zcopy_by_path && (as_receiver ? ctl_get(ss, CW_MAPPED) == 1 : ss->peer_map != NULL))
		return UINT32_MAX;
	return p->zcopy_threshold;
}

/* rx_lock held: worth offering the buffer at c to the sender (write-based zero copy)? */
bool may_post(struct wsd_sock *s, const struct cursor *c, int flags)
{
	return !(flags & MSG_PEEK) && s->sess && s->rx_mode == DIR_RING && !s->rx_back &&
	       !s->pre && !s->sess->post_active && c->i < c->n &&
	       c->iov[c->i].iov_len - c->off >= zc_threshold(s->sess, true) / 4;
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

	if (!ss || !ss->post_active || post_withdraw(s, true) != -EINPROGRESS)
		return n;
	for (int64_t end = wsd_now_ms() + 10000; ss->post_active;) {
		struct pollfd p = { .fd = s->fd, .events = POLLIN };
		ssize_t k = rx_step(s, c, flags);

		if (k > 0)
			return n > 0 ? n + k : k;
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

/* SPDX-License-Identifier: MIT */
/*
 * shm data path, run under the adapter lock from whichever thread posts or
 * polls.  Outbound requests execute in order: sends stream into our ring,
 * reads and writes copy with process_vm_readv/writev (not with a peer of
 * another user: "copy" connections carry sends alone), binds and
 * invalidates edit our window table.  A send's result waits until the peer
 * has consumed it, so the peer's verdict (overflow, bad window) reaches us.
 *
 * Doorbells: a side about to sleep sets an armed flag and re-checks; the
 * other side, after publishing, checks the flag and writes the sleeper's
 * eventfd.  Both sides put a full fence between the two steps, so one of
 * them always sees the other.
 *
 * The peer can write anything anywhere in the mapping at any time.  Sizes
 * come from struct shm_conn only; positions we own are kept there too;
 * each value the peer publishes (its head, our tail, a message header, a
 * window entry, a failure verdict) passes one check_* function below
 * before it is used, and a value no correct peer writes breaks the
 * connection (broken(): ND_CONNECTION_ABORTED), never our memory.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "provider/shm/shm.h"

#define MSG_ALIGN 32u   /* a header never straddles the end of the ring */
#define HDR sizeof(struct shm_msg)

static inline uint64_t stamp_of(uint64_t key, uint64_t pos)
{
	return (pos + 1) ^ key;
}

static inline struct shm_msg *slot_at(uint8_t *ring, uint32_t size, uint64_t pos)
{
	return (struct shm_msg *)(ring + (pos & (size - 1)));
}

static inline uint64_t msg_pad(uint64_t n)
{
	return (n + MSG_ALIGN - 1) & ~(uint64_t)(MSG_ALIGN - 1);
}

/*
 * After publishing, wake the other side if it is asleep.  With membarrier
 * the sleeper pays for the store-load ordering (see shm_arm), so the hot
 * path needs only a compiler barrier; without it, a full fence here.
 */
/*
 * The peer's doorbell: its CQ's eventfd; a peer of another user (copy)
 * gave none, as it could make our write to it block (clear O_NONBLOCK on
 * the file both share, or fill the count), and is rung by a byte on the
 * connection's socket, which its CQ watches, sent without waiting (a flag
 * of the call, which the peer cannot change).  A full socket means bytes
 * the peer has not read yet: it is awake already, or will be.
 */
static void bell(const struct shm_conn *c, int efd)
{
	if (efd >= 0)
		(void)eventfd_write(efd, 1);
	else
		(void)send(c->sock, "", 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

static void ring_bell(const struct shm_conn *c, _Atomic uint32_t *armed, int efd)
{
	if (c->fast_bell)
		atomic_signal_fence(memory_order_seq_cst);
	else
		atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit(armed, memory_order_relaxed) &&
	    atomic_exchange(armed, 0))
		bell(c, efd);
}

/* Copy between an SGL (at byte offset off) and a ring (at position pos). */
static void ring_copy(uint8_t *ring, uint32_t size, uint64_t pos, const struct nd_sge *sgl,
		      uint32_t nsge, uint64_t off, uint64_t n, int to_ring)
{
	uint32_t i = 0;

	while (i < nsge && off >= sgl[i].length) {
		off -= sgl[i].length;
		i++;
	}
	while (n) {
		uint8_t *p = (uint8_t *)sgl[i].addr + off;
		uint64_t chunk = sgl[i].length - off;
		uint32_t at = (uint32_t)(pos & (size - 1));

		if (chunk > n)
			chunk = n;
		if (chunk > size - at)
			chunk = size - at;
		if (to_ring)
			memcpy(ring + at, p, chunk);
		else
			memcpy(p, ring + at, chunk);
		pos += chunk;
		off += chunk;
		n -= chunk;
		if (off == sgl[i].length) {
			off = 0;
			i++;
		}
	}
}


/* Fail a request: it carries the status, the connection ends. */
static void wr_fail(struct nd_ep *ep, struct nd_wr *wr, nd_status st)
{
	wr->status = st;
	wr->executed = true;
	wsd_ep_terminate(ep);
}

static void push_recv(struct nd_ep *ep, nd_status st, uint64_t bytes, uint32_t flags);

/*
 * The peer broke the protocol.  The oldest unfinished request and a posted
 * receive say so with ND_CONNECTION_ABORTED; the rest are flushed.
 */
static void broken(struct nd_ep *ep, struct shm_conn *c)
{
	if (ep->state != EP_CONNECTED)
		return;
	for (uint64_t i = ep->sq_done; i < ep->sq_tail; i++) {
		struct nd_wr *wr = &ep->sq[i % ep->attr.outbound_entries];

		if (!wr->executed) {
			wr->status = ND_CONNECTION_ABORTED;
			wr->executed = true;
			break;
		}
	}
	if (ep->rq_head != ep->rq_tail && !wsd_cq_full(ep->attr.inbound_cq))
		push_recv(ep, ND_CONNECTION_ABORTED, 0, 0);
	c->in_msg = 0;
	wsd_ep_terminate(ep);
}

/* ---- checks on what the peer wrote ------------------------------------- */

/*
 * Our ring's tail, as the peer consumed it: between the last one it gave
 * and our head.  0, or -EPROTO.
 */
static int check_tx_tail(struct shm_conn *c, uint64_t tail)
{
	if (tail - c->tx_tail > c->tx_head - c->tx_tail)
		return -EPROTO;
	c->tx_tail = tail;
	return 0;
}

/* The peer's head while we stream a message out of its ring. */
static int check_rx_head(const struct shm_conn *c, uint64_t head)
{
	return head - c->rx_tail <= c->ring_size ? 0 : -EPROTO;
}

/* A message header: a known op and flags, and a whole message fits the ring. */
static int check_msg(const struct shm_conn *c, const struct shm_msg *m)
{
	if (m->op != ND_OP_SEND && m->op != ND_OP_SEND_INVALIDATE)
		return -EPROTO;
	if (m->flags & ~(SHM_MSG_SOLICIT | SHM_MSG_STREAM))
		return -EPROTO;
	if (!(m->flags & SHM_MSG_STREAM) && msg_pad(HDR + (uint64_t)m->len) > c->ring_size)
		return -EPROTO;
	return 0;
}

/* The verdict on one of our sends: we only ever write ND_REMOTE_ERROR there. */
static int check_fail(uint32_t status)
{
	return status == 0 || status == ND_REMOTE_ERROR ? 0 : -EPROTO;
}

/* ---- windows ----------------------------------------------------------- */

static int window_slot_free(struct shm_conn *c)
{
	for (uint32_t i = 0; i < c->nwindows; i++)
		if (!c->mws[i])
			return (int)i;
	return -1;
}

static void window_write(struct shm_window *w, uint64_t token, uint64_t base, uint64_t len,
			 uint32_t access)
{
	uint64_t s = atomic_load_explicit(&w->seq, memory_order_relaxed);

	atomic_store_explicit(&w->seq, s + 1, memory_order_relaxed);
	atomic_thread_fence(memory_order_release);
	w->token = token;
	w->base = base;
	w->length = len;
	w->access = access;
	atomic_store_explicit(&w->seq, s + 2, memory_order_release);
}

struct win_snap {
	uint64_t seq, token, base, length;
	uint32_t access;
	struct shm_window *w;
};

/* A window entry: known rights, and a range that does not wrap. */
static int check_window(const struct win_snap *s)
{
	if (s->access & ~(uint32_t)(ND_OP_FLAG_ALLOW_READ | ND_OP_FLAG_ALLOW_WRITE))
		return -EPROTO;
	return s->length <= UINT64_MAX - s->base ? 0 : -EPROTO;
}

/*
 * A consistent copy of an entry.  Its owner holds seq odd for a few stores;
 * one held odd (or changing) for WINDOW_TORN_MS is a broken peer, not a
 * busy one, and must not keep us here.
 */
#define WINDOW_TORN_MS 200

static int window_snap(struct shm_window *w, struct win_snap *s)
{
	int64_t give_up = -1;

	for (unsigned spins = 0;; spins++) {
		s->seq = atomic_load_explicit(&w->seq, memory_order_acquire);
		s->token = w->token;
		s->base = w->base;
		s->length = w->length;
		s->access = w->access;
		atomic_thread_fence(memory_order_acquire);
		if (!(s->seq & 1) && s->seq == atomic_load_explicit(&w->seq, memory_order_relaxed))
			return 0;
		if (spins < 64)
			continue;
		if (give_up < 0)
			give_up = wsd_now_ms() + WINDOW_TORN_MS;
		else if (wsd_now_ms() > give_up)
			return -EPROTO;
		sched_yield();
	}
}

/* Find a live window of the peer by token: 0 if found, -ENOENT, or -EPROTO. */
static int window_find(struct shm_conn *c, uint64_t token, struct win_snap *out)
{
	uint32_t n = c->nwindows;

	for (uint32_t k = 0; k < n; k++) {
		uint32_t i = (c->last_slot + k) % n;
		struct shm_window *w = &c->rx->windows[i];
		struct win_snap s;

		if (window_snap(w, &s) < 0)
			return -EPROTO;
		if (s.access && s.token == token) {
			if (check_window(&s) < 0)
				return -EPROTO;
			s.w = w;
			*out = s;
			c->last_slot = i;
			return 0;
		}
	}
	return -ENOENT;
}

nd_status shm_remote_check(struct nd_ep *ep, uint64_t addr, uint64_t len, uint64_t token,
			   uint32_t access)
{
	struct win_snap s;

	(void)access;
	if (window_find(ep->tpriv, token, &s) < 0)
		return ND_SUCCESS;   /* dead or broken window: the request fails when it runs */
	if (addr < s.base || addr - s.base > s.length || len > s.length - (addr - s.base))
		return ND_REMOTE_ERROR;
	return ND_SUCCESS;
}

static void mw_revoke(struct shm_conn *c, struct nd_mw *mw)
{
	window_write(&c->tx->windows[mw->slot], 0, 0, 0, 0);
	c->mws[mw->slot] = NULL;
	wsd_mw_unbind(mw);
}

/* ---- outbound ---------------------------------------------------------- */

/* Is the peer process still there?  pidfd turns readable when it exits. */
static int peer_alive(struct shm_conn *c)
{
	struct pollfd p = { .fd = c->pidfd, .events = POLLIN };
	int r;

	/* a signal caught here (the caller's SIGALRM) says nothing of the peer */
	do
		r = poll(&p, 1, 0);
	while (r < 0 && errno == EINTR);
	return r == 0;
}

static void exec_rdma(struct nd_ep *ep, struct shm_conn *c, struct nd_wr *wr)
{
	uint32_t need = wr->op == ND_OP_READ ? ND_OP_FLAG_ALLOW_READ : ND_OP_FLAG_ALLOW_WRITE;
	struct iovec liov[32], riov;
	struct win_snap s;
	nd_status st;
	uint64_t off;

	/* another user's memory is not ours to read or write (copy) */
	if (c->copy)
		return wr_fail(ep, wr, ND_ACCESS_VIOLATION);
	st = wsd_sgl_check(wr->sgl, wr->nsge,
		       wr->op == ND_OP_READ ? ND_MR_FLAG_ALLOW_LOCAL_WRITE : 0);
	if (st != ND_SUCCESS)
		return wr_fail(ep, wr, st);
	if (wr->op == ND_OP_READ && !c->peer_read_limit)
		return wr_fail(ep, wr, ND_INVALID_REQUEST);   /* the peer takes no reads */
	switch (window_find(c, wr->remote_token, &s)) {
	case 0:
		break;
	case -ENOENT:
		return wr_fail(ep, wr, ND_ACCESS_VIOLATION);
	default:
		return broken(ep, c);
	}
	if (!(s.access & need))
		return wr_fail(ep, wr, ND_ACCESS_VIOLATION);
	if (wr->remote_addr < s.base || wr->remote_addr - s.base > s.length ||
	    wr->length > s.length - (wr->remote_addr - s.base))
		return wr_fail(ep, wr, ND_REMOTE_ERROR);
	if (!peer_alive(c))
		return wr_fail(ep, wr, ND_TIMEOUT);
	wsd_sge_to_iov(wr->sgl, wr->nsge, liov);
	off = 0;
	while (off < wr->length) {
		struct iovec l[32];
		uint32_t n = 0;
		uint64_t skip = off;
		ssize_t got;

		/* the part of the SGL not yet moved */
		for (uint32_t i = 0; i < wr->nsge; i++) {
			if (skip >= liov[i].iov_len) {
				skip -= liov[i].iov_len;
				continue;
			}
			l[n].iov_base = (uint8_t *)liov[i].iov_base + skip;
			l[n].iov_len = liov[i].iov_len - skip;
			skip = 0;
			n++;
		}
		riov.iov_base = (void *)(uintptr_t)(wr->remote_addr + off);
		riov.iov_len = wr->length - off;
		if (wr->op == ND_OP_READ)
			got = process_vm_readv(c->peer_pid, l, n, &riov, 1, 0);
		else
			got = process_vm_writev(c->peer_pid, l, n, &riov, 1, 0);
		if (got <= 0)
			return wr_fail(ep, wr, got < 0 && errno == ESRCH ? ND_TIMEOUT : ND_FAILURE);
		off += (uint64_t)got;
	}
	/* The owner may have invalidated or died while we copied. */
	if (atomic_load_explicit(&s.w->seq, memory_order_acquire) != s.seq)
		return wr_fail(ep, wr, ND_ACCESS_VIOLATION);
	if (!peer_alive(c))
		return wr_fail(ep, wr, ND_TIMEOUT);
	if (wr->op == ND_OP_READ && (wr->flags & ND_OP_FLAG_RDMA_READ_LOCAL_INVALIDATE) &&
	    wr->nsge)
		wsd_mr_local_invalidate(wr->sgl[0].mr);
	wr->done = wr->length;
	wr->status = ND_SUCCESS;
	wr->executed = true;
}

/* Our tail as the peer left it, checked; -1 when that broke the connection. */
static int sync_tx_tail(struct nd_ep *ep, struct shm_conn *c)
{
	if (check_tx_tail(c, atomic_load_explicit(&c->tx->tail, memory_order_acquire)) < 0) {
		broken(ep, c);
		return -1;
	}
	return 0;
}

/* Publish our head: the private copy is the one we go on from. */
static void publish_head(struct shm_conn *c, uint64_t head, memory_order mo)
{
	c->tx_head = head;
	atomic_store_explicit(&c->tx->head, head, mo);
}

/* Put as much of a send into the ring as fits.  1 when all of it is in (or it failed). */
static int exec_send(struct nd_ep *ep, struct shm_conn *c, struct nd_wr *wr)
{
	struct shm_half *h = c->tx;
	uint32_t size = c->ring_size;
	uint64_t head = c->tx_head, tail, space, n;

	if (sync_tx_tail(ep, c) < 0)
		return 1;
	tail = c->tx_tail;
	space = size - (head - tail);

	if (!wr->started) {
		uint64_t total = msg_pad(HDR + wr->length);
		struct shm_msg *m = slot_at(c->tx_ring, size, head);
		nd_status st = wsd_sgl_check(wr->sgl, wr->nsge, 0);

		if (st != ND_SUCCESS) {
			wr_fail(ep, wr, st);
			return 1;
		}
		if (space < HDR + MSG_ALIGN && total > space)
			return 0;
		m->len = (uint32_t)wr->length;
		m->op = (uint8_t)wr->op;
		m->flags = (wr->flags & ND_OP_FLAG_SEND_AND_SOLICIT_EVENT) ? SHM_MSG_SOLICIT : 0;
		m->token = wr->remote_token;
		wr->ring_start = head;
		wr->started = true;
		if (total <= space) {
			/* The whole message fits: payload first, the stamp publishes it. */
			ring_copy(c->tx_ring, size, head + HDR, wr->sgl, wr->nsge, 0, wr->length, 1);
			wr->done = wr->length;
			wr->ring_end = head + total;
			c->tx_head = head + total;
			atomic_store_explicit(&m->stamp, stamp_of(c->tx_key, head),
					      memory_order_release);
			atomic_store_explicit(&h->head, head + total, memory_order_relaxed);
			ring_bell(c, &h->cons_armed, c->peer_in_efd);
			return 1;
		}
		m->flags |= SHM_MSG_STREAM;
		publish_head(c, head + HDR, memory_order_relaxed);
		atomic_store_explicit(&m->stamp, stamp_of(c->tx_key, head), memory_order_release);
		head += HDR;
		space -= HDR;
	}
	n = wr->length - wr->done;
	if (n > space)
		n = space;
	if (n) {
		ring_copy(c->tx_ring, size, head, wr->sgl, wr->nsge, wr->done, n, 1);
		head += n;
		wr->done += n;
	}
	if (wr->done == wr->length) {
		uint64_t end = wr->ring_start + msg_pad(HDR + wr->length);

		if (end - tail > size) {
			/* room for the data but not yet for the padding */
			publish_head(c, head, memory_order_release);
			ring_bell(c, &h->cons_armed, c->peer_in_efd);
			return 0;
		}
		head = end;
		wr->ring_end = end;
	}
	publish_head(c, head, memory_order_release);
	ring_bell(c, &h->cons_armed, c->peer_in_efd);
	return wr->done == wr->length;
}

static void exec_bind(struct nd_ep *ep, struct shm_conn *c, struct nd_wr *wr)
{
	int slot = window_slot_free(c);
	struct nd_mw *mw = wr->mw;

	/* a window a peer of another user could never use: none is published */
	if (c->copy)
		return wr_fail(ep, wr, ND_NOT_SUPPORTED);
	if (slot < 0)
		return wr_fail(ep, wr, ND_INSUFFICIENT_RESOURCES);
	mw->slot = (uint32_t)slot;
	c->mws[slot] = mw;
	window_write(&c->tx->windows[slot], mw->desc.token, mw->desc.base, mw->desc.length,
		     wr->bind_flags);
	wr->status = ND_SUCCESS;
	wr->executed = true;
}

static void run_outbound(struct nd_ep *ep, struct shm_conn *c)
{
	while (ep->state == EP_CONNECTED && ep->sq_exec < ep->sq_tail) {
		struct nd_wr *wr = &ep->sq[ep->sq_exec % ep->attr.outbound_entries];

		if (wr->deferred)
			break;
		switch (wr->op) {
		case ND_OP_SEND:
		case ND_OP_SEND_INVALIDATE:
			if (!exec_send(ep, c, wr))
				return;
			break;
		case ND_OP_READ:
		case ND_OP_WRITE:
			exec_rdma(ep, c, wr);
			break;
		case ND_OP_BIND:
			exec_bind(ep, c, wr);
			break;
		case ND_OP_INVALIDATE:
			if (wr->mw->ep == ep)
				mw_revoke(c, wr->mw);
			wr->status = ND_SUCCESS;
			wr->executed = true;
			break;
		default:
			wr_fail(ep, wr, ND_INVALID_PARAMETER);
		}
		if (ep->state == EP_CONNECTED)
			ep->sq_exec++;
	}
}

/* Sends the peer has consumed are done; the peer's verdict decides how. */
static void reap_sends(struct nd_ep *ep, struct shm_conn *c)
{
	uint32_t fail = atomic_load_explicit(&c->tx->fail_status, memory_order_acquire);
	uint64_t fail_pos = atomic_load_explicit(&c->tx->fail_pos, memory_order_relaxed);
	uint64_t tail;

	if (ep->state != EP_CONNECTED)
		return;
	if (check_fail(fail) < 0 || sync_tx_tail(ep, c) < 0)
		return broken(ep, c);
	tail = c->tx_tail;

	for (uint64_t i = ep->sq_done; i < ep->sq_exec; i++) {
		struct nd_wr *wr = &ep->sq[i % ep->attr.outbound_entries];

		if (wr->executed)
			continue;
		if (fail && wr->ring_start == fail_pos) {
			wr_fail(ep, wr, (nd_status)fail);
			return;
		}
		if (tail < wr->ring_end)
			return;
		wr->status = ND_SUCCESS;
		wr->executed = true;
	}
}

/* ---- inbound ----------------------------------------------------------- */

/* Tell the peer its message at pos failed, and end the connection. */
static void rx_fail(struct nd_ep *ep, struct shm_conn *c, nd_status peer_status)
{
	atomic_store_explicit(&c->rx->fail_pos, c->cur_start, memory_order_relaxed);
	atomic_store_explicit(&c->rx->fail_status, peer_status, memory_order_release);
	wsd_ep_terminate(ep);
}

static void push_recv(struct nd_ep *ep, nd_status st, uint64_t bytes, uint32_t flags)
{
	struct nd_rwr *rw = &ep->rq[ep->rq_head % ep->attr.inbound_entries];
	struct nd_result r = { .status = st, .op = ND_OP_RECEIVE, .bytes = bytes,
			       .request_context = rw->context, .flags = flags };

	wsd_cq_push(ep->attr.inbound_cq, &r);
	ep->rq_head++;
}

/* Apply a send-and-invalidate to our own table.  The two results go in order. */
static int rx_invalidate(struct nd_ep *ep, struct shm_conn *c)
{
	struct nd_result r = { .op = ND_OP_REMOTE_INVALIDATE };

	for (uint32_t i = 0; i < c->nwindows; i++) {
		struct nd_mw *mw = c->mws[i];

		if (mw && mw->desc.token == c->cur.token) {
			r.status = ND_SUCCESS;
			r.request_context = mw->bind_context;
			mw_revoke(c, mw);
			wsd_cq_push(ep->attr.inbound_cq, &r);
			return 0;
		}
	}
	r.status = ND_INVALIDATION_ERROR;
	wsd_cq_push(ep->attr.inbound_cq, &r);
	return -1;
}

/* Is a message header waiting at the consumer's position? */
static int rx_stamped(struct shm_conn *c, uint64_t tail)
{
	struct shm_msg *m = slot_at(c->rx_ring, c->ring_size, tail);

	return atomic_load_explicit(&m->stamp, memory_order_acquire) == stamp_of(c->rx_key, tail);
}

static void run_inbound(struct nd_ep *ep, struct shm_conn *c)
{
	struct shm_half *h = c->rx;
	uint32_t size = c->ring_size;
	uint64_t tail = c->rx_tail;
	uint64_t start_tail = tail;

	while (ep->state == EP_CONNECTED) {
		uint64_t end, n, avail;
		struct nd_rwr *rw;
		uint32_t fl;

		if (!c->in_msg) {
			struct shm_msg *m = slot_at(c->rx_ring, size, tail);
			nd_status st;

			if (!rx_stamped(c, tail))
				break;
			/* Room for the invalidate result and the receive's. */
			if (ep->rq_head == ep->rq_tail ||
			    ep->attr.inbound_cq->depth - ep->attr.inbound_cq->count < 2)
				break;
			/* one copy of the header: the peer may rewrite it meanwhile */
			c->cur.len = m->len;
			c->cur.op = m->op;
			c->cur.flags = m->flags;
			c->cur.token = m->token;
			c->cur_start = tail;
			c->cur_done = 0;
			if (check_msg(c, &c->cur) < 0) {
				broken(ep, c);
				break;
			}
			rw = &ep->rq[ep->rq_head % ep->attr.inbound_entries];
			st = wsd_sgl_check(rw->sgl, rw->nsge, ND_MR_FLAG_ALLOW_LOCAL_WRITE);
			if (st == ND_SUCCESS && c->cur.len > rw->length)
				st = ND_BUFFER_OVERFLOW;
			if (st != ND_SUCCESS) {
				push_recv(ep, st, 0, 0);
				rx_fail(ep, c, ND_REMOTE_ERROR);
				break;
			}
			tail += HDR;
			c->in_msg = 1;
		}
		rw = &ep->rq[ep->rq_head % ep->attr.inbound_entries];
		end = c->cur_start + msg_pad(HDR + c->cur.len);
		n = c->cur.len - c->cur_done;
		if (c->cur.flags & SHM_MSG_STREAM) {
			/* streamed: only what the producer has published so far */
			uint64_t head = atomic_load_explicit(&h->head, memory_order_acquire);

			c->rx_tail = tail;
			if (check_rx_head(c, head) < 0) {
				broken(ep, c);
				break;
			}
			avail = head - tail;
			if (n > avail)
				n = avail;
			if (n == c->cur.len - c->cur_done && head < end)
				avail = 0;   /* all data, but the padding is not published yet */
			else
				avail = 1;
		} else {
			avail = 1;
		}
		if (n) {
			ring_copy(c->rx_ring, size, tail, rw->sgl, rw->nsge, c->cur_done, n, 0);
			c->cur_done += n;
			tail += n;
		}
		if (c->cur_done < c->cur.len || !avail)
			break;
		fl = (c->cur.flags & SHM_MSG_SOLICIT) ? ND_RESULT_FLAG_SOLICITED : 0;
		tail = end;
		c->in_msg = 0;
		if (c->cur.op == ND_OP_SEND_INVALIDATE && rx_invalidate(ep, c) < 0) {
			push_recv(ep, ND_INVALIDATION_ERROR, c->cur.len, fl);
			rx_fail(ep, c, ND_REMOTE_ERROR);
			break;
		}
		push_recv(ep, ND_SUCCESS, c->cur.len, fl);
	}
	c->rx_tail = tail;
	if (tail != start_tail) {
		atomic_store_explicit(&h->tail, tail, memory_order_release);
		ring_bell(c, &h->prod_armed, c->peer_out_efd);
	}
}

void shm_progress(struct nd_ep *ep)
{
	struct shm_conn *c = ep->tpriv;

	if (ep->state != EP_CONNECTED)
		return;
	if (!shm_layout_intact(c))
		return broken(ep, c);
	if (atomic_load_explicit(&c->rx->closed, memory_order_acquire)) {
		/* Take what the peer sent before it left, then end. */
		run_inbound(ep, c);
		reap_sends(ep, c);
		wsd_ep_terminate(ep);
		return;
	}
	reap_sends(ep, c);
	run_outbound(ep, c);
	run_inbound(ep, c);
	reap_sends(ep, c);
}

/*
 * A peer of another user (copy) rings on the connection's socket (bell)
 * and hands descriptors over it (shm_fd_send): read what waits there, at
 * most 16 records, the descriptors kept in order (SHM_FDS_MAX at most: a
 * peer that sends more gets them closed).  -1 at the socket's end or
 * error, else 0.
 */
static int copy_drain(struct shm_conn *c)
{
	for (int k = 0; k < 16; k++) {
		union {
			char buf[CMSG_SPACE(sizeof(int) * 4)];
			struct cmsghdr align;
		} u;
		char b[64];
		struct iovec v = { b, sizeof(b) };
		struct msghdr mh = { .msg_iov = &v, .msg_iovlen = 1, .msg_control = u.buf,
				     .msg_controllen = sizeof(u.buf) };
		ssize_t n = recvmsg(c->sock, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);

		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
			return -1;
		if (n < 0)
			return 0;
		for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
			int got, fds[4];

			if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
				continue;
			got = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
			memcpy(fds, CMSG_DATA(cm), sizeof(int) * (size_t)(got < 4 ? got : 4));
			for (int i = 0; i < got && i < 4; i++) {
				if (c->nfds < SHM_FDS_MAX)
					c->fds[c->nfds++] = fds[i];
				else
					close(fds[i]);
			}
		}
	}
	return 0;
}

/*
 * Is the peer gone without saying so (killed)?  Its socket reads EOF.  A
 * peer of another user's bells are read here (copy_drain), before the CQ
 * sleeps, or they would keep it awake; a peer that sends more than we
 * read is only woken up for, as by its data.
 */
static int peer_vanished(struct shm_conn *c)
{
	char b;
	ssize_t n;

	if (c->copy)
		return copy_drain(c) < 0;
	n = recv(c->sock, &b, 1, MSG_DONTWAIT | MSG_PEEK);
	return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

/*
 * Between users the peer may not take a descriptor from our process
 * (pidfd_getfd), so it comes over the connection's socket, in a record of
 * one byte, without waiting: -EAGAIN while the peer has not read the ones
 * before.  The same user's peer takes it itself: -EOPNOTSUPP.
 */
int shm_fd_send(struct nd_ep *ep, int fd)
{
	struct shm_conn *c = ep->tpriv;
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec v = { "", 1 };
	struct msghdr mh = { .msg_iov = &v, .msg_iovlen = 1, .msg_control = u.buf,
			     .msg_controllen = sizeof(u.buf) };
	struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);

	if (!c->copy)
		return -EOPNOTSUPP;
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &fd, sizeof(int));
	return sendmsg(c->sock, &mh, MSG_DONTWAIT | MSG_NOSIGNAL) == 1 ? 0 : -errno;
}

/* The oldest descriptor the peer handed us (shm_fd_send), now ours; -EAGAIN: none yet. */
int shm_fd_take(struct nd_ep *ep)
{
	struct shm_conn *c = ep->tpriv;
	int fd;

	if (!c->copy)
		return -EOPNOTSUPP;
	if (!c->nfds && copy_drain(c) < 0 && !c->nfds)
		return -ECONNRESET;
	if (!c->nfds)
		return -EAGAIN;
	fd = c->fds[0];
	memmove(c->fds, c->fds + 1, --c->nfds * sizeof(c->fds[0]));
	return fd;
}

/* Could outbound progress be made now?  (The peer consumed, failed, or made room.) */
/* A hint only: a bad value the peer wrote here makes progress run and find it. */
static int outbound_ready(struct nd_ep *ep, struct shm_conn *c)
{
	uint64_t tail = atomic_load(&c->tx->tail);

	if (atomic_load(&c->tx->fail_status))
		return 1;
	for (uint64_t i = ep->sq_done; i < ep->sq_exec; i++) {
		struct nd_wr *wr = &ep->sq[i % ep->attr.outbound_entries];

		if (!wr->executed)
			return tail >= wr->ring_end;
	}
	if (ep->sq_exec < ep->sq_tail && !ep->sq[ep->sq_exec % ep->attr.outbound_entries].deferred)
		return c->tx_head - tail + HDR + MSG_ALIGN <= c->ring_size;
	return 0;
}

int shm_arm(struct nd_ep *ep, struct nd_cq *cq)
{
	struct shm_conn *c = ep->tpriv;
	int busy = 0;

	if (ep->state != EP_CONNECTED)
		return 0;
	if (!shm_layout_intact(c)) {
		broken(ep, c);
		return 1;
	}
	if (peer_vanished(c)) {
		/* settle what the peer took before it went */
		run_inbound(ep, c);
		reap_sends(ep, c);
		wsd_ep_terminate(ep);
		return 1;
	}
	if (ep->attr.inbound_cq == cq)
		atomic_store(&c->rx->cons_armed, 1);
	if (ep->attr.outbound_cq == cq)
		atomic_store(&c->tx->prod_armed, 1);
	shm_sleeper_barrier(c);
	if (atomic_load(&c->rx->closed))
		busy = 1;
	if (ep->attr.inbound_cq == cq && ep->rq_head != ep->rq_tail &&
	    (c->in_msg ? atomic_load(&c->rx->head) != c->rx_tail : rx_stamped(c, c->rx_tail)))
		busy = 1;
	if (ep->attr.outbound_cq == cq && !busy)
		busy = outbound_ready(ep, c);
	return busy;
}

void shm_disconnect(struct nd_ep *ep)
{
	struct shm_conn *c = ep->tpriv;

	if (!c)
		return;
	for (uint32_t i = 0; i < c->nwindows; i++)
		if (c->mws[i])
			mw_revoke(c, c->mws[i]);
	atomic_store_explicit(&c->tx->closed, 1, memory_order_release);
	atomic_thread_fence(memory_order_seq_cst);
	bell(c, c->peer_in_efd);
	bell(c, c->peer_out_efd);
	shutdown(c->sock, SHUT_RDWR);
	wsd_cq_detach(ep->attr.inbound_cq, c->sock);
	wsd_cq_detach(ep->attr.outbound_cq, c->sock);
}

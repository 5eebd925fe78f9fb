/* SPDX-License-Identifier: MIT */
/*
 * The sending side: records written into the peer's ring (write_record:
 * RDMA writes in order, or stores into its mapped ring), the room left
 * (fits), and send (wsd_sock_send): into a buffer the receiver offered, by
 * read-based zero copy to a receiver asleep (both zc.c), by ring, or by
 * the kernel stream; the wait for room, and the stall of two ends that
 * both send before they read (back to the stream both ways).  Locks:
 * tx_lock around all of it, dropped only while asleep.  It does not read
 * our ring (rx.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "switch/sess_int.h"

/* ---- records ------------------------------------------------------------------ */

static uint64_t tx_room(struct wsd_session *ss)
{
	uint64_t used = ss->tx_pos - ctl_get(ss, CW_CONSUMED);

	return used >= ss->peer_ring ? 0 : ss->peer_ring - used;
}

uint32_t max_payload(struct wsd_session *ss)
{
	uint32_t m = ss->peer_ring / 4 - REC_HDR - REC_TRAILER;

	return m < 65536 ? m : 65536;
}

/*
 * Where records must end at the latest: the ring's end, or within a
 * window smaller than the ring (slot.c) its end less the reserve for all
 * but FIN, SWITCH and BACK.  A FIN or a BACK after any other record then
 * goes below the window, in room that record left: a PAD to the ring's end
 * would take far more than the reserve.
 */
static uint64_t win_end(const struct wsd_session *ss, bool reserve)
{
	if (ss->tx_win >= ss->peer_ring)
		return ss->peer_ring;
	return reserve ? ss->tx_win : ss->tx_win - REC_RESERVE;
}

/*
 * tx_lock held.  Room for a record of len payload bytes at tx_pos, with the
 * pad to the ring's end if it does not end by win_end.  FIN, SWITCH and
 * BACK may use the reserve.
 */
bool fits(struct wsd_session *ss, uint32_t len, bool reserve)
{
	uint64_t off = ss->tx_pos % ss->peer_ring, need = rec_size(len);

	if (off + need > win_end(ss, reserve))
		need += ss->peer_ring - off;
	return tx_room(ss) >= need + (reserve ? 0 : REC_RESERVE);
}

/*
 * A record write failed: it may have landed in part or whole, so this
 * direction's ring position is lost and the stream cannot go on (writing
 * the next bytes at the same place could duplicate data).  The connection
 * ends as a reset would end it, and the program is told so: -ECONNRESET,
 * never the provider's status (EFAULT for a window the peer took back
 * after it saw our reset, EIO), which a socket's caller does not expect.
 */
int broken(struct wsd_sock *s, int r)
{
	wsd_debug("switch: fd %d: a record write failed (%d): connection reset", s->fd, r);
	if (s->sess && !faulted(s->sess)) {
		/* the peer's stream is reset too: it must not wait for what never comes */
		session_fail(s->sess, R_PROVIDER, "a record write failed");
	} else {
		keep_error(s, ECONNRESET);
	}
	s->tx_shut = true;
	return -ECONNRESET;
}

/* tx_lock held, fits() checked.  Payload from c (len bytes) or inline. */
/*
 * A record into the peer's mapped ring at off, its header staged: the same
 * pieces in the same order as write_record's RDMA writes, the payload
 * copied straight from the caller (no staging copy).
 */
static void store_record(struct wsd_session *ss, uint64_t off, uint32_t size,
			 struct cursor *c, uint32_t len, const void *inline_payload)
{
	uint8_t *dst = ss->peer_map + CTL_SIZE + off;
	uint64_t stamp = ((const struct wsd_rec *)ss->stage)->stamp;

	memcpy(dst, ss->stage, 8);                      /* len, type */
	__builtin_ia32_sfence();
	atomic_store_explicit((_Atomic uint64_t *)(void *)(dst + 8), stamp, memory_order_release);
	__builtin_ia32_sfence();
	if (c)
		cur_copy_from(c, dst + REC_HDR, len);
	else if (len)
		memcpy(dst + REC_HDR, inline_payload, len);
	memset(dst + REC_HDR + len, 0, size - REC_HDR - len);   /* pad, and the trailer's rest */
	__builtin_ia32_sfence();
	atomic_store_explicit((_Atomic uint64_t *)(void *)(dst + size - REC_TRAILER), stamp,
			      memory_order_release);
	atomic_thread_fence(memory_order_seq_cst);      /* as rdma_writev's */
}

int write_record(struct wsd_sock *s, uint32_t type, struct cursor *c, uint32_t len,
		 const void *inline_payload)
{
	return record_on(s, s->sess, type, c, len, inline_payload);
}

int record_on(struct wsd_sock *s, struct wsd_session *ss, uint32_t type, struct cursor *c,
	      uint32_t len, const void *inline_payload)
{
	uint64_t off = ss->tx_pos % ss->peer_ring;
	uint32_t size = rec_size(len);
	struct wsd_rec *h = (struct wsd_rec *)ss->stage;
	int r;

	/* a write the provider refuses, as it refuses a window taken back */
	if (type == REC_DATA && wsd_fault("rec-write", NULL))
		return broken(s, -EFAULT);
	if (off + size > win_end(ss, type == REC_FIN || type == REC_SWITCH || type == REC_BACK)) {
		uint32_t pad = (uint32_t)(ss->peer_ring - off);   /* to the ring's end, from the window's */

		h->len = pad;
		h->type = REC_PAD;
		h->stamp = ss->tx_pos ^ ss->tx_key;
		r = rdma_writev(ss, (WSABUFEX[]){ { 8, (char *)ss->stage, ss->stage_handle },
						  { 8, (char *)ss->stage + 8, ss->stage_handle } },
				2, CTL_SIZE + off);
		if (r)
			return broken(s, r);
		ss->tx_pos += pad;
		off = 0;
	}
	/* a smaller window learnt (winsize.h) begins where nothing lies past it */
	if (!off && ss->tx_win > ss->win.cap)
		ss->tx_win = ss->win.cap;
	h->len = len;
	h->type = type;
	h->stamp = ss->tx_pos ^ ss->tx_key;
	{
		long how;

		/* a header the peer's checks must refuse: a length past its ring, or no type */
		if (type == REC_DATA && wsd_fault("rec-header", &how)) {
			if (how)
				h->type = 0x7f;
			else
				h->len = 0xfffffff0u;
		}
	}
	if (ss->peer_map) {
		store_record(ss, off, size, c, len, inline_payload);
		wsd_session_touched(ss, off, size);
		ss->tx_pos += size;
		return 0;
	}
	if (c)
		cur_copy_from(c, ss->stage + REC_HDR, len);
	else if (len)
		memcpy(ss->stage + REC_HDR, inline_payload, len);
	memset(ss->stage + REC_HDR + len, 0, size - REC_HDR - len);
	*(uint64_t *)(ss->stage + size - REC_TRAILER) = ss->tx_pos ^ ss->tx_key;
	/*
	 * In pieces, in this order: the reader takes a record whose header
	 * stamp and trailer match, and must then find every byte before them
	 * in place.  One copy does not promise that: the kernel copies with
	 * fast string moves, whose stores other CPUs may see out of order
	 * (Intel SDM 3A, 9.2.4); separate moves are seen in program order.
	 */
	{
		WSABUFEX b[4] = {
			{ 8, (char *)ss->stage, ss->stage_handle },                    /* len, type */
			{ 8, (char *)ss->stage + 8, ss->stage_handle },                /* stamp */
			{ size - REC_HDR - REC_TRAILER, (char *)ss->stage + REC_HDR, ss->stage_handle },
			{ REC_TRAILER, (char *)ss->stage + size - REC_TRAILER, ss->stage_handle },
		};

		r = b[2].len ? rdma_writev(ss, b, 4, CTL_SIZE + off) :
			       rdma_writev(ss, (WSABUFEX[]){ b[0], b[1], b[3] }, 3, CTL_SIZE + off);
	}
	if (r)
		return broken(s, r);
	ss->tx_pos += size;
	return 0;
}

/* ---- send ------------------------------------------------------------------------ */

static ssize_t epipe(int flags)
{
	if (!(flags & MSG_NOSIGNAL))
		raise(SIGPIPE);
	return -EPIPE;
}

/*
 * Two programs that both send before they read: each end waits for room in
 * the other's ring, which nobody reads, and they would wait for each other
 * for ever, where TCP's buffers (a few MiB) would have taken both blocks.
 * tx_lock held, no room: the peer waits for room in our ring, which holds
 * data (a hint: a thread here may read it in a moment).
 */
#define STALL_MS 50

bool mutual_wait(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;

	return s->tx_mode == DIR_RING && s->rx_mode == DIR_RING &&
	       ctl_get(ss, CW_SPACE_ARM) != ss->rung_space &&
	       walk(ss, ss->rx_pos, 0, &(struct wire_rec){ 0 }, false) > 0;   /* no rx_lock */
}

/* tx_lock held: the stall is real: the connection goes back both ways. */
static bool stall_back(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;
	long ms;

	wsd_debug("switch: fd %d: both ends wait for room: back to the stream", s->fd);
	if (!ss->back_asked && !put_word(ss, W_TX, CW_BACK_REQ, 1))
		ss->back_asked = true;
	/*
	 * A test's window (tests/fault/stall_check.sh): tx_lock held, the peer
	 * asked back, our BACK not yet sent.  A receive of ours that sees the
	 * peer's request now must not wait for this lock past our going back.
	 */
	if (wsd_fault("back-hold", &ms))
		usleep((useconds_t)ms * 1000);
	return go_back(s) == 0;
}

__thread int wsd_recheck_ms = -1;

/*
 * tx_lock held, a sleeper, mutual_wait() true: wait up to STALL_MS for room.
 * If neither end took anything meanwhile, the connection goes back to the
 * stream both ways (we ask the peer, and go), and the kernel's buffers take
 * the rest.  1 when this direction went back, else 0 (look again).
 */
static int stall_wait(struct wsd_sock *s, uint32_t len)
{
	struct wsd_session *ss = s->sess;
	uint64_t rx0 = __atomic_load_n(&ss->rx_pos, __ATOMIC_RELAXED);
	uint64_t c0 = ctl_get(ss, CW_CONSUMED);
	int64_t end = wsd_now_ms() + STALL_MS, left;

	for (;;) {
		/* a peer gone back to the stream rings no more: tick */
		struct pollfd p = { .fd = s->fd, .events = ctl_get(ss, CW_BACK_BELLS) ? 0 : POLLIN };

		/* fits() under tx_lock: the peer's consumed is judged against our tx_pos */
		if (fits(ss, len, false) || (left = end - wsd_now_ms()) <= 0)
			break;
		pthread_mutex_unlock(&s->tx_lock);
		if (real.poll(&p, 1, p.events ? (int)left : TICK_MS) > 0) {
			pthread_mutex_lock(&s->tx_lock);
			break;
		}
		pthread_mutex_lock(&s->tx_lock);
	}
	pthread_mutex_unlock(&s->tx_lock);
	pthread_mutex_lock(&s->mu);
	if (s->sleepers == 1) {
		drain(s);
		/* the bells it read may have been an epoll set's (parked there) */
		wsd_poll_sock_unpark(s);
	}
	s->sleepers--;
	pthread_mutex_unlock(&s->mu);
	pthread_mutex_lock(&s->tx_lock);
	if (wsd_now_ms() < end || fits(ss, len, false) || !mutual_wait(s) ||
	    __atomic_load_n(&ss->rx_pos, __ATOMIC_RELAXED) != rx0 ||
	    ctl_get(ss, CW_CONSUMED) != c0)
		return 0;
	return stall_back(s);
}

/*
 * tx_lock held, mutual_wait() true, for a wait in poll, select or epoll
 * (which look again after wsd_recheck_ms): the same verdict, by the clock.
 */
bool stall_check(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;
	uint64_t rx = __atomic_load_n(&ss->rx_pos, __ATOMIC_RELAXED), c = ctl_get(ss, CW_CONSUMED);
	int64_t now = wsd_now_ms();

	if (!ss->stall_since || rx != ss->stall_rx || c != ss->stall_c) {
		ss->stall_since = now;
		ss->stall_rx = rx;
		ss->stall_c = c;
	} else if (now - ss->stall_since >= STALL_MS) {
		ss->stall_since = 0;
		return stall_back(s);
	}
	if (wsd_recheck_ms < 0 || wsd_recheck_ms > TICK_MS)
		wsd_recheck_ms = TICK_MS;
	return false;
}

/*
 * tx_lock held, no room for a record: widen the window when that is what
 * holds the stream back, a receiver that drained half of it since the
 * last wait began, within WIN_FAST_NS (a program streaming, at 128 MB/s or
 * more through the smallest window).  A receiver that reads slowly, or not
 * at all, keeps the window it has: its pages are not taken for nothing.
 */
#define WIN_FAST_NS 1000000

static bool tx_widen(struct wsd_session *ss)
{
	uint64_t c = ctl_get(ss, CW_CONSUMED);
	int64_t now;

	if (ss->tx_win >= ss->win.cap)
		return false;
	now = wsd_now_ns();
	if (ss->win_mark_ns && now - ss->win_mark_ns < WIN_FAST_NS &&
	    c - ss->win_mark_c >= ss->tx_win / 2) {
		ss->tx_win = ss->tx_win * 2 < ss->win.cap ? ss->tx_win * 2 : ss->win.cap;
		ss->win_mark_ns = 0;
		return true;
	}
	if (!ss->win_mark_ns || now - ss->win_mark_ns >= WIN_FAST_NS) {
		ss->win_mark_ns = now;
		ss->win_mark_c = c;
	}
	return false;
}

/*
 * tx_lock held on entry and exit (dropped while sleeping): wait for room.
 * 0, 1 when this direction went back to the stream instead, or -errno.
 */
int wait_room(struct wsd_sock *s, uint32_t len, bool nonblock, bool zc_wait)
{
	struct wsd_session *ss = s->sess;
	int64_t deadline = 0;
	int r;

	for (;;) {
		/* back to the stream (served here, or by another thread while we slept) */
		if (serve_back(s) && !zc_wait)
			return 1;
		if (zc_wait ? ctl_get(ss, CW_ZC_DONE) >=
			      ss->zc_sent : fits(ss, len, false))
			return 0;
		if (!zc_wait && tx_widen(ss))
			continue;
		if (faulted(ss))
			return -ECONNRESET;
		if (ctl_get(ss, CW_CLOSED) ||
		    s->tcp_eof || s->tcp_err)
			return -EPIPE;
		if (nonblock)
			return -EAGAIN;
		if (spin_for_room(s, len, zc_wait))
			continue;
		sleeper_enter(s);
		/* this write also finds a peer that died without a word */
		if (put_word(ss, W_TX, CW_SPACE_ARM, ++ss->space_gen)) {
			sleeper_leave(s);
			return -EPIPE;
		}
		race_window();    /* armed, the room not yet looked at again */
		if (zc_wait ? ctl_get(ss, CW_ZC_DONE) >=
			      ss->zc_sent : fits(ss, len, false)) {
			sleeper_leave(s);
			return 0;
		}
		if (!zc_wait && mutual_wait(s)) {
			if (stall_wait(s, len))
				return 1;
			continue;
		}
		pthread_mutex_unlock(&s->tx_lock);
		r = wait_fd(s, false, zc_wait ? &(int64_t){ -1 } : &deadline);
		if (r == -EBADF && zc_wait)
			real.poll(NULL, 0, TICK_MS);   /* closed: no bell to wait on */
		pthread_mutex_lock(&s->tx_lock);
		/* a zero-copy sender can't leave: the peer reads our memory */
		if (r < 0 && !zc_wait)
			return r;
		bell_probe(s);   /* the peer's FIN in: is anyone there? */
	}
}

/* The receiver armed from a blocking receive (sleeper bit) and we have not rung it yet. */
static bool receiver_asleep(struct wsd_session *ss)
{
	uint64_t v = ctl_get(ss, CW_DATA_ARM);

	return (v & 1) && v != ss->rung_data;
}

static ssize_t send_ring(struct wsd_sock *s, struct cursor *c, int flags, bool nonblock)
{
	struct wsd_session *ss = s->sess;
	size_t want = cur_left(c), done = 0;
	bool timed = false, split = false, big;
	int r = 0;

	if (s->tx_shut)
		return epipe(flags);
	switch (ctl_get(ss, CW_CLOSED)) {
	case 0:
		break;
	case 1:
	case WSD_CLOSING:
	case WSD_CLOSING_PROOF:
	case WSD_CLOSING_NO_PROOF:
		/*
		 * The peer closed cleanly: the kernel takes this send and the
		 * peer's answer is a reset, seen afterwards (POLLERR, EPIPE).
		 */
		if (!s->sent_after_close) {
			s->sent_after_close = true;
			s->tcp_err = true;
			s->tcp_errno = ECONNRESET;
			return (ssize_t)want;
		}
		/* fall through */
	default:
		if (s->tcp_err) {
			/* the send reports the pending reset: it is spent */
			s->tcp_err = false;
			s->tcp_eof = true;
			s->tx_shut = true;   /* reset: closed both ways, POLLHUP stays */
		}
		return epipe(flags);
	}
	/*
	 * A large blocking send on shm: when moving it in two parts at once
	 * has been the faster way, wait briefly for the receiver's offer.
	 */
	if (!nonblock && zc_split_timed(ss, want)) {
		timed = true;
		split = zc_split_wanted(ss, wsd_now_ns());
		/*
		 * When no offer comes in time the send goes by ring, and what
		 * it cost, the wait included, is what choosing to wait cost.
		 */
		if (split)
			zc_linger(s);
	}
	/*
	 * The receiver offered its buffer: write straight into it, unless
	 * this send was timed to go by ring (an offer left alone is void
	 * when our records reach the receiver).
	 */
	if (want >= POST_SEND_MIN && (split || !timed)) {
		ssize_t k = send_posted(s, c, !nonblock && ss->peer_map);

		if (k < 0)
			return k;
		done = (size_t)k;
		if (timed && done == want)
			zc_split_learn(ss, done, wsd_now_ns());
		if (done == want)
			return (ssize_t)done;
	}
	/*
	 * Read-based zero copy returns only once the receiver has read it all,
	 * so only when the receiver sleeps waiting for our data (armed, not yet
	 * rung): one that is busy, or sending to us itself, gets a copy it can
	 * take later, as from TCP's buffer, and two programs that both send
	 * before they read do not wait for each other for ever.
	 */
	if (!done && !nonblock && want >= zc_threshold(ss, false) && c->n - c->i == 1 &&
	    want <= (1u << 30) && receiver_asleep(ss)) {
		ssize_t n = send_zc(s, (const uint8_t *)c->iov[c->i].iov_base + c->off, want);

		if (n > 0)
			cur_skip(c, (size_t)n);
		return n == -EPIPE ? epipe(flags) : n;
	}
	big = want >= 2 * POST_SEND_MIN && max_payload(ss) >= 2 * POST_SEND_MIN;
	while (done < want) {
		uint32_t len = max_payload(ss);

		if (len > want - done)
			len = (uint32_t)(want - done);
		/*
		 * Take what fits when it is at least a quarter of a record.  A
		 * large send's records are all large, its last too: a receiver
		 * takes a small one that voids its offer for a program that
		 * sends small messages (may_post), and stops offering.
		 */
		if (big && want - done - len && want - done - len < POST_SEND_MIN)
			len = (uint32_t)(want - done - POST_SEND_MIN);
		while (!fits(ss, len, false) && (big ? len >= 2 * POST_SEND_MIN : len > 4096))
			len /= 2;
		/*
		 * Like the kernel's send buffer, a ring that ran full takes new
		 * data (and polls writable) only when a quarter of it is free.
		 */
		if (!done && ss->tx_full && !fits(ss, ss->tx_win / 4, false)) {
			r = nonblock ? -EAGAIN : wait_room(s, ss->tx_win / 4, false, false);
			if (r)
				break;
		}
		ss->tx_full = false;
		/* a blocking send takes everything, as the kernel's does */
		r = wait_room(s, len, nonblock, false);
		if (r)
			break;
		r = write_record(s, REC_DATA, c, len, NULL);
		if (r)
			break;
		done += len;
		wsd_stat_add(s->stat, &s->stat->copy_tx, len);
		ring_data(s);
	}
	/* part into an offer, the rest by ring: its time is in the run's, so its bytes are too */
	if (timed && done == want)
		zc_split_learn(ss, done, wsd_now_ns());
	if (done || r == 1)
		return (ssize_t)done;
	if (r == -EAGAIN) {
		ss->tx_full = true;
		atomic_fetch_add(&s->tx_eagain, 1);
	}
	if (r == -EPIPE)
		return epipe(flags);
	return r;
}

/* tx_lock held: the rest of c by the kernel stream, counted. */
static ssize_t kernel_send(struct wsd_sock *s, struct cursor *c, int flags)
{
	struct iovec v[64];
	struct msghdr m = { .msg_iov = v };
	struct cursor k = *c;
	ssize_t n;

	while (k.i < k.n && m.msg_iovlen < 64) {
		v[m.msg_iovlen].iov_base = (uint8_t *)k.iov[k.i].iov_base + k.off;
		v[m.msg_iovlen++].iov_len = k.iov[k.i].iov_len - k.off;
		k.i++;
		k.off = 0;
	}
	n = real.sendmsg(s->fd, &m, flags);
	if (n < 0)
		return -errno;
	s->tcp_tx += (uint64_t)n;
	wsd_stat_add(s->stat, &s->stat->tcp_tx, (uint64_t)n);
	return n;
}

/* ---- first bytes before the peer's answer (wsd-protocol(7), "The mailbox") ------ */

#define PROV_MAX 8192u               /* sent into a grant before the answer, at most */

/*
 * tx_lock held, s->prov set: c into the granted ring, unproven, and a copy
 * kept in case the peer declines; the first one after our SWITCH record.
 * -EXDEV: not here (too much, or a record the ring may not take): the
 * caller settles first.
 */
static ssize_t send_prov(struct wsd_sock *s, struct cursor *c)
{
	struct wsd_session *ss = s->prov;
	size_t want = cur_left(c);
	struct cursor k = *c;

	if (!want)
		return 0;
	if (s->tx_shut || s->detached || want > PROV_MAX - s->prov_len ||
	    (!s->prov_hold && (want > max_payload(ss) || !fits(ss, (uint32_t)want + 64, false))))
		return -EXDEV;
	if (!s->prov_buf && !(s->prov_buf = malloc(PROV_MAX)))
		return -EXDEV;
	if (s->prov_hold) {
		/* held here: nothing goes anywhere before the answer (tx_hold_commit) */
		if (!s->prov_len) {
			s->prov_k0 = kernel_written(s->fd, true);
			if (s->prov_k0 > 1 + (int64_t)s->tcp_tx) {
				stream_reset(s, R_BYPASS);
				return -ECONNRESET;
			}
		}
		cur_copy_from(&k, s->prov_buf + s->prov_len, want);
		s->prov_len += (uint32_t)want;
		cur_skip(c, want);
		return (ssize_t)want;
	}
	if (s->tx_mode == DIR_TCP) {
		uint64_t n = s->tcp_tx;

		s->prov_k0 = kernel_written(s->fd, true);
		/*
		 * The kernel counts our SYN: anything more was written behind
		 * our back, and a peer that saw our socket reads our ring from
		 * its answer on (WSD_OPENED_HELD): the connection fails here,
		 * before these bytes could be read ahead of those.
		 */
		if (s->prov_k0 > 1 + (int64_t)n) {
			stream_reset(s, R_BYPASS);
			return -ECONNRESET;
		}
		if (record_on(s, ss, REC_SWITCH, NULL, sizeof(n), &n))
			return -EXDEV;
		s->tx_mode = DIR_PROV;
	}
	cur_copy_from(&k, s->prov_buf + s->prov_len, want);
	if (record_on(s, ss, REC_DATA, NULL, (uint32_t)want, s->prov_buf + s->prov_len))
		return -EXDEV;
	s->prov_len += (uint32_t)want;
	cur_skip(c, want);   /* counted as the ring's or the stream's once settled */
	return (ssize_t)want;
}

/*
 * tx_lock held, s->prov_hold: the first bytes held here go into the ring of
 * the session attached to s (the peer answered OPENED and is ready), after
 * our SWITCH record, as if sent into a grant (tx_prov_commit writes our
 * proof); by the stream when the ring cannot take them now.
 */
void tx_hold_commit(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;
	uint64_t n = s->tcp_tx;

	/* nothing held (a first send too large to hold): the usual switch, at that send */
	if (ss && s->prov_len && s->tx_mode == DIR_TCP && !s->tx_shut && !s->detached &&
	    s->prov_len <= max_payload(ss) && fits(ss, s->prov_len + 128, false) &&
	    !record_on(s, ss, REC_SWITCH, NULL, sizeof(n), &n)) {
		/* from here on the grant's way: the SWITCH is in the ring */
		s->tx_mode = DIR_PROV;
		if (s->prov_len &&
		    record_on(s, ss, REC_DATA, NULL, s->prov_len, s->prov_buf)) {
			session_fail(ss, R_PROVIDER, "the first bytes did not go into the ring");
			return;
		}
		tx_prov_commit(s);
		return;
	}
	tx_prov_undo(s);
}

void tx_prov_undo(struct wsd_sock *s)
{
	int64_t k = kernel_written(s->fd, false);
	uint32_t done = 0;

	if (s->prov_hold) {
		/* held, never in a ring: the stream's, unless a write we did not see went first */
		s->prov_hold = false;
		if (!s->prov_len)
			return;
	} else if (s->tx_mode != DIR_PROV) {
		return;
	}
	s->tx_mode = DIR_TCP;
	/* a write we did not see went on the stream ahead of the copy: no order left to keep */
	if (k >= 0 && s->prov_k0 >= 0 && k > s->prov_k0) {
		wsd_debug("switch: fd %d: stream bytes written before its first bytes went "
			  "there: connection reset", s->fd);
		stream_reset(s, R_BYPASS);
		return;
	}
	/* the peer takes none of the ring's copy: all of it by the stream, in order */
	while (done < s->prov_len) {
		ssize_t n = real.send(s->fd, s->prov_buf + done, s->prov_len - done, MSG_NOSIGNAL);
		struct pollfd w = { .fd = s->fd, .events = POLLOUT };

		if (n > 0) {
			done += (uint32_t)n;
			continue;
		}
		if (n < 0 && errno != EAGAIN && errno != EINTR) {
			s->tcp_err = true;
			s->tcp_errno = errno;
			s->tx_shut = true;
			break;
		}
		real.poll(&w, 1, TICK_MS);
	}
	s->tcp_tx += done;
	wsd_stat_add(s->stat, &s->stat->tcp_tx, done);
}

ssize_t wsd_sock_send(struct wsd_sock *s, const struct iovec *iov, int iovcnt, int flags)
{
	struct cursor c = { iov, iovcnt, 0, 0 };
	bool nonblock = s->nonblock || (flags & MSG_DONTWAIT);
	size_t first = 0;
	ssize_t n;

	served(s);   /* we serve it ourselves (accept.c, maybe_handed) */
	wsd_upgrade_maybe(s);
	cur_skip(&c, 0);
	/* an OPEN just sent by message: our bytes wait here for its answer, a while */
	if (!s->hold_looked && s->chan_known && atomic_load(&s->upgrade_state) == UP_RUNNING)
		open_hold_begin(s);
	if (s->prov) {
		pthread_mutex_lock(&s->tx_lock);
		n = s->prov ? send_prov(s, &c) : -EXDEV;
		pthread_mutex_unlock(&s->tx_lock);
		if (n != -EXDEV) {
			return n;
		}
		wsd_upgrade_settle(s, false);
	}
	if (!nonblock)
		atomic_fetch_add_explicit(&in_calls, 1, memory_order_relaxed);
	pthread_mutex_lock(&s->tx_lock);
	serve_back(s);
	if (!s->connected_side && s->sess && !atomic_load(&s->proven) && s->tx_mode != DIR_RING &&
	    !pthread_mutex_trylock(&s->rx_lock)) {
		/* a listening side may send by ring once the peer's proof is read */
		rx_settle(s, true);
		pthread_mutex_unlock(&s->rx_lock);
	}
	if (s->detached) {
		n = -ECONNRESET;
	} else if (peer_bypass(s->sess)) {
		/* the reset once, as the kernel reports one, then EPIPE */
		if (s->tcp_err) {
			s->tcp_err = false;
			s->tcp_eof = true;
			n = -ECONNRESET;
		} else {
			n = epipe(flags);
		}
	} else if (s->tx_mode == DIR_RING || tx_switch_with(s, &c, &first)) {
		/* a receiver that armed before our switch was rung after its proof
		 * (to_ring; not on verbs yet) */
		n = cur_left(&c) || !first ? send_ring(s, &c, flags, nonblock) : 0;
		if (n >= 0)
			n += (ssize_t)first;
		else if (first)
			n = (ssize_t)first;
		if (n >= 0 && s->tx_back && cur_left(&c)) {
			/* went back to the stream part way: the rest goes there */
			ssize_t k = kernel_send(s, &c, flags);

			n = k < 0 ? (n ? n : k) : n + k;
		}
	} else {
		n = kernel_send(s, &c, flags);
	}
	if (n == -ECONNRESET && s->tcp_err)
		take_error(s);   /* this call reports the reset: spent, as the kernel's is */
	pthread_mutex_unlock(&s->tx_lock);
	if (!nonblock)
		atomic_fetch_sub_explicit(&in_calls, 1, memory_order_relaxed);
	return n;
}

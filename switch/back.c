/* SPDX-License-Identifier: MIT */
/*
 * Back to the stream (BACK), for good: a direction going back (go_back;
 * serve_back when the peer asks), the peer's BACK at the head
 * (check_back), its bells still on the stream skipped (skip_bells), and
 * what a socket owes before the stream's bytes (the prefix and those
 * bells: pre_recv, skip_owed).
 * Fork and exec: a socket brought back both ways first (wsd_sock_downgrade,
 * wsd_sock_bare), what it holds unread kept as a shared prefix
 * (set_prefix).  Locks: rx_lock, then tx_lock, then mu; the downgrade
 * holds rx_lock throughout and takes tx_lock in turns.  It does not send
 * or receive the program's data (tx.c, rx.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>

#include "switch/sess_int.h"

/* ---- back to the stream (BACK) -------------------------------------------------- */

/*
 * A direction goes back for good when its process forks or execs (or the
 * peer's does and asks): see wsd_sock_downgrade() and wsd-protocol(7).
 * Once both have, the socket is plain TCP again, but for what it still owes
 * before the stream's bytes, which poll must count (so it stays
 * "accelerated" until then).
 */
static void set_back(struct wsd_sock *s, bool rx)
{
	bool both;

	pthread_mutex_lock(&s->mu);
	if (rx)
		s->rx_back = true;
	else
		s->tx_back = true;
	both = s->rx_back && s->tx_back;
	pthread_mutex_unlock(&s->mu);
	if (both)
		plain_again(s, R_BACK);
}

/*
 * mu held, both directions back: something comes before the stream's next
 * byte, the prefix's bytes or the peer's bells still to skip.  While it
 * does, the kernel's readability is not the socket's (a bell would make
 * the fd readable with nothing to read), so readiness stays the switch's
 * to say (wsd_sock_revents).
 */
static bool owes(const struct wsd_sock *s)
{
	return (s->pre && !atomic_load_explicit(&s->pre->done, memory_order_acquire)) ||
	       (s->rx_back && s->rx_skip);
}

/*
 * Both directions are back (or never left, the ring's peer failing its
 * proof): plain TCP, but for what it owes first, which poll must count.
 */
void plain_again(struct wsd_sock *s, enum wsd_reason why)
{
	bool was, now;

	pthread_mutex_lock(&s->mu);
	was = s->accel;
	s->rx_ready_sent = false;
	s->accel = owes(s);
	now = s->accel;
	s->no_upgrade = true;
	s->why_not = (uint8_t)why;
	pthread_mutex_unlock(&s->mu);
	wsd_stat_begin(s->stat);
	s->stat->path = PATH_TCP;
	s->stat->way = WAY_NONE;
	s->stat->reason = (uint8_t)why;
	wsd_stat_end(s->stat);
	if (was != now)
		wsd_poll_sock_accelerated(s);
	wsd_debug("switch: fd %d is back on the stream both ways", s->fd);
}

/* Something owed was paid: once nothing is, the socket's readiness is the kernel's alone. */
static void owed_paid(struct wsd_sock *s)
{
	bool was;

	pthread_mutex_lock(&s->mu);
	was = s->accel;
	if (s->rx_back && s->tx_back)
		s->accel = owes(s);
	pthread_mutex_unlock(&s->mu);
	if (was && !s->accel)
		wsd_poll_sock_accelerated(s);
}

/* tx_lock held: one doorbell that must go (BACK counts it), waiting if need be. */
static void force_bell(struct wsd_sock *s)
{
	for (int i = 0; i < 100 && !try_bell(s); i++) {
		struct pollfd p = { .fd = s->fd, .events = POLLOUT };

		if (errno != EAGAIN && errno != EINTR)
			return;
		real.poll(&p, 1, TICK_MS);
	}
}

/*
 * tx_lock held: this direction goes back to the stream.  The count of our
 * bells goes first (back_bells: the peer's drain never takes a byte past
 * it), then the BACK record after our last ring data, then one more bell
 * to wake the peer; from then on the stream carries our data.  0, -EAGAIN
 * while the peer's ring has no room for the record, or -errno.
 */
int go_back(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;
	bool bell = s->tx_mode == DIR_RING && !s->kernel_fin;
	uint64_t bells;
	int r;

	if (s->tx_back)
		return 0;
	if (!ss)
		return -EINVAL;
	if (!fits(ss, sizeof(bells), true))
		return -EAGAIN;
	bells = ss->bells_tx + (bell ? 1 : 0);
	r = put_word(ss, W_TX, CW_BACK_BELLS, bells + 1);
	if (!r)
		r = write_record(s, REC_BACK, NULL, sizeof(bells), &bells);
	if (r)
		return r;
	if (bell)
		force_bell(s);
	if (s->tx_mode == DIR_RING && s->tx_shut && !s->kernel_fin) {
		/* our FIN went by ring: the stream must carry it now */
		s->kernel_fin = true;
		real.shutdown(s->fd, SHUT_WR);
	}
	s->tx_mode = DIR_TCP;
	wsd_poll_sock_accelerated(s);   /* POLLOUT is the kernel's to say again */
	set_back(s, false);
	wsd_debug("switch: fd %d sends by the stream again after %llu bells", s->fd,
		  (unsigned long long)bells);
	return 0;
}

/*
 * tx_lock held: the peer asked us back to the stream (it forks or execs, or
 * both ends stalled).  True when this direction is back, now or before
 * (another thread of ours may have served the request while the caller
 * slept): nothing may follow our BACK on the ring.
 */
bool serve_back(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;

	if (s->tx_back)
		return true;
	if (!ss || s->detached || !ctl_get(ss, CW_BACK_REQ))
		return false;
	return go_back(s) == 0;
}

/*
 * A receiving thread's way to tx_lock: true with it held, false without it
 * once this direction is back on the stream.  A sender gone back may hold
 * tx_lock in a blocking kernel send for as long as the peer does not read
 * the stream, and the peer reads it only once its ring is read up to our
 * BACK, perhaps by the very thread that would wait here: a plain lock,
 * taken after a look that saw the direction not back yet, could wait for
 * ever (the stall handover went back while we waited).  So the lock is
 * waited for in slices, the direction looked at between them.
 */
bool tx_lock_unless_back(struct wsd_sock *s)
{
	for (;;) {
		struct timespec t;

		if (__atomic_load_n(&s->tx_back, __ATOMIC_ACQUIRE))
			return false;
		if (!pthread_mutex_trylock(&s->tx_lock))
			break;
		t = wsd_timespec_in(CLOCK_REALTIME, TICK_MS * 1000000LL);
		if (!pthread_mutex_timedlock(&s->tx_lock, &t))
			break;
	}
	if (s->tx_back) {
		pthread_mutex_unlock(&s->tx_lock);
		return false;
	}
	return true;
}

/* Not holding tx_lock: as serve_back. */
void serve_back_unlocked(struct wsd_sock *s)
{
	if (!s->sess || s->tx_back ||
	    !ctl_get(s->sess, CW_BACK_REQ))
		return;
	if (!tx_lock_unless_back(s))
		return;
	serve_back(s);
	pthread_mutex_unlock(&s->tx_lock);
}

/*
 * rx_lock held: the peer's BACK at the head (after its FIN, perhaps) moves
 * rx to the stream for good; the peer's bells still on it are skipped first.
 */
void check_back(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;
	uint64_t lim, bells;
	struct wire_rec r;
	const char *why;
	int e;

	if (!ss || s->rx_back || s->rx_mode == DIR_DRAIN || s->rx_mode == DIR_PROOF)
		return;
	if (walk(ss, ss->rx_pos, WIRE_SKIP(REC_PAD) | WIRE_SKIP(REC_FIN), &r, true) <= 0 ||
	    r.type != REC_BACK)
		return;
	lim = ctl_get(ss, CW_BACK_BELLS);
	if (!lim) {
		/*
		 * The sender writes its count, whole, before the record: a BACK
		 * without it is broken (from a claimant: only ignored).
		 */
		if (!peer_untrusted(ss))
			protocol_fail(ss, "BACK before its count");
		return;
	}
	memcpy(&bells, r.payload, sizeof(bells));
	/*
	 * The count of bells left to skip and the mode change under mu, as one:
	 * the drain (another thread's, under mu alone) reads bells only while
	 * rx is on the ring, so none can be taken after the count is fixed.
	 */
	pthread_mutex_lock(&s->mu);
	e = wsd_wire_back_check(bells, lim, ss->bells_rx, &why);
	if (!e) {
		s->rx_skip = bells - ss->bells_rx;
		s->rx_skip_end = bells;
		consume(s, &r);
		s->rx_mode = DIR_TCP;
	}
	pthread_mutex_unlock(&s->mu);
	if (e) {
		protocol_fail(ss, why);
		return;
	}
	s->peer_fin = false;        /* the stream carries the peer's FIN now */
	s->tcp_eof = false;
	wsd_debug("switch: fd %d receives by the stream again (%llu bells to skip)", s->fd,
		  (unsigned long long)s->rx_skip);
	set_back(s, true);
}

/*
 * A byte that should be a bell is not, on a socket whose rx is back on the
 * stream (a session, or only the prefix a fork or an exec left): reset.
 */
static int bypass_reset(struct wsd_sock *s, const char *why)
{
	struct sockaddr unspec = { .sa_family = AF_UNSPEC };

	if (s->sess && !s->detached) {
		session_fail(s->sess, R_BYPASS, why);
		s->tcp_err = false;   /* the reset is this call's: then the end */
		s->tcp_eof = true;
		return -ECONNRESET;
	}
	wsd_debug("switch: fd %d: bytes moved behind the switch's back: %s: connection reset",
		  s->fd, why);
	wsd_stat_begin(s->stat);
	s->stat->reason = R_BYPASS;
	wsd_stat_end(s->stat);
	real.connect(s->fd, &unspec, sizeof(unspec));
	return -ECONNRESET;
}

/*
 * Skip up to *left bells on the stream without waiting, the last of them
 * number `end`: each looked at first, and a byte that is not the next bell
 * resets the connection (-ECONNRESET).  -EAGAIN while some are on their way.
 */
int skip_bells(struct wsd_sock *s, uint64_t *left, uint64_t end)
{
	uint8_t junk[256];
	const char *why;

	while (*left) {
		ssize_t n = real.recv(s->fd, junk, *left < sizeof(junk) ? *left : sizeof(junk),
				      MSG_DONTWAIT | MSG_PEEK);

		if (n > 0 && wsd_wire_bells_check(junk, (size_t)n, end - *left, end, &why))
			return bypass_reset(s, why);
		if (n > 0)
			n = real.recv(s->fd, junk, (size_t)n, MSG_DONTWAIT);
		if (n > 0) {
			*left -= (uint64_t)n;
			continue;
		}
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			return -EAGAIN;
		*left = 0;          /* the stream ended or failed: its reads will say so */
	}
	return 0;
}

/*
 * rx_lock held, the prefix's bytes (if any) read: the peer's bells still
 * owed on the stream before its next byte, skipped (the prefix's, then
 * those a BACK counted).  0 once none is left: the stream's next byte is
 * data, its end or its error.  -EAGAIN while a bell is on its way,
 * -ECONNRESET when a byte is not the bell it should be.
 */
int skip_owed(struct wsd_sock *s)
{
	struct wsd_prefix *p = s->pre;
	bool paid = false;
	int r;

	if (p && !atomic_load_explicit(&p->done, memory_order_acquire)) {
		wsd_prefix_lock(p);
		/* the prefix keeps the last bell's number's low 32 bits: the values' */
		r = p->off < p->len ? -EAGAIN :
		    skip_bells(s, &p->skip, (uint32_t)(p->bells_end - (uint32_t)p->skip) + p->skip);
		if (!r)
			atomic_store_explicit(&p->done, 1, memory_order_release);
		wsd_prefix_unlock(p);
		if (r)
			return r;
		paid = true;
	}
	if (s->rx_skip && s->rx_back) {
		r = skip_bells(s, &s->rx_skip, s->rx_skip_end);
		if (r)
			return r;
		paid = true;
	}
	/* (or another process paid the prefix we share: nothing is owed here either) */
	if (paid || (s->accel && s->rx_back && s->tx_back))
		owed_paid(s);
	return 0;
}

/*
 * rx_lock held: what the socket owes before its stream's bytes: the prefix,
 * then the peer's bells still on the stream.  Bytes, -EAGAIN while a bell
 * is on its way, or 0: read the stream.
 */
ssize_t pre_recv(struct wsd_sock *s, struct cursor *c, int flags)
{
	struct wsd_prefix *p = s->pre;

	if (p && !atomic_load_explicit(&p->done, memory_order_acquire)) {
		wsd_prefix_lock(p);
		if (p->off < p->len) {
			size_t k = p->len - p->off;

			if (k > cur_left(c))
				k = cur_left(c);
			cur_copy_to(c, p->data + p->off, k);
			if (!(flags & MSG_PEEK))
				p->off += k;
			wsd_prefix_unlock(p);
			return (ssize_t)k;
		}
		wsd_prefix_unlock(p);
	}
	return skip_owed(s);
}

/* ---- fork and exec: back to the stream ------------------------------------------ */

/* rx_lock held: what is left to deliver first (len bytes) becomes the (shared) prefix. */
int set_prefix(struct wsd_sock *s, const uint8_t *data, size_t len)
{
	struct wsd_prefix *p;
	int fd;

	if (!len && !s->rx_skip) {
		if (s->pre && atomic_load(&s->pre->done)) {
			wsd_prefix_close(s->pre);
			real.close(s->pre_fd);
			s->pre = NULL;
			s->pre_fd = -1;
		}
		return 0;
	}
	p = wsd_prefix_new(data, len, s->rx_skip, &fd);
	if (!p)
		return -ENOMEM;
	p->bells_end = (uint32_t)s->rx_skip_end;
	if (s->pre) {
		wsd_prefix_close(s->pre);
		real.close(s->pre_fd);
	}
	s->pre = p;
	s->pre_fd = fd;
	s->rx_skip = 0;
	return 0;
}

int wsd_sock_share_skip(struct wsd_sock *s)
{
	int r;

	pthread_mutex_lock(&s->rx_lock);
	r = s->rx_skip && !s->pre ? set_prefix(s, NULL, 0) : 0;
	pthread_mutex_unlock(&s->rx_lock);
	return r;
}

/*
 * The program will read the kernel socket by a path the switch does not
 * see (io_uring): once the socket went back to the stream, nothing of ours
 * may stand before the stream's bytes.  The peer's doorbells still on
 * their way are read now (ms at most).  Bytes that arrived by ring unread
 * (the prefix) cannot be put back in front of the stream, so then, and
 * when the socket did not go back at all (the peer's switch did not
 * answer), the connection is reset: the program's next call fails,
 * loudly, rather than read a stream with a hole in it.
 */
int wsd_sock_bare(struct wsd_sock *s, enum wsd_reason why, int ms)
{
	int64_t end = wsd_now_ms() + ms;
	struct wsd_session *ss = s->sess;
	const char *bad = NULL;

	if (!ss || s->detached)
		return 0;
	pthread_mutex_lock(&s->rx_lock);
	if (!faulted(ss)) {
		while (s->rx_back && s->rx_skip && skip_bells(s, &s->rx_skip, s->rx_skip_end) == -EAGAIN &&
		       wsd_now_ms() < end) {
			struct pollfd p = { .fd = s->fd, .events = POLLIN };

			real.poll(&p, 1, TICK_MS);
		}
		if (!(s->rx_back && s->tx_back))
			bad = "its peer's switch did not move back to the stream in time";
		else if (s->rx_skip || (s->pre && s->pre->skip))
			bad = "the peer's doorbells did not arrive in time";
		else if (wsd_prefix_has_data(s->pre))
			bad = "data that came by ring is still unread";
	}
	pthread_mutex_unlock(&s->rx_lock);
	if (!bad)
		return 0;
	session_fail(ss, why, bad);
	return -ECONNRESET;
}

int wsd_sock_downgrade(struct wsd_sock *s, int ms)
{
	struct wsd_session *ss = s->sess;
	int64_t end = wsd_now_ms() + ms;
	char *kept = NULL;
	size_t kept_len = 0;
	FILE *st;
	uint8_t *tmp;
	int r = 0;
	bool belled = false;

	if (!ss || s->detached)
		return -EINVAL;
	if (faulted(ss))
		return -ECONNRESET;
	if (!(tmp = malloc(65536)))
		return -ENOMEM;
	/* what the peer sent before its BACK, kept in a growing buffer */
	if (!(st = open_memstream(&kept, &kept_len))) {
		free(tmp);
		return -ENOMEM;
	}
	pthread_mutex_lock(&s->rx_lock);
	if (!s->rx_ready_sent) {
		/* the peer never sends by ring unless we say we are ready */
		set_back(s, true);
	} else if (!s->rx_back && !ss->back_asked) {
		pthread_mutex_lock(&s->tx_lock);
		if (!put_word(ss, W_TX, CW_BACK_REQ, 1)) {
			ss->back_asked = true;
			/* wake the peer's switch: a bell, which only a ring sender may send */
			if (tx_switch(s) && !s->tx_back) {
				force_bell(s);
				belled = true;
			}
		}
		pthread_mutex_unlock(&s->tx_lock);
	}
	/* everything the peer sent before its BACK, into the stash */
	while (!s->rx_back) {
		struct iovec v = { tmp, 65536 };
		struct cursor c = { &v, 1, 0, 0 };
		/* (rx_step serves the peer's own request: it may be downgrading too) */
		ssize_t n = rx_step(s, &c, 0);

		if (n > 0) {
			if (fwrite(tmp, 1, (size_t)n, st) != (size_t)n) {
				r = -ENOMEM;
				break;
			}
			continue;
		}
		if (n < 0 && n != -EAGAIN) {
			r = (int)n;
			break;
		}
		if (s->rx_back)
			break;
		if (wsd_now_ms() >= end) {
			r = -ETIMEDOUT;
			break;
		}
		/*
		 * The listening side may ring only once the peer's proof is read,
		 * which this loop may just have done (fdopen right after accept):
		 * a peer asleep in a receive wakes only for a bell.
		 */
		if (ss->back_asked && !belled && !s->tx_back && atomic_load(&s->proven)) {
			pthread_mutex_lock(&s->tx_lock);
			if (tx_switch(s) && !s->tx_back) {
				force_bell(s);
				belled = true;
			}
			pthread_mutex_unlock(&s->tx_lock);
		}
		/* nothing now (or the peer's FIN, its BACK to follow): wait a little */
		arm_data(s, false);
		{
			struct pollfd p = { .fd = s->fd, .events = POLLIN };

			if (real.poll(&p, 1, 1) > 0)
				sched_yield();   /* bells another sleeper owns, perhaps */
		}
	}
	/* then our direction */
	pthread_mutex_lock(&s->tx_lock);
	while (!r && !s->tx_back && (r = go_back(s)) == -EAGAIN && wsd_now_ms() < end) {
		pthread_mutex_unlock(&s->tx_lock);
		report(s, true);
		real.poll(NULL, 0, 1);
		pthread_mutex_lock(&s->tx_lock);
		r = 0;
	}
	/* our zero-copy sends (other threads') read before the pages go */
	while (!r && ctl_get(ss, CW_ZC_DONE) < ss->zc_sent && wsd_now_ms() < end) {
		pthread_mutex_unlock(&s->tx_lock);
		real.poll(NULL, 0, 1);
		pthread_mutex_lock(&s->tx_lock);
	}
	pthread_mutex_unlock(&s->tx_lock);
	/* the peer's bells before its BACK are on their way, or here */
	while (!r && s->rx_skip && skip_bells(s, &s->rx_skip, s->rx_skip_end) == -EAGAIN &&
	       wsd_now_ms() < end) {
		struct pollfd p = { .fd = s->fd, .events = POLLIN };

		real.poll(&p, 1, 1);
	}
	if (fclose(st) && !r)
		r = -ENOMEM;
	if (set_prefix(s, (const uint8_t *)kept, kept_len) && kept_len)
		r = -ENOMEM;    /* data we cannot keep: the connection cannot go on */
	pthread_mutex_unlock(&s->rx_lock);
	if (!r && (!s->rx_back || !s->tx_back))
		r = -ETIMEDOUT;
	if (!r)
		plain_again(s, R_BACK);         /* with the prefix just made */
	free(kept);
	free(tmp);
	wsd_debug("switch: fd %d downgrade: %d (%zu bytes kept)", s->fd, r, kept_len);
	return r;
}

/* SPDX-License-Identifier: MIT */
/*
 * Readiness: what poll, select and epoll see on an accelerated socket
 * (wsd_sock_revents), its doorbells armed for them (wsd_sock_arm), the
 * ring's data end for edge-triggered epoll (wsd_sock_rx_mark), FIONREAD
 * (wsd_sock_nread), data reaching a socket shut both ways (reset_if_shut),
 * and the path a socket uses (wsd_switch_path).  Locks: rx_lock for the
 * ring's state; tx_lock only tried (a busy sender's room is the kernel's
 * to say); a walk without rx_lock does not judge.  It does not sleep: the
 * readiness calls do (poll.c, epoll_wait.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <sys/ioctl.h>

#include "switch/sess_int.h"

/* ---- readiness ------------------------------------------------------------------ */

/*
 * rx_lock held.  Data reaching a socket shut both ways: the kernel would
 * answer with a reset (ECONNRESET here, EPIPE at the sender); so do we.
 */
void reset_if_shut(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;
	struct wire_rec r;
	int k;

	if (!s->rx_shut || !s->tx_shut || s->rx_mode != DIR_RING || s->tcp_err || s->tcp_eof)
		return;
	k = walk(ss, ss->rx_pos, WIRE_SKIP(REC_PAD), &r, true);
	if (k >= 0 && !ss->rx_off)
		ss->rx_pos = r.pos;     /* the pads passed */
	if (k <= 0 || (r.type != REC_DATA && r.type != REC_ZC))
		return;
	s->tcp_err = true;
	s->tcp_errno = ECONNRESET;
	pthread_mutex_lock(&s->tx_lock);
	put_word(ss, W_TX, CW_CLOSED, 2);
	pthread_mutex_unlock(&s->tx_lock);
}

/*
 * rx_lock held, rx back on the stream (or a socket left with only a prefix
 * by fork or exec), the prefix's bytes read: what the stream gives a
 * receive now.  Nothing while the peer's bells still owed there are not
 * all skipped: they make the fd readable with nothing to read.  Then the
 * kernel, asked now: what a wait saw before may be the very bell just
 * skipped.
 */
static short stream_revents(struct wsd_sock *s)
{
	struct pollfd p = { .fd = s->fd, .events = POLLIN };

	if (skip_owed(s) || real.poll(&p, 1, 0) != 1)
		return 0;
	return p.revents;
}

static bool rx_readable(struct wsd_sock *s, short kernel)
{
	struct wsd_session *ss = s->sess;

	serve_back_unlocked(s);         /* the bell that asked may be why we look */
	reset_if_shut(s);

	if (s->rx_shut || s->peer_fin || s->tcp_eof || s->tcp_err ||
	    wsd_prefix_has_data(s->pre))
		return true;
	rx_settle(s, false);
	check_back(s);
	if (s->rx_back)
		return stream_revents(s) != 0;
	if (s->rx_mode == DIR_PROOF)
		return false;   /* the stream's next bytes are the proof, not data */
	if (s->rx_mode != DIR_RING)
		return kernel & (POLLIN | POLLHUP | POLLERR);
	if (ss->rx_off)
		return true;    /* a record partly read */
	for (;;) {
		struct wire_rec r;
		struct wsd_wzc w;
		const char *why;
		uint64_t got;
		int k = walk(ss, ss->rx_pos, WIRE_SKIP(REC_PAD), &r, true);

		if (k < 0)
			return true;            /* the reset, to be read */
		ss->rx_pos = r.pos;         /* pads: nothing to read */
		if (!k) {
			/* dry: what the walk passed is reported, as rx_ring's */
			if (ss->rx_pos != ss->rx_reported)
				report(s, true);
			return false;
		}
		if (r.type != REC_WZC)
			return true;
		memcpy(&w, r.payload, sizeof(w));
		if (wsd_wire_wzc_check(&w, ss->post_gen, ss->post_active, ss->post_len, &got, &why)) {
			protocol_fail(ss, why);
			return true;
		}
		if (ss->post_active && w.gen == ss->post_gen)
			return true;
		consume(s, &r);   /* the answer to an offer let go: nothing to read */
	}
}

/* The peer's FIN record waits in the ring (behind data, perhaps). */
bool fin_pending(struct wsd_sock *s)
{
	struct wire_rec r;

	/* callers may not hold rx_lock: a walk that does not judge */
	return s->rx_mode == DIR_RING &&
	       walk(s->sess, s->sess->rx_pos, ~WIRE_SKIP(REC_FIN), &r, false) > 0;
}

short wsd_sock_revents(struct wsd_sock *s, short events, short kernel, bool arm)
{
	short r = 0;
	bool in;

	if (!s->sess || (s->rx_back && s->tx_back)) {
		/*
		 * Plain again (BACK), with a prefix or the peer's bells still
		 * owed: readable by the prefix, else by the stream once they
		 * are skipped, never by the kernel's word alone.
		 */
		r = kernel & ~POLLIN;
		if (events & POLLIN) {
			pthread_mutex_lock(&s->rx_lock);
			if (wsd_prefix_has_data(s->pre) || (stream_revents(s) & POLLIN))
				r |= POLLIN;
			pthread_mutex_unlock(&s->rx_lock);
		}
		if (events & POLLOUT) {
			struct pollfd p = { .fd = s->fd, .events = POLLOUT };

			if (real.poll(&p, 1, 0) == 1)
				r |= p.revents & (POLLOUT | POLLERR | POLLHUP);
		}
		return r & (events | POLLHUP | POLLERR);
	}
	if (peer_bypass(s->sess))
		/* reset: as tcp_poll says of a connection the peer reset */
		return (POLLIN | POLLOUT | POLLRDHUP | POLLERR | POLLHUP) & (events | POLLHUP | POLLERR);
	pthread_mutex_lock(&s->rx_lock);
	in = rx_readable(s, kernel);
	if (!in && arm && (events & POLLIN) && s->rx_ready_sent) {
		if (kernel & POLLIN)    /* a bell came: read it before arming again */
			atomic_store(&s->sess->arm_live, false);
		arm_data(s, false);
		in = rx_readable(s, kernel);
	}
	pthread_mutex_unlock(&s->rx_lock);
	if (in)
		r |= POLLIN;
	if (s->tcp_eof || s->peer_fin || s->rx_shut || fin_pending(s))
		r |= POLLRDHUP;
	if (s->rx_mode == DIR_TCP)
		r |= kernel & POLLRDHUP;   /* the peer shut its stream before switching */
	if (s->tcp_err)
		r |= POLLERR;
	if (ctl_get(s->sess, CW_CLOSED) == 2 && !s->tcp_eof)
		/* the peer reset (its kernel sent RST): readable, error, hang-up */
		r |= POLLIN | POLLRDHUP | POLLERR;
	if ((events & POLLOUT) && pthread_mutex_trylock(&s->tx_lock)) {
		/* a sender is busy in the stream: ask the kernel */
		struct pollfd p = { .fd = s->fd, .events = POLLOUT };

		if (s->tx_mode != DIR_RING && real.poll(&p, 1, 0) == 1)
			r |= p.revents & (POLLOUT | POLLERR | POLLHUP);
	} else if (events & POLLOUT) {
		if (s->tx_mode != DIR_RING) {
			struct pollfd p = { .fd = s->fd, .events = POLLOUT };

			if (real.poll(&p, 1, 0) == 1)
				r |= p.revents & (POLLOUT | POLLERR | POLLHUP);
		} else if (s->tx_shut || fits(s->sess, s->sess->tx_win / 4, false) ||
			   ctl_get(s->sess, CW_CLOSED) || s->tcp_eof) {
			r |= POLLOUT;
		} else if (arm) {
			struct wsd_session *ss = s->sess;

			put_word(ss, W_TX, CW_SPACE_ARM, ++ss->space_gen);
			if (fits(ss, ss->tx_win / 4, false)) {
				r |= POLLOUT;
			} else if (mutual_wait(s) && stall_check(s)) {
				struct pollfd p = { .fd = s->fd, .events = POLLOUT };

				if (real.poll(&p, 1, 0) == 1)
					r |= p.revents & (POLLOUT | POLLERR | POLLHUP);
			}
		}
		pthread_mutex_unlock(&s->tx_lock);
	}
	/* as tcp_poll: both directions shut here, or the connection reset */
	if (((s->tcp_eof || s->peer_fin || s->rx_shut || fin_pending(s)) && s->tx_shut) ||
	    s->tcp_err || ctl_get(s->sess, CW_CLOSED) == 2)
		r |= POLLHUP;
	return r & (events | POLLHUP | POLLERR);
}

uint64_t wsd_sock_rx_mark(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;
	struct wire_rec r;

	if (!ss || s->rx_mode != DIR_RING)
		return 0;
	/* without rx_lock: a walk that does not judge */
	walk(ss, ss->rx_pos, ~0u, &r, false);
	return r.pos;
}

void wsd_sock_arm(struct wsd_sock *s, short events)
{
	struct wsd_session *ss = s->sess;

	if (!ss)
		return;
	if ((events & POLLIN) && s->rx_ready_sent) {
		pthread_mutex_lock(&s->rx_lock);
		arm_data(s, false);
		pthread_mutex_unlock(&s->rx_lock);
	}
	if ((events & POLLOUT) && s->tx_mode == DIR_RING) {
		pthread_mutex_lock(&s->tx_lock);
		put_word(ss, W_TX, CW_SPACE_ARM, ++ss->space_gen);
		pthread_mutex_unlock(&s->tx_lock);
	}
}

void wsd_sock_bell_seen(struct wsd_sock *s)
{
	if (s->sess)
		atomic_store(&s->sess->arm_live, false);
}

bool wsd_sock_parkable(struct wsd_sock *s, bool *ready)
{
	struct wsd_session *ss = s->sess;
	bool ok = false;
	long us;

	*ready = false;
	if (!ss || !s->rx_ready_sent || (s->rx_back && s->tx_back) || peer_bypass(ss))
		return false;
	/* the test build: the peer's proof may come while we decide (proofwake_check.sh) */
	if (s->rx_mode == DIR_PROOF && wsd_fault("park-race", &us))
		usleep((useconds_t)us);
	pthread_mutex_lock(&s->rx_lock);
	/* not readable but by the kernel's word: in any mode but the ring's,
	 * readiness is the kernel stream's, and the ring's first record rings */
	if (arm_unrung(ss))
		ok = !(*ready = rx_readable(s, 0));
	pthread_mutex_unlock(&s->rx_lock);
	return ok;
}

/* Bytes a receive could return now (FIONREAD), or -1 to ask the kernel. */
long wsd_sock_nread(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;
	long n = 0;
	int k = 0;

	if (wsd_prefix_has_data(s->pre) && (!ss || !s->rx_ready_sent)) {
		int k = 0;

		real.ioctl(s->fd, FIONREAD, &k);
		wsd_prefix_lock(s->pre);
		n = (long)(s->pre->len - s->pre->off) + k - (long)s->pre->skip;
		wsd_prefix_unlock(s->pre);
		return n;
	}
	if (!ss || !s->rx_ready_sent)
		return -1;
	if (faulted(ss))
		return 0;
	pthread_mutex_lock(&s->rx_lock);
	rx_settle(s, false);
	if ((s->rx_mode == DIR_TCP || s->rx_mode == DIR_DRAIN) &&
	    real.ioctl(s->fd, FIONREAD, &k) == 0) {
		n = k;
		if (s->rx_mode == DIR_DRAIN && (uint64_t)n > s->rx_switch_at - s->tcp_rx)
			n = (long)(s->rx_switch_at - s->tcp_rx);
	}
	if (s->rx_mode != DIR_TCP && atomic_load(&s->proven)) {
		uint64_t pos = ss->rx_pos;
		uint32_t off = ss->rx_off;
		struct wire_rec r;

		while (walk(ss, pos, WIRE_SKIP(REC_PAD), &r, true) > 0 && r.type != REC_FIN) {
			uint64_t plen = r.type == REC_DATA ? r.len : 0;
			const char *why;

			if (r.type == REC_ZC) {
				struct wsd_zc z;

				memcpy(&z, r.payload, sizeof(z));
				if (wsd_wire_zc_check(&z, &why)) {
					protocol_fail(ss, why);
					break;
				}
				plen = z.len;
			}
			if (plen > off)
				n += (long)(plen - off);
			pos = r.next;
			off = 0;
		}
	}
	pthread_mutex_unlock(&s->rx_lock);
	return n;
}

const char *wsd_switch_path(int fd)
{
	struct wsd_sock *s = wsd_fd_get(fd);
	const char *p;

	if (!s)
		return NULL;
	if (wsd_sock_accel(s) && (s->tx_mode == DIR_RING || s->rx_mode == DIR_RING))
		p = s->sess->path == PATH_VERBS ? "verbs" : "shm";
	else
		p = "tcp";
	wsd_sock_put(s);
	return p;
}

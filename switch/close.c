/* SPDX-License-Identifier: MIT */
/*
 * The end of a session's streams: shutdown (a FIN record, or the
 * kernel's), the kernel stream finished once both FINs went by ring
 * (finish_kernel), and close: a reset for unread data or SO_LINGER {1, 0},
 * else a FIN record, SO_LINGER's wait for the peer to take our data, and
 * the closed word.  Locks: rx_lock, tx_lock and mu each in turn;
 * finish_kernel takes mu (rx.c calls it under rx_lock).  It does not free
 * the session (slot.c) nor the socket (sock.c).
 */
#define _GNU_SOURCE
#include <errno.h>

#include "switch/sess_int.h"

/* ---- shutdown, close ------------------------------------------------------------- */

/*
 * Both directions carried their FIN by ring: no doorbell is needed any more,
 * so end the kernel stream too, and the kernel's socket states (getpeername's
 * ENOTCONN, POLLHUP) follow as they would have.
 */
void finish_kernel(struct wsd_sock *s)
{
	pthread_mutex_lock(&s->mu);
	if (!s->kernel_fin && s->tx_shut && s->tx_mode == DIR_RING &&
	    (s->peer_fin || fin_pending(s))) {
		s->kernel_fin = true;
		real.shutdown(s->fd, SHUT_WR);
	}
	pthread_mutex_unlock(&s->mu);
}

int wsd_sock_shutdown(struct wsd_sock *s, int how)
{
	int r = 0;

	if (how == SHUT_RD || how == SHUT_RDWR) {
		pthread_mutex_lock(&s->rx_lock);
		s->rx_shut = true;
		pthread_mutex_unlock(&s->rx_lock);
		if (!s->rx_ready_sent && real.shutdown(s->fd, SHUT_RD))
			return -errno;
	}
	if (how == SHUT_WR || how == SHUT_RDWR) {
		pthread_mutex_lock(&s->tx_lock);
		if (s->tx_shut && s->kernel_fin) {
			/* both ends finished: the kernel's socket answers (ENOTCONN) */
			if (real.shutdown(s->fd, how))
				r = -errno;
		} else if (!s->tx_shut) {
			if (s->tx_mode == DIR_RING && bells_tx_check(s)) {
				/* reset instead: the peer's next call says so */
			} else if (s->tx_mode == DIR_RING) {
				if (fits(s->sess, 0, true))
					r = write_record(s, REC_FIN, NULL, 0, NULL);
				ring_data(s);
			} else if (real.shutdown(s->fd, SHUT_WR)) {
				r = -errno;
			}
			s->tx_shut = r == 0;
		}
		pthread_mutex_unlock(&s->tx_lock);
		finish_kernel(s);
	}
	return r;
}

/* SO_LINGER with a time (l): wait (that long at most) for the peer to take our data. */
static void linger(struct wsd_sock *s, struct linger l)
{
	struct wsd_session *ss = s->sess;
	int64_t end;

	if (s->tx_mode != DIR_RING || !l.l_onoff || l.l_linger <= 0)
		return;
	end = wsd_now_ms() + (int64_t)l.l_linger * 1000;
	while (ctl_get(ss, CW_CONSUMED) < ss->tx_pos &&
	       !ctl_get(ss, CW_CLOSED) && wsd_now_ms() < end) {
		struct pollfd p = { .fd = s->fd };

		real.poll(&p, 1, TICK_MS);
		if (p.revents & (POLLERR | POLLHUP))
			break;
	}
}

/* rx_lock taken here: the peer's SWITCH read if there, and whether its proof is still due. */
static bool proof_due(struct wsd_sock *s)
{
	bool due;

	pthread_mutex_lock(&s->rx_lock);
	rx_settle(s, false);
	due = s->rx_mode == DIR_PROOF && !faulted(s->sess);
	pthread_mutex_unlock(&s->rx_lock);
	return due;
}

/* mu taken here: the bells the peer announced are all read (or the stream ended). */
static bool bells_in(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;
	uint64_t w = ctl_get(ss, CW_BELLS);
	bool in;

	pthread_mutex_lock(&s->mu);
	drain(s);
	in = s->rx_mode != DIR_RING || s->tcp_eof || s->tcp_err || faulted(ss) ||
	     ss->bells_rx >= wsd_bells_announced(w);
	pthread_mutex_unlock(&s->mu);
	return in;
}

/*
 * Before the kernel's close (wsd-protocol(7), Closing): every byte the
 * peer's switch put on the stream is read, since one that reached the
 * socket after its close would draw the kernel's reset, where TCP ends
 * the connection cleanly (the program read all the peer's program sent).
 * The peer announces each such write before it makes it and looks at
 * CW_CLOSED after; we write CLOSING and look at its announcements after,
 * so that one of the two sees the other: it writes nothing more, or we
 * wait for what it writes.
 */
static void collect(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;
	int64_t end = wsd_now_ms() + CLOSE_STEP_MS;
	bool due;

	pthread_mutex_lock(&s->tx_lock);
	put_word(ss, W_TX, CW_CLOSED, WSD_CLOSING);
	pthread_mutex_unlock(&s->tx_lock);
	due = proof_due(s);
	pthread_mutex_lock(&s->tx_lock);
	put_word(ss, W_TX, CW_CLOSED, due ? WSD_CLOSING_PROOF : WSD_CLOSING_NO_PROOF);
	pthread_mutex_unlock(&s->tx_lock);
	while ((due || !bells_in(s)) && wsd_now_ms() < end && !faulted(ss)) {
		struct pollfd p = { .fd = s->fd, .events = POLLIN };

		real.poll(&p, 1, 1);
		if (due)
			due = proof_due(s);
	}
	if (due || !bells_in(s))
		wsd_debug("switch: fd %d closes without the peer's %s, after %d ms", s->fd,
			  due ? "proof" : "announced bells", CLOSE_STEP_MS);
}

void wsd_sock_closed(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;

	struct linger l = { 0 };
	socklen_t len = sizeof(l);
	bool lingers;

	if (ss && !s->detached && !faulted(ss))
		collect(s);
	/* after a violation the kernel's close ends what protocol_fail shut */
	if (!ss || s->detached || faulted(ss))
		return;
	if (real.getsockopt(s->fd, SOL_SOCKET, SO_LINGER, &l, &len))
		l = (struct linger){ 0 };
	lingers = l.l_onoff && l.l_linger > 0;
	if ((l.l_onoff && l.l_linger == 0) || (s->rx_ready_sent && wsd_sock_nread(s) > 0)) {
		/* SO_LINGER {1, 0} or unread data: the kernel resets, and so must we */
		l = (struct linger){ 1, 0 };
		real.setsockopt(s->fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
		pthread_mutex_lock(&s->tx_lock);
		s->tx_shut = true;
		put_word(ss, W_TX, CW_CLOSED, 2);
		pthread_mutex_unlock(&s->tx_lock);
		return;
	}
	/* doorbells left unread would make the kernel's close a reset */
	pthread_mutex_lock(&s->mu);
	drain(s);
	pthread_mutex_unlock(&s->mu);
	/*
	 * Sends back on the stream: the kernel's close ends them.  Receives may
	 * still come by ring (a downgrade the peer did not answer in time), and
	 * the bells its sends rang are read above, or this close would be a
	 * reset that the peer's next receive reports.
	 */
	if (s->tx_back)
		return;
	pthread_mutex_lock(&s->tx_lock);
	if (!s->tx_shut && bells_tx_check(s)) {
		pthread_mutex_unlock(&s->tx_lock);
		return;     /* reset: the kernel's close ends it */
	}
	if (s->tx_mode == DIR_RING && !s->tx_shut && fits(ss, 0, true))
		write_record(s, REC_FIN, NULL, 0, NULL);
	s->tx_shut = true;
	if (s->tx_mode == DIR_RING && !lingers && ctl_get(ss, CW_DATA_ARM) != ss->rung_data) {
		/*
		 * A peer that armed is woken by the kernel's FIN, sent here
		 * rather than by the close (another process may hold the
		 * socket), where a doorbell would be one more segment for it
		 * to read before the FIN that follows.  Our FIN record is in
		 * its ring ahead of it.
		 */
		real.shutdown(s->fd, SHUT_WR);
	} else if (s->tx_mode == DIR_RING) {
		ring_data(s);
	}
	linger(s, l);
	put_word(ss, W_TX, CW_CLOSED, 1);
	pthread_mutex_unlock(&s->tx_lock);
}

/* SPDX-License-Identifier: MIT */
/*
 * Each direction's switch from the kernel stream to the ring: the sender's
 * SWITCH record and, right after it on the stream, the proof that it holds
 * the TCP connection (tx_switch, proof_write); the receiver's SWITCH at the
 * head (check_switch) and the proof read before anything is taken from the
 * ring (proof_read, proof_in_read), failing which a listening side goes on
 * as plain TCP (proof_fail).  Locks: the sending side under tx_lock, the
 * receiving side under rx_lock (tx_locked: tx_lock held too), mu for the
 * mode change.  It does not go back to the stream (back.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "switch/sess_int.h"

/*
 * tx_lock held, our SWITCH record written: the peer's challenge on the
 * stream, whole, before any doorbell (the peer reads it at our SWITCH
 * point).  0 or -errno: a stream that takes no more is a dead connection.
 */
static int proof_write(struct wsd_sock *s)
{
	const uint8_t *p = s->sess->peer_nonce;
	size_t left = WSD_NONCE;

	for (int tries = 0; left && tries < 1000; tries++) {
		ssize_t n = real.send(s->fd, p, left, MSG_DONTWAIT | MSG_NOSIGNAL);
		struct pollfd w = { .fd = s->fd, .events = POLLOUT };

		if (n > 0) {
			p += n;
			left -= (size_t)n;
			continue;
		}
		if (n < 0 && errno != EAGAIN && errno != EINTR)
			return -errno;
		real.poll(&w, 1, TICK_MS);
	}
	return left ? -ETIMEDOUT : 0;
}

/*
 * tx_lock held, our SWITCH record written (and so announced): whether the
 * peer still reads our proof (wsd-protocol(7), Closing).  A peer whose
 * close began looks for our SWITCH after saying so, and says whether it
 * saw it: then it waits for the proof.  Otherwise its program closed, and
 * a proof written now would reach its socket after the close, whose
 * kernel then resets a connection TCP would have ended cleanly.  A peer
 * that does not say within CLOSE_STEP_MS is taken not to read it.
 */
static bool proof_wanted(struct wsd_sock *s)
{
	int64_t end = 0;

	for (;;) {
		uint64_t v = ctl_get(s->sess, CW_CLOSED);

		if (v == 0 || v == WSD_CLOSING_PROOF)
			return true;
		if (v != WSD_CLOSING || faulted(s->sess))
			return false;
		if (!end)
			end = wsd_now_ms() + CLOSE_STEP_MS;
		else if (wsd_now_ms() >= end)
			return false;
		real.poll(NULL, 0, 1);
	}
}

/* The listening side, whose peer's proof is waived: it saw the peer's socket (WSD_OPENED_HELD). */
static bool waived(const struct wsd_sock *s)
{
	return !s->connected_side && s->sess->proof_waived;
}

/*
 * tx_lock held, our SWITCH and whatever goes before the proof written: the
 * proof, and the ring from now on.  false: the stream took no proof (the
 * connection is broken).
 */
static bool to_ring(struct wsd_sock *s, int64_t written)
{
	bool was, no_proof = s->connected_side && s->sess->proof_waived;
	long ms;

	/* our SWITCH is in the peer's ring: its program may close meanwhile */
	if (!no_proof && wsd_fault("proof-delay", &ms))
		usleep((useconds_t)ms * 1000);
	if (!no_proof && proof_wanted(s) && proof_write(s)) {
		broken(s, -ECONNRESET);
		return false;
	}
	/* written (exact, or -1) counts no proof: the kernel is asked again after one */
	bells_tx_base(s, no_proof ? written : -1);
	s->tx_mode = DIR_RING;
	/*
	 * A bell too, if the peer armed, proof or not: a proof is no wake-up
	 * the peer can count on.  Any look of the peer's at its socket may take
	 * it (a sender's wait, another thread's call, an epoll set deciding
	 * whether to park it, or a second blocking receive, which proof_ours
	 * lets take it), and a look that reports nothing leaves a waiter
	 * asleep on a stream that carries nothing more, with the data it waits
	 * for already in its ring (tests/fault/proofwake_check.sh, twin).
	 * On verbs too: the hang of the VM rig's many.pair under load that
	 * once kept it off there was not seen again once the rig's wire kept
	 * rxe's packets in order (84b2486).
	 * The test build's no-proof-bell turns it off.  With no proof (waived)
	 * the bell is the only wake-up.
	 */
	if (no_proof || !wsd_fault("no-proof-bell", NULL))
		ring_data(s);
	/* the test build: a listening side's data of this send after the bell, late */
	if (!s->connected_side && wsd_fault("switch-data-delay", &ms))
		usleep((useconds_t)ms * 1000);
	pthread_mutex_lock(&s->mu);
	was = s->accel;
	s->accel = true;
	pthread_mutex_unlock(&s->mu);
	became_accel(s, was);
	if (was)
		wsd_poll_sock_accelerated(s);   /* POLLOUT is the ring's to say now */
	return true;
}

/* tx_lock held: move this direction to the ring if the peer is ready. */
bool tx_switch(struct wsd_sock *s)
{
	return tx_switch_with(s, NULL, NULL);
}

/*
 * ...and with the first bytes of a send (c, when not NULL: *sent of them)
 * in a record between our SWITCH and our proof: a peer that waits for the
 * proof finds them with it, and one asleep is rung after it (to_ring).
 */
bool tx_switch_with(struct wsd_sock *s, struct cursor *c, size_t *sent)
{
	struct wsd_session *ss = s->sess;
	uint64_t n;

	if (s->tx_mode == DIR_RING)
		return true;
	/*
	 * The connecting side goes first: it dialled the peer's own address
	 * (or its registry, which proved its process).  The listening side
	 * waits for that proof: its ring's peer could be anyone who named
	 * this connection's 4-tuple.  A peer whose socket we saw (proof_waived)
	 * reads its ring before its stream from its answer on: we do not wait
	 * for its rx_ready to show.
	 */
	if (!ss || s->tx_shut || s->detached || s->tx_back ||
	    (!s->connected_side && !atomic_load(&s->proven)) ||
	    !(waived(s) || ctl_get(ss, CW_RX_READY)))
		return false;
	n = s->tcp_tx;
	if (write_record(s, REC_SWITCH, NULL, sizeof(n), &n))
		return false;
	if (c && cur_left(c) && cur_left(c) <= max_payload(ss) &&
	    fits(ss, (uint32_t)cur_left(c), false)) {
		uint32_t len = (uint32_t)cur_left(c);

		if (write_record(s, REC_DATA, c, len, NULL))
			return false;
		*sent = len;
		wsd_stat_add(s->stat, &s->stat->copy_tx, len);
	}
	if (!to_ring(s, -1))
		return false;
	wsd_debug("switch: fd %d sends by ring after %llu stream bytes", s->fd,
		  (unsigned long long)n);
	return true;
}

void tx_prov_commit(struct wsd_sock *s)
{
	bool exact;
	int64_t k = kernel_written_ex(s->fd, false, &exact);

	if (s->tx_mode != DIR_PROV)
		return;   /* nothing went into the grant: the usual switch, later */
	/* a write we did not see went on the stream ahead of where our proof would */
	if (k >= 0 && s->prov_k0 >= 0 && k > s->prov_k0) {
		session_fail(s->sess, R_BYPASS, "stream bytes written before the first bytes' proof");
		return;
	}
	/* tx_lock held since k: nothing of ours went on the stream; k serves as the base */
	if (!to_ring(s, exact ? k : -1))
		return;
	wsd_stat_add(s->stat, &s->stat->copy_tx, s->prov_len);
	wsd_debug("switch: fd %d sends by ring from its first byte", s->fd);
}

static void proof_fail(struct wsd_sock *s, const char *why, bool tx_locked);

/*
 * The listening side: the peer, answered OPENED in our mailbox, stayed on
 * the stream without switching (it rejected the entry).  Before any SWITCH
 * of its came and while ours waits for its proof, nothing of the session
 * was used: it goes, and the socket is plain TCP again.  A SWITCH already
 * read is left to the proof, which fails on the stream's bytes.
 */
void wsd_sock_unswitched(struct wsd_sock *s)
{
	bool plain = false;

	pthread_mutex_lock(&s->rx_lock);
	pthread_mutex_lock(&s->tx_lock);
	if (s->sess && !s->connected_side && s->tx_mode != DIR_RING && s->rx_mode == DIR_TCP &&
	    !atomic_load(&s->proven) && !s->rx_back) {
		s->rx_back = true;
		s->tx_back = true;
		plain = true;
	}
	pthread_mutex_unlock(&s->tx_lock);
	pthread_mutex_unlock(&s->rx_lock);
	if (plain)
		plain_again(s, R_UNSUPPORTED);
}

/*
 * rx_lock held: a SWITCH record at the head moves rx to DRAIN (or straight
 * to PROOF when every stream byte before the switch point was read).
 */
void check_switch(struct wsd_sock *s, bool tx_locked)
{
	struct wsd_session *ss = s->sess;
	struct wire_rec r;
	const char *why;
	uint64_t n;

	if (!ss || s->rx_mode != DIR_TCP || s->rx_back)
		return;
	if (rec_at(ss, ss->rx_pos, &r) <= 0 || r.type != REC_SWITCH)
		return;
	memcpy(&n, r.payload, sizeof(n));
	if (wsd_wire_switch_check(n, s->tcp_rx, &why)) {
		/* e.g. stream bytes we delivered that it says it never sent */
		if (peer_untrusted(ss))
			proof_fail(s, why, tx_locked);
		else
			protocol_fail(ss, why);
		return;
	}
	s->rx_switch_at = n;
	consume(s, &r);
	report(s, false);
	s->rx_mode = s->tcp_rx == n ? DIR_PROOF : DIR_DRAIN;
	s->proof_got = 0;
	wsd_debug("switch: fd %d receives by ring after %llu stream bytes and the proof", s->fd,
		  (unsigned long long)n);
}

/* ---- the proof ------------------------------------------------------------------ */

/*
 * rx_lock held: the ring's peer failed to show it holds this TCP
 * connection (what the stream carries at its switch point is not our
 * challenge).  The listening side has sent nothing by ring and read
 * nothing from it: it forgets the session and goes on as plain TCP, the
 * stream bytes it looked at still the program's (the part of the
 * challenge it took first, since it matched, is given back as a prefix).
 * The connecting side already sends by ring to whoever that is: the
 * connection fails at both ends (a reset), never to deliver a byte of it.
 */
static void proof_fail(struct wsd_sock *s, const char *why, bool tx_locked)
{
	struct wsd_session *ss = s->sess;
	bool reset;

	/* tx_mode and tx_back are the sender's: decided and set under its lock */
	if (!tx_locked)
		pthread_mutex_lock(&s->tx_lock);
	/*
	 * A peer that sent first bytes into our grant (wsd-protocol(7), The
	 * mailbox) and then no proof wrote on the stream behind its switch's
	 * back: those bytes and the stream's cannot both be the program's, so
	 * the connection fails.  Such a peer passed the shm transport's check
	 * (it may write our memory): it could break us anyway.
	 */
	reset = !peer_untrusted(ss) || s->tx_mode == DIR_RING || ss->granted ||
		(s->proof_got && set_prefix(s, ss->nonce, s->proof_got));
	if (!reset) {
		s->proof_got = 0;
		s->rx_mode = DIR_TCP;
		s->rx_back = true;
		s->tx_back = true;   /* our sending side never switched, nor will */
	}
	if (!tx_locked)
		pthread_mutex_unlock(&s->tx_lock);
	if (reset) {
		session_fail(ss, R_AUTH, why);
		return;
	}
	wsd_debug("switch: fd %d: the ring's peer failed its proof (%s): plain TCP", s->fd, why);
	wsd_session_abandon(ss);
	plain_again(s, R_AUTH);
	wsd_stat_add(s->stat, &s->stat->fallbacks, 1);
	wsd_stat_refused(R_AUTH);
}

/* rx_lock held, rx at the peer's switch point: from here the ring, the stream's bytes bells. */
static void rx_to_ring(struct wsd_sock *s)
{
	atomic_store(&s->proven, true);
	pthread_mutex_lock(&s->mu);
	bells_base(s);
	s->rx_mode = DIR_RING;
	pthread_mutex_unlock(&s->mu);
}

/*
 * rx_lock held, rx in PROOF: take the peer's proof from the stream without
 * waiting.  Bytes are looked at before they are taken, so that a mismatch
 * leaves them to the program; they are taken as they match.  Part of a
 * proof that waits PROOF_MS for the rest is a failure (the peer writes all
 * of it at once).
 */
void proof_read(struct wsd_sock *s, bool tx_locked)
{
	struct wsd_session *ss = s->sess;
	uint8_t b[WSD_NONCE];
	ssize_t n;

	if (s->rx_mode == DIR_PROOF && waived(s)) {
		rx_to_ring(s);
		return;
	}
	while (s->rx_mode == DIR_PROOF) {
		n = real.recv(s->fd, b, WSD_NONCE - s->proof_got, MSG_DONTWAIT | MSG_PEEK);
		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
			/* the stream ended or failed where the proof should be */
			proof_fail(s, "no proof before the end of the stream", tx_locked);
			return;
		}
		if (n < 0) {
			/*
			 * Not a certain failure: the bytes taken may be an honest
			 * proof's first part, which must never reach the program
			 * as data.  A reset loses nothing that was delivered.
			 */
			if (s->proof_got && wsd_now_ms() - s->proof_since > PROOF_MS)
				session_fail(ss, R_AUTH, "part of a proof, and no more");
			return;
		}
		if (memcmp(b, ss->nonce + s->proof_got, (size_t)n)) {
			proof_fail(s, "the stream does not carry our challenge", tx_locked);
			return;
		}
		/* a receiver asleep in the socket needs these bytes to wake */
		if (!proof_ours(s))
			return;
		n = real.recv(s->fd, b, (size_t)n, MSG_DONTWAIT);
		if (n <= 0)
			continue;
		if (!s->proof_got)
			s->proof_since = wsd_now_ms();
		s->proof_got = (uint8_t)(s->proof_got + n);
		if (s->proof_got == WSD_NONCE) {
			rx_to_ring(s);
			wsd_debug("switch: fd %d: the peer proved the connection", s->fd);
		}
	}
}

/*
 * rx_lock held, rx in TCP and a read of n stream bytes just taken (unless
 * peek) that found the peer's SWITCH point `left` bytes in: the bytes past
 * it (in the caller's buffer, at c) are the proof, then doorbells.  Returns
 * the bytes of the read that are data: left, or all n when the ring's peer
 * failed the proof and the socket went back to plain TCP.
 */
size_t proof_in_read(struct wsd_sock *s, const struct cursor *c, size_t left, size_t n,
		     bool peek)
{
	struct wsd_session *ss = s->sess;
	struct cursor k = *c;
	uint8_t b[WSD_NONCE];
	size_t m = waived(s) ? 0 : n - left;   /* no proof: bells from the switch point */

	if (m > WSD_NONCE)
		m = WSD_NONCE;
	cur_skip(&k, left);
	cur_copy_from(&k, b, m);
	if (m && memcmp(b, ss->nonce, m)) {
		proof_fail(s, "the stream does not carry our challenge", false);
		return s->rx_mode == DIR_TCP && !s->tcp_err ? n : left;
	}
	if (peek)
		return left;   /* nothing taken: the next read finds the same */
	s->rx_mode = DIR_PROOF;
	s->proof_got = (uint8_t)m;
	s->proof_since = wsd_now_ms();
	if (m == WSD_NONCE || waived(s)) {
		uint64_t ann;
		const char *why = NULL;

		atomic_store(&s->proven, true);
		/* read, and not data: each must be the next announced bell (BACK counts them) */
		ann = wsd_bells_announced(ctl_get(ss, CW_BELLS));
		pthread_mutex_lock(&s->mu);
		for (size_t rest = n - left - m; rest && !why;) {
			size_t q = rest < sizeof(b) ? rest : sizeof(b);

			cur_copy_from(&k, b, q);
			/* (already taken: a word half written counts them as the bells they look) */
			if (wsd_wire_bells_check(b, q, ss->bells_rx, ann, &why) &&
			    bells_settle(s, b, q) != -EPROTO)
				why = NULL;
			if (!why)
				ss->bells_rx += q;
			rest -= q;
		}
		/* RING only now: a drain (mu) then finds bells_rx counting these */
		bells_base(s);
		s->rx_mode = DIR_RING;
		pthread_mutex_unlock(&s->mu);
		if (why)
			session_fail(ss, R_BYPASS, why);
	}
	return left;
}

/*
 * rx_lock held: the receiving direction's state moved on as far as it can
 * without waiting (a SWITCH record, the end of the drain, the proof).
 */
void rx_settle(struct wsd_sock *s, bool tx_locked)
{
	check_switch(s, tx_locked);
	if (s->rx_mode == DIR_DRAIN && s->tcp_rx == s->rx_switch_at)
		s->rx_mode = DIR_PROOF;
	if (s->rx_mode == DIR_PROOF)
		proof_read(s, tx_locked);
}

/*
 * The connecting side switches its sending direction as soon as it may,
 * not only at its next send: the listening side sends nothing by ring
 * before it read our proof, which follows our SWITCH.
 */
void prove_self(struct wsd_sock *s)
{
	if (!s->connected_side || s->tx_mode == DIR_RING || !s->sess || s->tx_back ||
	    s->tx_shut || !ctl_get(s->sess, CW_RX_READY) || pthread_mutex_trylock(&s->tx_lock))
		return;
	tx_switch(s);
	pthread_mutex_unlock(&s->tx_lock);
}

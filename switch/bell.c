/* SPDX-License-Identifier: MIT */
/*
 * Doorbells (wsd-protocol(7), Doorbells): the single bytes on the kernel
 * stream that wake a peer asleep in its fd.  Sent counted and announced
 * (try_bell; ring_data and ring_space when the peer armed), read by the
 * drain, and the stream judged against what the kernel counts, so that a
 * byte a call we do not see wrote or read there fails the connection
 * (R_BYPASS: bells_due, bells_look, bells_tx_check).  Locks: bells are
 * sent under tx_lock and read under mu (bells_rx, k_base); ring_space
 * takes tx_lock under rx_lock.  It does not decide when to sleep (wait.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>
#include <sys/ioctl.h>
#include <netinet/tcp.h>
#include <linux/sockios.h>
#include <sched.h>

#include "provider/fault.h"
#include "switch/sess_int.h"

/*
 * Doorbells the peer announced and our kernel socket does not hold
 * (wsd-protocol(7), Doorbells) are on their way, or were taken by a call
 * we did not see.  The kernel tells which (kernel_taken): we look again
 * every BELL_RECHECK_MS while some are missing.  A kernel that does not
 * tell leaves a grace: on one host the loopback delivers a bell within
 * the sender's call, though a loaded machine may defer that to ksoftirqd;
 * across hosts TCP retransmits a lost segment after a backoff of seconds.
 */
#define BELL_RECHECK_MS 100
#define BELL_GRACE_SHM_MS 2000
#define BELL_GRACE_VERBS_MS 10000

/*
 * struct tcp_info as Linux 4.1 and later fill it (<linux/tcp.h>), past the
 * part glibc's copy declares: tcpi_bytes_received counts every byte the
 * kernel took in order on the connection (and the FIN); from 4.6,
 * notsent_bytes the bytes written and not yet sent, data_segs_out the
 * segments that carried data (sent again or not).
 */
struct tcp_info_rx {
	struct tcp_info base;
	uint64_t pacing_rate, max_pacing_rate, bytes_acked, bytes_received;
	uint32_t segs_out, segs_in, notsent_bytes, min_rtt, data_segs_in, data_segs_out;
};
_Static_assert(offsetof(struct tcp_info_rx, bytes_received) == 128, "tcp_info layout");
_Static_assert(offsetof(struct tcp_info_rx, data_segs_out) == 156, "tcp_info layout");
/* ---- doorbells --------------------------------------------------------------- */

/*
 * tx_lock held: one bell on the stream, counted (BACK tells the peer how
 * many).  Announced first (CW_BELLS, with the "one more" bit): the peer
 * takes a byte on the stream that it finds no count for as one moved by a
 * call the switch did not see.  A bell the kernel does not take is
 * unannounced again, or the peer would wait for it (and, after its grace,
 * call it stolen).  false with errno when it was not written.
 */
bool try_bell(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;
	uint8_t bell = wsd_bell_value(ss->bells_tx + 1);
	int e;

	/* closed: the number may be another file's now (sock.c, last_close) */
	if (atomic_load(&s->closed)) {
		errno = EBADF;
		return false;
	}
	if (put_word(ss, W_TX, CW_BELLS, ss->bells_tx << 1 | 1)) {
		errno = ECONNRESET;
		return false;
	}
	/*
	 * Announced, then the peer's close looked at (wsd-protocol(7),
	 * Closing): a close that began is no one to wake, and the byte
	 * would reach its socket after it, where the kernel answers a reset.
	 */
	if (ctl_get(ss, CW_CLOSED)) {
		put_word(ss, W_TX, CW_BELLS, ss->bells_tx << 1);
		errno = EPIPE;
		return false;
	}
	if (wsd_fault("bell-unsent", NULL) ? (errno = ENOBUFS, true) :
	    real.send(s->fd, &bell, 1, MSG_DONTWAIT | MSG_NOSIGNAL) != 1) {
		e = errno;
		put_word(ss, W_TX, CW_BELLS, ss->bells_tx << 1);
		/*
		 * The kernel reports a reset once, to whichever call comes
		 * first: this bell took it, so keep it for the receiver, who
		 * would otherwise read a clean end of stream.
		 */
		if (e == ECONNRESET)
			keep_error(s, e);
		errno = e;
		return false;
	}
	ss->bells_tx++;
	wsd_stat_add(s->stat, &s->stat->doorbells_tx, 1);
	/* one bell wakes the peer for every ring before it: none is owed */
	atomic_store_explicit(&ss->bell_owed, false, memory_order_relaxed);
	return true;
}

/*
 * tx_lock held: a ring (wsd-protocol(7), Sleeping and waking).  The peer
 * that armed may be asleep on its kernel socket with nothing else coming
 * there, so a bell the kernel did not take is owed, not dropped: the
 * channel's sweep and this socket's next wait write it (bell_retry).
 * Only a peer that began to close (EPIPE), a socket closed here or a
 * connection reset needs none.
 */
static void doorbell(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;

	if (try_bell(s))
		return;
	ss->bells_unsent++;
	ss->bell_errno = errno;
	if (errno != EPIPE && errno != EBADF && errno != ECONNRESET)
		atomic_store_explicit(&ss->bell_owed, true, memory_order_relaxed);
}

/*
 * A bell owed (doorbell), written now if tx_lock is free (its holder is
 * sending: it rings after its records anyway).  Cheap when none is owed.
 */
void bell_retry(struct wsd_sock *s, struct wsd_session *ss)
{
	if (!atomic_load_explicit(&ss->bell_owed, memory_order_relaxed) ||
	    pthread_mutex_trylock(&s->tx_lock))
		return;
	/*
	 * Only while this direction is on the ring: once it went back to the
	 * stream (its BACK counts the bells before it), a byte there is data,
	 * and the stream's own bytes wake the peer.
	 */
	if (s->sess == ss && s->tx_mode == DIR_RING && !s->tx_back && !s->tx_shut)
		doorbell(s);
	else if (s->sess != ss || s->tx_back)
		atomic_store_explicit(&ss->bell_owed, false, memory_order_relaxed);
	pthread_mutex_unlock(&s->tx_lock);
}

/*
 * Between two liveness bells (bell_probe): a peer that half-closed and
 * reads on gets one byte a second while our sender waits for it.
 */
#define PROBE_MS 1000

/*
 * tx_lock held, a sender waiting for room while our receive is still on
 * the stream.  The peer's death shows on the kernel stream as its FIN or
 * a reset: a reset ends the wait (wait_fd, POLLHUP), but a FIN there is
 * also what a live peer's shutdown sends, and one that half-closed may
 * read our ring yet.  A peer killed with its ring unread can send nothing
 * more, so ask its kernel: a bell (announced, so a live peer takes it for
 * one) to a socket no process holds is answered with a reset, which the
 * next wait sees.  Once a second while the peer's FIN is in (CLOSE_WAIT).
 */
void bell_probe(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;
	struct tcp_info ti;
	socklen_t tl = sizeof(ti);
	int64_t now;

	if (!ss || s->tx_mode != DIR_RING || s->tx_back || s->tx_shut || s->rx_mode == DIR_RING)
		return;
	now = wsd_now_ms();
	if (now - ss->probe_at < PROBE_MS ||
	    real.getsockopt(s->fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) ||
	    ti.tcpi_state != TCP_CLOSE_WAIT)
		return;
	ss->probe_at = now;
	(void)try_bell(s);   /* one the kernel did not take: the next second's */
}

/* tx_lock held: the peer waits for data, so make its fd readable. */
void ring_data(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;
	uint64_t v;

	race_window();    /* the record out, the arm not yet read */
	v = ctl_get(ss, CW_DATA_ARM);

	if (v != ss->rung_data) {
		ss->rung_data = v;
		doorbell(s);
	}
}

/* rx_lock held: the peer waits for room (or a zero-copy completion). */
void ring_space(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;
	uint64_t v;

	race_window();    /* the room reported, the arm not yet read */
	v = ctl_get(ss, CW_SPACE_ARM);

	/*
	 * A direction back on the stream rings no more (tx_switch says no),
	 * and its sender may sit in a blocking kernel send holding tx_lock
	 * until the peer reads the stream, which the peer does only once we
	 * read our ring up to its BACK: do not wait for that lock here, nor
	 * go on waiting for it once the direction has gone back meanwhile.
	 */
	if (v == ss->rung_space || !tx_lock_unless_back(s))
		return;
	if (tx_switch(s)) {
		ss->rung_space = v;
		doorbell(s);
	}
	pthread_mutex_unlock(&s->tx_lock);
}

/*
 * One of the kernel's byte counts of the stream (TCP_INFO: rx, bytes
 * received in order and the FIN; else bytes acknowledged) with its queue
 * (FIONREAD / SIOCOUTQ) taken between two reads of it.  When the count did
 * not move across the queue's question, the pair is one moment's: exact.
 * When segments keep arriving, after a few tries the pair is taken in the
 * order that errs as asked (high or low: a byte arriving between the two
 * questions makes the answer one too high or one too low).  A count off by
 * one hid a stolen doorbell: bells_base took one too high while a bell
 * arrived, and the missing bell then looked on its way for ever (the
 * bypass check's read case waited out its receive timeout, 1 run in 8
 * under load).  -1 when the kernel does not tell.
 *
 * A stream that has carried no data yet in the direction asked (no
 * segment with data received; or none sent, nothing waiting to be and our
 * FIN not sent) has an empty queue there: the count alone is the answer,
 * exact, from the one question.  (The count itself may include the SYN or
 * the FIN, as in any other answer: the kernel counts one of them on some
 * paths; bases and checks compare answers of this function only.)  That is
 * every short connection's case at its switch and often at its close, one
 * system call where the pair and its check take three.
 */
static int64_t kernel_count(int fd, bool rx, bool high, bool *exact)
{
	struct tcp_info_rx ti;
	uint64_t c[2] = { 0, 0 };
	int q = 0;

	*exact = false;
	for (int i = 0; i < 8; i++) {
		for (int k = 0; k < 2; k++) {
			socklen_t len = sizeof(ti);

			if (real.getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) ||
			    len < offsetof(struct tcp_info_rx, bytes_received) +
					  sizeof(ti.bytes_received))
				return -1;
			if (i == 0 && k == 0 && len >= sizeof(ti) &&
			    (rx ? !ti.data_segs_in :
				  !ti.data_segs_out && !ti.notsent_bytes &&
				  (ti.base.tcpi_state == TCP_ESTABLISHED ||
				   ti.base.tcpi_state == TCP_CLOSE_WAIT))) {
				*exact = true;
				return (int64_t)(rx ? ti.bytes_received : ti.bytes_acked);
			}
			c[k] = rx ? ti.bytes_received : ti.bytes_acked;
			if (k == 0 && real.ioctl(fd, rx ? FIONREAD : SIOCOUTQ, &q))
				return -1;
		}
		if (c[0] == c[1]) {
			*exact = true;
			break;
		}
	}
	/*
	 * Still moving: received bytes raise the count after the queue was
	 * asked (the later count errs high), acknowledged ones lower the queue
	 * before the count is asked (the later count errs high too).
	 */
	return rx ? (int64_t)(c[high ? 1 : 0] - (uint64_t)q) : (int64_t)(c[high ? 1 : 0] + (uint64_t)q);
}

/*
 * The bytes read from the kernel socket so far, by anyone, as the kernel
 * counts them (received in order, less those it still holds), or -1 when
 * it does not tell.  high: when it cannot be had exact, an answer that
 * errs high (for a base taken before any check), else low (for a check):
 * the two errors only ever hide a theft, never invent one.
 */
static int64_t kernel_taken(int fd, bool high)
{
	bool exact;

	return kernel_count(fd, true, high, &exact);
}

/*
 * The bytes written to the kernel socket so far, by anyone, as the kernel
 * counts them (acknowledged by the peer, plus those it still holds), or -1.
 * high: as kernel_taken's.  Before our FIN only: the kernel counts that
 * too.
 */
int64_t kernel_written(int fd, bool high)
{
	bool exact;

	return kernel_count(fd, false, high, &exact);
}

/* kernel_written, and whether the count is one moment's (*exact) rather than an estimate. */
int64_t kernel_written_ex(int fd, bool high, bool *exact)
{
	return kernel_count(fd, false, high, exact);
}

/*
 * tx_lock held, our direction switched (its proof written): from here the
 * only bytes we write on the stream are bells, so the kernel's count of
 * bytes written stays k_tx_base + bells_tx unless a call we do not see
 * writes.  known: an exact count (kernel_written_ex) taken under this
 * tx_lock since our last write on the stream, or -1 to ask the kernel.
 * A count taken earlier is as good a base as a new one, and stricter: a
 * write we did not see in between is one the close's check then finds.
 */
void bells_tx_base(struct wsd_sock *s, int64_t known)
{
	int64_t t = known >= 0 ? known : kernel_written(s->fd, true);

	s->sess->k_tx_base = t < 0 ? -1 : t - (int64_t)s->sess->bells_tx;
}

/*
 * tx_lock held, about to end our direction (FIN by ring): bytes the
 * program wrote on the kernel socket behind our back would otherwise end
 * the stream cleanly short at the peer, the bytes neither delivered nor
 * reported (the peer's drain may not see them before our FIN record, and
 * across hosts they may still be on their way).  True when that failed
 * the connection.
 */
bool bells_tx_check(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;
	int64_t t;

	if (ss->k_tx_base < 0 || s->tx_mode != DIR_RING || s->kernel_fin || s->tx_back)
		return false;
	t = kernel_written(s->fd, false);
	if (t < 0 || t <= ss->k_tx_base + (int64_t)ss->bells_tx)
		return false;
	session_fail(ss, R_BYPASS, "bytes were written to the kernel socket by a call the "
			       "switch did not see");
	return true;
}

/*
 * mu held, rx entering RING: from here every byte taken from the kernel
 * socket is a doorbell the drain took (bells_rx), so the kernel's count of
 * bytes taken stays k_base + bells_rx unless a call we do not see reads.
 */
void bells_base(struct wsd_sock *s)
{
	int64_t t = kernel_taken(s->fd, true);

	s->sess->k_base = t < 0 ? -1 : t - (int64_t)s->sess->bells_rx;
}

/* The doorbells the peer still owes on the stream (mu held). */
static uint64_t bells_owed(struct wsd_session *ss)
{
	uint64_t back = ctl_get(ss, CW_BACK_BELLS);
	uint64_t ann = back ? back - 1 : wsd_bells_announced(ctl_get(ss, CW_BELLS));

	return ann > ss->bells_rx ? ann - ss->bells_rx : 0;
}

static int64_t bell_grace_ms(const struct wsd_session *ss)
{
	return ss->path == PATH_VERBS ? BELL_GRACE_VERBS_MS : BELL_GRACE_SHM_MS;
}

/*
 * mu held, our kernel socket empty, doorbells the peer announced missing:
 * on their way, or read by a call we did not see.  The kernel's count of
 * bytes taken from the socket says which; without it, bells missing for a
 * grace count as read.  While some are missing, a wait in poll, select or
 * epoll looks again in time (wsd_recheck_ms), as a blocking receive does
 * (bells_wait_ms).
 */
static void bells_due(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;
	int64_t now, left, t;

	if (!bells_owed(ss)) {
		ss->bells_short_since = 0;
		return;
	}
	now = wsd_now_ms();
	if (!ss->bells_short_since || ss->bells_short_at != ss->bells_rx) {
		ss->bells_short_since = now;
		ss->bells_short_at = ss->bells_rx;
	}
	if (ss->k_base >= 0) {
		t = kernel_taken(s->fd, false);
		/* (a FIN that came meanwhile counts in t: the socket must still be empty) */
		if (t >= 0 && t > ss->k_base + (int64_t)ss->bells_rx &&
		    !wsd_kernel_readable(s->fd)) {
			session_fail(ss, R_BYPASS, "bells: announced doorbells were read from the "
					       "kernel socket by a call the switch did not see");
			return;
		}
		left = BELL_RECHECK_MS;
	} else {
		left = ss->bells_short_since + bell_grace_ms(ss) - now;
		if (left <= 0) {
			session_fail(ss, R_BYPASS, "bells: announced doorbells never came (read "
					       "behind the switch's back)");
			return;
		}
	}
	ss->bells_look_at = now + left;
	if (wsd_recheck_ms < 0 || wsd_recheck_ms > left)
		wsd_recheck_ms = (int)left;
}

/*
 * How long a blocking receive may sleep before bells_due must look again,
 * or -1.  Only without the kernel's count: with it, the bells found missing
 * before the sleep were not taken, so they are on their way and wake it
 * (and the wait stays the kernel's, with its SA_RESTART and SO_RCVTIMEO).
 */
int bells_wait_ms(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;
	int64_t left;

	if (!ss || !ss->bells_short_since || s->rx_mode != DIR_RING || ss->k_base >= 0)
		return -1;
	left = ss->bells_look_at - wsd_now_ms();
	return left > 0 ? (int)left + 1 : 0;
}

/*
 * mu held: bytes on the stream (want at buf) that the bells word read
 * before did not cover.  That read may have met the word half written (the
 * peer announcing its next bell as we looked), and kept the last whole
 * value, older than the bytes: read it again until it is whole.  0 when
 * the bytes are announced bells after all, -EPROTO when a whole word says
 * they are not, -EAGAIN when it stays half written (the peer's switch off
 * its CPU in the middle of the write: judged later, by the grace at most).
 */
int bells_settle(struct wsd_sock *s, const uint8_t *buf, size_t want)
{
	struct wsd_session *ss = s->sess;
	const char *why;
	int64_t now;
	uint64_t v;

	for (int i = 0; i < 1000; i++) {
		int k = wsd_wire_word_try(ss->ctl, CW_BELLS, &ss->seen[CW_BELLS], UINT64_MAX, &v,
					  &why);

		if (k < 0) {
			protocol_fail(ss, why);
			return -EPROTO;
		}
		if (k > 0) {
			ss->bells_torn_since = 0;
			return wsd_wire_bells_check(buf, want, ss->bells_rx,
						    wsd_bells_announced(v), &why);
		}
		__builtin_ia32_pause();
		if (i % 100 == 99)
			sched_yield();
	}
	now = wsd_now_ms();
	if (!ss->bells_torn_since)
		ss->bells_torn_since = now;
	if (now - ss->bells_torn_since > bell_grace_ms(ss))
		return -EPROTO;
	sched_yield();
	return -EAGAIN;
}

/*
 * rx_lock held, the peer's FIN record at the head: the end of the stream
 * only when the kernel socket holds nothing but announced bells.  Looked
 * at, not taken (another thread may sleep on them).  0 when it does,
 * -ECONNRESET when it holds something else (the connection was reset,
 * R_BYPASS), -EAGAIN when the bells word was half written (look again).
 */
int bells_look(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;
	uint8_t buf[4096];
	const char *why = NULL;
	int r = 0;
	ssize_t n;

	pthread_mutex_lock(&s->mu);
	n = s->tcp_eof || s->tcp_err ? 0 :
	    real.recv(s->fd, buf, sizeof(buf), MSG_DONTWAIT | MSG_PEEK);
	if (n > 0) {
		uint64_t back = ctl_get(ss, CW_BACK_BELLS);
		uint64_t ann = wsd_bells_announced(ctl_get(ss, CW_BELLS));
		size_t want = (size_t)n;

		if (back) {
			uint64_t left = back - 1 > ss->bells_rx ? back - 1 - ss->bells_rx : 0;

			if (left < want)
				want = (size_t)left;
		}
		if (wsd_wire_bells_check(buf, want, ss->bells_rx, ann, &why)) {
			r = bells_settle(s, buf, want);
			if (r != -EPROTO)
				why = NULL;   /* announced after all, or half written */
		}
	}
	pthread_mutex_unlock(&s->mu);
	if (why)
		session_fail(ss, R_BYPASS, why);
	return faulted(ss) ? -ECONNRESET : r == -EAGAIN ? -EAGAIN : 0;
}

/*
 * mu held, no other sleeper: read doorbells (ring mode only: they are not
 * data).  Look first (MSG_PEEK), then read the peer's counts: a bell in
 * our kernel socket was announced (CW_BELLS) before it was sent, and the
 * peer sets back_bells before it sends data by the stream, so every byte
 * looked at must be the next announced bell, and once the peer went back
 * the bytes after its last bell are data, left where they are.  Any other
 * byte was written by a call a switch did not see: the connection is
 * reset (R_BYPASS), never the byte delivered nor dropped.
 */
void drain(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;
	uint8_t buf[256];
	const char *why;
	ssize_t n;

	if (s->rx_mode != DIR_RING || s->tcp_eof || s->tcp_err || faulted(ss) ||
	    atomic_load(&s->closed))
		return;
	for (;;) {
		uint64_t back, ann;
		size_t want;

		n = real.recv(s->fd, buf, sizeof(buf), MSG_DONTWAIT | MSG_PEEK);
		if (n <= 0)
			break;
		want = (size_t)n;
		back = ctl_get(ss, CW_BACK_BELLS);
		ann = wsd_bells_announced(ctl_get(ss, CW_BELLS));
		if (back) {
			uint64_t left = back - 1 > ss->bells_rx ? back - 1 - ss->bells_rx : 0;

			if (left < want)
				want = (size_t)left;
			if (!want)
				return;
		}
		if (wsd_wire_bells_check(buf, want, ss->bells_rx, ann, &why)) {
			int r = bells_settle(s, buf, want);

			if (r == -EAGAIN)
				return;     /* the word half written: judged at the next look */
			if (r) {
				session_fail(ss, R_BYPASS, why);
				return;
			}
		}
		n = real.recv(s->fd, buf, want, MSG_DONTWAIT);
		if (n <= 0)
			break;
		ss->bells_rx += (uint64_t)n;
		wsd_stat_add(s->stat, &s->stat->doorbells_rx, (uint64_t)n);
	}
	if (n == 0) {
		s->tcp_eof = true;
	} else if (errno == EAGAIN) {
		bells_due(s);
	} else if (errno != EINTR) {
		s->tcp_err = true;
		s->tcp_errno = errno;
	}
}

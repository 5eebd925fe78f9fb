/* SPDX-License-Identifier: MIT */
/*
 * Control words and RDMA puts: the one way our side writes into the peer's
 * receive region (rdma_put, rdma_writev: RDMA writes, or stores when the
 * peer's region is mapped here), the control words each side writes for
 * the other (put_word) and reads back checked (ctl_get), and the one place
 * a violation is handled (session_fail: the connection ends as a reset
 * would end it).  Locks: none of its own; each word pair put_word stages
 * belongs to a lock (W_RX, W_TX, W_MU, W_FAIL), and ctl_get's bounds are
 * read under the locks that guard them.  It does not write records (tx.c)
 * nor walk them (rx.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>

#include "switch/sess_int.h"

int wsa_errno(int e)
{
	switch (e) {
	case WSAECONNRESET: case WSAECONNABORTED: case WSAENOTCONN: case WSAESHUTDOWN:
	case WSAENETDOWN: case WSA_OPERATION_ABORTED:
		return ECONNRESET;
	case WSAENOBUFS:
		return ENOBUFS;
	case WSAEFAULT:
		return EFAULT;
	default:
		return EIO;
	}
}

/* Finish an SPI RDMA call: 0 or -errno. */
int rdma_done(SOCKET ws, WSAOVERLAPPED *ov, int ret, int err)
{
	uint32_t bytes, fl;

	if (ret == 0)
		return 0;
	if (err != WSA_IO_PENDING)
		return -wsa_errno(err);
	if (!wsd_spi()->lpWSPGetOverlappedResult(ws, ov, &bytes, 1, &fl, &err))
		return -wsa_errno(err);
	return 0;
}

int rdma_put(struct wsd_session *ss, const uint8_t *desc, WSABUFEX *b, uint32_t nb,
	     uint64_t offset)
{
	WSAOVERLAPPED ov = { .hEvent = (void *)1 };
	uint32_t n;
	int err = 0;
	int r = wsd_spi()->lpWSPRdmaWrite(ss->ws, b, nb, (void *)desc, WSP_RDMA_DESCRIPTOR_SIZE,
					  (uint32_t)offset, &n, 0, &ov, NULL, NULL, &err);

	return rdma_done(ss->ws, &ov, r, err);
}

/*
 * Into the peer's receive region: the pieces in order, each seen before the
 * next.  On shm with the peer's region mapped here, by plain stores, with a
 * store fence between pieces (a copy's fast string stores may otherwise be
 * seen out of order, as in the kernel's); else by RDMA writes.
 */
int rdma_writev(struct wsd_session *ss, WSABUFEX *b, uint32_t nb, uint64_t offset)
{
	if (ss->peer_map) {
		uint8_t *dst = ss->peer_map + offset;

		for (uint32_t i = 0; i < nb; i++) {
			if (b[i].len == 8)
				atomic_store_explicit((_Atomic uint64_t *)(void *)dst,
						      *(const uint64_t *)(const void *)b[i].buf,
						      memory_order_release);
			else
				memcpy(dst, b[i].buf, b[i].len);
			dst += b[i].len;
			__builtin_ia32_sfence();
		}
		/*
		 * And a full fence: callers write, then read a word the peer
		 * writes (an arm, a credit), as the peer does the other way
		 * round; a load may otherwise pass our store in the store
		 * buffer, both sides read old values, and both sleep.
		 */
		atomic_thread_fence(memory_order_seq_cst);
		return 0;
	}
	return rdma_put(ss, ss->peer_desc, b, nb, ss->peer_off + offset);
}

/* Write one of the peer's control words. */
int put_word(struct wsd_session *ss, int which, int idx, uint64_t v)
{
	uint64_t *w = &ss->words[2 * which];
	WSABUFEX b[2] = { { 8, (char *)w, ss->words_handle },
			  { 8, (char *)(w + 1), ss->words_handle } };

	if (idx == CW_CONSUMED && wsd_fault("ctl-word", NULL))
		v += 1ull << 40;      /* past what the peer sent: its check must catch it */
	w[0] = v;
	w[1] = ~v;
	return rdma_writev(ss, b, 2, (uint64_t)idx * sizeof(struct wsd_word));
}

/*
 * The listening side's ring peer before its proof (wsd-protocol(7),
 * "Proof"): it may be anyone who named this connection, so nothing it
 * writes is used (its words read as 0, as they started) or judged (it
 * could reset a connection not its own).  Only its SWITCH record is read,
 * and a failed proof costs it the session, never the connection.
 */
bool peer_untrusted(const struct wsd_session *ss)
{
	const struct wsd_sock *s = ss->sock;

	return s && !s->connected_side && !atomic_load(&s->proven);
}

/*
 * A control word the peer wrote: its value when its check holds, or the
 * last that did.  Checked against what we sent (wsd_wire_word_check): the
 * bounds are ours, read under the lock that guards them (tx_pos and
 * zc_sent: tx_lock; post_gen: rx_lock), where the words that use them are
 * read.  A violation fails the connection; the last good value is returned.
 */
uint64_t ctl_get(struct wsd_session *ss, int idx)
{
	uint64_t v, bound = idx == CW_CONSUMED ? ss->tx_pos : idx == CW_ZC_DONE ? ss->zc_sent :
			    idx == CW_CLAIM ? ss->post_gen : UINT64_MAX;
	const char *why;
	int e;

	if (peer_untrusted(ss) && idx != CW_BACK_REQ)
		return 0;
	e = wsd_wire_word_get(ss->ctl, idx, &ss->seen[idx], bound, &v, &why);
	if (e && peer_untrusted(ss))
		return 0;   /* a back request it cannot make */
	if (e)
		protocol_fail(ss, why);
	return v;
}

/*
 * The peer broke the protocol (why: the check that failed).  Nothing it
 * writes is read any more, and the connection ends as a reset would end
 * it, at both ends: our program's next call fails with ECONNRESET, the
 * kernel stream is shut (the peer's liveness signal; our own sleepers wake
 * on it), and wsd stat shows reason protocol.  Any thread, any lock: the
 * first report wins.  The one place a violation is handled.
 */
void session_fail(struct wsd_session *ss, enum wsd_reason reason, const char *why)
{
	struct wsd_sock *s = ss->sock;
	const char *none = NULL;

	if (!__atomic_compare_exchange_n(&ss->fault, &none, why, false, __ATOMIC_ACQ_REL,
					 __ATOMIC_ACQUIRE))
		return;
	wsd_debug("switch: fd %d: %s: %s: connection reset", s ? s->fd : -1,
		  reason == R_AUTH ? "the ring's peer failed its proof" :
		  reason == R_BYPASS ? "bytes moved behind the switch's back" :
		  reason == R_PROTOCOL ? "protocol violation" : wsd_reason_name(reason), why);
	if (!s)
		return;
	/*
	 * A bypass is no fault of the peer's switch: tell it why (before the
	 * reset it would otherwise take for a plain one), so that its program
	 * fails too and its wsd stat says bypass.
	 */
	if (reason == R_BYPASS)
		put_word(ss, W_FAIL, CW_CLOSED, 3);
	stream_reset(s, reason);
}

void stream_reset(struct wsd_sock *s, enum wsd_reason reason)
{
	struct sockaddr unspec = { .sa_family = AF_UNSPEC };

	s->tcp_err = true;
	s->tcp_errno = ECONNRESET;
	s->tx_shut = true;
	wsd_stat_begin(s->stat);
	s->stat->reason = (uint8_t)reason;
	wsd_stat_end(s->stat);
	wsd_stat_add(s->stat, &s->stat->fallbacks, 1);
	/*
	 * The kernel's reset (connect to AF_UNSPEC disconnects a TCP socket
	 * with RST): the TCP peer must not take a FIN for a clean end, and
	 * our own sleepers wake on it.
	 */
	real.connect(s->fd, &unspec, sizeof(unspec));
}

void protocol_fail(struct wsd_session *ss, const char *why)
{
	session_fail(ss, R_PROTOCOL, why);
}

bool faulted(const struct wsd_session *ss)
{
	return ss && __atomic_load_n(&ss->fault, __ATOMIC_ACQUIRE);
}

/*
 * The peer's switch found bytes on the stream it did not send (closed 3):
 * this end fails the same way, reason bypass.  True when the session failed.
 */
bool peer_bypass(struct wsd_session *ss)
{
	if (!ss || faulted(ss))
		return faulted(ss);
	if (!peer_untrusted(ss) && ctl_get(ss, CW_CLOSED) == 3)
		session_fail(ss, R_BYPASS, "the peer's switch found the stream moved by a call no "
				       "switch saw");
	return faulted(ss);
}

/*
 * The kernel reports a stream error (a reset) once, to whichever call
 * takes it.  One our switch took is kept for the program (keep_error,
 * unless one is kept or the end was seen), and the call that reports it
 * spends it (take_error: the error, then the end).
 */
void keep_error(struct wsd_sock *s, int e)
{
	if (!s->tcp_err && !s->tcp_eof) {
		s->tcp_errno = e;
		s->tcp_err = true;
	}
}

int take_error(struct wsd_sock *s)
{
	s->tcp_err = false;
	s->tcp_eof = true;
	return -s->tcp_errno;
}

/* After a violation: the reset once (as the kernel reports one), then the end. */
ssize_t fault_rx(struct wsd_sock *s)
{
	if (s->tcp_err) {
		s->tcp_err = false;
		s->tcp_eof = true;
		return -ECONNRESET;
	}
	return 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * The ring protocol's internal declarations: what one of its files defines
 * and another uses, by file, with the constants they share.  Nothing here
 * is for the rest of the switch (switch.h, session.h).  The files, one
 * concern each (as net/smc's smc_tx.c, smc_rx.c, smc_cdc.c, smc_close.c):
 * cw.c (control words, RDMA puts, failures), slot.c (the session object),
 * bell.c (doorbells), proof.c (the switch to the ring and the proof),
 * back.c (back to the stream; fork and exec), tx.c (records written,
 * send), rx.c (the record walk, receive), zc.c (zero copy), wait.c
 * (sleeping and spinning), ready.c (readiness), close.c (shutdown, close).
 *
 * The ring protocol (wsd-protocol(7)).  Each side owns a receive region:
 * control words its peer writes, then a ring its peer fills with records by
 * WSPRdmaWrite.  Each direction starts on the kernel stream; its sender
 * switches when the receiver said it is ready (rx_ready) by writing a
 * SWITCH record naming the stream byte count N; the receiver delivers
 * exactly N bytes from the kernel stream and then reads the ring.  Kernel
 * bytes after N are doorbells: sent only when the peer armed a generation
 * word, so an idle connection costs no CPU and the application's own fd
 * turns readable for poll/epoll.  Each is counted in the receiver's bells
 * word before it is sent and has a known value, so a byte a call we do not
 * see wrote or read there fails the connection at both ends (R_BYPASS).
 *
 * Each side proves it holds the TCP connection: right after its SWITCH
 * point it writes the challenge the peer sent in the handshake on the
 * stream (proof_write), which only the real TCP peer can do; the receiver
 * takes nothing from the ring before it read that proof (proof_read), and
 * the listening side sends nothing by ring before.  A listening side whose
 * ring peer fails the proof goes on over TCP as if nothing happened.
 *
 * Locks: rx_lock, then tx_lock, then mu.  Nobody sleeps holding one.
 */
#ifndef WSD_SWITCH_SESS_INT_H
#define WSD_SWITCH_SESS_INT_H

#include <unistd.h>

#include "provider/fault.h"
#include "provider/internal.h"
#include "switch/cursor.h"
#include "switch/session.h"

#define W_RX 0
#define W_TX 1
#define W_MU 2
#define W_FAIL 3                     /* session_fail's: the first report only */
#define TICK_MS 10                   /* waits no doorbell can end */
/*
 * How long either side of a close waits for the other's next step of the
 * closing handshake (wsd-protocol(7), Shutdown and close): the peer takes
 * it within its call, so only a peer stopped or dead mid-step costs this.
 */
#define CLOSE_STEP_MS 1000
#define PROOF_MS 2000                /* part of a proof waits this for the rest */

/*
 * Test builds only (provider/fault.h; tests/fault/wake_check.sh): widen one
 * step of the sleeper/waker protocol (wsd-protocol(7), Sleeping and
 * waking), between a word published and the look that must follow it, by
 * WSD_FAULT=wake-race=US: a sleep of US microseconds at one pass in four of
 * each thread.  No lock may be held across it that the peer's step needs.
 */
static inline void race_window(void)
{
	static __thread unsigned passes;
	long us;

	if (wsd_fault("wake-race", &us) && (++passes & 3) == 0)
		usleep((useconds_t)us);
}

/* cw.c: control words and RDMA puts; the protocol's failures */
int wsa_errno(int e);
int rdma_done(SOCKET ws, WSAOVERLAPPED *ov, int ret, int err);
int rdma_put(struct wsd_session *ss, const uint8_t *desc, WSABUFEX *b, uint32_t nb,
	     uint64_t offset);
int rdma_writev(struct wsd_session *ss, WSABUFEX *b, uint32_t nb, uint64_t offset);
int put_word(struct wsd_session *ss, int which, int idx, uint64_t v);
bool peer_untrusted(const struct wsd_session *ss);
uint64_t ctl_get(struct wsd_session *ss, int idx);
void session_fail(struct wsd_session *ss, enum wsd_reason reason, const char *why);
/* The connection fails here, reason in wsd stat, and the kernel resets it (session or none). */
void stream_reset(struct wsd_sock *s, enum wsd_reason reason);
void protocol_fail(struct wsd_session *ss, const char *why);
bool faulted(const struct wsd_session *ss);
bool peer_bypass(struct wsd_session *ss);
ssize_t fault_rx(struct wsd_sock *s);
void keep_error(struct wsd_sock *s, int e);
int take_error(struct wsd_sock *s);

/* slot.c: the session object */
void publish_rx_ready(struct wsd_sock *s);
void first_data_call(struct wsd_sock *s);

/* Each send and receive (not a peek): the first marks s served. */
static inline void served(struct wsd_sock *s)
{
	if (!s->data_called)
		first_data_call(s);
}
void wsd_session_touched(struct wsd_session *ss, uint64_t off, uint32_t size);
void became_accel(struct wsd_sock *s, bool was);

/* bell.c: doorbells */
bool try_bell(struct wsd_sock *s);
void bell_retry(struct wsd_sock *s, struct wsd_session *ss);
void bell_probe(struct wsd_sock *s);
void ring_data(struct wsd_sock *s);
void ring_space(struct wsd_sock *s);
void bells_tx_base(struct wsd_sock *s, int64_t known);
bool bells_tx_check(struct wsd_sock *s);
void bells_base(struct wsd_sock *s);
int bells_wait_ms(struct wsd_sock *s);
int bells_settle(struct wsd_sock *s, const uint8_t *buf, size_t want);
int bells_look(struct wsd_sock *s);
void drain(struct wsd_sock *s);

/* proof.c: the switch to the ring and the proof */
bool tx_switch(struct wsd_sock *s);
bool tx_switch_with(struct wsd_sock *s, struct cursor *c, size_t *sent);
uint32_t max_payload(struct wsd_session *ss);
void check_switch(struct wsd_sock *s, bool tx_locked);
void proof_read(struct wsd_sock *s, bool tx_locked);
size_t proof_in_read(struct wsd_sock *s, const struct cursor *c, size_t left, size_t n,
		     bool peek);
void rx_settle(struct wsd_sock *s, bool tx_locked);
void prove_self(struct wsd_sock *s);

/* back.c: back to the stream (BACK); fork and exec */
void plain_again(struct wsd_sock *s, enum wsd_reason why);
int go_back(struct wsd_sock *s);
bool serve_back(struct wsd_sock *s);
void serve_back_unlocked(struct wsd_sock *s);
bool tx_lock_unless_back(struct wsd_sock *s);
void check_back(struct wsd_sock *s);
int skip_bells(struct wsd_sock *s, uint64_t *left, uint64_t end);
int skip_owed(struct wsd_sock *s);
ssize_t pre_recv(struct wsd_sock *s, struct cursor *c, int flags);
int set_prefix(struct wsd_sock *s, const uint8_t *data, size_t len);

/* tx.c: records written, send */
/*
 * The sender's smallest window (tx_win): a ring of this size or less is
 * used whole.  Larger rings (shm's default) are for streams: the window
 * grows into them while one runs (tx_widen).
 */
#define WIN_MIN (256u << 10)
bool fits(struct wsd_session *ss, uint32_t len, bool reserve);
int broken(struct wsd_sock *s, int r);
/* ...into the ring of ss, a session not (yet) the socket's (its first bytes, tx.c) */
int record_on(struct wsd_sock *s, struct wsd_session *ss, uint32_t type, struct cursor *c,
	      uint32_t len, const void *inline_payload);
/* The kernel's count of bytes written on s's stream by anyone, or -1 (bell.c). */
int64_t kernel_written(int fd, bool high);
int64_t kernel_written_ex(int fd, bool high, bool *exact);
int write_record(struct wsd_sock *s, uint32_t type, struct cursor *c, uint32_t len,
		 const void *inline_payload);
bool mutual_wait(struct wsd_sock *s);
bool stall_check(struct wsd_sock *s);
int wait_room(struct wsd_sock *s, uint32_t len, bool nonblock, bool zc_wait);

/* rx.c: the record walk, receive */
int walk(struct wsd_session *ss, uint64_t pos, uint32_t skip, struct wire_rec *r,
	 bool judge);
int rec_at(struct wsd_session *ss, uint64_t pos, struct wire_rec *r);
bool rec_head(struct wsd_session *ss);
void report(struct wsd_sock *s, bool force);
void consume(struct wsd_sock *s, const struct wire_rec *r);
ssize_t rx_step(struct wsd_sock *s, struct cursor *c, int flags);

/* zc.c: zero copy */
/* A send answers the receiver's offer from this many bytes (write-based zero copy). */
#define POST_SEND_MIN 16384u

void post_offer(struct wsd_sock *s, struct cursor *c);
void post_release(struct wsd_session *ss);
int post_withdraw(struct wsd_sock *s, bool check_claim);
void post_missed(struct wsd_session *ss);
ssize_t send_posted(struct wsd_sock *s, struct cursor *c, bool split);
void zc_linger(struct wsd_sock *s);
bool zc_split_timed(const struct wsd_session *ss, size_t len);
bool zc_split_wanted(struct wsd_session *ss, int64_t now);
void zc_split_learn(struct wsd_session *ss, size_t len, int64_t now);
int zc_read(struct wsd_sock *s, struct wsd_zc *z, uint32_t at, struct cursor *c,
	    size_t n);
uint32_t zc_threshold(struct wsd_session *ss, bool as_receiver);
bool may_post(struct wsd_sock *s, const struct cursor *c, int flags);
ssize_t post_settle(struct wsd_sock *s, struct cursor *c, int flags, ssize_t n);
ssize_t send_zc(struct wsd_sock *s, const void *buf, size_t len);

/* wait.c: sleeping and spinning */
void sleeper_enter(struct wsd_sock *s);
void sleeper_leave(struct wsd_sock *s);
void rx_sleeper_enter(struct wsd_sock *s);
void rx_sleeper_leave(struct wsd_sock *s);
/* rx_lock held: may this thread take the peer's proof from the stream? */
bool proof_ours(struct wsd_sock *s);
bool proof_alone(struct wsd_sock *s);
void arm_data(struct wsd_sock *s, bool self);
/* The last arm word the peer has not rung yet (no bell announced since it went out)? */
bool arm_unrung(struct wsd_session *ss);
/* The doorbells read on s's session so far (0 without one). */
uint64_t bells_read(struct wsd_sock *s);
void disarm_data(struct wsd_sock *s);
int wait_fd(struct wsd_sock *s, bool for_rx, int64_t *deadline);
bool spin_for_data(struct wsd_sock *s);
bool spin_for_room(struct wsd_sock *s, uint32_t len, bool zc);
/* threads inside a blocking send or receive on an accelerated socket */
extern _Atomic int in_calls;

/* ready.c: readiness */
void reset_if_shut(struct wsd_sock *s);
bool fin_pending(struct wsd_sock *s);

/* close.c: shutdown, close */
void finish_kernel(struct wsd_sock *s);
#endif /* WSD_SWITCH_SESS_INT_H */

/* SPDX-License-Identifier: MIT */
/*
 * The ring protocol's objects, shared by its files (sess_int.h) and upgrade.c.
 * wsd-protocol(7) describes the same layout for interoperation.
 */
#ifndef WSD_SWITCH_SESSION_H
#define WSD_SWITCH_SESSION_H

#include "switch/switch.h"
#include "switch/wire.h"
#include "switch/chan.h"
#include "switch/winsize.h"

struct wsd_chan;

struct wsd_session {
	SOCKET ws;                   /* the channel's SPI connection */
	struct wsd_chan *ch;         /* the channel (held) */
	struct wsd_slot slot;        /* our receive slot on it */
	struct wsd_sock *sock;       /* the socket it is attached to, or NULL before */
	const char *fault;           /* the peer broke the protocol: the failed check (atomic) */
	enum wsd_path path;
	/* our receive region: the slot */
	uint8_t *region;
	size_t region_len;
	struct wsd_ctl *ctl;
	uint8_t *ring;
	uint32_t ring_size;
	uint64_t rx_key;
	struct wire_ring rxr;        /* the three above, for the record walk */
	uint8_t rx_desc[WSP_RDMA_DESCRIPTOR_SIZE];
	/* the peer's */
	uint8_t peer_desc[WSP_RDMA_DESCRIPTOR_SIZE];
	/* the challenge we sent (the peer must write it on the stream after
	 * its SWITCH point), and the one the peer sent (we write it after ours) */
	uint8_t nonce[WSD_NONCE], peer_nonce[WSD_NONCE];
	uint8_t *peer_map;           /* shm: the peer's slot, mapped here (or NULL) */
	uint32_t peer_seg, peer_off; /* the peer's slot: its segment, and its offset there
					(and in the segment's registration: RDMA writes) */
	bool peer_known;             /* we know the peer's slot (and write it: SHUT at the end) */
	bool slot_known;             /* the peer knows ours (and may write it) */
	bool granted;                /* made ahead for the mailbox: the peer may send before its proof */
	/* the connecting side's proof is not written (OPENED with WSD_OPENED_HELD):
	 * its switch point is where its ring's records start, on both sides */
	bool proof_waived;
	/* a mapped ring's pages (tx_lock): when a record last went to a new
	 * page past the first, 0 when none did since the last give-back
	 * (wsd-protocol(7), "Pages on demand") */
	int64_t tx_page_ms;
	uint32_t peer_ring;
	/*
	 * The sender's window (tx_lock): records go below it, a PAD skipping
	 * the rest of the ring, so a connection that never streams touches
	 * WIN_MIN of it; it doubles, to the ring, when the receiver drained
	 * it fast and we still wait for room (tx_widen), and goes back when
	 * the pages do.  When the last wait for room began and the receiver's
	 * count then.  On shm, runs of large sends learn its size (win,
	 * winsize.h): a smaller one takes effect at the ring's start.
	 */
	uint32_t tx_win;
	struct wsd_winsize win;
	int64_t win_mark_ns;
	uint64_t win_mark_c;
	uint64_t tx_key;
	/* staging for records (tx_lock) and single words (each its own) */
	uint8_t *stage;
	uint32_t stage_len;
	uint64_t stage_handle;
	uint64_t *words;             /* pairs: [0] rx_lock, [2] tx_lock, [4] mu */
	uint64_t words_handle;
	uint64_t small[24];          /* stage and words when the peer's slot is mapped */
	/* tx (tx_lock) */
	uint64_t tx_pos;
	uint64_t zc_sent;
	uint64_t space_gen, rung_data;
	bool tx_full;                /* a non-blocking send found no room */
	/* rx (rx_lock) */
	uint64_t rx_pos;
	uint32_t rx_off;
	uint64_t rx_reported;
	uint64_t data_gen, rung_space;
	uint64_t drained_gen;        /* data_gen when bells were last read dry */
	/*
	 * The last arm we wrote, while no bell was announced after it: the
	 * peer rings the next arrival without another word from us.  Set
	 * under rx_lock; anyone may clear it (a kernel event says a bell came).
	 */
	_Atomic bool arm_live;
	bool arm_self;               /* ...with the sleeper bit */
	uint64_t arm_bells;          /* the peer's announced bells just after it */
	uint64_t zc_finished;
	/* doorbell bytes on the stream since the switch, each way (BACK counts them) */
	uint64_t bells_tx;           /* tx_lock */
	/*
	 * tx_lock: a ring that wrote no byte while the peer may sleep on it
	 * (bell_retry), rings that wrote none, and the last one's errno.
	 */
	_Atomic bool bell_owed;
	uint64_t bells_unsent;
	int bell_errno;
	int64_t probe_at;            /* tx_lock: the last liveness bell (bell_probe, ms) */
	uint64_t bells_rx;           /* mu */
	/* mu: since when (ms; 0: not) the peer's announced bells exceed those
	 * read with our kernel socket empty, and bells_rx then */
	int64_t bells_short_since;
	uint64_t bells_short_at;
	int64_t bells_look_at;       /* then bells_due looks again (ms) */
	int64_t bells_torn_since;    /* the bells word found half written since (ms) */
	/* mu: bytes taken from the kernel socket, as the kernel counts them,
	 * less bells_rx, since rx entered RING (-1: the kernel does not tell) */
	int64_t k_base;
	/* tx_lock: bytes written on the kernel socket, as the kernel counts
	 * them, less bells_tx, since tx entered RING (-1: it does not tell) */
	int64_t k_tx_base;
	bool back_asked;             /* we wrote the peer's back_req */
	_Atomic uint64_t seen[CW_N];  /* the control words' last checked values */
	/* our offer of a receive buffer (rx_lock) */
	bool post_active;
	uint64_t post_gen;
	uint64_t post_len;
	uint8_t post_desc[WSP_RDMA_DESCRIPTOR_SIZE];
	uint32_t post_dlen;
	uint64_t post_split;         /* the offer's bytes a SPLIT had us read (past its wlen) */
	uint64_t post_split_wlen;    /* and the bytes it said the peer writes before them */
	uint32_t offer_misses;       /* offers in a row let go unused (may_post) */
	uint64_t offer_chances;      /* receives that might have offered, after those */
	/* the peer's offers we answered (tx_lock) */
	uint64_t post_answered;
	/*
	 * Large blocking sends on shm (tx_lock), timed in runs one way each
	 * (zc_split_wanted): ns per MiB by the ring [0] and in two parts [1]
	 * (0: not yet known), the way planned for the next run, the way this
	 * one goes and the way that was cheaper, sends and bytes so far in
	 * this run and its start (and the window then), runs
	 * until the other way is tried again and the gap after that.
	 */
	uint32_t run_cost[2];
	uint32_t run_win;
	bool run_plan, run_split, run_best;
	uint32_t run_n, explore_in, explore_gap;
	uint64_t run_bytes;
	int64_t run_t0;
	/* a wait for room both ends share, seen from poll (tx_lock) */
	int64_t stall_since;
	uint64_t stall_rx, stall_c;
};

/* Make a session on a channel: a receive slot of ours taken. */
struct wsd_session *wsd_session_new(struct wsd_chan *ch);
/* The peer learnt our slot: it may write there until it says it is done. */
void wsd_session_known(struct wsd_session *ss);
/* The peer's slot is mapped here (shm stores), not written by RDMA. */
bool wsd_session_mapped(const struct wsd_session *ss);
/* We never wrote into the peer's slot as its connection: no SHUT for it when freed. */
void wsd_session_forget_peer(struct wsd_session *ss);
/*
 * tx_lock held, s->tx_mode DIR_PROV: the first bytes committed (the peer
 * answered OPENED, its session now s->sess: our proof follows them on the
 * stream), or sent by the stream (declined; s->sess NULL).  proof.c, tx.c.
 */
void tx_prov_commit(struct wsd_sock *s);
void tx_prov_undo(struct wsd_sock *s);
/* tx_lock held, s->prov_hold, s->sess attached: the held bytes by ring (or stream). tx.c */
void tx_hold_commit(struct wsd_sock *s);
/* The peer published rx_ready in our slot. */
bool wsd_session_rx_ready(struct wsd_session *ss);
/* The channel's sweep (its mu held): an idle ring gives its pages back. */
void wsd_session_sweep(struct wsd_session *ss, int64_t now);
/* The peer's region, from its handshake message. */
void wsd_session_peer(struct wsd_session *ss, const struct wsd_hello *h);
/* Fill a handshake message with our side. */
void wsd_session_hello(const struct wsd_session *ss, struct wsd_hello *h, uint16_t kind);
/* Give s its session (established): from here the peer may switch. */
void wsd_session_attach(struct wsd_sock *s, struct wsd_session *ss);
/*
 * The same, by a caller holding none of s's locks (a handshake's end): when
 * a fork or spawn came while it ran (no_upgrade), s goes back to the
 * stream at once, its peer never told it may switch.
 */
void wsd_session_attach_new(struct wsd_sock *s, struct wsd_session *ss);

/* The SPI instance the switch uses (upgrade.c), started on first use. */
WSPPROC_TABLE *wsd_spi(void);

#endif /* WSD_SWITCH_SESSION_H */

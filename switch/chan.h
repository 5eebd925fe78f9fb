/* SPDX-License-Identifier: MIT */
/*
 * The channel: what two processes share for all the TCP connections the
 * switch moved between them (wsd-protocol(7), "Channels").
 *
 * One SPI connection (one provider connection: on verbs one RC QP, on shm
 * one unix socket and its completion path), one reader thread, and receive
 * memory in segments: each segment holds slots, a slot is one connection's
 * receive region (its control words, then its ring).  A connection is a
 * slot on each side; its records, credits, doorbells and handover are the
 * session's (session.h), as they were when each had a provider connection
 * of its own.  The first connection between two processes makes the
 * channel (HELLO, ACCEPT); later ones are a message on it (OPEN, OPENED or
 * DECLINE) and start at once.  The connecting process keeps the channel
 * while connections use it and a while after (short connections reuse
 * it); either side's death ends it, and the connections on it go on by
 * the memory both still map until their TCP connection ends.
 *
 * Owns: the channel table, segments and slots, the peer's segments mapped
 * here, the reader thread, the channel messages' sending.  Does not own:
 * what a slot's memory holds (session), which socket a request names
 * (upgrade.c).
 *
 * Locks: a channel's mu guards its slots, segments and session list; it is
 * taken after a socket's locks, never before.  The table's lock is taken
 * before any channel's.
 */
#ifndef WSD_SWITCH_CHAN_H
#define WSD_SWITCH_CHAN_H

#include "switch/switch.h"
#include "switch/wire.h"

struct wsd_session;
struct wsd_chan;

/* Our receive slot for a session: where it is, and its registration. */
struct wsd_slot {
	uint8_t *base;               /* CTL_SIZE control bytes, then the ring */
	uint32_t seg, off;           /* its segment and offset in it */
	uint32_t ring;               /* its ring's size (the segment's) */
	uint8_t desc[WSP_RDMA_DESCRIPTOR_SIZE];   /* the segment's registration */
};

/*
 * A channel around a connected SPI socket (it becomes the channel's).
 * connector: we asked for it (we keep it in the table under key, and end
 * it when idle); the other side keeps it while the peer does.  Not yet
 * reading: wsd_chan_start does that, after the handshake.
 */
struct wsd_chan *wsd_chan_new(SOCKET ws, enum wsd_path path, bool connector,
			      const struct wsd_stat_addr *key);
/*
 * The channel's receives posted, for the messages the peer may send as
 * soon as it has our answer: on verbs, a message that finds no receive is
 * refused (RNR) and sent again only after a timer, and Debian 12's rxe was
 * seen to stall on that for good.  The listening side calls it before it
 * answers the handshake; wsd_chan_start does it when not yet done.  0, or
 * -EPIPE (the channel is ended).
 */
int wsd_chan_receive(struct wsd_chan *ch, uint32_t peer_pid);
/* The handshake is done: the reader starts, a connector's channel is found from now. */
int wsd_chan_start(struct wsd_chan *ch, uint32_t peer_pid);
/* A connector's live channel to key (the peer's address and port), held, or NULL. */
struct wsd_chan *wsd_chan_find(const struct wsd_stat_addr *key);
void wsd_chan_hold(struct wsd_chan *ch);
void wsd_chan_put(struct wsd_chan *ch);
SOCKET wsd_chan_socket(const struct wsd_chan *ch);
enum wsd_path wsd_chan_path(const struct wsd_chan *ch);
/* A small number naming the channel in wsd stat (unique in this process). */
uint32_t wsd_chan_id(const struct wsd_chan *ch);
/*
 * The inodes of its shm memory (0: none): our receive segment, and the
 * peer's mapped here: the first segment each (shm has one); for wsd stat.
 */
void wsd_chan_mem_inodes(struct wsd_chan *ch, uint64_t ino[2]);
/* The peer process's pid when the transport told it (shm), else 0. */
uint32_t wsd_chan_peer_pid(const struct wsd_chan *ch);
/* Our live channels to process pid. */
int wsd_chan_with(uint32_t pid);
/*
 * shm, the listening side: the poster of an OPEN in our mailbox holds the
 * other end of s's TCP connection as its descriptor fd.  A copy taken of
 * it (pidfd_getfd, the right the shm transport checked, on the process the
 * kernel named) is a TCP socket of s's network namespace whose addresses
 * are s's the other way round, which no other socket of that namespace
 * can be: its proof on the stream is not needed (WSD_OPENED_HELD).
 */
bool wsd_chan_box_held(struct wsd_chan *ch, int fd, const struct wsd_sock *s);
/* The handshake closed the SPI socket (it timed out): nothing to close later. */
void wsd_chan_lost_socket(struct wsd_chan *ch);
/* The channel broke or ended: no more requests on it. */
bool wsd_chan_dead(const struct wsd_chan *ch);
/* With a process of another user (shm by copy): rings mapped, no zero copy. */
bool wsd_chan_copy(const struct wsd_chan *ch);
/* The user of the process at the other end of SPI socket ws (shm), or -1. */
int64_t wsd_chan_sock_uid(SOCKET ws);

/* ---- slots ---- */

/* A free receive slot of ring bytes (zeroed control words), or -ENOMEM/-EMFILE. */
int wsd_chan_slot_get(struct wsd_chan *ch, struct wsd_slot *sl);
/*
 * Our side is done with our slot.  peer_writes: the peer learnt of it and
 * may write there until it says it no longer does (SHUT) or the channel
 * dies; else the slot is free at once.  shut: we wrote into the peer's
 * slot (peer_seg, peer_off), and tell it we no longer do.
 */
void wsd_chan_slot_done(struct wsd_chan *ch, const struct wsd_slot *sl, bool peer_writes,
			bool shut, uint32_t peer_seg, uint32_t peer_off);
/* The slot's fields of a HELLO, ACCEPT, OPEN or OPENED (ring_size, key, nonce: the session's). */
void wsd_chan_slot_describe(struct wsd_chan *ch, const struct wsd_slot *sl,
			    struct wsd_hello *h);
/*
 * The peer's slot a message describes, mapped here when the transport can
 * (shm): its address, or NULL (then RDMA writes at h->slot_off).  A
 * segment is mapped once per channel, from the memfd the first message
 * naming it hands over.
 */
uint8_t *wsd_chan_peer_slot(struct wsd_chan *ch, const struct wsd_hello *h);

/* ---- sessions on the channel ---- */

void wsd_chan_session_add(struct wsd_chan *ch, struct wsd_session *ss);
void wsd_chan_session_del(struct wsd_chan *ch, struct wsd_session *ss);

/* ---- messages ---- */

/* Send one channel message; 0 or -EPIPE. */
int wsd_chan_send(struct wsd_chan *ch, struct wsd_chmsg *m);

/*
 * The upgrade's side of the messages (upgrade.c), called on the channel's
 * reader thread: an OPEN from the peer, an answer to one of ours (OPENED
 * or DECLINE, m NULL when the channel died first).
 */
void wsd_upgrade_on_open(struct wsd_chan *ch, const struct wsd_chmsg *m);
void wsd_upgrade_on_answer(struct wsd_chan *ch, uint64_t req, const struct wsd_chmsg *m);
/* The channel died: requests it had in hand are answered DECLINE (upgrade.c). */
void wsd_upgrade_chan_dead(struct wsd_chan *ch);

/* ---- the mailbox (mbox.c; shm only) ---- */

#define WSD_BOX_N 16u                /* entries in a segment's mailbox */

/*
 * The listening side: every entry free again (or given up by the peer)
 * gets a grant, a session made ahead whose slot the entry describes; and
 * the grants dropped when the channel ends.
 */
void wsd_chan_box_grant(struct wsd_chan *ch);
/* ...none, ever, for this channel (before it starts): its port is shared with other processes. */
void wsd_chan_no_box(struct wsd_chan *ch);
void wsd_chan_box_drop(struct wsd_chan *ch);
/* ...for every listening channel of ours (the sweep). */
void wsd_chan_box_refill(void);
/* An OPEN waits in one of our mailboxes (a look at the state words, no tuple learnt). */
bool wsd_chan_box_any(void);
/* ...or one may come: an entry granted, or being written. */
bool wsd_chan_box_busy(void);
/*
 * An OPEN posted to us for the connection (local, peer), taken: its
 * channel held, its entry in *idx, a copy in *m (still to be checked), the
 * session the entry granted in *grant; or NULL.
 */
struct wsd_chan *wsd_chan_box_take(const struct wsd_stat_addr *local,
				   const struct wsd_stat_addr *peer, int *idx, struct wsd_chmsg *m,
				   struct wsd_session **grant);
/*
 * Our answer to the OPEN at idx: OPENED for the accepted socket s (grant
 * NULL: the connection has it; s held until the peer frees the entry, or
 * rejects it: then wsd_sock_unswitched), or DECLINE with the grant given
 * back (the peer may have written its slot, which stays the entry's until
 * the peer frees the entry; s NULL).
 */
void wsd_chan_box_reply(struct wsd_chan *ch, int idx, const struct wsd_chmsg *a,
			struct wsd_session *grant, struct wsd_sock *s);

/*
 * The connecting side: a granted entry claimed (its grant's description,
 * checked, in *g), or -1; our OPEN posted in it; its answer (1 with it in
 * *a, or 0 not yet); the entry freed once we are done with the grant's
 * slot (rejected: after OPENED, the connection stayed on the stream); or
 * our OPEN taken back unread (true; the grant is given up), false when the
 * peer took it first (it answers).
 */
/*
 * SHUT by memory: the peer's slot (seg, off) that we will not write again,
 * queued in the peer's mailbox page (false: no room, or no mailbox: send
 * the message); and the slots of ours the peer so queued (up to max).
 */
bool wsd_chan_shut_post(struct wsd_chan *ch, uint32_t seg, uint32_t off);
int wsd_chan_shut_take(struct wsd_chan *ch, uint32_t *offs, int max);
int wsd_chan_box_claim(struct wsd_chan *ch, struct wsd_hello *g);
void wsd_chan_box_post(struct wsd_chan *ch, int idx, const struct wsd_chmsg *m);
int wsd_chan_box_answer(struct wsd_chan *ch, int idx, struct wsd_chmsg *a);
void wsd_chan_box_release(struct wsd_chan *ch, int idx, bool rejected);
bool wsd_chan_box_withdraw(struct wsd_chan *ch, int idx);

/* fork, in the child: the parent's channels are not the child's (forgotten, not freed). */
void wsd_chan_atfork_child(void);
/* No more requests on the channel; its provider connection shuts down (the memory stays). */
void wsd_chan_end(struct wsd_chan *ch);


#endif /* WSD_SWITCH_CHAN_H */

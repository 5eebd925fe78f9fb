/* SPDX-License-Identifier: MIT */
/*
 * The channel's own layout, shared by chan.c (the channel, its slots and
 * messages) and mbox.c (the mailbox in the tag page).  Nothing else looks
 * inside a channel.
 */
#ifndef WSD_SWITCH_CHAN_INT_H
#define WSD_SWITCH_CHAN_INT_H

#include "provider/internal.h"
#include "switch/chan.h"

/*
 * Segments a side: the first is registered before any message; on verbs,
 * whose registered memory is pinned, more are added while connections
 * fill those there are (chan_seg.c), each of smaller rings.
 */
#define MAX_SEGS 16
#define SHM_SLOTS 16384              /* on shm, at most (the registration's 4 GiB bound them too) */
/*
 * Rings by default (WSD_SWITCH_RING unset): on shm large, for streams, a
 * sender's window growing into one only while it streams (slot.c), so the
 * first segment holds 511; on verbs, where the first segment is pinned,
 * small.
 */
#define SHM_RING (8u << 20)
#define VERBS_RING (256u << 10)
#define SHM_GROW_RING (256u << 10)   /* shm: an added segment's rings (or WSD_SWITCH_RING if smaller) */
#define VERBS_SLOTS 64               /* verbs: the first segment's, of WSD_SWITCH_RING rings */
#define VERBS_GROW_SLOTS 256         /* verbs: each added segment's */
/*
 * and their rings (or WSD_SWITCH_RING if smaller): 16 KiB, so a segment pins
 * 5 MB (256 slots of 20 KiB), and 1,000 connections 21 MB a side
 */
#define VERBS_GROW_RING 16384u
enum { SL_USED = 1, SL_PEER = 2, SL_WARM = 4 };   /* SL_WARM: free, its pages not yet given back */
#define SWEEP_MS 500
#define IDLE_MS 10000                /* a connector's channel with no slot lives this long */
#define OUTS 32                      /* messages in flight on a channel; more wait in line */
/*
 * Receives a channel keeps posted: the peer may have this many of our
 * messages untaken, the last kept for CREDIT (wsd-protocol(7), "Credits").
 * A message that found no receive would wait in the device (verbs: an RNR
 * retried for ever) and hold up every RDMA write posted after it, among
 * them the ones a reader waits for: two readers, each waiting so, stood
 * still for good.
 */
#define NRECV 32
#define BACKLOG_MAX 65536            /* messages waiting for credit: a peer that takes none */

struct seg {
	uint8_t *mem;
	size_t len;                  /* with the tag page */
	uint32_t nslots, stride, tag;
	uint32_t ring;               /* its slots' ring size */
	uint8_t *state;              /* per slot: SL_USED (our session holds it), SL_PEER
					(the peer may still write it) */
	uint32_t *freel, nfree;      /* slots free again, taken first */
	uint32_t fresh;              /* slots never used start here */
	uint8_t desc[WSP_RDMA_DESCRIPTOR_SIZE];
	int memfd;                   /* shm: until the peer mapped it (MAPPED) */
	bool shared;                 /* a memfd's pages: MADV_REMOVE gives them back */
	uint64_t ino;
};

struct peer_seg {
	uint8_t *map;
	size_t len;
	uint32_t tag;
	bool failed;                 /* could not map: RDMA writes */
	bool tell;                   /* MAPPED to send once the handshake is over */
	uint64_t ino;                /* its memfd's, for wsd stat */
};

struct wsd_chan {
	struct wsd_chan *next;       /* the table (connectors) or the live list */
	_Atomic int refs;
	pthread_mutex_t mu;
	pthread_mutex_t send_mu;
	SOCKET ws;
	enum wsd_path path;
	bool connector;
	bool no_box;                 /* the listening side grants no mailbox entries (shared port) */
	/*
	 * shm with a process of another user (SO_WSP_PEER_UID): each side's
	 * one segment handed over on the transport's socket at the start
	 * (SIO_WSP_SEND_FD), no second, no RDMA (no zero copy)
	 */
	bool copy;
	atomic_flag seg_handed;      /* copy: the peer's segment taken from the provider */
	struct wsd_stat_addr key;
	uint32_t id;
	pid_t owner;                 /* the process it belongs to (fork) */
	uint32_t peer_pid;
	int peer_pidfd;              /* mbox.c: the peer the kernel named, -1 not yet, -2 none */
	_Atomic bool dead;
	bool reading;
	bool receiving;              /* its receives posted (wsd_chan_receive) */
	int64_t idle_since;          /* ms, with no slot in use; 0 while one is */
	uint32_t ring;
	struct seg segs[MAX_SEGS];
	uint32_t nsegs, slots_used;
	bool growing;                /* a thread adds segs[nsegs], mu not held */
	pthread_cond_t grown;        /* and the others wait for it */
	bool grow_failed;            /* could not (memory, pinning limit): not again */
	struct peer_seg peers[MAX_SEGS];
	struct wsd_session **sess;   /* the sessions on it */
	/* listening side: the sessions our mailbox's entries grant (mbox.c) */
	pthread_mutex_t box_mu;
	struct wsd_session *grant[WSD_BOX_N];
	struct wsd_sock *taken[WSD_BOX_N];   /* held: answered OPENED, until the entry is free */
	size_t nsess, capsess;
	/* the receives posted on the port, each holding a reference */
	struct in {
		WSAOVERLAPPED ov;
		struct wsd_chmsg m;
		WSABUF b;
	} ins[NRECV];
	_Atomic uint32_t rx_taken;   /* the peer's messages taken (the reader) */
	_Atomic bool rx_ended;       /* the reader saw the end: unlinked, died */
	/*
	 * Sends (send_mu): overlapped, their completions on the port, so that
	 * no thread waits for the peer's reader (two readers each waiting
	 * for the other to take a message would wait for ever).
	 */
	struct out {
		WSAOVERLAPPED ov;
		struct wsd_chmsg m;
		bool busy;
	} outs[OUTS];
	struct backlog {
		struct backlog *next;
		struct wsd_chmsg m;
	} *bl_head, **bl_tail;
	uint32_t nbacklog;
	/* credits (send_mu): our messages posted, and of those the peer said it took */
	uint32_t sent, peer_taken;
	uint32_t told;               /* rx_taken, as our last message said */
};

/* chan_seg.c: the channel's segments and slots, for chan.c */
void chan_seg_fd_close(struct seg *g);
int chan_seg_add(struct wsd_chan *ch, uint32_t ring, uint32_t nslots);
void chan_slot_drop(struct wsd_chan *ch, uint32_t seg, uint32_t k, uint8_t side);
void chan_slots_rest(struct wsd_chan *ch);
void chan_on_mapped(struct wsd_chan *ch, uint32_t seg);
void chan_on_shut(struct wsd_chan *ch, uint32_t seg, uint32_t off);
void chan_send_mapped(struct wsd_chan *ch, uint32_t seg);

/* tab_lock guards chans, the list of every live channel of this process */
extern pthread_mutex_t wsd_chan_tab_lock;
extern struct wsd_chan *wsd_chans;

#endif /* WSD_SWITCH_CHAN_INT_H */

/* SPDX-License-Identifier: MIT */
/*
 * What a process running the switch publishes for `wsd stat`: one file per
 * process, /dev/shm/wsd-stat.<pid> (or wsd-stat.<pid>.<16 hex digits> when
 * another user holds that name), mode 0600, holding a header and a table
 * of slots, one per socket.  The process writes with relaxed atomics; a
 * reader copies a slot and trusts it when gen is even and unchanged across
 * the copy (a seqlock).  The process removes the file when it exits; a
 * reader removes files whose pid is gone.
 */
#ifndef WSD_SWITCH_STAT_H
#define WSD_SWITCH_STAT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define WSD_STAT_MAGIC   0x54534457u    /* "WDST" */
#define WSD_STAT_VERSION 7u
#define WSD_STAT_SLOTS   65536u
#define WSD_STAT_DIR     "/dev/shm"
#define WSD_STAT_PREFIX  "wsd-stat."
#define WSD_STAT_REASONS 32u           /* refused[]: enum wsd_reason, the last for any above */

struct wsd_stat_addr {
	uint8_t family;        /* AF_INET, AF_INET6, 0: unknown */
	uint8_t pad;
	uint16_t port;         /* host order */
	uint8_t addr[16];      /* IPv4 in the first 4 bytes */
};

/* The values of a slot's wait[], in order (wsd/stat.c names them). */
enum {
	WSD_WAIT_AT,            /* CLOCK_MONOTONIC ms of the sleep; 0: none yet */
	WSD_WAIT_WHAT,          /* 1 data, 2 room, 3 a zero-copy completion */
	WSD_WAIT_MODES,         /* tx_mode << 8 | rx_mode (DIR_*) */
	WSD_WAIT_SLEEPERS,      /* threads asleep on it, this one included */
	WSD_WAIT_TX_POS,        /* our sending direction: our position, */
	WSD_WAIT_CONSUMED,      /* the peer's consumed as last read, */
	WSD_WAIT_ZC_SENT,       /* our zero-copy records, */
	WSD_WAIT_ZC_DONE,       /* those the peer finished, */
	WSD_WAIT_SPACE_GEN,     /* our space arm, */
	WSD_WAIT_PEER_DATA_ARM, /* the peer's data arm as last read, */
	WSD_WAIT_RUNG_DATA,     /* the last one we rang for */
	WSD_WAIT_RX_POS,        /* our receiving direction: our position, */
	WSD_WAIT_RX_REPORTED,   /* the consumed count we last wrote, */
	WSD_WAIT_DATA_GEN,      /* our data arm, */
	WSD_WAIT_PEER_SPACE_ARM,/* the peer's space arm as last read, */
	WSD_WAIT_RUNG_SPACE,    /* the last one we rang for */
	WSD_WAIT_BELLS_TX,      /* doorbells we sent, */
	WSD_WAIT_BELLS_RX,      /* doorbells we read, */
	WSD_WAIT_BELLS_ANN,     /* doorbells the peer announced, */
	WSD_WAIT_CLOSED,        /* the peer's closed word */
	WSD_WAIT_ARM_BELLS,     /* the peer's announced bells when we last armed for data */
	WSD_WAIT_BELLS_UNSENT,  /* rings of ours that wrote no byte, */
	WSD_WAIT_BELL_ERRNO,    /* and the errno of the last */
	WSD_STAT_WAIT_N
};

/*
 * How an accelerated connection's bytes move: stores into the peer's ring
 * mapped here (map), the peer's memory written by the kernel for us (vm:
 * shm that could not map it), the rings alone with a process of another
 * user (copy), RDMA between hosts (rdma).  0: not accelerated.
 */
enum wsd_stat_way { WAY_NONE, WAY_MAP, WAY_VM, WAY_COPY, WAY_RDMA };

struct wsd_stat_slot {
	_Atomic uint32_t gen;  /* odd while being written */
	uint32_t used;         /* 1: a live socket */
	int32_t fd;            /* -1: its last descriptor closed (its end still settling) */
	uint8_t path;          /* enum wsd_path: 0 tcp, 1 shm, 2 verbs */
	uint8_t reason;        /* enum wsd_reason */
	uint8_t listening;
	uint8_t way;           /* enum wsd_stat_way: how its bytes move */
	struct wsd_stat_addr local, peer;
	/* counters, bytes unless said */
	_Atomic uint64_t tcp_tx, tcp_rx;        /* through the kernel stream */
	_Atomic uint64_t copy_tx, copy_rx;      /* through the ring */
	_Atomic uint64_t zcopy_tx, zcopy_rx;    /* by RDMA read */
	_Atomic uint64_t doorbells_tx, doorbells_rx;   /* count */
	_Atomic uint64_t waits;                 /* count of sleeps */
	_Atomic uint64_t fallbacks;             /* count of declined upgrades */
	/* the channel it is a slot of (a number in this process, 0: none)
	 * and the peer process at its other end (0: not known, as on verbs) */
	_Atomic uint64_t channel, peer_pid;
	/*
	 * The inodes of the channel's receive memory on shm (0: none): ours,
	 * and the peer's mapped here; wsd stat sums their pages from
	 * /proc/PID/smaps, per channel.
	 */
	_Atomic uint64_t mem_ino[2];
	/*
	 * The ring protocol's state when a thread last went to sleep on the
	 * socket (wsd stat --waits): what a stall is read from.  Each value is
	 * stored on its own, outside the seqlock; WSD_WAIT_AT first cleared and
	 * last set, so a reader that sees it unchanged across its copy saw
	 * one sleep's values.
	 */
	_Atomic uint64_t wait[WSD_STAT_WAIT_N];
};

struct wsd_stat_file {
	uint32_t magic;
	uint32_t version;
	int32_t pid;
	uint32_t nslots;
	char comm[16];
	_Atomic uint32_t hiwater;   /* slots [0, hiwater) may be in use */
	/*
	 * Names another user held (0: none; else its uid + 1): the file's own
	 * (wsd-stat.PID, so the file is wsd-stat.PID.RANDOM), and the
	 * registry's of port reg_taken_port (its listener took an alternate).
	 */
	uint32_t stat_taken_uid;
	uint32_t reg_taken_uid;
	uint16_t reg_taken_port;
	uint16_t pad;
	/* upgrade requests this process's registry turned down, by reason */
	_Atomic uint64_t refused[WSD_STAT_REASONS];
	struct wsd_stat_slot slots[];
};

/* The switch's side (switch/stat.c). */
/*
 * Never NULL: one on the heap, not shown, when the table is full or
 * unavailable; the shared dummy when even that fails.
 */
struct wsd_stat_slot *wsd_stat_alloc(void);
/* false for the shared dummy: its tuple is anyone's, so its socket stays plain */
bool wsd_stat_own(const struct wsd_stat_slot *slot);
void wsd_stat_free(struct wsd_stat_slot *slot);
/* slot's socket has no descriptor any more: wsd stat leaves it out. */
void wsd_stat_closed(struct wsd_stat_slot *slot);
/* Begin/end an update of the slot's descriptive fields (not the counters). */
void wsd_stat_begin(struct wsd_stat_slot *slot);
void wsd_stat_end(struct wsd_stat_slot *slot);
/* Count a request this process's registry turned down (enum wsd_reason). */
void wsd_stat_refused(unsigned reason);
/* port's registry name was held by another user (uid): shown by wsd stat. */
void wsd_stat_reg_taken(uint16_t port, uint32_t uid);
/* after fork, in the child: a file of its own */
void wsd_stat_atfork_child(void);

static inline void wsd_stat_add(struct wsd_stat_slot *slot, _Atomic uint64_t *ctr, uint64_t n)
{
	(void)slot;
	atomic_fetch_add_explicit(ctr, n, memory_order_relaxed);
}

#endif /* WSD_SWITCH_STAT_H */

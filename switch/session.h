/* SPDX-License-Identifier: MIT */
/*
 * The ring protocol's objects, shared by session.c and upgrade.c.
 * wsd-protocol(7) describes the same layout for interoperation.
 */
#ifndef WSD_SWITCH_SESSION_H
#define WSD_SWITCH_SESSION_H

#include "switch/switch.h"

#define WSD_PROTO_MAGIC   0x57534453u   /* "WSDS" */
#define WSD_PROTO_VERSION 5u
#define WSD_TUPLE_MAGIC   0x5754u       /* "TW" */
#define WSD_NONCE         16u           /* bytes of a handshake's challenge */

/* Handshake messages (WSPSend on the SPI connection), little-endian. */
enum { MSG_HELLO = 1, MSG_ACCEPT = 2, MSG_REFUSE = 3 };

struct wsd_hello {
	uint32_t magic;
	uint16_t version;
	uint16_t kind;               /* MSG_* */
	uint32_t reason;             /* MSG_REFUSE: enum wsd_reason */
	uint32_t ring_size;          /* the sender's receive ring */
	uint64_t key;                /* stamps of records in the sender's ring */
	uint8_t desc[WSP_RDMA_DESCRIPTOR_SIZE];  /* the sender's receive region */
	/* shm: the sender's pid and the descriptor of the memfd that holds its
	 * region, for the peer to map (pidfd_getfd); 0 and -1 otherwise */
	uint32_t pid;
	int32_t region_fd;
	/*
	 * A fresh random challenge: the peer proves it holds the TCP
	 * connection by writing it on the stream right after its SWITCH
	 * point (wsd-protocol(7), "Proof"), which no other host or process
	 * can do.  Zero in a REFUSE.
	 */
	uint8_t nonce[WSD_NONCE];
	/* zero: version 3 had the 4-tuple here, now in struct wsd_tuple;
	 * kept so that every version's HELLO is 96 bytes (wsd-protocol(7)) */
	uint8_t reserved[16];
};
_Static_assert(sizeof(struct wsd_hello) == 96, "handshake messages are 96 bytes");

/*
 * The connecting side's connect data (WSPConnect's caller data; rdma_cm's
 * private data on verbs): the TCP connection, as the connecting side sees
 * it, that the new SPI connection is for.  It must fit the 44 bytes a
 * verbs connect request has left.
 */
struct wsd_tuple {
	uint16_t magic;              /* WSD_TUPLE_MAGIC */
	uint8_t version;             /* WSD_PROTO_VERSION */
	uint8_t pad;
	struct wsd_stat_addr client, server;
};
_Static_assert(sizeof(struct wsd_tuple) <= 44, "the tuple must fit a verbs connect request");

/*
 * A receive region: the words the peer writes about itself, then the ring
 * the peer fills with records.  Each word is a value and its check (~value)
 * written after it, apart: a reader takes a value only with its check (a
 * copy into our memory may show its bytes out of order, see write_record),
 * and otherwise the last one it took.
 */
enum {
	CW_CONSUMED,     /* ring bytes the peer consumed (our credits) */
	CW_DATA_ARM,     /* the peer waits for our data: a generation */
	CW_SPACE_ARM,    /* the peer waits for room in our ring */
	CW_RX_READY,     /* the peer takes our data by ring from now */
	CW_ZC_DONE,      /* our zero-copy records the peer finished */
	CW_CLOSED,       /* the peer closed its socket: 1, or 2 for a reset */
	CW_BACK_REQ,     /* the peer asks us to send by the stream again */
	CW_BACK_BELLS,   /* the peer's doorbells on the stream + 1, once it went
			    back: its stream bytes after those are data */
	CW_POST,         /* the peer offers its receive buffer (post.gen), or 0 */
	CW_POST_CANCEL,  /* the peer withdrew its offer of this generation */
	CW_CLAIM,        /* the peer is writing into our offered buffer (generation) */
	CW_MAPPED,       /* the peer mapped our region (1) or will not (2): our memfd can go */
	CW_N
};

struct wsd_word {
	_Atomic uint64_t v, check;
};

/* A receive buffer offered for a write-based zero-copy transfer. */
struct wsd_post {
	uint64_t gen;                /* one more each offer */
	uint64_t pos;                /* the offerer's ring position: valid only there */
	uint64_t len;
	uint64_t pad;
	uint8_t desc[WSP_RDMA_DESCRIPTOR_SIZE];
};

struct wsd_ctl {
	struct wsd_word w[CW_N];
	struct wsd_post post;        /* written before CW_POST names its generation */
};

#define CTL_SIZE 512u
_Static_assert(sizeof(struct wsd_ctl) <= CTL_SIZE, "control area");

enum { REC_DATA = 1, REC_ZC = 2, REC_SWITCH = 3, REC_FIN = 4, REC_PAD = 5, REC_BACK = 6,
       REC_WZC = 7 };

/* REC_WZC's payload: the offer it answers, and the bytes written into it (0: declined). */
struct wsd_wzc {
	uint64_t gen, len;
};

/* A record: header, payload padded to 16, trailer (not for PAD). */
struct wsd_rec {
	uint32_t len;                /* payload bytes; PAD: bytes skipped */
	uint32_t type;
	_Atomic uint64_t stamp;      /* position ^ key */
};

struct wsd_zc {
	uint64_t len;
	uint8_t desc[WSP_RDMA_DESCRIPTOR_SIZE];
};

#define REC_HDR 16u
#define REC_TRAILER 16u
#define REC_RESERVE 128u             /* kept free so a FIN and a BACK always fit */

static inline uint32_t rec_size(uint32_t len)
{
	return REC_HDR + ((len + 15u) & ~15u) + REC_TRAILER;
}

struct wsd_session {
	SOCKET ws;                   /* the SPI connection */
	enum wsd_path path;
	/* our receive region */
	uint8_t *region;
	size_t region_len;
	struct wsd_ctl *ctl;
	uint8_t *ring;
	uint32_t ring_size;
	uint64_t rx_key;
	uint8_t rx_desc[WSP_RDMA_DESCRIPTOR_SIZE];
	int region_fd;               /* shm: the memfd holding it, until the peer mapped it */
	uint64_t region_ino;         /* its inode: the program may have closed the fd */
	size_t map_len;              /* region_len and the page holding rx_key after it */
	/* the peer's */
	uint8_t peer_desc[WSP_RDMA_DESCRIPTOR_SIZE];
	/* the challenge we sent (the peer must write it on the stream after
	 * its SWITCH point), and the one the peer sent (we write it after ours) */
	uint8_t nonce[WSD_NONCE], peer_nonce[WSD_NONCE];
	uint8_t *peer_map;           /* shm: the peer's region, mapped here (or NULL) */
	size_t peer_map_len;
	uint32_t peer_ring;
	uint64_t tx_key;
	/* staging for records (tx_lock) and single words (each its own) */
	uint8_t *stage;
	uint32_t stage_len;
	uint64_t stage_handle;
	uint64_t *words;             /* pairs: [0] rx_lock, [2] tx_lock, [4] mu */
	uint64_t words_handle;
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
	uint64_t zc_finished;
	/* doorbell bytes on the stream since the switch, each way (BACK counts them) */
	uint64_t bells_tx;           /* tx_lock */
	uint64_t bells_rx;           /* mu */
	bool back_asked;             /* we wrote the peer's back_req */
	_Atomic uint64_t seen[CW_N];  /* the control words' last checked values */
	/* our offer of a receive buffer (rx_lock) */
	bool post_active;
	uint64_t post_gen;
	uint8_t post_desc[WSP_RDMA_DESCRIPTOR_SIZE];
	uint32_t post_dlen;
	/* the peer's offers we answered (tx_lock) */
	uint64_t post_answered;
	/* a wait for room both ends share, seen from poll (tx_lock) */
	int64_t stall_since;
	uint64_t stall_rx, stall_c;
};

/* Make a session on a connected SPI socket: our region registered. */
struct wsd_session *wsd_session_new(SOCKET ws, enum wsd_path path);
/* The peer's region, from its handshake message. */
void wsd_session_peer(struct wsd_session *ss, const struct wsd_hello *h);
/* Fill a handshake message with our side. */
void wsd_session_hello(const struct wsd_session *ss, struct wsd_hello *h, uint16_t kind);
/* Give s its session (established): from here the peer may switch. */
void wsd_session_attach(struct wsd_sock *s, struct wsd_session *ss);

/* The SPI instance the switch uses (upgrade.c), started on first use. */
WSPPROC_TABLE *wsd_spi(void);

#endif /* WSD_SWITCH_SESSION_H */

/* SPDX-License-Identifier: MIT */
/*
 * What two switches write to each other (wsd-protocol(7)): the handshake
 * messages, the connect request's tuple, the control words and the ring's
 * records, and one check per kind of message for what the peer wrote.
 *
 * The peer writes our region while we read it, and is not trusted: every
 * value it wrote is read once into a private copy, checked here, and only
 * the copy used (a second read could see another value).  The checks are
 * pure functions of that copy and of our own state, so that a Check suite
 * and the fuzzers (tests/fuzz/) drive the very code the switch runs.  Each
 * returns 0 when the value is valid, else -EPROTO (or -EPROTONOSUPPORT for
 * another version, which the handshake answers rather than drops) and sets
 * *why to a static string naming the failed check, for WSD_DEBUG.
 */
#ifndef WSD_SWITCH_WIRE_H
#define WSD_SWITCH_WIRE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wsd/wsp.h"
#include "switch/stat.h"

#define WSD_PROTO_MAGIC   0x57534453u   /* "WSDS" */
#define WSD_PROTO_VERSION 13u
#define WSD_TUPLE_MAGIC   0x5754u       /* "TW" */
/*
 * The refusals that carry a field: "moved", the process that holds the
 * connection has a registry of its own, on the port in seg (1-65535);
 * "policy", whose seg is WSD_REFUSE_EVERY when the policy keeps every
 * connection to the port on TCP, whoever asks (else 0).
 */
#define WSD_REASON_MOVED  19u
#define WSD_REASON_POLICY 21u
#define WSD_REFUSE_EVERY  1u
#define WSD_NONCE         16u           /* bytes of a handshake's challenge */

/*
 * Handshake messages (WSPSend on the SPI connection), little-endian: HELLO,
 * ACCEPT and REFUSE make a channel (96 bytes); OPEN, OPENED, DECLINE and
 * SHUT, MAPPED and CREDIT go on it afterwards (struct wsd_chmsg, 160 bytes).
 */
enum { MSG_HELLO = 1, MSG_ACCEPT = 2, MSG_REFUSE = 3, MSG_OPEN = 4, MSG_OPENED = 5,
       MSG_DECLINE = 6, MSG_SHUT = 7, MSG_MAPPED = 8, MSG_CREDIT = 9 };

struct wsd_hello {
	uint32_t magic;
	uint16_t version;
	uint16_t kind;               /* MSG_* */
	uint32_t reason;             /* MSG_REFUSE: enum wsd_reason */
	uint32_t ring_size;          /* the sender's receive ring (its slot's) */
	uint64_t key;                /* stamps of records in the sender's ring */
	uint8_t desc[WSP_RDMA_DESCRIPTOR_SIZE];  /* the sender's receive segment */
	/* shm: the sender's pid and the descriptor of the memfd that holds the
	 * segment, for the peer to map (pidfd_getfd), the first time a message
	 * names that segment; 0 and -1 otherwise */
	uint32_t pid;
	int32_t region_fd;
	/*
	 * A fresh random challenge: the peer proves it holds the TCP
	 * connection by writing it on the stream right after its SWITCH
	 * point (wsd-protocol(7), "Proof"), which no other host or process
	 * can do.  Zero in a REFUSE.
	 */
	uint8_t nonce[WSD_NONCE];
	/*
	 * The sender's receive slot for this connection: its segment (a
	 * number of the sender's), its offset in the segment, the segment's
	 * length (with the page after it that holds seg_tag, a random number
	 * by which the peer knows it mapped the right memfd).  Version 3 had
	 * the 4-tuple here; every version's HELLO is 96 bytes.
	 */
	uint32_t seg, slot_off, seg_len, seg_tag;
};
_Static_assert(sizeof(struct wsd_hello) == 96, "handshake messages are 96 bytes");

/* A segment's slots start page-aligned; its last page holds the tag. */
#define WSD_SEG_PAGE 4096u

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
	CW_CLOSED,       /* the peer closed its socket: 1, or 2 for a reset, 3 for
			    a reset because it found a bypass (R_BYPASS); 4 to 6
			    while its close collects our stream bytes (WSD_CLOSING) */
	CW_BACK_REQ,     /* the peer asks us to send by the stream again */
	CW_BACK_BELLS,   /* the peer's doorbells on the stream + 1, once it went
			    back: its stream bytes after those are data */
	CW_POST,         /* the peer offers its receive buffer (post.gen), or 0 */
	CW_POST_CANCEL,  /* the peer withdrew its offer of this generation */
	CW_CLAIM,        /* the peer is writing into our offered buffer (generation) */
	CW_MAPPED,       /* the peer mapped our region (1) or will not (2): our memfd can go */
	CW_BELLS,        /* the peer's doorbells on the stream, times 2, plus 1
			    while it writes one more (wsd_bells_announced) */
	CW_N
};

/*
 * Doorbells are recognisable: bell number i (from 1, each direction) is the
 * byte i mod 256, and its sender counts it in CW_BELLS before it writes it,
 * so a receiver that finds on the stream a byte that is not the next
 * announced bell knows a call it did not see moved it (wsd-protocol(7),
 * Doorbells).
 */
static inline uint8_t wsd_bell_value(uint64_t i)
{
	return (uint8_t)i;
}

/* The doorbells a CW_BELLS value allows on the stream. */
static inline uint64_t wsd_bells_announced(uint64_t w)
{
	return (w >> 1) + (w & 1);
}

/*
 * CW_CLOSED while the peer's close collects what our switch announced on
 * the stream (wsd-protocol(7), Closing): a byte that reaches its socket
 * after its close would make its kernel answer with a reset that TCP
 * would not have given.  It writes CLOSING, then looks: our SWITCH in its
 * ring makes it wait for our proof (CLOSING_PROOF), else it reads none
 * (CLOSING_NO_PROOF); either way it reads the bells CW_BELLS announced.
 * A writer announces first and looks at this word after: it writes a
 * proof only on 0 or CLOSING_PROOF, a bell only on 0.
 */
enum { WSD_CLOSING = 4, WSD_CLOSING_PROOF = 5, WSD_CLOSING_NO_PROOF = 6 };

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
/* where wsd-protocol(7) puts them */
_Static_assert(offsetof(struct wsd_ctl, w[CW_BELLS]) == 192, "the bells word");
_Static_assert(offsetof(struct wsd_ctl, post) == 208, "the offer block");

enum { REC_DATA = 1, REC_ZC = 2, REC_SWITCH = 3, REC_FIN = 4, REC_PAD = 5, REC_BACK = 6,
       REC_WZC = 7, REC_SPLIT = 8 };

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

/*
 * REC_SPLIT's payload: an answer to the offer gen in two parts moved at
 * once.  The sender writes the first wlen bytes into the offered buffer
 * (its REC_WZC for gen, of wlen bytes, says they are there) while the
 * receiver reads the next zc.len bytes from zc.desc into the buffer at
 * wlen, counting it in CW_ZC_DONE like a ZC record.
 */
struct wsd_split {
	uint64_t gen, wlen;
	struct wsd_zc zc;
};

#define REC_HDR 16u
#define REC_TRAILER 16u
#define REC_RESERVE 128u             /* kept free so a FIN and a BACK always fit */

/* In 64 bits: a peer's len near 2^32 must not wrap past a bound check. */
static inline uint64_t rec_size(uint32_t len)
{
	return REC_HDR + (((uint64_t)len + 15u) & ~(uint64_t)15u) + REC_TRAILER;
}


/*
 * A message on a channel: OPEN (a connection to take over, h: the opener's
 * slot, t: the TCP connection as the opener sees it), OPENED (h: the
 * answerer's slot), DECLINE (h.reason), SHUT (h.seg and h.slot_off: the
 * receiver's slot, which the sender writes no more).  req: the opener's
 * number for the request, echoed in the answer.
 */
struct wsd_chmsg {
	struct wsd_hello h;
	uint64_t req;
	struct wsd_tuple t;
	/*
	 * OPEN posted in a mailbox: the opener's descriptor of the TCP
	 * connection, which the answerer may take a copy of to see that the
	 * opener holds it (-1: not offered; 0 in any other message).
	 */
	int32_t fd;
	uint32_t flags;              /* OPENED: WSD_OPENED_HELD or 0; 0 otherwise */
	/*
	 * Every kind: how many of the receiver's messages on this channel the
	 * sender has taken, each receive posted again first (mod 2^32): the
	 * receiver's credit (wsd-protocol(7), "Credits").  CREDIT carries
	 * nothing else.
	 */
	uint32_t taken;
};
_Static_assert(sizeof(struct wsd_chmsg) == 160, "channel messages are 160 bytes");

/*
 * OPENED: the answerer saw the connection's socket in the opener's hands
 * (its fd, on shm): the opener writes no proof on the stream (wsd-protocol(7),
 * "Proof"), and its first bytes are the connection's from this answer on.
 */
#define WSD_OPENED_HELD 1u

/* ---- the checks ---------------------------------------------------------------- */

#define WIRE_RING_MIN 16384u
#define WIRE_RING_MAX 67108864u
#define WIRE_ZC_MAX (1u << 30)       /* a sender's zero-copy transfer, and an offer */

/* A HELLO, ACCEPT or REFUSE, received where a message of kind was expected. */
int wsd_wire_hello_check(const struct wsd_hello *h, uint16_t kind, const char **why);
/* A channel message (kind: its h.kind, checked) that the peer sent. */
int wsd_wire_chmsg_check(const struct wsd_chmsg *m, const char **why);
/* The connect request's caller data (len bytes at data, copied to *t when valid). */
int wsd_wire_tuple_check(const void *data, uint32_t len, struct wsd_tuple *t, const char **why);

/* Our receive ring, as we know it (private: never read from the peer). */
struct wire_ring {
	const uint8_t *mem;
	uint32_t size;               /* a power of two */
	uint64_t key;
};

/* A record as read once from the ring: use these, never the ring's header again. */
struct wire_rec {
	uint64_t pos;                /* where it starts */
	uint64_t next;               /* where the next starts (PAD: the ring's end) */
	uint32_t len, type;
	const uint8_t *payload;      /* in the ring: the peer may still change it */
};

/* The header fields len and type of a record at ring offset off. */
int wsd_wire_rec_check(uint32_t len, uint32_t type, uint64_t off, uint32_t ring_size,
		       const char **why);
/*
 * The record at pos, for a receiver whose position is start (pos >= start):
 * 1 with *r when it is complete and valid, 0 when it is not there (yet),
 * -EPROTO when the peer broke the format.
 */
int wsd_wire_rec_at(const struct wire_ring *rg, uint64_t start, uint64_t pos,
		    struct wire_rec *r, const char **why);
/*
 * The record walk every reader of the ring uses: from pos, past every
 * record whose type is in skip (a mask of 1u << type), to the first other
 * one.  1 with *r, 0 when the records end first (r->pos: where), or -EPROTO.
 * It ends: each record takes 16 bytes at least and none ends more than a
 * ring past start.
 */
int wsd_wire_walk(const struct wire_ring *rg, uint64_t start, uint64_t pos, uint32_t skip,
		  struct wire_rec *r, const char **why);
#define WIRE_SKIP(t) (1u << (t))

/* A partly delivered record at the head (off bytes of it taken): still the same kind. */
int wsd_wire_resume_check(uint32_t type, uint64_t len, uint64_t off, const char **why);
/* SWITCH: N, with received bytes already taken from the stream. */
int wsd_wire_switch_check(uint64_t n, uint64_t received, const char **why);
/* ZC: the transfer's length. */
int wsd_wire_zc_check(const struct wsd_zc *z, const char **why);
/*
 * WZC: an answer to one of our offers (the last is post_gen).  *deliver:
 * the bytes to take, when it answers the offer still open (of room bytes
 * at most), else 0.
 */
int wsd_wire_wzc_check(const struct wsd_wzc *w, uint64_t post_gen, bool open, uint64_t room,
		       uint64_t *deliver, const char **why);
/*
 * Doorbells: n bytes taken (or looked at) on the stream after `read` bells,
 * with `announced` bells counted by the peer: each must be the next bell.
 * -EPROTO means a byte moved by a call a switch did not see (R_BYPASS).
 */
int wsd_wire_bells_check(const uint8_t *b, size_t n, uint64_t read, uint64_t announced,
			 const char **why);
/* BACK: the peer's bells on the stream, with its back_bells word and the bells we read. */
int wsd_wire_back_check(uint64_t bells, uint64_t word, uint64_t bells_read, const char **why);
/* An offer (CW_POST's block) of generation gen, for a sender at tx_pos. */
int wsd_wire_post_check(const struct wsd_post *p, uint64_t gen, uint64_t tx_pos,
			const char **why);
/*
 * SPLIT: an answer to one of our offers (the last is post_gen) in two
 * parts.  *take: 1 when it answers the offer still open (of room bytes at
 * most), else 0 (an offer let go: its parts are not ours to take).
 */
int wsd_wire_split_check(const struct wsd_split *sp, uint64_t post_gen, bool open, uint64_t room,
			 int *take, const char **why);

/*
 * A control word's new value v, after last (the value taken before): the
 * positions and counts only grow and stay within bound (what we sent: our
 * position, our ZC records, our last offer), flags stay in their range.
 */
int wsd_wire_word_check(int idx, uint64_t v, uint64_t last, uint64_t bound, const char **why);
/*
 * Read control word idx once: *v is its value when its check agrees, else
 * the last value taken (*seen); 0, or -EPROTO when the value breaks
 * wsd_wire_word_check (then *v is the last good one).
 */
int wsd_wire_word_get(const struct wsd_ctl *ctl, int idx, _Atomic uint64_t *seen,
		      uint64_t bound, uint64_t *v, const char **why);
/*
 * As wsd_wire_word_get, and 1 when this read found the word whole (value
 * and check agreeing), 0 when the peer was writing it (*v: the last one).
 */
int wsd_wire_word_try(const struct wsd_ctl *ctl, int idx, _Atomic uint64_t *seen,
		      uint64_t bound, uint64_t *v, const char **why);

#endif /* WSD_SWITCH_WIRE_H */

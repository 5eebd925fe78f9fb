/* SPDX-License-Identifier: MIT */
/*
 * A peer switch written from wsd-protocol(7) (version 6) alone, for the
 * attackers in this folder: the wire formats and the provider calls to
 * reach a wsd server's registry.  Not the switch's own code, on purpose:
 * an attacker needs no more than the page tells.
 */
#ifndef WSD_TESTS_ATTACK_PEER_H
#define WSD_TESTS_ATTACK_PEER_H

#include <stdint.h>
#include <sys/socket.h>

#include "wsd/wsp.h"

#define P_MAGIC 0x57534453u
#define P_VERSION 13
#define P_TUPLE_MAGIC 0x5754
#define P_CTL 512u                   /* the control area before the ring */

enum { P_HELLO = 1, P_ACCEPT = 2, P_REFUSE = 3 };
enum { P_DATA = 1, P_ZC = 2, P_SWITCH = 3, P_FIN = 4, P_PAD = 5, P_BACK = 6, P_WZC = 7,
       P_SPLIT = 8 };
/* control words, 16 bytes each: value, then ~value */
enum { W_CONSUMED, W_DATA_ARM, W_SPACE_ARM, W_RX_READY, W_ZC_DONE, W_CLOSED, W_BACK_REQ,
       W_BACK_BELLS, W_POST, W_POST_CANCEL, W_CLAIM, W_MAPPED, W_BELLS };

struct p_addr {
	uint8_t family, pad;
	uint16_t port;
	uint8_t addr[16];
};

struct p_tuple {
	uint16_t magic;
	uint8_t version, pad;
	struct p_addr client, server;
};

struct p_hello {
	uint32_t magic;
	uint16_t version, kind;
	uint32_t reason, ring_size;
	uint64_t key;
	uint8_t desc[32];
	uint32_t pid;
	int32_t region_fd;
	uint8_t nonce[16];
	/* the sender's receive slot: in a segment of seg_len bytes, its last page a tag */
	uint32_t seg, slot_off, seg_len, seg_tag;
};
/* A segment holding one slot of ring bytes at offset 0 (wsd-protocol(7), "Channels"). */
#define P_SEG_LEN(ring) ((P_CTL + (ring) + 4095u) / 4096u * 4096u + 4096u)
_Static_assert(sizeof(struct p_hello) == 96, "wsd-protocol(7): 96 bytes");

extern WSPPROC_TABLE p_procs;

/* The provider, started once; 0 or -1. */
int p_start(void);
/* A provider connection to the registry of port on addr (IPv4) naming t; or INVALID_SOCKET. */
SOCKET p_request(const char *addr, int port, const struct p_tuple *t);
/* The tuple of a connected IPv4 TCP socket, as its connecting side names it. */
void p_tuple_of(int fd, struct p_tuple *t);
/* One handshake message within ms: 0 or -1. */
int p_send(SOCKET ws, const struct p_hello *h);
int p_recv(SOCKET ws, struct p_hello *h, int ms);
/* An RDMA write of len bytes at buf (registered: handle) to desc's region at off; 0 or -1. */
int p_write(SOCKET ws, const void *buf, uint32_t len, uint64_t handle, const uint8_t *desc,
	    uint64_t off);

#endif

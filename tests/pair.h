/* SPDX-License-Identifier: MIT */
/*
 * Test harness for the endpoint suites: a "side" is an adapter, CQs, an
 * endpoint and a registered buffer; a pair is this process and a forked
 * peer process connected over the transport under test (WSD_TEST_TRANSPORT,
 * default shm), with a pipe pair for out-of-band coordination.
 */
#ifndef WSD_TESTS_PAIR_H
#define WSD_TESTS_PAIR_H

#include <check.h>
#include <stdint.h>
#include <netinet/in.h>
#include <sys/types.h>

#include "wsd/nd.h"

#define TBUF (4u << 20)

struct tside {
	struct nd_adapter *ad;
	struct nd_cq *icq, *ocq;
	struct nd_ep *ep;
	uint8_t *buf;
	struct nd_mr *mr;
	int oob_in, oob_out;     /* to and from the other process */
	pid_t peer;              /* in the parent: the peer's pid */
	uint16_t port;           /* where the peer listens */
};

typedef int (*peer_fn)(struct tside *s, void *arg);

extern int t_is_peer;
extern uint32_t t_cq_depth;   /* for CQs made after it is set */      /* set in the forked peer */
const char *t_transport(void);
/* The verbs transport, where the device, not software, checks remote access. */
int t_verbs(void);
/* Defaults: 64 entries, 4 SGEs each way, read limit 4; attr may override. */
void tside_open(struct tside *s, const struct nd_ep_attr *attr);
void tside_close(struct tside *s);
/*
 * Fork a peer that listens, accepts and runs fn (its return is its exit
 * status); this process connects.  peer_attr/attr may be NULL.
 */
void pair_start(struct tside *me, const struct nd_ep_attr *attr, peer_fn fn, void *arg,
		const struct nd_ep_attr *peer_attr);
/* The two halves of pair_start, for a test with several peers: spawn all first. */
void pair_spawn(struct tside *me, peer_fn fn, void *arg, const struct nd_ep_attr *peer_attr);
void pair_connect(struct tside *me, const struct nd_ep_attr *attr);
/* Wait for the peer; returns its exit status (or 128+signal). */
int pair_finish(struct tside *me);
/* Nonzero: the peers pair_spawn forks from now on run as this user and group (root). */
extern unsigned pair_peer_uid;
/* When set: called on the peer's listener, and on our endpoint before it connects. */
extern void (*pair_on_listen)(struct nd_listener *l);
extern void (*pair_on_connect)(struct nd_ep *ep);

void oob_send(struct tside *s, const void *p, size_t n);
void oob_recv(struct tside *s, void *p, size_t n);
void oob_sync(struct tside *s);       /* send a token, wait for the peer's */

/* CLOCK_MONOTONIC in milliseconds */
int64_t t_now_ms(void);
/* One result from cq within timeout_ms, or the test fails. */
struct nd_result t_wait(struct nd_cq *cq, int timeout_ms);
/* 1 if cq yields no result within ms (progress keeps running). */
int t_quiet(struct nd_cq *cq, int ms);
/* A peer that only waits for one oob_sync. */
int t_peer_idle(struct tside *s, void *arg);
struct nd_sge t_sge(struct tside *s, size_t off, uint32_t len);
uint16_t t_port(void);
/* WSD_TEST_ADDR (default 127.0.0.1) at port: where pairs listen and connect. */
struct sockaddr_in t_addr(uint16_t port);

/* A test case named name (the transport may come as argv[1]), and running it. */
TCase *t_case(const char *name, int argc, char **argv);
int t_run(const char *suite, TCase *tc);

/* Peer-side assertion: exits the peer with the line number on failure. */
#define PEER_CHECK(c) do { if (!(c)) { fprintf(stderr, "peer check failed %s:%d: %s\n", \
	__FILE__, __LINE__, #c); return __LINE__ % 200 + 1; } } while (0)

/* Each argument once: a second call of `got` (a wait) would hide what the first returned. */
#define ck_status(got, want) do { \
	nd_status ck_got_ = (got), ck_want_ = (want); \
	ck_assert_msg(ck_got_ == ck_want_, "%s: got %s, want %s", #got, \
		      nd_strstatus(ck_got_), nd_strstatus(ck_want_)); \
} while (0)

#endif

/* SPDX-License-Identifier: MIT */
/*
 * A peer that passed the proof (root here, as the victim) then scribbles on
 * the shared region, one value per case: layout fields, a message header
 * (length near 2^32, zero length with a bad op or flags, a streamed length
 * past the producer's head), the consumer's tail, the failure verdict, a
 * window entry held torn or wrapping.  The victim must not crash or hang:
 * the connection fails with ND_CONNECTION_ABORTED, and its connection to
 * an honest peer keeps moving data.  scribble_copy: the same with the peers
 * as another user (nobody), paired by copy, where nothing but the rings is
 * shared (the window cases need RDMA Read, which copy has not).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "provider/internal.h"
#include "tests/pair.h"
#include "provider/shm/shm.h"

enum kind {
	K_RING_SIZE, K_NWINDOWS, K_RING_OFFSET, K_STAMP_KEY,
	K_MSG_HUGE, K_MSG_STREAM_HEAD, K_MSG_ZERO_BAD_OP, K_MSG_ZERO_BAD_FLAGS,
	K_TAIL_AHEAD, K_TAIL_BACK, K_FAIL_STATUS,
	K_WINDOW_TORN, K_WINDOW_WRAP, K_WINDOW_BAD_ACCESS,
	K_COUNT
};

static const char *const names[K_COUNT] = {
	"ring_size", "nwindows", "ring_offset", "stamp_key",
	"msg_len_huge", "msg_stream_head", "msg_zero_bad_op", "msg_zero_bad_flags",
	"tail_ahead", "tail_back", "fail_status",
	"window_torn", "window_wrap", "window_bad_access",
};

#define TOKEN 0x1234567890abcdefull

/* A message header in our own ring, stamped as the victim expects. */
static void forge_msg(struct shm_conn *c, uint32_t len, uint8_t op, uint8_t flags)
{
	uint64_t pos = c->tx_head;
	struct shm_msg *m = (struct shm_msg *)(c->tx_ring + (pos & (c->ring_size - 1)));

	m->len = len;
	m->op = op;
	m->flags = flags;
	m->token = 0;
	atomic_store(&m->stamp, (pos + 1) ^ c->tx_key);
}

static void forge_window(struct shm_conn *c, uint64_t seq, uint64_t base, uint64_t len,
			 uint32_t access)
{
	struct shm_window *w = &c->tx->windows[0];

	w->token = TOKEN;
	w->base = base;
	w->length = len;
	w->access = access;
	atomic_store(&w->seq, seq);
}

static void scribble(struct shm_conn *c, enum kind k)
{
	switch (k) {
	case K_RING_SIZE: c->tx->ring_size = 1u << 31; break;
	case K_NWINDOWS: c->rx->nwindows = UINT32_MAX; break;
	case K_RING_OFFSET: c->tx->ring_offset = UINT64_MAX - 7; break;
	case K_STAMP_KEY: c->rx->stamp_key ^= 1; break;
	case K_MSG_HUGE: forge_msg(c, UINT32_MAX - 31, ND_OP_SEND, 0); break;
	case K_MSG_STREAM_HEAD:
		forge_msg(c, 1000, ND_OP_SEND, SHM_MSG_STREAM);
		atomic_store(&c->tx->head, c->tx_head + (1ull << 40));
		break;
	case K_MSG_ZERO_BAD_OP: forge_msg(c, 0, 0x77, 0); break;
	case K_MSG_ZERO_BAD_FLAGS: forge_msg(c, 0, ND_OP_SEND, 0x80); break;
	/* the victim's ring: we are its consumer */
	case K_TAIL_AHEAD: atomic_store(&c->rx->tail, 1ull << 20); break;
	case K_TAIL_BACK: atomic_store(&c->rx->tail, UINT64_MAX - 31); break;
	case K_FAIL_STATUS:
		atomic_store(&c->rx->fail_pos, 0);
		atomic_store(&c->rx->fail_status, 0xdeadbeefu);
		break;
	case K_WINDOW_TORN: forge_window(c, 1, 0, 4096, ND_OP_FLAG_ALLOW_READ); break;
	case K_WINDOW_WRAP:
		forge_window(c, 2, UINT64_MAX - 10, 4096, ND_OP_FLAG_ALLOW_READ);
		break;
	case K_WINDOW_BAD_ACCESS: forge_window(c, 2, 4096, 4096, 0xff00u); break;
	case K_COUNT: break;
	}
}

/* The attacker, connected through pair_spawn: scribble when told, stay alive. */
static int scribbler(struct tside *s, void *arg)
{
	struct shm_conn *c;
	char go;

	(void)arg;
	oob_recv(s, &go, 1);
	c = s->ep->tpriv;
	pthread_mutex_lock(&s->ep->ad->lock);
	scribble(c, (enum kind)go);
	pthread_mutex_unlock(&s->ep->ad->lock);
	if (c->copy) {
		/* by copy the bells are bytes on the unix socket */
		(void)send(c->sock, "", 1, MSG_DONTWAIT | MSG_NOSIGNAL);
		(void)send(c->sock, "", 1, MSG_DONTWAIT | MSG_NOSIGNAL);
	} else {
		(void)eventfd_write(c->peer_in_efd, 1);
		(void)eventfd_write(c->peer_out_efd, 1);
	}
	oob_send(s, &go, 1);
	oob_recv(s, &go, 1);   /* alive until the victim has judged */
	return 0;
}

/* The honest peer: echoes one message. */
static int echo_peer(struct tside *s, void *arg)
{
	struct nd_sge g = t_sge(s, 0, 4096);
	struct nd_result r;

	(void)arg;
	PEER_CHECK(nd_ep_receive(s->ep, NULL, &g, 1) == ND_SUCCESS);
	oob_sync(s);
	r = t_wait(s->icq, 10000);
	PEER_CHECK(r.status == ND_SUCCESS);
	g = t_sge(s, 0, (uint32_t)r.bytes);
	PEER_CHECK(nd_ep_send(s->ep, NULL, &g, 1, 0) == ND_SUCCESS);
	PEER_CHECK(t_wait(s->ocq, 5000).status == ND_SUCCESS);
	oob_sync(s);
	return 0;
}

/* Wait for the result that says the connection broke; others (flushes) may come too. */
static void expect_aborted(struct nd_cq *cq, enum nd_op op)
{
	for (int i = 0; i < 4; i++) {
		struct nd_result r = t_wait(cq, 5000);

		if (r.op == op) {
			ck_status(r.status, ND_CONNECTION_ABORTED);
			return;
		}
	}
	ck_abort_msg("no result for op %d", op);
}

static void scribble_case(enum kind k)
{
	struct tside honest, evil;
	struct nd_sge g;
	struct nd_mw_descriptor d = { 0, 4096, TOKEN };
	char go = (char)k;

	pair_spawn(&honest, echo_peer, NULL, NULL);
	pair_spawn(&evil, scribbler, NULL, NULL);
	pair_connect(&honest, NULL);
	pair_connect(&evil, NULL);
	printf("case %s%s\n", names[k], pair_peer_uid ? ", by copy" : "");
	/* by copy when the peer is another user: nothing shared but the rings */
	ck_assert(!pair_peer_uid || ((struct shm_conn *)evil.ep->tpriv)->copy);
	ck_status(nd_ep_receive(evil.ep, NULL, &(struct nd_sge){ evil.buf, 4096, evil.mr }, 1),
		  ND_SUCCESS);
	oob_send(&evil, &go, 1);
	oob_recv(&evil, &go, 1);
	g = t_sge(&evil, 8192, 100);
	switch (k) {
	case K_TAIL_AHEAD: case K_TAIL_BACK: case K_FAIL_STATUS:
		ck_status(nd_ep_send(evil.ep, NULL, &g, 1, 0), ND_SUCCESS);
		expect_aborted(evil.ocq, ND_OP_SEND);
		break;
	case K_WINDOW_TORN: case K_WINDOW_WRAP: case K_WINDOW_BAD_ACCESS:
		d.base = k == K_WINDOW_WRAP ? UINT64_MAX - 10 : k == K_WINDOW_TORN ? 0 : 4096;
		(void)nd_ep_read(evil.ep, NULL, &g, 1, &d, 0, 0);
		expect_aborted(evil.ocq, ND_OP_READ);
		break;
	default:
		expect_aborted(evil.icq, ND_OP_RECEIVE);
		break;
	}
	oob_send(&evil, &go, 1);
	ck_assert_int_eq(pair_finish(&evil), 0);

	/* the other connection is untouched */
	ck_status(nd_ep_receive(honest.ep, NULL, &(struct nd_sge){ honest.buf + 4096, 64,
								  honest.mr }, 1), ND_SUCCESS);
	oob_sync(&honest);
	memcpy(honest.buf, "still here", 10);
	g = t_sge(&honest, 0, 10);
	ck_status(nd_ep_send(honest.ep, NULL, &g, 1, 0), ND_SUCCESS);
	ck_status(t_wait(honest.ocq, 5000).status, ND_SUCCESS);
	{
		struct nd_result r = t_wait(honest.icq, 5000);

		ck_status(r.status, ND_SUCCESS);
		ck_assert(r.bytes == 10 && !memcmp(honest.buf + 4096, "still here", 10));
	}
	oob_sync(&honest);
	ck_assert_int_eq(pair_finish(&honest), 0);
	tside_close(&evil);
	tside_close(&honest);
}

START_TEST(scribble_one)
{
	scribble_case((enum kind)_i);
}
END_TEST

static void copy_listen(struct nd_listener *l)
{
	wsd_listen_other_users(l, true);
}

static void copy_connect(struct nd_ep *ep)
{
	wsd_ep_other_users(ep, true);
}

/* The peers as nobody, by copy: a hostile user of another uid. */
START_TEST(scribble_copy)
{
	pair_peer_uid = 65534;
	pair_on_listen = copy_listen;
	pair_on_connect = copy_connect;
	scribble_case((enum kind)_i);
}
END_TEST

int main(void)
{
	TCase *tc;

	if (strcmp(t_transport(), "shm")) {
		printf("shm_scribble_test: the shm region only; skipped on %s\n", t_transport());
		return 77;
	}
	if (geteuid() != 0) {
		printf("shm_scribble_test: the peer must be able to read us (root); skipped\n");
		return 77;
	}
	tc = t_case("scribble", 0, NULL);
	tcase_add_loop_test(tc, scribble_one, 0, K_COUNT);
	tcase_add_loop_test(tc, scribble_copy, 0, K_WINDOW_TORN);
	return t_run("shm_scribble", tc);
}

/* SPDX-License-Identifier: MIT */
/*
 * Endpoint layer: objects, connection setup, send/receive and the flags.
 * Runs on the transport named by WSD_TEST_TRANSPORT (default shm).
 */
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/pair.h"

/* ---- objects ----------------------------------------------------------- */

START_TEST(adapter_open_query_close)
{
	struct nd_adapter *ad;
	struct nd_adapter_info info;
	struct nd_cq *cq;

	ck_status(nd_adapter_open("no-such-transport", &ad), ND_NOT_SUPPORTED);
	ck_status(nd_adapter_open(t_transport(), &ad), ND_SUCCESS);
	ck_status(nd_adapter_query(ad, &info), ND_SUCCESS);
	ck_assert_str_eq(info.transport, t_transport());
	ck_assert_uint_ge(info.max_outbound_sge, 2);
	ck_assert_uint_ge(info.max_inbound_sge, 2);
	ck_assert_uint_ge(info.max_outbound_requests, 64);
	ck_assert_uint_ge(info.max_window_size, 1u << 20);
	ck_assert(info.flags & ND_ADAPTER_FLAG_MEMORY_WINDOWS);
	ck_status(nd_cq_create(ad, 8, &cq), ND_SUCCESS);
	ck_status(nd_adapter_close(ad), ND_DEVICE_BUSY);
	ck_status(nd_cq_destroy(cq), ND_SUCCESS);
	ck_status(nd_adapter_close(ad), ND_SUCCESS);
}
END_TEST

START_TEST(object_limits)
{
	struct nd_adapter *ad;
	struct nd_adapter_info info;
	struct nd_cq *cq;
	struct nd_ep *ep;
	struct nd_mr *mr;
	struct nd_ep_attr a = { .inbound_entries = 4, .outbound_entries = 4, .inbound_sge = 1,
				.outbound_sge = 1 };
	static char buf[4096];

	ck_status(nd_adapter_open(t_transport(), &ad), ND_SUCCESS);
	nd_adapter_query(ad, &info);
	ck_status(nd_cq_create(ad, 0, &cq), ND_INVALID_PARAMETER);
	ck_status(nd_cq_create(ad, info.max_cq_entries + 1, &cq), ND_INVALID_PARAMETER);
	ck_status(nd_cq_create(ad, 4, &cq), ND_SUCCESS);
	a.inbound_cq = a.outbound_cq = cq;
	a.outbound_sge = info.max_outbound_sge + 1;
	ck_status(nd_ep_create(ad, &a, &ep), ND_INVALID_PARAMETER);
	a.outbound_sge = 1;
	a.inbound_entries = info.max_inbound_requests + 1;
	ck_status(nd_ep_create(ad, &a, &ep), ND_INVALID_PARAMETER);
	a.inbound_entries = 4;
	ck_status(nd_ep_create(ad, &a, &ep), ND_SUCCESS);
	ck_status(nd_cq_destroy(cq), ND_DEVICE_BUSY);
	ck_status(nd_mr_register(ad, buf, 0, 0, &mr), ND_INVALID_PARAMETER);
	ck_status(nd_mr_register(ad, buf, sizeof(buf), 0x80, &mr), ND_INVALID_PARAMETER);
	ck_status(nd_mr_register(ad, buf, sizeof(buf), ND_MR_FLAG_ALLOW_LOCAL_WRITE, &mr),
		  ND_SUCCESS);
	ck_status(nd_mr_deregister(mr), ND_SUCCESS);
	ck_status(nd_ep_destroy(ep), ND_SUCCESS);
	ck_status(nd_cq_destroy(cq), ND_SUCCESS);
	ck_status(nd_adapter_close(ad), ND_SUCCESS);
}
END_TEST

START_TEST(not_connected)
{
	struct tside s;
	struct nd_sge g;
	struct nd_mw *mw;
	struct nd_mw_descriptor d = { 0x1000, 4096, 1 };

	tside_open(&s, NULL);
	g = t_sge(&s, 0, 64);
	ck_status(nd_ep_send(s.ep, NULL, &g, 1, 0), ND_CONNECTION_INVALID);
	ck_status(nd_ep_read(s.ep, NULL, &g, 1, &d, 0, 0), ND_CONNECTION_INVALID);
	ck_status(nd_ep_write(s.ep, NULL, &g, 1, &d, 0, 0), ND_CONNECTION_INVALID);
	ck_status(nd_ep_read_token(s.ep, NULL, &g, 1, 0x1000, 1, 0), ND_CONNECTION_INVALID);
	ck_status(nd_ep_send_invalidate(s.ep, NULL, &g, 1, &d, 0), ND_CONNECTION_INVALID);
	ck_status(nd_mw_create(s.ad, &mw), ND_SUCCESS);
	ck_status(nd_ep_bind(s.ep, NULL, s.mr, mw, s.buf, 4096, ND_OP_FLAG_ALLOW_READ, &d),
		  ND_CONNECTION_INVALID);
	ck_status(nd_ep_disconnect(s.ep), ND_CONNECTION_INVALID);
	/* A receive may be posted before the connection exists (seed 004). */
	ck_status(nd_ep_receive(s.ep, NULL, &g, 1), ND_SUCCESS);
	ck_status(nd_mw_destroy(mw), ND_SUCCESS);
	tside_close(&s);
}
END_TEST

START_TEST(connect_refused_and_timeout)
{
	struct tside s;
	struct nd_listener *l;
	struct nd_conn_request *req;
	struct sockaddr_in sa = t_addr(t_port());

	tside_open(&s, NULL);
	ck_status(nd_ep_connect(s.ep, (struct sockaddr *)&sa, sizeof(sa), NULL, 0, 2000),
		  ND_CONNECTION_REFUSED);
	ck_status(nd_listen(s.ad, (struct sockaddr *)&sa, sizeof(sa), 4, &l), ND_SUCCESS);
	{
		struct nd_listener *l2;

		ck_status(nd_listen(s.ad, (struct sockaddr *)&sa, sizeof(sa), 4, &l2),
			  ND_ADDRESS_IN_USE);
	}
	ck_status(nd_listen_get_request(l, 50, &req), ND_TIMEOUT);
	ck_status(nd_listen_close(l), ND_SUCCESS);
	tside_close(&s);
}
END_TEST

static int peer_reject(struct tside *s, void *arg)
{
	(void)s;
	(void)arg;
	return 0;
}

/* The listener rejects: the connector hears ND_CONNECTION_REFUSED. */
START_TEST(connect_rejected)
{
	struct tside s;
	int p[2];
	pid_t pid;
	uint16_t port = t_port();
	struct sockaddr_in sa = t_addr(port);
	char c;
	int status;

	(void)peer_reject;
	ck_assert(pipe(p) == 0);
	pid = fork();
	if (pid == 0) {
		struct nd_adapter *ad;
		struct nd_listener *l;
		struct nd_conn_request *req;
		char data[8];
		size_t len = 1;

		alarm(30);
		if (nd_adapter_open(t_transport(), &ad) || nd_listen(ad, (struct sockaddr *)&sa,
								    sizeof(sa), 1, &l))
			_exit(1);
		if (write(p[1], "r", 1) != 1 || nd_listen_get_request(l, 10000, &req))
			_exit(2);
		/* private data: too small a buffer says how much is needed */
		if (nd_conn_request_data(req, data, &len) != ND_BUFFER_OVERFLOW || len != 5)
			_exit(3);
		if (nd_conn_request_data(req, data, &len) != ND_SUCCESS || memcmp(data, "hello", 5))
			_exit(4);
		_exit(nd_conn_request_reject(req) == ND_SUCCESS ? 0 : 5);
	}
	ck_assert(read(p[0], &c, 1) == 1);
	tside_open(&s, NULL);
	ck_status(nd_ep_connect(s.ep, (struct sockaddr *)&sa, sizeof(sa), "hello", 5, 5000),
		  ND_CONNECTION_REFUSED);
	ck_assert(waitpid(pid, &status, 0) == pid);
	ck_assert_int_eq(WEXITSTATUS(status), 0);
	tside_close(&s);
}
END_TEST

/*
 * Listen with adapter type lt in a child, connect with ct here; return the
 * transport that served the connection, or NULL with *st set.
 */
static const char *connect_with(const char *lt, const char *ct, nd_status *st)
{
	struct tside c;
	struct sockaddr_in sa = t_addr(t_port());
	static char used[16];
	int p[2], status;
	pid_t pid;
	char ok;

	ck_assert(pipe(p) == 0);
	pid = fork();
	if (pid == 0) {
		struct nd_adapter *ad;
		struct nd_listener *l;
		struct nd_conn_request *req;
		struct tside srv;

		alarm(30);
		setenv("WSD_TEST_TRANSPORT", lt, 1);   /* the adapter tside_open opens */
		tside_open(&srv, NULL);
		ad = srv.ad;
		if (nd_listen(ad, (struct sockaddr *)&sa, sizeof(sa), 4, &l) != ND_SUCCESS ||
		    write(p[1], "r", 1) != 1)
			_exit(1);
		if (nd_listen_get_request(l, 5000, &req) != ND_SUCCESS)
			_exit(0);   /* nobody came: the connector's status tells */
		_exit(nd_ep_accept(srv.ep, req, NULL, 0, 5000) == ND_SUCCESS ? 0 : 2);
	}
	ck_assert(read(p[0], &ok, 1) == 1);
	setenv("WSD_TEST_TRANSPORT", ct, 1);
	tside_open(&c, NULL);
	*st = nd_ep_connect(c.ep, (struct sockaddr *)&sa, sizeof(sa), NULL, 0, 5000);
	used[0] = 0;
	if (*st == ND_SUCCESS)
		snprintf(used, sizeof(used), "%s", nd_ep_transport(c.ep));
	kill(pid, SIGKILL);
	waitpid(pid, &status, 0);
	close(p[0]);
	close(p[1]);
	tside_close(&c);
	return *st == ND_SUCCESS ? used : NULL;
}

/*
 * "auto" takes shm for a peer on this host and verbs when only verbs
 * reaches it; a forced transport is that transport or nothing.
 */
START_TEST(transport_choice)
{
	struct nd_adapter *ad;
	nd_status st;
	int verbs = nd_adapter_open("verbs", &ad) == ND_SUCCESS;

	if (verbs)
		nd_adapter_close(ad);
	else
		ck_status(nd_adapter_open("verbs", &ad), ND_NOT_SUPPORTED);
	ck_assert_str_eq(connect_with("auto", "auto", &st), "shm");
	ck_assert_str_eq(connect_with("shm", "auto", &st), "shm");
	if (!verbs)
		return;   /* no RDMA device here: the VM rig runs the rest */
	ck_assert_str_eq(connect_with("verbs", "auto", &st), "verbs");
	ck_assert_str_eq(connect_with("auto", "verbs", &st), "verbs");
	ck_assert_ptr_null(connect_with("shm", "verbs", &st));
	ck_status(st, ND_CONNECTION_REFUSED);
	ck_assert_ptr_null(connect_with("verbs", "shm", &st));
	ck_status(st, ND_CONNECTION_REFUSED);
}
END_TEST

/* ---- send / receive ---------------------------------------------------- */

static int peer_echo(struct tside *s, void *arg)
{
	struct nd_result r;
	struct nd_sge g[2];
	char pd[16];
	size_t len = sizeof(pd);

	(void)arg;
	PEER_CHECK(nd_ep_peer_data(s->ep, pd, &len) == ND_SUCCESS && len == 2 &&
		   !memcmp(pd, "me", 2));
	/* two SGEs: 10 bytes, then the rest */
	g[0] = t_sge(s, 0, 10);
	g[1] = t_sge(s, 4096, 4096);
	PEER_CHECK(nd_ep_receive(s->ep, (void *)0x77, g, 2) == ND_SUCCESS);
	g[0] = t_sge(s, 65536, 16);
	PEER_CHECK(nd_ep_receive(s->ep, (void *)0x78, g, 1) == ND_SUCCESS);
	oob_sync(s);
	r = t_wait(s->icq, 5000);
	PEER_CHECK(r.status == ND_SUCCESS && r.op == ND_OP_RECEIVE && r.bytes == 1000 &&
		   r.request_context == (void *)0x77);
	for (int i = 0; i < 1000; i++)
		PEER_CHECK(s->buf[i < 10 ? i : 4096 + i - 10] == (uint8_t)(i * 7));
	r = t_wait(s->icq, 5000);
	PEER_CHECK(r.status == ND_SUCCESS && r.bytes == 0 && r.request_context == (void *)0x78);
	/* echo the 1000 bytes back in one SGE */
	memmove(s->buf + 10, s->buf + 4096, 990);
	g[0] = t_sge(s, 0, 1000);
	PEER_CHECK(nd_ep_send(s->ep, (void *)0x79, g, 1, 0) == ND_SUCCESS);
	r = t_wait(s->ocq, 5000);
	PEER_CHECK(r.status == ND_SUCCESS && r.op == ND_OP_SEND && r.bytes == 1000 &&
		   r.request_context == (void *)0x79);
	oob_sync(s);
	return 0;
}

START_TEST(send_receive_sgl)
{
	struct tside s;
	struct nd_sge g[3];
	struct nd_result r;
	char pd[16];
	size_t len = sizeof(pd);

	pair_start(&s, NULL, peer_echo, NULL, NULL);
	ck_status(nd_ep_peer_data(s.ep, pd, &len), ND_SUCCESS);
	ck_assert_uint_eq(len, 4);
	ck_assert(!memcmp(pd, "peer", 4));
	for (int i = 0; i < 1000; i++)
		s.buf[i] = (uint8_t)(i * 7);
	g[0] = t_sge(&s, 200, 4096);
	ck_status(nd_ep_receive(s.ep, (void *)5, g, 1), ND_SUCCESS);
	oob_sync(&s);
	/* 1000 bytes from three SGEs */
	g[0] = t_sge(&s, 0, 300);
	g[1] = t_sge(&s, 300, 300);
	g[2] = t_sge(&s, 600, 400);
	ck_status(nd_ep_send(s.ep, (void *)1, g, 3, 0), ND_SUCCESS);
	ck_status(nd_ep_send(s.ep, (void *)2, NULL, 0, 0), ND_SUCCESS);  /* zero bytes */
	r = t_wait(s.ocq, 5000);
	ck_status(r.status, ND_SUCCESS);
	ck_assert_ptr_eq(r.request_context, (void *)1);
	ck_assert_uint_eq(r.bytes, 1000);
	r = t_wait(s.ocq, 5000);
	ck_assert_ptr_eq(r.request_context, (void *)2);
	r = t_wait(s.icq, 5000);
	ck_status(r.status, ND_SUCCESS);
	ck_assert_uint_eq(r.bytes, 1000);
	ck_assert(!memcmp(s.buf + 200 + 0, s.buf, 10));
	oob_sync(&s);
	ck_assert_int_eq(pair_finish(&s), 0);
	tside_close(&s);
}
END_TEST

struct big { uint32_t len; uint32_t count; };

static int peer_big_recv(struct tside *s, void *arg)
{
	const struct big *b = arg;

	for (uint32_t m = 0; m < b->count; m++) {
		struct nd_sge g = t_sge(s, 0, TBUF);
		struct nd_result r;

		PEER_CHECK(nd_ep_receive(s->ep, NULL, &g, 1) == ND_SUCCESS);
		if (m == 0)
			oob_sync(s);
		r = t_wait(s->icq, 20000);
		PEER_CHECK(r.status == ND_SUCCESS && r.bytes == b->len);
		for (uint32_t i = 0; i < b->len; i += 4093)
			PEER_CHECK(s->buf[i] == (uint8_t)(i * 13 + m));
	}
	oob_sync(s);
	return 0;
}

/* Messages far larger than the ring stream through it intact. */
START_TEST(send_larger_than_ring)
{
	struct tside s;
	struct big b = { 3u << 20, 3 };

	setenv("WSD_SHM_RING_SIZE", "65536", 1);
	pair_start(&s, NULL, peer_big_recv, &b, NULL);
	oob_sync(&s);
	for (uint32_t m = 0; m < b.count; m++) {
		struct nd_sge g = t_sge(&s, 0, b.len);
		struct nd_result r;

		for (uint32_t i = 0; i < b.len; i++)
			s.buf[i] = (uint8_t)(i * 13 + m);
		ck_status(nd_ep_send(s.ep, NULL, &g, 1, 0), ND_SUCCESS);
		r = t_wait(s.ocq, 20000);
		ck_status(r.status, ND_SUCCESS);
		ck_assert_uint_eq(r.bytes, b.len);
	}
	oob_sync(&s);
	ck_assert_int_eq(pair_finish(&s), 0);
	tside_close(&s);
}
END_TEST

static int peer_late_receive(struct tside *s, void *arg)
{
	struct nd_sge g = t_sge(s, 0, 64);
	struct nd_result r;

	(void)arg;
	oob_sync(s);            /* the send is already on its way */
	PEER_CHECK(t_quiet(s->icq, 100));
	PEER_CHECK(nd_ep_receive(s->ep, NULL, &g, 1) == ND_SUCCESS);
	r = t_wait(s->icq, 5000);
	PEER_CHECK(r.status == ND_SUCCESS && r.bytes == 5 && !memcmp(s->buf, "early", 5));
	return 0;
}

/* A send that arrives before any receive waits for one; nothing is lost. */
START_TEST(send_waits_for_receive)
{
	struct tside s;
	struct nd_sge g;
	struct nd_result r;

	pair_start(&s, NULL, peer_late_receive, NULL, NULL);
	memcpy(s.buf, "early", 5);
	g = t_sge(&s, 0, 5);
	ck_status(nd_ep_send(s.ep, NULL, &g, 1, 0), ND_SUCCESS);
	oob_sync(&s);
	r = t_wait(s.ocq, 5000);
	ck_status(r.status, ND_SUCCESS);
	ck_assert_int_eq(pair_finish(&s), 0);
	tside_close(&s);
}
END_TEST

static int peer_small_receive(struct tside *s, void *arg)
{
	struct nd_sge g = t_sge(s, 0, 16);
	struct nd_result r;

	(void)arg;
	PEER_CHECK(nd_ep_receive(s->ep, (void *)1, &g, 1) == ND_SUCCESS);
	PEER_CHECK(nd_ep_receive(s->ep, (void *)2, &g, 1) == ND_SUCCESS);
	oob_sync(s);
	r = t_wait(s->icq, 5000);
	PEER_CHECK(r.status == ND_BUFFER_OVERFLOW && r.request_context == (void *)1);
	/* the connection is terminated: the other receive is flushed */
	r = t_wait(s->icq, 5000);
	PEER_CHECK(r.status == ND_CANCELED && r.request_context == (void *)2);
	PEER_CHECK(nd_ep_receive(s->ep, NULL, &g, 1) == ND_CONNECTION_INVALID);
	oob_sync(s);
	return 0;
}

/* seed 004: a receive too small for the send fails and ends the connection. */
START_TEST(receive_too_small)
{
	struct tside s;
	struct nd_sge g;
	struct nd_result r;

	pair_start(&s, NULL, peer_small_receive, NULL, NULL);
	ck_status(nd_ep_receive(s.ep, (void *)9, &g, 0), ND_SUCCESS);
	oob_sync(&s);
	g = t_sge(&s, 0, 100);
	/* posted together: on verbs the first can fail before a second post */
	ck_status(nd_ep_send(s.ep, (void *)3, &g, 1, ND_OP_FLAG_DEFER), ND_SUCCESS);
	ck_status(nd_ep_send(s.ep, (void *)4, &g, 1, 0), ND_SUCCESS);
	r = t_wait(s.ocq, 5000);
	ck_assert_ptr_eq(r.request_context, (void *)3);
	/*
	 * The send fails (seed 004).  On verbs the peer's NAK and its
	 * disconnect travel apart (the NAK on the QP, the disconnect through
	 * the connection manager): when the disconnect is handled first, the
	 * send is flushed before the NAK could fail it (seen once, in the
	 * sanitizer build under load).
	 */
	if (!(r.status == ND_CANCELED && !strcmp(t_transport(), "verbs")))
		ck_status(r.status, ND_REMOTE_ERROR);
	r = t_wait(s.ocq, 5000);
	ck_assert_ptr_eq(r.request_context, (void *)4);
	ck_status(r.status, ND_CANCELED);
	r = t_wait(s.icq, 5000);
	ck_status(r.status, ND_CANCELED);
	ck_status(nd_ep_send(s.ep, NULL, &g, 1, 0), ND_CONNECTION_INVALID);
	oob_sync(&s);
	ck_assert_int_eq(pair_finish(&s), 0);
	tside_close(&s);
}
END_TEST

/* Limits on the request itself: SGE count, queue depth, transfer length. */
START_TEST(request_limits)
{
	struct tside s;
	struct nd_ep_attr a = { .outbound_entries = 4, .inbound_entries = 2, .outbound_sge = 2,
				.inbound_sge = 1, .inbound_read_limit = 1 };
	struct nd_adapter_info info;
	struct nd_sge g[3];
	struct nd_sge huge[2];

	pair_start(&s, &a, t_peer_idle, NULL, NULL);
	nd_adapter_query(s.ad, &info);
	g[0] = g[1] = g[2] = t_sge(&s, 0, 8);
	ck_status(nd_ep_send(s.ep, NULL, g, 3, 0), ND_DATA_OVERRUN);
	ck_status(nd_ep_receive(s.ep, NULL, g, 2), ND_DATA_OVERRUN);
	ck_status(nd_ep_send(s.ep, NULL, g, 1, 0x8000), ND_INVALID_PARAMETER);
	ck_status(nd_ep_send(s.ep, NULL, NULL, 1, 0), ND_INVALID_PARAMETER);
	huge[0] = huge[1] = t_sge(&s, 0, (uint32_t)(info.max_transfer_length / 2 + 1));
	ck_status(nd_ep_send(s.ep, NULL, huge, 2, 0), ND_BUFFER_OVERFLOW);
	ck_status(nd_ep_receive(s.ep, NULL, g, 1), ND_SUCCESS);
	ck_status(nd_ep_receive(s.ep, NULL, g, 1), ND_SUCCESS);
	ck_status(nd_ep_receive(s.ep, NULL, g, 1), ND_NO_MORE_ENTRIES);
	/* the peer posts no receives: sends stay outstanding */
	for (int i = 0; i < 4; i++)
		ck_status(nd_ep_send(s.ep, NULL, g, 1, ND_OP_FLAG_DEFER), ND_SUCCESS);
	ck_status(nd_ep_send(s.ep, NULL, g, 1, 0), ND_NO_MORE_ENTRIES);
	oob_sync(&s);
	ck_assert_int_eq(pair_finish(&s), 0);
	tside_close(&s);
}
END_TEST

static int peer_disconnect(struct tside *s, void *arg)
{
	struct nd_sge g = t_sge(s, 0, 64);
	struct nd_result r;

	(void)arg;
	PEER_CHECK(nd_ep_receive(s->ep, (void *)1, &g, 1) == ND_SUCCESS);
	oob_sync(s);
	r = t_wait(s->icq, 5000);
	PEER_CHECK(r.status == ND_CANCELED && r.request_context == (void *)1);
	PEER_CHECK(nd_ep_send(s->ep, NULL, &g, 1, 0) == ND_CONNECTION_INVALID);
	oob_sync(s);
	return 0;
}

/* Disconnect flushes both sides' outstanding requests with ND_CANCELED. */
START_TEST(disconnect_flushes)
{
	struct tside s;
	struct nd_sge g = { 0 };
	struct nd_result r;

	pair_start(&s, NULL, peer_disconnect, NULL, NULL);
	g = t_sge(&s, 0, 64);
	ck_status(nd_ep_receive(s.ep, (void *)2, &g, 1), ND_SUCCESS);
	oob_sync(&s);
	ck_status(nd_ep_disconnect(s.ep), ND_SUCCESS);
	r = t_wait(s.icq, 5000);
	ck_status(r.status, ND_CANCELED);
	ck_assert_ptr_eq(r.request_context, (void *)2);
	ck_status(nd_ep_send(s.ep, NULL, &g, 1, 0), ND_CONNECTION_INVALID);
	oob_sync(&s);
	ck_assert_int_eq(pair_finish(&s), 0);
	tside_close(&s);
}
END_TEST

/* ---- flags ------------------------------------------------------------- */

static int peer_recv_n(struct tside *s, void *arg)
{
	int n = (int)(intptr_t)arg;

	for (int i = 0; i < n; i++) {
		struct nd_sge g = t_sge(s, (size_t)i * 64, 64);

		PEER_CHECK(nd_ep_receive(s->ep, (void *)(intptr_t)i, &g, 1) == ND_SUCCESS);
	}
	oob_sync(s);
	for (int i = 0; i < n; i++) {
		struct nd_result r = t_wait(s->icq, 5000);

		PEER_CHECK(r.status == ND_SUCCESS && r.request_context == (void *)(intptr_t)i);
		PEER_CHECK(s->buf[i * 64] == 'a' + i);
	}
	oob_sync(s);
	return 0;
}

/* SILENT_SUCCESS: no result for a send that works. */
START_TEST(silent_success)
{
	struct tside s;
	struct nd_result r;

	pair_start(&s, NULL, peer_recv_n, (void *)2, NULL);
	oob_sync(&s);
	s.buf[0] = 'a';
	s.buf[64] = 'b';
	{
		struct nd_sge g0 = t_sge(&s, 0, 8), g1 = t_sge(&s, 64, 8);

		ck_status(nd_ep_send(s.ep, (void *)1, &g0, 1, ND_OP_FLAG_SILENT_SUCCESS), ND_SUCCESS);
		ck_status(nd_ep_send(s.ep, (void *)2, &g1, 1, 0), ND_SUCCESS);
	}
	r = t_wait(s.ocq, 5000);
	ck_assert_ptr_eq(r.request_context, (void *)2);
	ck_assert(t_quiet(s.ocq, 50));
	oob_sync(&s);
	ck_assert_int_eq(pair_finish(&s), 0);
	tside_close(&s);
}
END_TEST

static int peer_defer(struct tside *s, void *arg)
{
	struct nd_result r;

	(void)arg;
	for (int i = 0; i < 2; i++) {
		struct nd_sge g = t_sge(s, (size_t)i * 64, 64);

		PEER_CHECK(nd_ep_receive(s->ep, (void *)(intptr_t)i, &g, 1) == ND_SUCCESS);
	}
	oob_sync(s);
	oob_sync(s);     /* a deferred send has been posted */
	PEER_CHECK(t_quiet(s->icq, 100));
	oob_sync(s);     /* now one without DEFER */
	for (int i = 0; i < 2; i++) {
		r = t_wait(s->icq, 5000);
		PEER_CHECK(r.status == ND_SUCCESS && r.request_context == (void *)(intptr_t)i);
		PEER_CHECK(s->buf[i * 64] == 'a' + i);
	}
	return 0;
}

/* DEFER: nothing moves until a request without it is posted. */
START_TEST(defer_batches)
{
	struct tside s;
	struct nd_sge g0, g1;

	pair_start(&s, NULL, peer_defer, NULL, NULL);
	oob_sync(&s);
	s.buf[0] = 'a';
	s.buf[64] = 'b';
	g0 = t_sge(&s, 0, 8);
	g1 = t_sge(&s, 64, 8);
	ck_status(nd_ep_send(s.ep, NULL, &g0, 1, ND_OP_FLAG_DEFER), ND_SUCCESS);
	ck_assert(t_quiet(s.ocq, 20));
	oob_sync(&s);
	oob_sync(&s);
	ck_status(nd_ep_send(s.ep, NULL, &g1, 1, 0), ND_SUCCESS);
	ck_status(t_wait(s.ocq, 5000).status, ND_SUCCESS);
	ck_status(t_wait(s.ocq, 5000).status, ND_SUCCESS);
	ck_assert_int_eq(pair_finish(&s), 0);
	tside_close(&s);
}
END_TEST

static int peer_solicit(struct tside *s, void *arg)
{
	struct nd_result r;

	(void)arg;
	for (int i = 0; i < 2; i++) {
		struct nd_sge g = t_sge(s, (size_t)i * 64, 64);

		PEER_CHECK(nd_ep_receive(s->ep, (void *)(intptr_t)i, &g, 1) == ND_SUCCESS);
	}
	PEER_CHECK(nd_cq_notify(s->icq, ND_CQ_NOTIFY_SOLICITED) == ND_SUCCESS);
	oob_sync(s);
	oob_sync(s);     /* a plain send went */
	PEER_CHECK(nd_cq_wait(s->icq, 150) == ND_TIMEOUT);
	oob_sync(s);     /* now the solicited one goes */
	PEER_CHECK(nd_cq_wait(s->icq, 5000) == ND_SUCCESS);
	r = t_wait(s->icq, 100);
	PEER_CHECK(r.status == ND_SUCCESS && !(r.flags & ND_RESULT_FLAG_SOLICITED));
	r = t_wait(s->icq, 100);
	PEER_CHECK(r.status == ND_SUCCESS && (r.flags & ND_RESULT_FLAG_SOLICITED));
	return 0;
}

/* SEND_AND_SOLICIT_EVENT wakes a solicited-only waiter; a plain send does not. */
START_TEST(solicited_notify)
{
	struct tside s;
	struct nd_sge g;

	pair_start(&s, NULL, peer_solicit, NULL, NULL);
	oob_sync(&s);
	g = t_sge(&s, 0, 8);
	ck_status(nd_ep_send(s.ep, NULL, &g, 1, 0), ND_SUCCESS);
	oob_sync(&s);
	oob_sync(&s);   /* the peer saw no wake-up */
	ck_status(nd_ep_send(s.ep, NULL, &g, 1, ND_OP_FLAG_SEND_AND_SOLICIT_EVENT), ND_SUCCESS);
	/* a send's result comes once the peer took it (its waits drive that) */
	ck_status(t_wait(s.ocq, 5000).status, ND_SUCCESS);
	ck_status(t_wait(s.ocq, 5000).status, ND_SUCCESS);
	ck_assert_int_eq(pair_finish(&s), 0);
	tside_close(&s);
}
END_TEST

/* A CQ smaller than the burst: results wait, none is lost. */
START_TEST(small_cq_backpressure)
{
	struct tside s;
	const int n = 40;

	t_cq_depth = 4;
	pair_start(&s, NULL, peer_recv_n, (void *)(intptr_t)n, NULL);
	oob_sync(&s);
	for (int i = 0; i < n; i++) {
		struct nd_sge g = t_sge(&s, (size_t)i * 64, 8);

		s.buf[i * 64] = (uint8_t)('a' + i);
		ck_status(nd_ep_send(s.ep, (void *)(intptr_t)i, &g, 1, 0), ND_SUCCESS);
	}
	for (int i = 0; i < n; i++) {
		struct nd_result r = t_wait(s.ocq, 5000);

		ck_status(r.status, ND_SUCCESS);
		ck_assert_ptr_eq(r.request_context, (void *)(intptr_t)i);
	}
	oob_sync(&s);
	ck_assert_int_eq(pair_finish(&s), 0);
	tside_close(&s);
}
END_TEST

/*
 * A waiter with nothing to wait for sleeps: over a 400 ms wait it may burn
 * its spin period, not the wall time.  (A loose bound: this checks sleeping,
 * not speed.)
 */
START_TEST(idle_wait_sleeps)
{
	struct tside s;
	struct timespec c0, c1;
	double cpu_ms;

	setenv("WSD_SPIN_US", "1000", 1);
	pair_start(&s, NULL, t_peer_idle, NULL, NULL);
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
	ck_status(nd_cq_wait(s.icq, 400), ND_TIMEOUT);
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
	cpu_ms = (c1.tv_sec - c0.tv_sec) * 1e3 + (c1.tv_nsec - c0.tv_nsec) / 1e6;
	ck_assert_msg(cpu_ms < 100, "idle wait used %.1f ms of CPU in 400 ms", cpu_ms);
	oob_sync(&s);
	ck_assert_int_eq(pair_finish(&s), 0);
	tside_close(&s);
}
END_TEST

static int peer_send_one(struct tside *s, void *arg)
{
	struct nd_sge g = t_sge(s, 0, 8);

	(void)arg;
	oob_sync(s);
	PEER_CHECK(nd_ep_send(s->ep, NULL, &g, 1, 0) == ND_SUCCESS);
	PEER_CHECK(t_wait(s->ocq, 5000).status == ND_SUCCESS);
	oob_sync(s);
	return 0;
}

/*
 * nd_cq_fd as an event loop uses it: arm, sleep on the fd, poll, re-arm.
 * Once the news is taken the fd must go quiet, or the loop spins.
 */
START_TEST(cq_fd_quiet_after_poll)
{
	struct tside s;
	struct nd_sge g;
	struct nd_result r;
	struct pollfd p;

	pair_start(&s, NULL, peer_send_one, NULL, NULL);
	g = t_sge(&s, 0, 64);
	ck_status(nd_ep_receive(s.ep, NULL, &g, 1), ND_SUCCESS);
	ck_status(nd_cq_notify(s.icq, ND_CQ_NOTIFY_ANY), ND_SUCCESS);
	p = (struct pollfd){ .fd = nd_cq_fd(s.icq), .events = POLLIN };
	ck_assert_int_eq(poll(&p, 1, 0), 0);
	oob_sync(&s);
	ck_assert_int_eq(poll(&p, 1, 5000), 1);
	ck_assert_int_eq(nd_cq_poll(s.icq, &r, 1), 1);
	ck_status(r.status, ND_SUCCESS);
	ck_status(nd_cq_notify(s.icq, ND_CQ_NOTIFY_ANY), ND_SUCCESS);
	ck_assert_int_eq(poll(&p, 1, 100), 0);
	oob_sync(&s);
	ck_assert_int_eq(pair_finish(&s), 0);
	tside_close(&s);
}
END_TEST

int main(int argc, char **argv)
{
	TCase *tc = t_case("endpoint", argc, argv);

	tcase_add_test(tc, adapter_open_query_close);
	tcase_add_test(tc, object_limits);
	tcase_add_test(tc, not_connected);
	tcase_add_test(tc, connect_refused_and_timeout);
	tcase_add_test(tc, connect_rejected);
	tcase_add_test(tc, transport_choice);
	tcase_add_test(tc, send_receive_sgl);
	tcase_add_test(tc, send_larger_than_ring);
	tcase_add_test(tc, send_waits_for_receive);
	tcase_add_test(tc, receive_too_small);
	tcase_add_test(tc, request_limits);
	tcase_add_test(tc, disconnect_flushes);
	tcase_add_test(tc, silent_success);
	tcase_add_test(tc, defer_batches);
	tcase_add_test(tc, solicited_notify);
	tcase_add_test(tc, small_cq_backpressure);
	tcase_add_test(tc, idle_wait_sleeps);
	tcase_add_test(tc, cq_fd_quiet_after_poll);
	return t_run("nd", tc);
}

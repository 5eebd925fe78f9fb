/* SPDX-License-Identifier: MIT */
/*
 * The Winsock Direct SPI over a connection's life: closing with
 * operations outstanding and right after a completion, going idle after
 * traffic, WSPAccept's condition function and its timeout, and
 * completion ports shared by threads and closed under waiters.  Runs on
 * the transport named by WSD_TEST_TRANSPORT (wsp_test.c: the calls and
 * RDMA).
 */
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tests/spi.h"

static int peer_silent(struct spi *p, void *arg)
{
	(void)arg;
	sync_fd(p->oob_in, p->oob_out);
	return 0;
}

/*
 * Closing with requests outstanding: each ends WSA_OPERATION_ABORTED, into
 * the port.  Also WSA_IO_INCOMPLETE while pending, and WSAENOBUFS when the
 * queue is full.
 */
START_TEST(close_aborts_outstanding)
{
	struct spi p;
	struct wsd_port *port;
	WSAOVERLAPPED rov = { 0 }, sov[300];
	char rb[64], sb[16] = "x";
	WSABUF r = { sizeof(rb), rb }, s = { 1, sb };
	uint32_t n, fl = 0, bytes;
	uintptr_t key;
	WSAOVERLAPPED *got;
	int err = 0, sent = 0, aborted = 0;

	spi_pair(&p, peer_silent, NULL);
	ck_assert_int_eq(wsd_port_create(&port), 0);
	ck_assert_int_eq(wsd_port_associate(port, p.s, 5), 0);
	ck_assert_int_eq(WSPRecv(p.s, &r, 1, &n, &fl, &rov, NULL, NULL, &err), SOCKET_ERROR);
	ck_assert_int_eq(err, WSA_IO_PENDING);
	ck_assert_int_eq(WSPGetOverlappedResult(p.s, &rov, &bytes, 0, NULL, &err), 0);
	ck_assert_int_eq(err, WSA_IO_INCOMPLETE);
	/* the peer takes nothing: sends pile up until the queue is full */
	memset(sov, 0, sizeof(sov));
	for (int i = 0; i < 300; i++) {
		if (WSPSend(p.s, &s, 1, &n, 0, &sov[i], NULL, NULL, &err) == SOCKET_ERROR &&
		    err != WSA_IO_PENDING) {
			ck_assert_int_eq(err, WSAENOBUFS);
			break;
		}
		sent++;
	}
	ck_assert_int_lt(sent, 300);
	ck_assert_int_eq(WSPCloseSocket(p.s, &err), 0);
	ck_assert_uint_eq(rov.Internal, WSA_OPERATION_ABORTED);
	for (int i = 0; i < sent + 1; i++) {
		ck_assert_int_eq(wsd_port_wait(port, &bytes, &key, &got, 5000), 1);
		ck_assert_uint_eq(key, 5);
		if (got->Internal == WSA_OPERATION_ABORTED)
			aborted++;
	}
	/* sends the peer's ring took count as done; the rest and the receive abort */
	ck_assert_int_ge(aborted, 2);
	ck_assert_int_eq(wsd_port_close(port), 0);
	sync_fd(p.oob_in, p.oob_out);
	ck_assert_int_eq(spi_finish(&p), 0);
}
END_TEST

static int peer_recv_many(struct spi *p, void *arg)
{
	int n = (int)(intptr_t)arg, err;
	char b[64];
	WSABUF w = { sizeof(b), b };
	uint32_t got, fl = 0;

	for (int i = 0; i < n; i++)
		PCHECK(WSPRecv(p->s, &w, 1, &got, &fl, NULL, NULL, NULL, &err) == 0);
	sync_fd(p->oob_in, p->oob_out);
	return 0;
}

/* After traffic the instance goes idle: its completion thread sleeps. */
START_TEST(idle_after_traffic)
{
	struct spi p;
	char b[8] = "x";
	WSABUF w = { 1, b };
	uint32_t n;
	int err;
	struct timespec c0, c1;
	double ms;

	spi_pair(&p, peer_recv_many, (void *)(intptr_t)1);
	usleep(50000);   /* the completion thread goes to sleep, doorbells armed */
	ck_assert_int_eq(WSPSend(p.s, &w, 1, &n, 0, NULL, NULL, NULL, &err), 0);
	usleep(20000);
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
	usleep(300000);
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
	ms = (c1.tv_sec - c0.tv_sec) * 1e3 + (c1.tv_nsec - c0.tv_nsec) / 1e6;
	ck_assert_msg(ms < 60, "idle for 300 ms, used %.1f ms of CPU", ms);
	sync_fd(p.oob_in, p.oob_out);
	ck_assert_int_eq(spi_finish(&p), 0);
}
END_TEST

static int peer_accept_many(struct spi *p, void *arg)
{
	int n = (int)(intptr_t)arg, err;
	char b[8];
	WSABUF w = { sizeof(b), b };
	uint32_t got, fl = 0;

	PCHECK(WSPCloseSocket(p->s, &err) == 0);
	for (int i = 0; i < n; i++) {
		SOCKET c = WSPAccept(p->l, NULL, NULL, NULL, 0, &err);

		PCHECK(c != INVALID_SOCKET);
		PCHECK(WSPRecv(c, &w, 1, &got, &fl, NULL, NULL, NULL, &err) == 0);
		PCHECK(WSPCloseSocket(c, &err) == 0);
	}
	sync_fd(p->oob_in, p->oob_out);
	return 0;
}

/* Echo 1-byte messages until a 0 comes. */
static int peer_echo(struct spi *p, void *arg)
{
	char b[1];
	WSABUF w = { 1, b };
	uint32_t n, fl = 0;
	int err;

	(void)arg;
	for (;;) {
		PCHECK(WSPRecv(p->s, &w, 1, &n, &fl, NULL, NULL, NULL, &err) == 0 && n == 1);
		PCHECK(WSPSend(p->s, &w, 1, &n, 0, NULL, NULL, NULL, &err) == 0);
		if (!b[0])
			break;
	}
	sync_fd(p->oob_in, p->oob_out);
	return 0;
}

static _Atomic int ping_stop;

/* Blocking round trips: each wait the completion thread ends, polling every CQ. */
static void *pinger(void *arg)
{
	struct spi *p = arg;
	char b[1];
	WSABUF w = { 1, b };
	uint32_t n, fl = 0;
	int err;

	do {
		b[0] = atomic_load(&ping_stop) ? 0 : 1;
		ck_assert_int_eq(WSPSend(p->s, &w, 1, &n, 0, NULL, NULL, NULL, &err), 0);
		ck_assert_int_eq(WSPRecv(p->s, &w, 1, &n, &fl, NULL, NULL, NULL, &err), 0);
	} while (b[0]);
	return NULL;
}

/*
 * Connects that fail while the completion thread polls every socket's CQ:
 * a failed connect must not destroy its CQ under the thread (it did,
 * without the lock, and the sanitizer build caught the thread in
 * nd_cq_poll on freed memory).  The sanitizer build is the one that sees
 * a use after free here; every build checks that each connect fails
 * cleanly and the pair still echoes.
 */
START_TEST(connect_fails_beside_traffic)
{
	struct spi p;
	pthread_t t;
	struct sockaddr_in none = t_addr(t_port());   /* nobody listens there */
	int64_t t0;
	int err, fails = 0;

	spi_pair(&p, peer_echo, NULL);
	atomic_store(&ping_stop, 0);
	ck_assert_int_eq(pthread_create(&t, NULL, pinger, &p), 0);
	t0 = t_now_ms();
	do {
		SOCKET c = WSPSocket(AF_INET, SOCK_STREAM, 0, &p.info, 0, 0, &err);

		ck_assert(c != INVALID_SOCKET);
		ck_assert_int_ne(WSPConnect(c, (struct sockaddr *)&none, sizeof(none), NULL, NULL,
					    NULL, NULL, &err), 0);
		ck_assert_int_eq(WSPCloseSocket(c, &err), 0);
		fails++;
	} while (t_now_ms() - t0 < 1000);
	atomic_store(&ping_stop, 1);
	ck_assert_int_eq(pthread_join(t, NULL), 0);
	ck_assert_int_gt(fails, 0);
	sync_fd(p.oob_in, p.oob_out);
	ck_assert_int_eq(spi_finish(&p), 0);
}
END_TEST

/*
 * Sockets closed the moment their completion came through a port: the
 * completion thread may still be finishing with them.
 */
START_TEST(close_right_after_completion)
{
	struct spi p;
	struct wsd_port *port;
	const int n = 60;
	struct sockaddr_in sa;
	socklen_t len = sizeof(sa);
	char b[8] = "x";
	WSABUF w = { 1, b };
	int err;

	spi_pair(&p, peer_accept_many, (void *)(intptr_t)n);
	ck_assert_int_eq(WSPCloseSocket(p.s, &err), 0);
	ck_assert_int_eq(wsd_port_create(&port), 0);
	sa = t_addr(0);
	(void)len;
	for (int i = 0; i < n; i++) {
		WSAOVERLAPPED ov = { 0 }, *got;
		uint32_t bytes;
		uintptr_t key;
		SOCKET c = WSPSocket(AF_INET, SOCK_STREAM, 0, &p.info, 0, 0, &err);
		int r;

		ck_assert(c != INVALID_SOCKET);
		sa.sin_port = spi_last_port;
		ck_assert_int_eq(WSPConnect(c, (struct sockaddr *)&sa, sizeof(sa), NULL, NULL, NULL,
					    NULL, &err), 0);
		ck_assert_int_eq(wsd_port_associate(port, c, (uintptr_t)i), 0);
		r = WSPSend(c, &w, 1, &bytes, 0, &ov, NULL, NULL, &err);
		ck_assert(r == 0 || err == WSA_IO_PENDING);
		ck_assert_int_eq(wsd_port_wait(port, &bytes, &key, &got, 5000), 1);
		ck_assert_ptr_eq(got, &ov);
		ck_assert_int_eq(WSPCloseSocket(c, &err), 0);
	}
	ck_assert_int_eq(wsd_port_close(port), 0);
	sync_fd(p.oob_in, p.oob_out);
	ck_assert_int_eq(spi_finish(&p), 0);
}
END_TEST

/* ---- the condition function of WSPAccept ---------------------------------- */

struct cond_log {
	int calls;
	char seen[64];
};

/* "reject..." is refused, "defer..." deferred once, anything else taken with an answer */
static int on_request(WSABUF *caller_id, WSABUF *caller_data, void *sqos, void *gqos,
		      WSABUF *callee_id, WSABUF *callee_data, unsigned *g, uintptr_t arg)
{
	struct cond_log *log = (struct cond_log *)arg;
	size_t n;

	(void)caller_id; (void)callee_id; (void)g;
	log->calls++;
	if (!caller_data || sqos || gqos)
		return 99;   /* WSAEINVAL for the test to see */
	n = caller_data->len < sizeof(log->seen) - 1 ? caller_data->len : sizeof(log->seen) - 1;
	memcpy(log->seen, caller_data->buf, n);
	log->seen[n] = 0;
	if (!strncmp(log->seen, "reject", 6))
		return CF_REJECT;
	if (!strncmp(log->seen, "defer", 5) && log->calls == 2)
		return CF_DEFER;
	callee_data->len = (uint32_t)snprintf(callee_data->buf, callee_data->len, "ok:%s", log->seen);
	return CF_ACCEPT;
}

static int peer_conditions(struct spi *p, void *arg)
{
	struct cond_log log = { 0 };
	SOCKET c;
	int err = 0;

	(void)arg;
	PCHECK(WSPCloseSocket(p->s, &err) == 0);
	/* a request refused: the function saw its data */
	c = WSPAccept(p->l, NULL, NULL, on_request, (uintptr_t)&log, &err);
	PCHECK(c == INVALID_SOCKET && err == WSAECONNREFUSED);
	PCHECK(log.calls == 1 && !strcmp(log.seen, "reject me"));
	/* deferred, then shown again to the next call, and taken */
	c = WSPAccept(p->l, NULL, NULL, on_request, (uintptr_t)&log, &err);
	PCHECK(c == INVALID_SOCKET && err == WSATRY_AGAIN);
	PCHECK(log.calls == 2 && !strcmp(log.seen, "defer me"));
	c = WSPAccept(p->l, NULL, NULL, on_request, (uintptr_t)&log, &err);
	PCHECK(c != INVALID_SOCKET);
	PCHECK(log.calls == 3 && !strcmp(log.seen, "defer me"));
	PCHECK(WSPCloseSocket(c, &err) == 0);
	sync_fd(p->oob_in, p->oob_out);
	return 0;
}

/* Connect with caller data; the WSA code, and the callee data in out. */
static int connect_with(struct spi *p, const char *data, char *out, size_t outlen)
{
	struct sockaddr_in sa = t_addr(0);
	WSABUF caller = { (uint32_t)strlen(data), (char *)data };
	WSABUF callee = { (uint32_t)outlen - 1, out };
	SOCKET c = WSPSocket(AF_INET, SOCK_STREAM, 0, &p->info, 0, 0, &(int){ 0 });
	int err = 0, r;

	ck_assert(c != INVALID_SOCKET);
	sa.sin_port = spi_last_port;
	memset(out, 0, outlen);
	r = WSPConnect(c, (struct sockaddr *)&sa, sizeof(sa), &caller, &callee, NULL, NULL, &err);
	if (!r)
		out[callee.len] = 0;
	ck_assert_int_eq(WSPCloseSocket(c, &(int){ 0 }), 0);
	return r ? err : 0;
}

START_TEST(accept_condition)
{
	struct spi p;
	char answer[64];

	spi_pair(&p, peer_conditions, NULL);
	ck_assert_int_eq(connect_with(&p, "reject me", answer, sizeof(answer)), WSAECONNREFUSED);
	ck_assert_int_eq(connect_with(&p, "defer me", answer, sizeof(answer)), 0);
	ck_assert_str_eq(answer, "ok:defer me");
	sync_fd(p.oob_in, p.oob_out);
	ck_assert_int_eq(spi_finish(&p), 0);
}
END_TEST

/* A connect from another thread, for accept_timeout. */
struct dialer {
	WSAPROTOCOL_INFO *info;
	struct sockaddr_in sa;
	SOCKET s;
	int err;
};

static void *dial(void *arg)
{
	struct dialer *d = arg;

	usleep(50 * 1000);
	d->s = WSPSocket(AF_INET, SOCK_STREAM, 0, d->info, 0, 0, &d->err);
	if (d->s != INVALID_SOCKET &&
	    WSPConnect(d->s, (struct sockaddr *)&d->sa, sizeof(d->sa), NULL, NULL, NULL, NULL,
		       &d->err) == 0)
		d->err = 0;
	return NULL;
}

/*
 * SO_WSP_ACCEPT_MS: a listener's WSPAccept gives up after it with
 * WSAETIMEDOUT, and still takes a request that comes within it.
 */
START_TEST(accept_timeout)
{
	struct spi p;
	struct dialer d = { .sa = t_addr(t_port()), .err = -1 };
	int err = 0, v = -1, bad = -1;
	socklen_t vl = sizeof(v);
	int64_t t0;
	SOCKET l, a;
	pthread_t th;
	long ms;

	spi_start(&p);
	p.s = INVALID_SOCKET;
	d.info = &p.info;
	l = WSPSocket(AF_INET, SOCK_STREAM, 0, &p.info, 0, 0, &err);
	ck_assert(l != INVALID_SOCKET);
	ck_assert_int_eq(WSPBind(l, (struct sockaddr *)&d.sa, sizeof(d.sa), &err), 0);
	ck_assert_int_eq(WSPListen(l, 4, &err), 0);
	ck_assert_int_eq(WSPGetSockOpt(l, SOL_WSP, SO_WSP_ACCEPT_MS, &v, &vl, &err), 0);
	ck_assert_int_eq(v, 0);
	ck_assert_int_eq(WSPSetSockOpt(l, SOL_WSP, SO_WSP_ACCEPT_MS, &bad, sizeof(bad), &err),
			 SOCKET_ERROR);
	ck_assert_int_eq(err, WSAEINVAL);
	v = 300;
	ck_assert_int_eq(WSPSetSockOpt(l, SOL_WSP, SO_WSP_ACCEPT_MS, &v, sizeof(v), &err), 0);
	v = 0;
	ck_assert_int_eq(WSPGetSockOpt(l, SOL_WSP, SO_WSP_ACCEPT_MS, &v, &vl, &err), 0);
	ck_assert_int_eq(v, 300);
	/* nobody connects: back after the limit (not before it, nor long after) */
	t0 = t_now_ms();
	ck_assert(WSPAccept(l, NULL, NULL, NULL, 0, &err) == INVALID_SOCKET);
	ms = (long)(t_now_ms() - t0);
	ck_assert_int_eq(err, WSAETIMEDOUT);
	ck_assert_msg(ms >= 290 && ms < 10000, "WSPAccept came back after %ld ms", ms);
	/* a request within the limit is taken */
	v = 10000;
	ck_assert_int_eq(WSPSetSockOpt(l, SOL_WSP, SO_WSP_ACCEPT_MS, &v, sizeof(v), &err), 0);
	ck_assert_int_eq(pthread_create(&th, NULL, dial, &d), 0);
	a = WSPAccept(l, NULL, NULL, NULL, 0, &err);
	ck_assert_msg(a != INVALID_SOCKET, "accept: %d", err);
	ck_assert_int_eq(pthread_join(th, NULL), 0);
	ck_assert_int_eq(d.err, 0);
	ck_assert_int_eq(WSPCloseSocket(a, &err), 0);
	ck_assert_int_eq(WSPCloseSocket(d.s, &err), 0);
	ck_assert_int_eq(WSPCloseSocket(l, &err), 0);
	spi_stop(&p);
}
END_TEST

/* ---- completion ports ----------------------------------------------------- */

struct waiter_arg {
	struct wsd_port *port;
	int got;
};

static void *waiter(void *arg)
{
	struct waiter_arg *a = arg;
	uint32_t bytes;
	uintptr_t key;
	WSAOVERLAPPED *ov;
	int r;

	while ((r = wsd_port_wait(a->port, &bytes, &key, &ov, 2000)) == 1)
		a->got++;
	return (void *)(intptr_t)r;
}

START_TEST(port_threads)
{
	struct wsd_port *port;
	struct waiter_arg a[3];
	pthread_t t[3];
	uint32_t bytes;
	uintptr_t key;
	WSAOVERLAPPED *ov, mine;
	int total = 0;

	ck_assert_int_eq(wsd_port_create(&port), 0);
	ck_assert_int_eq(wsd_port_wait(port, &bytes, &key, &ov, 50), 0);
	ck_assert_int_eq(wsd_port_post(port, 7, 9, &mine), 0);
	ck_assert_int_eq(wsd_port_wait(port, &bytes, &key, &ov, 1000), 1);
	ck_assert(bytes == 7 && key == 9 && ov == &mine);
	for (int i = 0; i < 3; i++) {
		a[i] = (struct waiter_arg){ port, 0 };
		pthread_create(&t[i], NULL, waiter, &a[i]);
	}
	for (int i = 0; i < 1000; i++)
		ck_assert_int_eq(wsd_port_post(port, (uint32_t)i, 1, &mine), 0);
	for (int i = 0; i < 3; i++) {
		pthread_join(t[i], NULL);
		total += a[i].got;
	}
	/* each completion to exactly one waiter */
	ck_assert_int_eq(total, 1000);
	ck_assert_int_eq(wsd_port_close(port), 0);
}
END_TEST

static void *blocked_waiter(void *arg)
{
	uint32_t bytes;
	uintptr_t key;
	WSAOVERLAPPED *ov;

	return (void *)(intptr_t)wsd_port_wait(arg, &bytes, &key, &ov, -1);
}

START_TEST(port_close_wakes_waiters)
{
	struct wsd_port *port;
	pthread_t t;
	void *ret;

	ck_assert_int_eq(wsd_port_create(&port), 0);
	pthread_create(&t, NULL, blocked_waiter, port);
	usleep(50000);
	ck_assert_int_eq(wsd_port_close(port), 0);
	pthread_join(t, &ret);
	ck_assert_int_eq((int)(intptr_t)ret, -ECANCELED);
}
END_TEST

int main(int argc, char **argv)
{
	TCase *tc = t_case("spi-life", argc, argv);

	tcase_add_test(tc, close_aborts_outstanding);
	tcase_add_test(tc, idle_after_traffic);
	tcase_add_test(tc, close_right_after_completion);
	tcase_add_test(tc, connect_fails_beside_traffic);
	tcase_add_test(tc, accept_condition);
	tcase_add_test(tc, accept_timeout);
	tcase_add_test(tc, port_threads);
	tcase_add_test(tc, port_close_wakes_waiters);
	return t_run("wsp_life", tc);
}

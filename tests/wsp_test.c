/* SPDX-License-Identifier: MIT */
/*
 * The Winsock Direct SPI: startup, sockets, overlapped I/O, memory
 * registration, and WSPRdmaRead/Write with every error code of seed 002.
 * Closing, WSPAccept's condition function and completion ports are in
 * wsp_life_test.c.  Runs on the transport named by WSD_TEST_TRANSPORT.
 */
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tests/spi.h"

/* ---- startup and sockets ------------------------------------------------ */

START_TEST(startup_and_tables)
{
	WSPDATA d;
	WSAPROTOCOL_INFO a, b;
	WSPPROC_TABLE t, small;
	int err = 0;
	SOCKET sa, sb;

	setenv("WSD_TRANSPORT", t_transport(), 1);
	t.cbSize = sizeof(t);
	ck_assert_int_eq(WSPStartup(0x0101, &d, &a, NULL, &t), WSAVERNOTSUPPORTED);
	ck_assert_int_eq(WSPStartup(0x0201, &d, &a, NULL, &t), WSAVERNOTSUPPORTED);  /* 1.2 */
	ck_assert_int_eq(WSPStartup(WSP_VERSION, NULL, &a, NULL, &t), WSAEFAULT);
	ck_assert_int_eq(WSPStartup(WSP_VERSION, &d, &a, NULL, &t), 0);
	ck_assert_uint_eq(t.cbSize, sizeof(t));
	ck_assert_ptr_eq(t.lpWSPRdmaRead, WSPRdmaRead);
	ck_assert_int_eq(d.wVersion, 0x0202);
	/* a caller that knows a shorter table gets only that much */
	memset(&small, 0xab, sizeof(small));
	small.cbSize = offsetof(WSPPROC_TABLE, lpWSPBind);
	ck_assert_int_eq(WSPStartup(WSP_VERSION, &d, &b, NULL, &small), 0);
	ck_assert_uint_eq(small.cbSize, offsetof(WSPPROC_TABLE, lpWSPBind));
	ck_assert_ptr_eq(small.lpWSPSocket, WSPSocket);
	ck_assert(*(uint8_t *)&small.lpWSPBind == 0xab);
	/* two independent instances */
	ck_assert_ptr_ne(a.provider, b.provider);
	sa = WSPSocket(AF_INET, SOCK_STREAM, 0, &a, 0, 0, &err);
	sb = WSPSocket(AF_INET, SOCK_STREAM, 0, &b, 0, 0, &err);
	ck_assert(sa != INVALID_SOCKET && sb != INVALID_SOCKET && sa != sb);
	ck_assert_int_eq(WSPCleanup(b.provider, &err), 0);
	/* b's socket: network down; a's: fine */
	ck_assert_int_eq(WSPListen(sb, 1, &err), SOCKET_ERROR);
	ck_assert_int_eq(err, WSAENETDOWN);
	ck_assert_int_eq(WSPListen(sa, 1, &err), SOCKET_ERROR);
	ck_assert_int_eq(err, WSAEINVAL);    /* not bound: a is alive */
	ck_assert_int_eq(WSPCloseSocket(sb, &err), 0);
	ck_assert_int_eq(WSPCloseSocket(sa, &err), 0);
	ck_assert_int_eq(WSPCleanup(a.provider, &err), 0);
}
END_TEST

START_TEST(socket_errors)
{
	struct spi p;
	int err = 0;
	SOCKET s;
	struct sockaddr_in sa = t_addr(t_port());
	uint32_t n;
	WSABUF b = { 4, (char *)"abcd" };

	spi_start(&p);
	ck_assert(WSPSocket(AF_UNIX, SOCK_STREAM, 0, &p.info, 0, 0, &err) == INVALID_SOCKET);
	ck_assert_int_eq(err, WSAEAFNOSUPPORT);
	ck_assert(WSPSocket(AF_INET, SOCK_DGRAM, 0, &p.info, 0, 0, &err) == INVALID_SOCKET);
	ck_assert_int_eq(err, WSAEINVAL);
	ck_assert(WSPSocket(AF_INET, SOCK_STREAM, 99, &p.info, 0, 0, &err) == INVALID_SOCKET);
	ck_assert_int_eq(err, WSAEPROTONOSUPPORT);
	s = WSPSocket(AF_INET, SOCK_STREAM, 0, &p.info, 0, 0, &err);
	ck_assert(s != INVALID_SOCKET);
	ck_assert_int_eq(WSPListen(s, 1, &err), SOCKET_ERROR);
	ck_assert_int_eq(err, WSAEINVAL);
	ck_assert(WSPAccept(s, NULL, NULL, NULL, 0, &err) == INVALID_SOCKET);
	ck_assert_int_eq(err, WSAEINVAL);
	ck_assert_int_eq(WSPSend(s, &b, 1, &n, 0, NULL, NULL, NULL, &err), SOCKET_ERROR);
	ck_assert_int_eq(err, WSAENOTCONN);
	ck_assert_int_eq(WSPConnect(s, (struct sockaddr *)&sa, sizeof(sa), NULL, NULL, NULL, NULL,
				    &err), SOCKET_ERROR);
	ck_assert_int_eq(err, WSAECONNREFUSED);
	ck_assert_int_eq(WSPCloseSocket(s, &err), 0);
	/* the handle is dead now, and so is any made-up one */
	ck_assert_int_eq(WSPCloseSocket(s, &err), SOCKET_ERROR);
	ck_assert_int_eq(err, WSAENOTSOCK);
	ck_assert_int_eq(WSPSend((SOCKET)12345678, &b, 1, &n, 0, NULL, NULL, NULL, &err),
			 SOCKET_ERROR);
	ck_assert_int_eq(err, WSAENOTSOCK);
	p.s = INVALID_SOCKET;
	spi_stop(&p);
}
END_TEST

static int peer_echo(struct spi *p, void *arg)
{
	char msg[64];
	WSABUF b = { sizeof(msg), msg };
	uint32_t n, fl = 0;
	int err;

	(void)arg;
	PCHECK(WSPRecv(p->s, &b, 1, &n, &fl, NULL, NULL, NULL, &err) == 0 && n == 5);
	PCHECK(!memcmp(msg, "hello", 5));
	b.len = n;
	PCHECK(WSPSend(p->s, &b, 1, &n, 0, NULL, NULL, NULL, &err) == 0 && n == 5);
	sync_fd(p->oob_in, p->oob_out);
	return 0;
}

START_TEST(send_recv_and_options)
{
	struct spi p;
	char msg[64] = "hello";
	WSABUF b = { 5, msg };
	uint32_t n, fl = 0;
	int err, v;
	socklen_t len = sizeof(v);
	char name[16];

	spi_pair(&p, peer_echo, NULL);
	ck_assert_int_eq(WSPSend(p.s, &b, 1, &n, 0, NULL, NULL, NULL, &err), 0);
	ck_assert_uint_eq(n, 5);
	memset(msg, 0, sizeof(msg));
	b.len = sizeof(msg);
	ck_assert_int_eq(WSPRecv(p.s, &b, 1, &n, &fl, NULL, NULL, NULL, &err), 0);
	ck_assert_uint_eq(n, 5);
	ck_assert(!memcmp(msg, "hello", 5));
	/* the provider's sizes */
	ck_assert_int_eq(WSPGetSockOpt(p.s, SOL_WSP, SO_RDMA_THRESHOLD_SIZE, &v, &len, &err), 0);
	ck_assert_int_eq(v, 65536);
	v = 4096;
	ck_assert_int_eq(WSPSetSockOpt(p.s, SOL_WSP, SO_RDMA_THRESHOLD_SIZE, &v, sizeof(v), &err),
			 0);
	ck_assert_int_eq(WSPGetSockOpt(p.s, SOL_WSP, SO_RDMA_THRESHOLD_SIZE, &v, &len, &err), 0);
	ck_assert_int_eq(v, 4096);
	ck_assert_int_eq(WSPGetSockOpt(p.s, SOL_WSP, SO_MAX_RDMA_SIZE, &v, &len, &err), 0);
	ck_assert_int_ge(v, 1 << 20);
	ck_assert_int_eq(WSPGetSockOpt(p.s, SOL_WSP, SO_MAX_MSG_SIZE, &v, &len, &err), 0);
	ck_assert_int_ge(v, 1 << 20);
	ck_assert_int_eq(WSPSetSockOpt(p.s, SOL_WSP, SO_MAX_RDMA_SIZE, &v, sizeof(v), &err),
			 SOCKET_ERROR);
	ck_assert_int_eq(err, WSAENOPROTOOPT);
	len = 2;
	ck_assert_int_eq(WSPGetSockOpt(p.s, SOL_WSP, SO_MAX_MSG_SIZE, &v, &len, &err), SOCKET_ERROR);
	ck_assert_int_eq(err, WSAEFAULT);
	ck_assert_int_eq(WSPIoctl(p.s, SIO_WSP_TRANSPORT, NULL, 0, name, sizeof(name), &n, NULL,
				  NULL, NULL, &err), 0);
	ck_assert_str_eq(name, t_transport());
	/* the peer's process as the kernel named it: shm knows it, verbs cannot */
	len = sizeof(v);
	if (!strcmp(t_transport(), "shm")) {
		ck_assert_int_eq(WSPGetSockOpt(p.s, SOL_WSP, SO_WSP_PEER_PID, &v, &len, &err), 0);
		ck_assert_int_eq(v, p.peer);
	} else {
		ck_assert_int_eq(WSPGetSockOpt(p.s, SOL_WSP, SO_WSP_PEER_PID, &v, &len, &err),
				 SOCKET_ERROR);
		ck_assert_int_eq(err, WSAENOPROTOOPT);
	}
	sync_fd(p.oob_in, p.oob_out);
	ck_assert_int_eq(spi_finish(&p), 0);
}
END_TEST

/* ---- RDMA ---------------------------------------------------------------- */

/* A peer that offers BUF bytes of pattern for reading (and writing), then follows orders. */
enum { CMD_END = 1, CMD_DEREG, CMD_CLOSE, CMD_CHECK_WRITE, CMD_REOFFER };

static int peer_offer(struct spi *p, void *arg)
{
	uint8_t desc[WSP_RDMA_DESCRIPTOR_SIZE];
	uint32_t dl = sizeof(desc);
	int err, cmd;

	(void)arg;
	for (uint32_t i = 0; i < BUF; i++)
		p->buf[i] = (uint8_t)(i * 13 + 5);
	PCHECK(WSPRegisterRdmaMemory(p->s, p->buf, BUF, MEM_READWRITE, desc, &dl, &err) == 0);
	PCHECK(dl == WSP_RDMA_DESCRIPTOR_SIZE);
	xsend(p->oob_out, desc, sizeof(desc));
	for (;;) {
		xrecv(p->oob_in, &cmd, sizeof(cmd));
		if (cmd == CMD_END)
			return 0;
		if (cmd == CMD_DEREG)
			PCHECK(WSPDeregisterRdmaMemory(p->s, desc, sizeof(desc), &err) == 0);
		if (cmd == CMD_CLOSE)
			PCHECK(WSPCloseSocket(p->s, &err) == 0);
		if (cmd == CMD_CHECK_WRITE)
			for (uint32_t i = 0; i < 4096; i++)
				PCHECK(p->buf[1000 + i] == (uint8_t)~i);
		if (cmd == CMD_REOFFER) {
			/* the same buffer withdrawn and offered again: a new descriptor */
			PCHECK(WSPDeregisterRdmaMemory(p->s, desc, sizeof(desc), &err) == 0);
			dl = sizeof(desc);
			PCHECK(WSPRegisterRdmaMemory(p->s, p->buf, BUF, MEM_READWRITE, desc, &dl,
						     &err) == 0);
			xsend(p->oob_out, desc, sizeof(desc));
		}
		sync_fd(p->oob_in, p->oob_out);
	}
}

static void order(struct spi *p, int cmd)
{
	xsend(p->oob_out, &cmd, sizeof(cmd));
	if (cmd != CMD_END)
		sync_fd(p->oob_in, p->oob_out);
}

static int pattern_ok(const uint8_t *b, uint32_t off, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		if (b[i] != (uint8_t)((off + i) * 13 + 5))
			return 0;
	return 1;
}

/* One read through desc into b, waited for: 0, or SOCKET_ERROR with *err. */
static int read_waited(SOCKET h, WSABUFEX *b, const uint8_t *desc, int *err)
{
	WSAOVERLAPPED ov = { 0 };
	uint32_t n;
	int r = WSPRdmaRead(h, b, 1, (void *)desc, WSP_RDMA_DESCRIPTOR_SIZE, 0, &n, 0, &ov, NULL,
			    NULL, err);

	if (r == SOCKET_ERROR && *err == WSA_IO_PENDING)
		r = WSPGetOverlappedResult(h, &ov, &n, 1, NULL, err) ? 0 : SOCKET_ERROR;
	return r;
}

/* seed 002: overlapped read, stack buffer array, result by polling and by port */
START_TEST(rdma_read_overlapped)
{
	struct spi p;
	uint8_t desc[WSP_RDMA_DESCRIPTOR_SIZE];
	struct wsd_port *port;
	WSAOVERLAPPED ov = { 0 }, quiet = { 0 }, *got;
	uint64_t h;
	uint32_t n = 0, bytes = 0;
	uintptr_t key;
	int err = 0, r;

	spi_pair(&p, peer_offer, NULL);
	xrecv(p.oob_in, desc, sizeof(desc));
	ck_assert_int_eq(wsd_port_create(&port), 0);
	ck_assert_int_eq(wsd_port_associate(port, p.s, 0x77), 0);
	h = WSPRegisterMemory(p.s, p.buf, BUF, MEM_WRITE, &err);
	ck_assert(h != 0);
	{
		/* the array lives on the stack and is scribbled over at once */
		WSABUFEX b[2] = { { 100, (char *)p.buf, h }, { 5000, (char *)p.buf + 8192, h } };

		r = WSPRdmaRead(p.s, b, 2, desc, sizeof(desc), 1000, &n, 0, &ov, NULL, NULL, &err);
		memset(b, 0xff, sizeof(b));
	}
	ck_assert(r == 0 || (r == SOCKET_ERROR && err == WSA_IO_PENDING));
	ck_assert_int_eq(WSPGetOverlappedResult(p.s, &ov, &bytes, 1, NULL, &err), 1);
	ck_assert_uint_eq(bytes, 5100);
	if (r == 0)
		ck_assert_uint_eq(n, 5100);
	ck_assert(pattern_ok(p.buf, 1000, 100) && pattern_ok(p.buf + 8192, 1100, 5000));
	/* the port hears of it, with the key */
	ck_assert_int_eq(wsd_port_wait(port, &bytes, &key, &got, 5000), 1);
	ck_assert_ptr_eq(got, &ov);
	ck_assert_uint_eq(key, 0x77);
	ck_assert_uint_eq(bytes, 5100);
	/* hEvent's low bit: no notification; the caller polls */
	quiet.hEvent = (void *)(uintptr_t)1;
	{
		WSABUFEX b = { 4096, (char *)p.buf, h };

		r = WSPRdmaRead(p.s, &b, 1, desc, sizeof(desc), 0, &n, 0, &quiet, NULL, NULL, &err);
	}
	ck_assert(r == 0 || err == WSA_IO_PENDING);
	while (!WSPGetOverlappedResult(p.s, &quiet, &bytes, 0, NULL, &err))
		ck_assert_int_eq(err, WSA_IO_INCOMPLETE);
	ck_assert_uint_eq(bytes, 4096);
	ck_assert(pattern_ok(p.buf, 0, 4096));
	ck_assert_int_eq(wsd_port_wait(port, &bytes, &key, &got, 100), 0);
	ck_assert_int_eq(wsd_port_close(port), -EBUSY);
	order(&p, CMD_END);
	ck_assert_int_eq(WSPCloseSocket(p.s, &err), 0);
	ck_assert_int_eq(wsd_port_close(port), 0);
	ck_assert_int_eq(spi_finish(&p), 0);
}
END_TEST

/* Several reads outstanding at once, each with its own overlapped structure. */
START_TEST(rdma_many_outstanding)
{
	struct spi p;
	uint8_t desc[WSP_RDMA_DESCRIPTOR_SIZE];
	WSAOVERLAPPED ov[8];
	uint64_t h;
	int err = 0;

	spi_pair(&p, peer_offer, NULL);
	xrecv(p.oob_in, desc, sizeof(desc));
	h = WSPRegisterMemory(p.s, p.buf, BUF, MEM_WRITE, &err);
	memset(ov, 0, sizeof(ov));
	for (int i = 0; i < 8; i++) {
		WSABUFEX b = { 1024u * (i + 1), (char *)p.buf + i * 65536, h };
		uint32_t n;
		int r = WSPRdmaRead(p.s, &b, 1, desc, sizeof(desc), (uint32_t)i * 3000, &n, 0,
				    &ov[i], NULL, NULL, &err);

		ck_assert(r == 0 || err == WSA_IO_PENDING);
	}
	for (int i = 7; i >= 0; i--) {
		uint32_t bytes;

		ck_assert_int_eq(WSPGetOverlappedResult(p.s, &ov[i], &bytes, 1, NULL, &err), 1);
		ck_assert_uint_eq(bytes, 1024u * (i + 1));
		ck_assert(pattern_ok(p.buf + i * 65536, (uint32_t)i * 3000, 1024u * (i + 1)));
	}
	order(&p, CMD_END);
	ck_assert_int_eq(spi_finish(&p), 0);
}
END_TEST

START_TEST(rdma_write)
{
	struct spi p;
	uint8_t desc[WSP_RDMA_DESCRIPTOR_SIZE];
	WSAOVERLAPPED ov = { 0 };
	uint64_t h;
	uint32_t n, bytes;
	int err = 0, r;

	spi_pair(&p, peer_offer, NULL);
	xrecv(p.oob_in, desc, sizeof(desc));
	for (uint32_t i = 0; i < 4096; i++)
		p.buf[i] = (uint8_t)~i;
	h = WSPRegisterMemory(p.s, p.buf, 4096, MEM_READ, &err);
	{
		WSABUFEX b = { 4096, (char *)p.buf, h };

		r = WSPRdmaWrite(p.s, &b, 1, desc, sizeof(desc), 1000, &n, 0, &ov, NULL, NULL, &err);
	}
	ck_assert(r == 0 || err == WSA_IO_PENDING);
	ck_assert_int_eq(WSPGetOverlappedResult(p.s, &ov, &bytes, 1, NULL, &err), 1);
	ck_assert_uint_eq(bytes, 4096);
	order(&p, CMD_CHECK_WRITE);
	order(&p, CMD_END);
	ck_assert_int_eq(spi_finish(&p), 0);
}
END_TEST

/* Every code of seed 002 that a call returns at once. */
START_TEST(rdma_call_errors)
{
	struct spi p;
	uint8_t desc[WSP_RDMA_DESCRIPTOR_SIZE], bad[WSP_RDMA_DESCRIPTOR_SIZE];
	WSAOVERLAPPED ov = { 0 };
	WSABUFEX b, many[WSP_MAX_BUFFERS + 1];
	uint64_t h, ro;
	uint32_t n;
	int err = 0;
	SOCKET lone;

	spi_pair(&p, peer_offer, NULL);
	xrecv(p.oob_in, desc, sizeof(desc));
	h = WSPRegisterMemory(p.s, p.buf, 65536, MEM_WRITE, &err);
	ro = WSPRegisterMemory(p.s, p.buf + 65536, 65536, MEM_READ, &err);
	b = (WSABUFEX){ 4096, (char *)p.buf, h };
#define RD(bufs, nb, d, dl, off, fl, o, cr) \
	WSPRdmaRead(p.s, bufs, nb, d, dl, off, &n, fl, o, cr, NULL, &err)
	/* WSAEINVAL: flags, descriptor length, no overlapped, a completion routine */
	ck_assert_int_eq(RD(&b, 1, desc, sizeof(desc), 0, 1, &ov, NULL), SOCKET_ERROR);
	ck_assert_int_eq(err, WSAEINVAL);
	ck_assert_int_eq(RD(&b, 1, desc, 16, 0, 0, &ov, NULL), SOCKET_ERROR);
	ck_assert_int_eq(err, WSAEINVAL);
	ck_assert_int_eq(RD(&b, 1, desc, sizeof(desc), 0, 0, NULL, NULL), SOCKET_ERROR);
	ck_assert_int_eq(err, WSAEINVAL);
	ck_assert_int_eq(RD(&b, 1, desc, sizeof(desc), 0, 0, &ov,
			    (LPWSAOVERLAPPED_COMPLETION_ROUTINE)abort), SOCKET_ERROR);
	ck_assert_int_eq(err, WSAEINVAL);
	/* WSAEFAULT: a bad handle, a buffer past its registration, one without write,
	 * the remote range past the peer's buffer, a descriptor that is not one */
	b.handle = 0xdead;
	ck_assert_int_eq(RD(&b, 1, desc, sizeof(desc), 0, 0, &ov, NULL), SOCKET_ERROR);
	ck_assert_int_eq(err, WSAEFAULT);
	b = (WSABUFEX){ 8192, (char *)p.buf + 65536 - 4096, h };
	ck_assert_int_eq(RD(&b, 1, desc, sizeof(desc), 0, 0, &ov, NULL), SOCKET_ERROR);
	ck_assert_int_eq(err, WSAEFAULT);
	b = (WSABUFEX){ 4096, (char *)p.buf + 65536, ro };
	ck_assert_int_eq(RD(&b, 1, desc, sizeof(desc), 0, 0, &ov, NULL), SOCKET_ERROR);
	ck_assert_int_eq(err, WSAEFAULT);
	b = (WSABUFEX){ 4096, (char *)p.buf, h };
	ck_assert_int_eq(RD(&b, 1, desc, sizeof(desc), BUF - 100, 0, &ov, NULL), SOCKET_ERROR);
	ck_assert_int_eq(err, WSAEFAULT);
	memset(bad, 0x5a, sizeof(bad));
	ck_assert_int_eq(RD(&b, 1, bad, sizeof(bad), 0, 0, &ov, NULL), SOCKET_ERROR);
	ck_assert_int_eq(err, WSAEFAULT);
	/* WSAENOBUFS: more buffers than one request can carry */
	for (unsigned i = 0; i <= WSP_MAX_BUFFERS; i++)
		many[i] = (WSABUFEX){ 16, (char *)p.buf + i * 16, h };
	ck_assert_int_eq(RD(many, WSP_MAX_BUFFERS + 1, desc, sizeof(desc), 0, 0, &ov, NULL),
			 SOCKET_ERROR);
	ck_assert_int_eq(err, WSAENOBUFS);
	/* WSAENOTSOCK, WSAENOTCONN */
	ck_assert_int_eq(WSPRdmaRead((SOCKET)999999, &b, 1, desc, sizeof(desc), 0, &n, 0, &ov,
				     NULL, NULL, &err), SOCKET_ERROR);
	ck_assert_int_eq(err, WSAENOTSOCK);
	lone = WSPSocket(AF_INET, SOCK_STREAM, 0, &p.info, 0, 0, &err);
	ck_assert_int_eq(WSPRdmaRead(lone, &b, 1, desc, sizeof(desc), 0, &n, 0, &ov, NULL, NULL,
				     &err), SOCKET_ERROR);
	ck_assert_int_eq(err, WSAENOTCONN);
	ck_assert_int_eq(WSPCloseSocket(lone, &err), 0);
	/* nothing above hurt the connection */
	ck_assert(RD(&b, 1, desc, sizeof(desc), 0, 0, &ov, NULL) == 0 || err == WSA_IO_PENDING);
	ck_assert_int_eq(WSPGetOverlappedResult(p.s, &ov, &n, 1, NULL, &err), 1);
	/* WSAENETDOWN: the instance is cleaned up under the socket */
	ck_assert_int_eq(WSPCleanup(p.info.provider, &err), 0);
	p.cleaned = 1;
	ck_assert_int_eq(RD(&b, 1, desc, sizeof(desc), 0, 0, &ov, NULL), SOCKET_ERROR);
	ck_assert_int_eq(err, WSAENETDOWN);
#undef RD
	order(&p, CMD_END);
	ck_assert_int_eq(spi_finish(&p), 0);
}
END_TEST

/* A read through a buffer the peer withdrew: WSAEFAULT, then WSAECONNABORTED. */
START_TEST(rdma_after_deregister)
{
	struct spi p;
	uint8_t desc[WSP_RDMA_DESCRIPTOR_SIZE];
	WSAOVERLAPPED ov = { 0 };
	uint64_t h;
	uint32_t n;
	int err = 0;

	spi_pair(&p, peer_offer, NULL);
	xrecv(p.oob_in, desc, sizeof(desc));
	h = WSPRegisterMemory(p.s, p.buf, 4096, MEM_WRITE, &err);
	order(&p, CMD_DEREG);
	{
		WSABUFEX b = { 4096, (char *)p.buf, h };
		int r = WSPRdmaRead(p.s, &b, 1, desc, sizeof(desc), 0, &n, 0, &ov, NULL, NULL,
				    &err);

		if (r == SOCKET_ERROR && err == WSA_IO_PENDING) {
			ck_assert_int_eq(WSPGetOverlappedResult(p.s, &ov, &n, 1, NULL, &err), 0);
		} else {
			ck_assert_int_eq(r, SOCKET_ERROR);
		}
		ck_assert_int_eq(err, WSAEFAULT);
		r = WSPRdmaRead(p.s, &b, 1, desc, sizeof(desc), 0, &n, 0, &ov, NULL, NULL, &err);
		ck_assert_int_eq(r, SOCKET_ERROR);
		ck_assert_int_eq(err, WSAECONNABORTED);
	}
	order(&p, CMD_END);
	ck_assert_int_eq(spi_finish(&p), 0);
}
END_TEST

/*
 * The peer offers the same buffer again, many times (its region stays
 * cached): each new descriptor reads the buffer, and the one withdrawn
 * before it is dead (WSAEFAULT, then the connection is over).
 */
START_TEST(rdma_reoffer_same_buffer)
{
	struct spi p;
	uint8_t desc[WSP_RDMA_DESCRIPTOR_SIZE], old[WSP_RDMA_DESCRIPTOR_SIZE];
	uint8_t *dst = malloc(BUF);
	uint64_t h;
	int err = 0;
	WSABUFEX b;

	ck_assert_ptr_nonnull(dst);
	spi_pair(&p, peer_offer, NULL);
	xrecv(p.oob_in, desc, sizeof(desc));
	h = WSPRegisterMemory(p.s, dst, BUF, MEM_WRITE, &err);
	ck_assert(h != 0);
	b = (WSABUFEX){ BUF, (char *)dst, h };
	for (int round = 0; round < 40; round++) {
		memset(dst, 0, BUF);
		ck_assert_msg(read_waited(p.s, &b, desc, &err) == 0,
			      "round %d: read through the new descriptor: %d", round, err);
		ck_assert(pattern_ok(dst, 0, BUF));
		memcpy(old, desc, sizeof(desc));
		xsend(p.oob_out, &(int){ CMD_REOFFER }, sizeof(int));
		xrecv(p.oob_in, desc, sizeof(desc));
		sync_fd(p.oob_in, p.oob_out);
		ck_assert(memcmp(old, desc, sizeof(desc)) != 0);
	}
	ck_assert_int_eq(read_waited(p.s, &b, old, &err), SOCKET_ERROR);
	ck_assert_msg(err == WSAEFAULT, "read through a withdrawn descriptor: %d", err);
	order(&p, CMD_END);
	ck_assert_int_eq(spi_finish(&p), 0);
	free(dst);
}
END_TEST

/* The peer closes: WSAECONNRESET. */
START_TEST(rdma_peer_closed)
{
	struct spi p;
	uint8_t desc[WSP_RDMA_DESCRIPTOR_SIZE];
	uint64_t h;
	int err = 0;
	WSABUFEX b;

	spi_pair(&p, peer_offer, NULL);
	xrecv(p.oob_in, desc, sizeof(desc));
	h = WSPRegisterMemory(p.s, p.buf, 4096, MEM_WRITE, &err);
	order(&p, CMD_CLOSE);
	b = (WSABUFEX){ 4096, (char *)p.buf, h };
	ck_assert_int_eq(read_waited(p.s, &b, desc, &err), SOCKET_ERROR);
	ck_assert_msg(err == WSAECONNRESET, "read after the peer closed: %d", err);
	order(&p, CMD_END);
	ck_assert_int_eq(spi_finish(&p), 0);
}
END_TEST

/* ---- memory ---------------------------------------------------------------- */

START_TEST(registration_cache)
{
	struct spi p;
	uint8_t desc[WSP_RDMA_DESCRIPTOR_SIZE];
	WSAOVERLAPPED ov = { 0 };
	uint64_t a, b, c;
	uint32_t n;
	int err = 0;
	void *gone;

	spi_pair(&p, peer_offer, NULL);
	xrecv(p.oob_in, desc, sizeof(desc));
	a = WSPRegisterMemory(p.s, p.buf, 4096, MEM_WRITE, &err);
	b = WSPRegisterMemory(p.s, p.buf + 100, 200, MEM_WRITE, &err);
	ck_assert(a != 0 && a == b);   /* the same registration serves both */
	ck_assert_int_eq(WSPDeregisterMemory(p.s, a, &err), 0);
	ck_assert_int_eq(WSPDeregisterMemory(p.s, b, &err), 0);
	ck_assert_int_eq(WSPDeregisterMemory(p.s, a, &err), SOCKET_ERROR);
	ck_assert_int_eq(err, WSAEINVAL);
	ck_assert(WSPRegisterMemory(p.s, p.buf, 4096, 0, &err) == 0);
	ck_assert_int_eq(err, WSAEINVAL);
	{
		/*
		 * neighbours in use are not taken into a new registration (each
		 * would be pinned twice): one across two of them is a third
		 */
		uint8_t *pg = (uint8_t *)(((uintptr_t)p.buf + 65536) & ~(uintptr_t)4095);
		uint64_t x, y, z;

		x = WSPRegisterMemory(p.s, pg, 4096, MEM_READ, &err);
		y = WSPRegisterMemory(p.s, pg + 4096, 4096, MEM_READ, &err);
		ck_assert(x != 0 && y != 0 && y != x);
		z = WSPRegisterMemory(p.s, pg + 1000, 6000, MEM_READ, &err);
		ck_assert(z != 0 && z != x && z != y);
		ck_assert(WSPRegisterMemory(p.s, pg + 8192, 4096, MEM_READ, &err) != z);
		ck_assert_int_eq(WSPDeregisterMemory(p.s, x, &err), 0);
		ck_assert_int_eq(WSPDeregisterMemory(p.s, y, &err), 0);
		ck_assert_int_eq(WSPDeregisterMemory(p.s, z, &err), 0);
	}
	gone = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	munmap(gone, 8192);
	ck_assert(WSPRegisterMemory(p.s, gone, 8192, MEM_WRITE, &err) == 0);
	ck_assert_int_eq(err, WSAEFAULT);
	/* the memory goes away: the provider drops what it cached for it */
	c = WSPRegisterMemory(p.s, p.buf, 4096, MEM_WRITE, &err);
	ck_assert_int_eq(WSPMemoryRegistrationCacheCallback(p.buf, 4096, &err), 0);
	{
		WSABUFEX bx = { 4096, (char *)p.buf, c };

		ck_assert_int_eq(WSPRdmaRead(p.s, &bx, 1, desc, sizeof(desc), 0, &n, 0, &ov, NULL,
					     NULL, &err), SOCKET_ERROR);
		ck_assert_int_eq(err, WSAEFAULT);
	}
	ck_assert(WSPRegisterMemory(p.s, p.buf, 4096, MEM_WRITE, &err) != c);
	order(&p, CMD_END);
	ck_assert_int_eq(spi_finish(&p), 0);
}
END_TEST

int main(int argc, char **argv)
{
	TCase *tc = t_case("spi", argc, argv);

	tcase_add_test(tc, startup_and_tables);
	tcase_add_test(tc, socket_errors);
	tcase_add_test(tc, send_recv_and_options);
	tcase_add_test(tc, rdma_read_overlapped);
	tcase_add_test(tc, rdma_many_outstanding);
	tcase_add_test(tc, rdma_write);
	tcase_add_test(tc, rdma_call_errors);
	tcase_add_test(tc, rdma_after_deregister);
	tcase_add_test(tc, rdma_reoffer_same_buffer);
	tcase_add_test(tc, rdma_peer_closed);
	tcase_add_test(tc, registration_cache);
	return t_run("wsp", tc);
}

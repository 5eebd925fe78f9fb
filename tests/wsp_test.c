/* SPDX-License-Identifier: MIT */
/*
 * The Winsock Direct SPI: startup, sockets, overlapped I/O, completion
 * ports, memory registration, and WSPRdmaRead/Write with every error code
 * of seed 002.  Runs on the transport named by WSD_TEST_TRANSPORT.
 */
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/pair.h"
#include "wsd/wsp.h"

#define BUF (1u << 20)

struct spi {
	WSAPROTOCOL_INFO info;
	WSPPROC_TABLE procs;
	SOCKET s, l;                 /* l: the peer's listener, for more accepts */
	int oob_in, oob_out;
	pid_t peer;
	uint8_t *buf;
	int cleaned;                 /* the test ran WSPCleanup itself */
};

static void spi_start(struct spi *p)
{
	WSPDATA d;

	memset(&p->procs, 0, sizeof(p->procs));
	p->procs.cbSize = sizeof(p->procs);
	setenv("WSD_TRANSPORT", t_transport(), 1);
	ck_assert_int_eq(WSPStartup(WSP_VERSION, &d, &p->info, NULL, &p->procs), 0);
	p->buf = aligned_alloc(4096, BUF);
	memset(p->buf, 0, BUF);
	p->cleaned = 0;
}

/* Close what the test left open and stop the instance. */
static void spi_stop(struct spi *p)
{
	int err;

	(void)WSPCloseSocket(p->s, &err);
	if (!p->cleaned)
		ck_assert_int_eq(WSPCleanup(p->info.provider, &err), 0);
	free(p->buf);
}

typedef int (*spi_peer_fn)(struct spi *p, void *arg);

static in_port_t last_port;      /* where the latest spi_pair peer listens */

/* Fork a peer that accepts one connection and runs fn; connect to it. */
static void spi_pair(struct spi *me, spi_peer_fn fn, void *arg)
{
	int to[2], from[2], err = 0;
	struct sockaddr_in sa = t_addr(t_port());
	char c;

	last_port = sa.sin_port;
	ck_assert(pipe(to) == 0 && pipe(from) == 0);
	fflush(NULL);
	me->peer = fork();
	if (me->peer == 0) {
		struct spi p;
		SOCKET l;

		alarm(60);
		t_is_peer = 1;
		close(to[1]);
		close(from[0]);
		p.oob_in = to[0];
		p.oob_out = from[1];
		spi_start(&p);
		l = WSPSocket(AF_INET, SOCK_STREAM, 0, &p.info, 0, 0, &err);
		if (l == INVALID_SOCKET || WSPBind(l, (struct sockaddr *)&sa, sizeof(sa), &err) ||
		    WSPListen(l, 4, &err))
			_exit(90);
		if (write(p.oob_out, "r", 1) != 1)
			_exit(91);
		p.s = WSPAccept(l, NULL, NULL, NULL, 0, &err);
		if (p.s == INVALID_SOCKET)
			_exit(92);
		p.l = l;
		_exit(fn(&p, arg));
	}
	close(to[0]);
	close(from[1]);
	me->oob_out = to[1];
	me->oob_in = from[0];
	ck_assert(read(me->oob_in, &c, 1) == 1);
	spi_start(me);
	me->s = WSPSocket(AF_INET, SOCK_STREAM, 0, &me->info, 0, 0, &err);
	ck_assert(me->s != INVALID_SOCKET);
	ck_assert_msg(WSPConnect(me->s, (struct sockaddr *)&sa, sizeof(sa), NULL, NULL, NULL, NULL,
				 &err) == 0, "connect: %d", err);
}

static void xsend(int fd, const void *p, size_t n)
{
	if (write(fd, p, n) != (ssize_t)n)
		_exit(98);
}

static void xrecv(int fd, void *p, size_t n)
{
	size_t got = 0;

	while (got < n) {
		ssize_t r = read(fd, (char *)p + got, n - got);

		if (r <= 0)
			_exit(98);
		got += (size_t)r;
	}
}

static void sync_fd(int in, int out)
{
	char c = 's';

	xsend(out, &c, 1);
	xrecv(in, &c, 1);
}

static int spi_finish(struct spi *me)
{
	int status;

	spi_stop(me);
	close(me->oob_out);
	close(me->oob_in);
	ck_assert(waitpid(me->peer, &status, 0) == me->peer);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

#define PCHECK(c) PEER_CHECK(c)

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
enum { CMD_END = 1, CMD_DEREG, CMD_CLOSE, CMD_CHECK_WRITE };

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

/* The peer closes: WSAECONNRESET. */
START_TEST(rdma_peer_closed)
{
	struct spi p;
	uint8_t desc[WSP_RDMA_DESCRIPTOR_SIZE];
	WSAOVERLAPPED ov = { 0 };
	uint64_t h;
	uint32_t n;
	int err = 0, r;
	WSABUFEX b;

	spi_pair(&p, peer_offer, NULL);
	xrecv(p.oob_in, desc, sizeof(desc));
	h = WSPRegisterMemory(p.s, p.buf, 4096, MEM_WRITE, &err);
	order(&p, CMD_CLOSE);
	b = (WSABUFEX){ 4096, (char *)p.buf, h };
	r = WSPRdmaRead(p.s, &b, 1, desc, sizeof(desc), 0, &n, 0, &ov, NULL, NULL, &err);
	if (r == SOCKET_ERROR && err == WSA_IO_PENDING)
		ck_assert_int_eq(WSPGetOverlappedResult(p.s, &ov, &n, 1, NULL, &err), 0);
	else
		ck_assert_int_eq(r, SOCKET_ERROR);
	ck_assert_msg(err == WSAECONNRESET, "read after the peer closed: %d", err);
	order(&p, CMD_END);
	ck_assert_int_eq(spi_finish(&p), 0);
}
END_TEST

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
		sa.sin_port = last_port;
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
	sa.sin_port = last_port;
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
	struct timespec t0, t1;
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
	clock_gettime(CLOCK_MONOTONIC, &t0);
	ck_assert(WSPAccept(l, NULL, NULL, NULL, 0, &err) == INVALID_SOCKET);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	ck_assert_int_eq(err, WSAETIMEDOUT);
	ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
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
	tcase_add_test(tc, rdma_peer_closed);
	tcase_add_test(tc, close_aborts_outstanding);
	tcase_add_test(tc, idle_after_traffic);
	tcase_add_test(tc, close_right_after_completion);
	tcase_add_test(tc, accept_condition);
	tcase_add_test(tc, accept_timeout);
	tcase_add_test(tc, port_threads);
	tcase_add_test(tc, port_close_wakes_waiters);
	tcase_add_test(tc, registration_cache);
	return t_run("wsp", tc);
}

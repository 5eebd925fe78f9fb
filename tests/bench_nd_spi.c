/* SPDX-License-Identifier: MIT */
/*
 * bench_nd, 6 and 7, through the SPI (wsd/wsp.h): 1 MiB WSPRdmaRead vs
 * nd_ep_read, and 64-byte overlapped WSPSend/WSPRecv round trips, polled and
 * through a completion port.  main, in bench_nd.c, runs them and reports.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "wsd/nd.h"
#include "wsd/wsp.h"
#include "tests/bench_nd.h"

/* ---- 6, 7: the SPI (wsd/wsp.h) ------------------------------------------ */

#define SPI_RD_ROUNDS 15            /* 6: A/B rounds of ROUND_READS reads each */
#define SPI_NSEND 8                 /* 7: overlapped sends in flight at most */

static void wsp_fail(const char *what, int err)
{
	fail("%s failed: WSA error %d", what, err);
}

/* A provider instance of our own.  Fork no peer while one is up: its
 * completion thread would not come along (WSPCleanup ends it). */
static void spi_start(WSAPROTOCOL_INFO *info)
{
	WSPPROC_TABLE procs = { .cbSize = sizeof(procs) };
	WSPDATA data;
	int st = WSPStartup(WSP_VERSION, &data, info, NULL, &procs);

	if (st)
		wsp_fail("WSPStartup", st);
}

static void spi_stop(WSAPROTOCOL_INFO *info)
{
	int err = 0;

	if (WSPCleanup(info->provider, &err))
		wsp_fail("WSPCleanup", err);
}

/* Child: listen on sa, tell the parent by wr, accept one connection. */
static SOCKET spi_accept(WSAPROTOCOL_INFO *info, const struct sockaddr_in *sa, int wr,
			 SOCKET *lsock)
{
	SOCKET l, s;
	int err = 0;

	l = WSPSocket(AF_INET, SOCK_STREAM, 0, info, 0, 0, &err);
	if (l == INVALID_SOCKET)
		wsp_fail("WSPSocket", err);
	if (WSPBind(l, (const struct sockaddr *)sa, sizeof(*sa), &err))
		wsp_fail("WSPBind", err);
	if (WSPListen(l, 4, &err))
		wsp_fail("WSPListen", err);
	if (write(wr, "r", 1) != 1)
		fail("pipe write failed");
	s = WSPAccept(l, NULL, NULL, NULL, 0, &err);
	if (s == INVALID_SOCKET)
		wsp_fail("WSPAccept", err);
	*lsock = l;
	return s;
}

static SOCKET spi_connect(WSAPROTOCOL_INFO *info, const struct sockaddr_in *sa)
{
	SOCKET s;
	int err = 0;

	s = WSPSocket(AF_INET, SOCK_STREAM, 0, info, 0, 0, &err);
	if (s == INVALID_SOCKET)
		wsp_fail("WSPSocket", err);
	if (WSPConnect(s, (const struct sockaddr *)sa, sizeof(*sa), NULL, NULL, NULL, NULL, &err))
		wsp_fail("WSPConnect", err);
	return s;
}

static void spi_close(SOCKET s)
{
	int err = 0;

	if (s != INVALID_SOCKET && WSPCloseSocket(s, &err))
		wsp_fail("WSPCloseSocket", err);
}

/*
 * Poll an overlapped request that asked for no notification until it is
 * done: its byte count.  A busy poller yields on a single CPU.
 */
static uint32_t spi_poll(SOCKET s, WSAOVERLAPPED *ov, int64_t deadline, const char *what)
{
	uint32_t bytes = 0, flags;
	int err = 0;

	for (unsigned k = 1; !WSPGetOverlappedResult(s, ov, &bytes, 0, &flags, &err); k++) {
		if (err != WSA_IO_INCOMPLETE)
			wsp_fail(what, err);
		if (one_cpu)
			sched_yield();
		if (!(k & 1023) && now_ns() > deadline)
			fail("%s: timed out waiting for the overlapped result", what);
	}
	return bytes;
}

/* ---- 6: WSPRdmaRead ------------------------------------------------------- */

/* Child: offer WIN_LEN bytes of pattern through both layers, their descriptors by the
 * pipe (the SPI's after a second ready byte; it listens at *(sockaddr_in *)arg). */
static int spi_window_child(const struct sockaddr_in *sa, int rd, int wr, void *arg)
{
	const struct sockaddr_in *ssa = arg;
	uint8_t desc[WSP_RDMA_DESCRIPTOR_SIZE];
	uint32_t dl = sizeof(desc);
	struct nd_mw_descriptor d;
	WSAPROTOCOL_INFO info;
	struct nd_mw *mw;
	struct side nd;
	SOCKET l, s;
	int err = 0;

	/*
	 * One buffer behind both: first a window on an endpoint, as in 1 ...
	 * (the two layers' figures then differ by their code alone, not by
	 * where each peer's pages happen to lie, which here moves a 1 MiB read
	 * by 10% or more from one process pair to the next).
	 */
	side_open(&nd, WIN_LEN, ND_MR_FLAG_ALLOW_LOCAL_WRITE | ND_MR_FLAG_ALLOW_REMOTE_READ, sa,
		  wr);
	pat_do(nd.buf, 0, WIN_LEN, 0, 0);
	TRY("create window", nd_mw_create(nd.ad, &mw));
	TRY("bind", nd_ep_bind(nd.ep, NULL, nd.mr, mw, nd.buf, WIN_LEN, ND_OP_FLAG_ALLOW_READ,
			       &d));
	if (next_result(&nd, 1, now_ns() + PHASE_NS).op != ND_OP_BIND)
		fail("expected the bind's result");
	if (write(wr, &d, sizeof(d)) != sizeof(d))
		fail("pipe write failed");
	/* ... then the same memory through the SPI. */
	spi_start(&info);
	s = spi_accept(&info, ssa, wr, &l);
	if (WSPRegisterRdmaMemory(s, nd.buf, WIN_LEN, MEM_READ, desc, &dl, &err))
		wsp_fail("WSPRegisterRdmaMemory", err);
	if (dl != sizeof(desc))
		fail("WSPRegisterRdmaMemory: descriptor of %u bytes", dl);
	if (write(wr, desc, sizeof(desc)) != sizeof(desc))
		fail("pipe write failed");
	(void)wait_parent(rd);      /* reads need nothing of us */
	(void)WSPDeregisterRdmaMemory(s, desc, sizeof(desc), &err);
	spi_close(s);
	spi_close(l);
	spi_stop(&info);
	return 0;
}

struct spi_reader {
	SOCKET s;
	uint8_t desc[WSP_RDMA_DESCRIPTOR_SIZE];
	uint8_t *dst;                   /* 1 MiB, registered once */
	uint64_t h;
	unsigned at_once, pending;      /* how the reads completed */
};

/* One round of 1 MiB WSPRdmaReads into the one destination, polled; GB/s. */
static double read_round_spi(struct spi_reader *r)
{
	int64_t t0 = now_ns();

	for (unsigned i = 0; i < ROUND_READS; i++) {
		WSAOVERLAPPED ov = { .hEvent = (void *)(uintptr_t)1 };   /* no notification */
		WSABUFEX b = { MIB, (char *)r->dst, r->h };
		uint32_t n = 0;
		int err = 0;

		if (WSPRdmaRead(r->s, &b, 1, r->desc, sizeof(r->desc), (uint32_t)WOFF(i), &n, 0,
				&ov, NULL, NULL, &err) == 0) {
			r->at_once++;
		} else if (err == WSA_IO_PENDING) {
			r->pending++;
			n = spi_poll(r->s, &ov, t0 + PHASE_NS, "WSPRdmaRead");
		} else {
			wsp_fail("WSPRdmaRead", err);
		}
		if (n != MIB)
			fail("WSPRdmaRead moved %u bytes, not %u", n, MIB);
		if (now_ns() - t0 > PHASE_NS)
			fail("WSPRdmaReads timed out");
	}
	return (double)ROUND_READS * MIB / (double)(now_ns() - t0);
}

/* Check a round's last read (landed at dst), then clear dst. */
static void read_verify_at(uint8_t *dst, const char *what)
{
	if (!pat_do(dst, WOFF(ROUND_READS - 1) / 8, MIB, 0, 1))
		fail("%s: the last 1 MiB read does not match the window's pattern", what);
	memset(dst, 0, MIB);
}

double bench_spi_read(void)
{
	struct sockaddr_in nsa = next_addr(), ssa = next_addr();
	double spi[SPI_RD_ROUNDS], nd[SPI_RD_ROUNDS], ratio[SPI_RD_ROUNDS], ms, mn, mr;
	struct nd_mw_descriptor d;
	WSAPROTOCOL_INFO info;
	struct spi_reader r = { 0 };
	struct peer p;
	struct side s;
	int err = 0;
	char c;

	printf("\n== 6. WSPRdmaRead of 1 MiB through the SPI vs nd_ep_read, from one %u MiB buffer "
	       "offered through both\n"
	       "   %d rounds of %d MiB of each, A/B alternating; both one read at a time into one "
	       "1 MiB buffer registered with both, WSPRdmaRead polled (hEvent low bit)\n",
	       WIN_LEN / MIB, SPI_RD_ROUNDS, ROUND_READS);
	spawn(&p, spi_window_child, &nsa, &ssa);
	side_open(&s, MIB, ND_MR_FLAG_ALLOW_LOCAL_WRITE, &nsa, -1);
	if (read(p.rd, &d, sizeof(d)) != sizeof(d) || d.length != WIN_LEN)
		fail("no window descriptor from the peer");
	/* No fork from here on: our provider instance runs a thread. */
	if (read(p.rd, &c, 1) != 1)
		fail("the peer's SPI socket did not start listening");
	spi_start(&info);
	r.s = spi_connect(&info, &ssa);
	if (read(p.rd, r.desc, sizeof(r.desc)) != sizeof(r.desc))
		fail("no SPI descriptor from the peer");
	r.dst = s.buf;
	r.h = WSPRegisterMemory(r.s, r.dst, MIB, MEM_WRITE, &err);
	if (!r.h)
		wsp_fail("WSPRegisterMemory", err);
	printf("   transport: %s\n", info.transport);
	/* One untimed round of each first: the first touches of the window cost more. */
	(void)read_round_nd_depth(&s, &d, 1);
	read_verify_at(s.buf, "nd_ep_read");
	(void)read_round_spi(&r);
	read_verify_at(r.dst, "WSPRdmaRead");
	r.at_once = r.pending = 0;
	printf("   %-8s %17s %16s %8s\n", "round", "WSPRdmaRead GB/s", "nd_ep_read GB/s", "ratio");
	for (int i = 0; i < SPI_RD_ROUNDS; i++) {
		/* Alternate which goes first, so drift hits both alike. */
		for (int k = 0; k < 2; k++) {
			if ((k ^ i) & 1) {
				nd[i] = read_round_nd_depth(&s, &d, 1);
				read_verify_at(s.buf, "nd_ep_read");
			} else {
				spi[i] = read_round_spi(&r);
				read_verify_at(r.dst, "WSPRdmaRead");
			}
		}
		ratio[i] = spi[i] / nd[i];
		printf("   %-8d %17.2f %16.2f %8.3f\n", i + 1, spi[i], nd[i], ratio[i]);
	}
	/*
	 * The ratio is the median of the rounds' own: the machine's speed
	 * drifts (here by 20% and more within a run), and each round's pair
	 * ran close together, so each sees the same speed.
	 */
	ms = quantile(spi, SPI_RD_ROUNDS, 0.5);
	mn = quantile(nd, SPI_RD_ROUNDS, 0.5);
	mr = quantile(ratio, SPI_RD_ROUNDS, 0.5);
	printf("   %-8s %17.2f %16.2f %8.3f   (ratio of the medians %.3f)\n", "median", ms, mn, mr,
	       ms / mn);
	printf("   WSPRdmaRead: %u of %u timed reads completed in the call, %u pending; "
	       "(nd_ep_read %d outstanding into %d MiB, from 1: %.2f GB/s)\n", r.at_once,
	       r.at_once + r.pending, r.pending, NSLOT, NSLOT, nd_read_gbs);
	(void)WSPDeregisterMemory(r.s, r.h, &err);
	reap(&p);
	spi_close(r.s);
	spi_stop(&info);
	side_close(&s);
	return mr;
}

/* ---- 7: overlapped round trip --------------------------------------------- */

/* One side of an SPI ping-pong: one receive posted at a time, alternating
 * between two buffers; sends rotate through SPI_NSEND buffers. */
struct spi_link {
	const struct spp_cfg *c;
	WSAPROTOCOL_INFO info;
	SOCKET s, l;
	struct wsd_port *port;
	int64_t deadline;
	uint8_t buf[2 + SPI_NSEND][MSG];
	WSAOVERLAPPED rov[2], sov[SPI_NSEND];
	int rbusy[2], sbusy[SPI_NSEND];    /* posted, completion not yet seen */
	uint32_t rbytes[2];
};

#define SPI_PORT_KEY 0x5753

static void spi_link_open(struct spi_link *l, const struct spp_cfg *c,
			  const struct sockaddr_in *sa, int wr)
{
	int ret;

	memset(l, 0, sizeof(*l));
	l->c = c;
	l->l = INVALID_SOCKET;
	l->deadline = now_ns() + PHASE_NS;
	spi_start(&l->info);
	l->s = wr >= 0 ? spi_accept(&l->info, sa, wr, &l->l) : spi_connect(&l->info, sa);
	if (c->use_port) {
		ret = wsd_port_create(&l->port);
		if (ret < 0)
			fail("wsd_port_create: %s", strerror(-ret));
		ret = wsd_port_associate(l->port, l->s, SPI_PORT_KEY);
		if (ret < 0)
			fail("wsd_port_associate: %s", strerror(-ret));
	}
}

static void spi_link_close(struct spi_link *l)
{
	int ret;

	spi_close(l->s);
	spi_close(l->l);
	if (l->port && (ret = wsd_port_close(l->port)) < 0)
		fail("wsd_port_close: %s", strerror(-ret));
	spi_stop(&l->info);
}

/* Port: take one completion and mark its request done. */
static void spi_port_take(struct spi_link *l)
{
	WSAOVERLAPPED *ov;
	uint32_t bytes;
	uintptr_t key;
	int ret;

	while ((ret = wsd_port_wait(l->port, &bytes, &key, &ov, 100)) == 0)
		if (now_ns() > l->deadline)
			fail("timed out waiting for a completion port packet");
	if (ret < 0)
		fail("wsd_port_wait: %s", strerror(-ret));
	if (key != SPI_PORT_KEY)
		fail("completion with key 0x%lx, not ours", (unsigned long)key);
	if (ov->Internal != 0)
		fail("overlapped request failed: WSA error %lu", (unsigned long)ov->Internal);
	if (ov >= l->rov && ov < l->rov + 2 && l->rbusy[ov - l->rov]) {
		l->rbusy[ov - l->rov] = 0;
		l->rbytes[ov - l->rov] = bytes;
	} else if (ov >= l->sov && ov < l->sov + SPI_NSEND && l->sbusy[ov - l->sov]) {
		l->sbusy[ov - l->sov] = 0;
	} else {
		fail("a completion for an overlapped structure not outstanding");
	}
}

static void spi_send_wait(struct spi_link *l, unsigned k)
{
	if (!l->sbusy[k])
		return;
	if (l->c->use_port) {
		while (l->sbusy[k])
			spi_port_take(l);
	} else {
		(void)spi_poll(l->s, &l->sov[k], l->deadline, "WSPSend");
		l->sbusy[k] = 0;
	}
}

static void spi_post_recv(struct spi_link *l, unsigned k)
{
	WSABUF b = { MSG, (char *)l->buf[k] };
	uint32_t n, flags = 0;
	int err = 0;

	l->rov[k] = (WSAOVERLAPPED){ .hEvent = l->c->use_port ? NULL : (void *)(uintptr_t)1 };
	l->rbusy[k] = 1;
	if (WSPRecv(l->s, &b, 1, &n, &flags, &l->rov[k], NULL, NULL, &err) && err != WSA_IO_PENDING)
		wsp_fail("WSPRecv", err);
	/* done at once or not, a port still hears of it; a poller finds it done */
}

static void spi_send(struct spi_link *l, uint64_t i, uint64_t flip)
{
	unsigned k = (unsigned)(i % SPI_NSEND);
	WSABUF b = { MSG, (char *)l->buf[2 + k] };
	uint32_t n;
	int err = 0;

	spi_send_wait(l, k);    /* a send buffer is reused only after its send completed */
	MSG_FILL(l->buf[2 + k], i, flip);
	l->sov[k] = (WSAOVERLAPPED){ .hEvent = l->c->use_port ? NULL : (void *)(uintptr_t)1 };
	l->sbusy[k] = 1;
	if (WSPSend(l->s, &b, 1, &n, 0, &l->sov[k], NULL, NULL, &err) && err != WSA_IO_PENDING)
		wsp_fail("WSPSend", err);
}

/* Wait for message i (in receive buffer i & 1), check it, post the next receive. */
static void spi_recv(struct spi_link *l, uint64_t i, uint64_t flip, uint64_t total)
{
	unsigned k = (unsigned)(i & 1);
	uint32_t bytes;

	if (l->c->use_port) {
		while (l->rbusy[k])
			spi_port_take(l);
		bytes = l->rbytes[k];
	} else {
		bytes = spi_poll(l->s, &l->rov[k], l->deadline, "WSPRecv");
		l->rbusy[k] = 0;
	}
	if (bytes != MSG || !MSG_OK(l->buf[k], i, flip))
		fail("SPI ping-pong message %llu does not verify (%u bytes)",
		     (unsigned long long)i, bytes);
	if (i + 1 < total)
		spi_post_recv(l, k ^ 1);
}

static void spi_drain(struct spi_link *l)
{
	for (unsigned k = 0; k < SPI_NSEND; k++)
		spi_send_wait(l, k);
}

/* Child: answer each message with its complement, on cpu_b. */
static int spi_pp_child(const struct sockaddr_in *sa, int rd, int wr, void *arg)
{
	const struct spp_cfg *c = arg;
	uint64_t total = (uint64_t)(WARM + c->iters);
	static struct spi_link l;

	pin(cpu_b);     /* before the instance starts: its thread stays here too */
	spi_link_open(&l, c, sa, wr);
	spi_post_recv(&l, 0);
	for (uint64_t i = 0; i < total; i++) {
		spi_recv(&l, i, 0, total);
		spi_send(&l, i, ~0ull);
	}
	spi_drain(&l);  /* the parent consumed our last reply */
	(void)wait_parent(rd);
	spi_link_close(&l);
	return 0;
}

/* rtt[] gets c->iters round trips (ns) after WARM unrecorded ones. */
void spi_pingpong(const struct spp_cfg *c, double *rtt)
{
	struct sockaddr_in sa = next_addr();
	uint64_t total = (uint64_t)(WARM + c->iters);
	static struct spi_link l;
	struct peer p;

	spawn(&p, spi_pp_child, &sa, (void *)c);
	pin(cpu_a);
	spi_link_open(&l, c, &sa, -1);
	spi_post_recv(&l, 0);
	for (uint64_t i = 0; i < total; i++) {
		int64_t t0 = now_ns();

		spi_send(&l, i, 0);
		spi_recv(&l, i, ~0ull, total);
		if (i >= WARM)
			rtt[i - WARM] = (double)(now_ns() - t0);
	}
	spi_drain(&l);
	reap(&p);
	spi_link_close(&l);
	pin(-1);
}

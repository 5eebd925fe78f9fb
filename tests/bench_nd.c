/* SPDX-License-Identifier: MIT */
/*
 * bench_nd: figures for the endpoint layer (wsd/nd.h), each against a raw
 * baseline measured in the same run, between forked process pairs:
 *   1. 1 MiB nd_ep_read from a window vs raw process_vm_readv of that buffer
 *   2. 64-byte ping-pong across cores, busy polling, vs a shared-memory spin
 *   3. 64-byte ping-pong on one core with nd_cq_wait vs TCP loopback
 *   4. CPU time of an idle nd_cq_wait(cq, 500)
 *   5. (information) 2 with nd_cq_wait instead of busy polling
 *   6. 1 MiB WSPRdmaRead through the SPI (wsd/wsp.h) vs nd_ep_read
 *   7. (information) 64-byte overlapped WSPSend/WSPRecv round trip across
 *      cores: polled with WSPGetOverlappedResult, and through a completion port
 * Figures are reported, not asserted: the exit status is 1 only when a
 * transfer fails or data does not verify.
 *
 * This file: the shared helpers, process pairs and endpoints, 1 to 5, and
 * main with the report; bench_nd_spi.c: 6 and 7, through the SPI;
 * bench_nd.h: what the two share.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "wsd/nd.h"
#include "tests/bench_nd.h"

static cpu_set_t orig_mask;
int cpu_a, cpu_b, one_cpu;          /* the cores the pairs run on */
static unsigned port_seq;
static pid_t child_pid;             /* the current peer, killed if we fail */
static int in_child;
double nd_read_gbs;                 /* 1's median nd_ep_read GB/s, quoted in 6 */

void fail(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fprintf(stderr, "bench_nd%s: ", in_child ? " (peer)" : "");
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	if (in_child)
		_exit(1);
	if (child_pid > 0) {
		kill(child_pid, SIGKILL);
		waitpid(child_pid, NULL, 0);
	}
	exit(1);
}

static int64_t clock_ns(clockid_t id)
{
	struct timespec ts;

	clock_gettime(id, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t now_ns(void)
{
	return clock_ns(CLOCK_MONOTONIC);
}

/* Run on one core; cpu < 0 restores the mask we started with. */
void pin(int cpu)
{
	cpu_set_t m = orig_mask;

	if (cpu >= 0) {
		CPU_ZERO(&m);
		CPU_SET(cpu, &m);
	}
	if (sched_setaffinity(0, sizeof(m), &m) < 0)
		fail("sched_setaffinity(cpu %d) failed", cpu);
}

/* The window's contents: word i of it is pat(i). */
static uint64_t pat(uint64_t i)
{
	uint64_t z = i + 0x9e3779b97f4a7c15ull;

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Fill or check len bytes as the pattern from word w on, each word xored with flip. */
int pat_do(uint8_t *buf, uint64_t w, size_t len, uint64_t flip, int check)
{
	for (size_t i = 0; i < len; i += 8, w++) {
		uint64_t v = pat(w) ^ flip, have;

		memcpy(&have, buf + i, 8);
		if (check && have != v)
			return 0;
		memcpy(buf + i, &v, 8);
	}
	return 1;
}

static int cmp_dbl(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* The q quantile of v[0..n) (sorts v). */
double quantile(double *v, int n, double q)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_dbl);
	return v[(int)(q * (n - 1) + 0.5)];
}

/* ---- process pairs ------------------------------------------------------ */

struct sockaddr_in next_addr(void)
{
	struct sockaddr_in sa = { .sin_family = AF_INET,
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };

	/* above the kernel's ephemeral ports (32768-60999 by default), which
	 * other programs' connections may hold at any moment */
	sa.sin_port = htons((uint16_t)(61000 + (getpid() * 16 + port_seq++) % 4500));
	return sa;
}

/* Fork a child running fn; return once it has written its ready byte. */
void spawn(struct peer *p, child_fn fn, const struct sockaddr_in *sa, void *arg)
{
	int up[2], down[2];
	char c;

	if (pipe(up) < 0 || pipe(down) < 0)
		fail("pipe failed");
	fflush(stdout);
	p->pid = fork();
	if (p->pid < 0)
		fail("fork failed");
	if (p->pid == 0) {
		in_child = 1;
		alarm(30);      /* do not outlive a parent that hangs */
		close(up[0]);
		close(down[1]);
		_exit(fn(sa, down[0], up[1], arg));
	}
	child_pid = p->pid;
	close(up[1]);
	close(down[0]);
	p->rd = up[0];
	p->wr = down[1];
	if (read(p->rd, &c, 1) != 1)
		fail("the peer process failed to start");
}

/* Tell the child we are done (EOF on its pipe) and check how it ended. */
void reap(struct peer *p)
{
	int status;

	close(p->wr);
	if (waitpid(p->pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status))
		fail("the peer process failed (status 0x%x)", status);
	close(p->rd);
	child_pid = 0;
}

/* Child: block until the parent closes our pipe. */
int wait_parent(int rd)
{
	char c;

	while (read(rd, &c, 1) > 0)
		;
	return 0;
}

/* ---- endpoints ---------------------------------------------------------- */

/* Open an endpoint over a registered buffer of len bytes, then connect it
 * (wr < 0) or, in the child, listen, tell the parent by wr, and accept. */
void side_open(struct side *s, size_t len, uint32_t mr_flags,
	       const struct sockaddr_in *sa, int wr)
{
	struct nd_ep_attr a = { .inbound_entries = 64, .outbound_entries = 64, .inbound_sge = 1,
				.outbound_sge = 1, .inbound_read_limit = 8 };
	const struct sockaddr *addr = (const struct sockaddr *)sa;
	struct nd_conn_request *req;
	struct nd_listener *l;

	TRY("open adapter", nd_adapter_open(NULL, &s->ad));
	TRY("create cq", nd_cq_create(s->ad, 256, &s->cq));
	a.inbound_cq = a.outbound_cq = s->cq;
	TRY("create endpoint", nd_ep_create(s->ad, &a, &s->ep));
	len = (len + 4095) & ~(size_t)4095;     /* aligned_alloc wants whole pages */
	s->buf = aligned_alloc(4096, len);
	if (!s->buf)
		fail("out of memory");
	memset(s->buf, 0, len);     /* fault the pages in before timing */
	TRY("register", nd_mr_register(s->ad, s->buf, len, mr_flags, &s->mr));
	if (wr < 0) {
		TRY("connect", nd_ep_connect(s->ep, addr, sizeof(*sa), NULL, 0, 10000));
		return;
	}
	TRY("listen", nd_listen(s->ad, addr, sizeof(*sa), 4, &l));
	if (write(wr, "r", 1) != 1)
		fail("pipe write failed");
	TRY("get request", nd_listen_get_request(l, 10000, &req));
	TRY("accept", nd_ep_accept(s->ep, req, NULL, 0, 10000));
	(void)nd_listen_close(l);
}

void side_close(struct side *s)
{
	(void)nd_ep_disconnect(s->ep);
	(void)nd_ep_destroy(s->ep);
	(void)nd_mr_deregister(s->mr);
	(void)nd_cq_destroy(s->cq);
	(void)nd_adapter_close(s->ad);
	free(s->buf);
}

/*
 * The next result, by busy polling or by nd_cq_wait; fails on an error
 * result or past the deadline.  On a single CPU a busy poller yields, or the
 * peer it waits for could not run until the poller's time slice ends.
 */
struct nd_result next_result(struct side *s, int use_wait, int64_t deadline)
{
	struct nd_result r;
	unsigned k = 0;
	int n;

	while ((n = nd_cq_poll(s->cq, &r, 1)) == 0) {
		if (use_wait)
			(void)nd_cq_wait(s->cq, 100);
		else if (one_cpu)
			sched_yield();
		if ((use_wait || (++k & 1023) == 0) && now_ns() > deadline)
			fail("timed out waiting for a result");
	}
	if (n < 0)
		fail("nd_cq_poll: %s", nd_strstatus((nd_status)-n));
	if (r.status != ND_SUCCESS)
		fail("request (op %d) failed: %s", (int)r.op, nd_strstatus(r.status));
	return r;
}

/* ---- 1: read bandwidth -------------------------------------------------- */

/* Child: offer a window over the pattern and send its descriptor by the pipe
 * (when *(int *)arg is 0, just stay connected). */
static int window_child(const struct sockaddr_in *sa, int rd, int wr, void *arg)
{
	int bind = *(const int *)arg;
	struct nd_mw_descriptor d;
	struct nd_mw *mw;
	struct side s;

	side_open(&s, bind ? WIN_LEN : 4096,
		  ND_MR_FLAG_ALLOW_LOCAL_WRITE | ND_MR_FLAG_ALLOW_REMOTE_READ, sa, wr);
	if (bind) {
		pat_do(s.buf, 0, WIN_LEN, 0, 0);
		TRY("create window", nd_mw_create(s.ad, &mw));
		TRY("bind", nd_ep_bind(s.ep, NULL, s.mr, mw, s.buf, WIN_LEN,
				       ND_OP_FLAG_ALLOW_READ, &d));
		if (next_result(&s, 1, now_ns() + PHASE_NS).op != ND_OP_BIND)
			fail("expected the bind's result");
		if (write(wr, &d, sizeof(d)) != sizeof(d))
			fail("pipe write failed");
	}
	return wait_parent(rd);     /* reads need nothing of us */
}

/* One round of 1 MiB nd_ep_reads, depth (<= NSLOT) outstanding, each into
 * slot i % depth; GB/s. */
double read_round_nd_depth(struct side *s, const struct nd_mw_descriptor *d,
			   unsigned depth)
{
	int64_t t0 = now_ns();
	unsigned posted = 0, done = 0;

	while (done < ROUND_READS) {
		struct nd_result r[NSLOT];
		int n;

		/* A slot is reused only once the read before into it has completed. */
		for (; posted < ROUND_READS && posted - done < depth; posted++) {
			struct nd_sge sge = { s->buf + (size_t)(posted % depth) * MIB, MIB, s->mr };

			TRY("read", nd_ep_read(s->ep, NULL, &sge, 1, d, WOFF(posted), 0));
		}
		n = nd_cq_poll(s->cq, r, NSLOT);
		if (n < 0)
			fail("nd_cq_poll: %s", nd_strstatus((nd_status)-n));
		for (int i = 0; i < n; i++)
			if (r[i].status != ND_SUCCESS || r[i].op != ND_OP_READ || r[i].bytes != MIB)
				fail("read failed: %s (%llu bytes)", nd_strstatus(r[i].status),
				     (unsigned long long)r[i].bytes);
		done += (unsigned)n;
		if (now_ns() - t0 > PHASE_NS)
			fail("reads timed out");
	}
	return (double)ROUND_READS * MIB / (double)(now_ns() - t0);
}

/* One round of 1 MiB nd_ep_reads, NSLOT outstanding; GB/s. */
static double read_round_nd(struct side *s, const struct nd_mw_descriptor *d)
{
	return read_round_nd_depth(s, d, NSLOT);
}

/* The same reads as raw process_vm_readv from the window's owner; GB/s. */
static double read_round_raw(struct side *s, pid_t pid, const struct nd_mw_descriptor *d)
{
	int64_t t0 = now_ns();

	for (unsigned i = 0; i < ROUND_READS; i++) {
		struct iovec l = { SLOT(s, i), MIB };
		struct iovec r = { (void *)(uintptr_t)(d->base + WOFF(i)), MIB };

		if (process_vm_readv(pid, &l, 1, &r, 1, 0) != MIB)
			fail("process_vm_readv failed: %m");
	}
	return (double)ROUND_READS * MIB / (double)(now_ns() - t0);
}

/* Check the round's last read, then clear the slots for the next round. */
static void read_verify(struct side *s, const char *what)
{
	if (!pat_do(SLOT(s, ROUND_READS - 1), WOFF(ROUND_READS - 1) / 8, MIB, 0, 1))
		fail("%s: the last 1 MiB read does not match the window's pattern", what);
	memset(s->buf, 0, (size_t)NSLOT * MIB);
}

static double bench_read(void)
{
	struct sockaddr_in sa = next_addr();
	struct nd_mw_descriptor d;
	double nd[ROUNDS], raw[ROUNDS], mn, mr;
	struct peer p;
	struct side s;

	printf("\n== 1. nd_ep_read of 1 MiB from a %u MiB window vs raw process_vm_readv\n"
	       "   %d rounds of %d MiB each, A/B alternating, %d reads outstanding\n",
	       WIN_LEN / MIB, ROUNDS, ROUND_READS, NSLOT);
	spawn(&p, window_child, &sa, &(int){ 1 });
	side_open(&s, (size_t)NSLOT * MIB, ND_MR_FLAG_ALLOW_LOCAL_WRITE, &sa, -1);
	if (read(p.rd, &d, sizeof(d)) != sizeof(d) || d.length != WIN_LEN)
		fail("no window descriptor from the peer");
	/* One untimed round of each first: the first touches of the window cost more. */
	(void)read_round_nd(&s, &d);
	(void)read_round_raw(&s, p.pid, &d);
	read_verify(&s, "process_vm_readv");
	printf("   %-8s %16s %22s\n", "round", "nd_ep_read GB/s", "process_vm_readv GB/s");
	for (int i = 0; i < ROUNDS; i++) {
		/* Alternate which goes first, so drift hits both alike. */
		for (int k = 0; k < 2; k++) {
			if ((k ^ i) & 1) {
				raw[i] = read_round_raw(&s, p.pid, &d);
				read_verify(&s, "process_vm_readv");
			} else {
				nd[i] = read_round_nd(&s, &d);
				read_verify(&s, "nd_ep_read");
			}
		}
		printf("   %-8d %16.2f %22.2f\n", i + 1, nd[i], raw[i]);
	}
	mn = quantile(nd, ROUNDS, 0.5);
	mr = quantile(raw, ROUNDS, 0.5);
	nd_read_gbs = mn;
	printf("   %-8s %16.2f %22.2f   ratio %.3f\n", "median", mn, mr, mn / mr);
	reap(&p);
	side_close(&s);
	return mn / mr;
}

/* ---- 2, 3, 5: ping-pong ------------------------------------------------- */

enum link_kind { LINK_ND, LINK_SPIN, LINK_TCP };

/* Spin baseline: one counter each way on a shared page, each on its own line. */
struct spin_page {
	struct {
		_Alignas(64) _Atomic uint64_t v;
	} ctr[2];
};

struct pp_cfg {
	enum link_kind kind;
	int iters;
	int cross;                      /* the child on cpu_b, else both on cpu_a */
	int use_wait;                   /* nd: nd_cq_wait instead of busy polling */
	struct spin_page *pg;           /* spin: the shared page */
};

/* One side of a ping-pong: how it sends message i and waits for message i. */
struct link {
	const struct pp_cfg *c;
	int64_t deadline;
	int me;                         /* 0 parent, 1 child */
	struct side s;                  /* nd */
	int sends;                      /* nd: sends not yet completed */
	int fd;                         /* tcp */
};

#define RECV_BUF(s, k) ((s)->buf + (size_t)(k) * MSG)
#define SEND_BUF(s, k) ((s)->buf + (size_t)(NRECV + (k)) * MSG)

static void post_recv(struct side *s, unsigned k)
{
	struct nd_sge sge = { RECV_BUF(s, k), MSG, s->mr };

	TRY("receive", nd_ep_receive(s->ep, (void *)(uintptr_t)k, &sge, 1));
}

static void tcp_xfer(int fd, uint8_t *m, int out)
{
	unsigned intr = 0;

	for (size_t done = 0; done < MSG;) {
		ssize_t n = out ? write(fd, m + done, MSG - done) : read(fd, m + done, MSG - done);

		/* A socket with a timeout says EINTR after a stop and continue. */
		if (n < 0 && errno == EINTR && ++intr < 100)
			continue;
		if (n <= 0)
			fail("tcp %s failed: %m", out ? "write" : "read");
		done += (size_t)n;
	}
}

static void link_send(struct link *l, uint64_t i, uint64_t flip)
{
	struct nd_sge sge = { NULL, MSG, l->s.mr };
	uint8_t m[MSG];

	switch (l->c->kind) {
	case LINK_SPIN:
		atomic_store_explicit(&l->c->pg->ctr[l->me].v, i + 1, memory_order_release);
		break;
	case LINK_TCP:
		MSG_FILL(m, i, flip);
		tcp_xfer(l->fd, m, 1);
		break;
	case LINK_ND:
		/* A send buffer is reused only after its send completed. */
		if (l->sends >= NSEND)
			fail("send results are not coming back");
		sge.addr = SEND_BUF(&l->s, i % NSEND);
		MSG_FILL(sge.addr, i, flip);
		TRY("send", nd_ep_send(l->s.ep, NULL, &sge, 1, 0));
		l->sends++;
		break;
	}
}

/* nd: the next receive (its slot), counting send results meanwhile; -1 when drained. */
static int nd_next(struct link *l, int want_recv)
{
	while (want_recv || l->sends > 0) {
		struct nd_result r = next_result(&l->s, l->c->use_wait, l->deadline);

		if (r.op == ND_OP_SEND)
			l->sends--;
		else if (r.op == ND_OP_RECEIVE && want_recv && r.bytes == MSG)
			return (int)(uintptr_t)r.request_context;
		else
			fail("unexpected result (op %d, %llu bytes)", (int)r.op,
			     (unsigned long long)r.bytes);
	}
	return -1;
}

/* Wait for message i and check it (nd reposts its receive before we reply). */
static void link_recv(struct link *l, uint64_t i, uint64_t flip)
{
	_Atomic uint64_t *v;
	uint8_t m[MSG];
	int k;

	switch (l->c->kind) {
	case LINK_SPIN:
		v = &l->c->pg->ctr[!l->me].v;
		for (unsigned n = 1; atomic_load_explicit(v, memory_order_acquire) != i + 1; n++) {
			if (one_cpu)
				sched_yield();
			if (!(n & 4095) && now_ns() > l->deadline)
				fail("shared-memory spin timed out");
		}
		return;
	case LINK_TCP:
		tcp_xfer(l->fd, m, 0);
		if (!MSG_OK(m, i, flip))
			fail("tcp message %llu does not verify", (unsigned long long)i);
		return;
	case LINK_ND:
		k = nd_next(l, 1);
		if (!MSG_OK(RECV_BUF(&l->s, k), i, flip))
			fail("ping-pong message %llu does not verify", (unsigned long long)i);
		post_recv(&l->s, (unsigned)k);
		return;
	}
}

static int tcp_setup(int fd)
{
	struct timeval tv = { .tv_sec = 5 };   /* bound every blocking call */
	int one = 1;

	return setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) |
	       setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) |
	       setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

/* Connect the link; the child also says when the parent may connect (wr). */
static void link_open(struct link *l, const struct pp_cfg *c, const struct sockaddr_in *sa,
		      int me, int wr)
{
	int one = 1, fd = -1;

	*l = (struct link){ .c = c, .me = me, .deadline = now_ns() + PHASE_NS, .fd = -1 };
	if (c->kind == LINK_ND) {
		side_open(&l->s, (NRECV + NSEND) * MSG, ND_MR_FLAG_ALLOW_LOCAL_WRITE, sa,
			  me ? wr : -1);
		for (unsigned k = 0; k < NRECV; k++)
			post_recv(&l->s, k);
		return;
	}
	if (c->kind == LINK_TCP && !me) {
		l->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (l->fd < 0 || tcp_setup(l->fd) ||
		    connect(l->fd, (const struct sockaddr *)sa, sizeof(*sa)))
			fail("tcp connect failed: %m");
	}
	if (!me)
		return;
	if (c->kind == LINK_TCP) {
		fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
		    bind(fd, (const struct sockaddr *)sa, sizeof(*sa)) || listen(fd, 1))
			fail("tcp listen failed: %m");
	}
	if (write(wr, "r", 1) != 1)
		fail("pipe write failed");
	if (fd >= 0) {
		l->fd = accept(fd, NULL, NULL);
		if (l->fd < 0 || tcp_setup(l->fd))
			fail("tcp accept failed: %m");
		close(fd);
	}
}

/* Child: answer each message with its complement. */
static int pp_child(const struct sockaddr_in *sa, int rd, int wr, void *arg)
{
	const struct pp_cfg *c = arg;
	struct link l;

	pin(c->cross ? cpu_b : cpu_a);
	link_open(&l, c, sa, 1, wr);
	for (uint64_t i = 0; i < (uint64_t)(WARM + c->iters); i++) {
		link_recv(&l, i, 0);
		link_send(&l, i, ~0ull);
	}
	if (c->kind == LINK_ND)
		(void)nd_next(&l, 0);   /* the parent consumed our last reply */
	return wait_parent(rd);
}

/* rtt[] gets c->iters round trips (ns) after WARM unrecorded ones. */
static void pingpong(struct pp_cfg *c, double *rtt)
{
	struct sockaddr_in sa = next_addr();
	struct peer p;
	struct link l;

	pin(cpu_a);
	c->pg = mmap(NULL, sizeof(*c->pg), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
		     -1, 0);
	if (c->pg == MAP_FAILED)
		fail("mmap failed");
	spawn(&p, pp_child, &sa, c);
	link_open(&l, c, &sa, 0, -1);
	for (uint64_t i = 0; i < (uint64_t)(WARM + c->iters); i++) {
		int64_t t0 = now_ns();

		link_send(&l, i, 0);
		link_recv(&l, i, ~0ull);
		if (i >= WARM)
			rtt[i - WARM] = (double)(now_ns() - t0);
	}
	if (c->kind == LINK_ND)
		(void)nd_next(&l, 0);
	if (c->kind == LINK_TCP)
		close(l.fd);
	reap(&p);
	if (c->kind == LINK_ND)
		side_close(&l.s);
	munmap(c->pg, sizeof(*c->pg));
	pin(-1);
}

struct lat {
	double p50, p99;    /* microseconds */
};

static struct lat lat_row(const char *name, double *rtt, int n)
{
	struct lat l = { quantile(rtt, n, 0.5) / 1e3, quantile(rtt, n, 0.99) / 1e3 };

	printf("   %-34s %9.2f %9.2f\n", name, l.p50, l.p99);
	return l;
}

static double mean_us(const double *v, int n)
{
	double sum = 0;

	for (int i = 0; i < n; i++)
		sum += v[i];
	return sum / n / 1e3;
}

/* ---- 4: idle CPU -------------------------------------------------------- */

/* Process CPU microseconds of an idle nd_cq_wait(cq, 500): the median of 3. */
static double bench_idle(void)
{
	struct sockaddr_in sa = next_addr();
	double cpu[3], wall[3];
	struct peer p;
	struct side s;

	printf("\n== 4. idle nd_cq_wait(cq, 500) on a connected endpoint, nothing arriving\n");
	spawn(&p, window_child, &sa, &(int){ 0 });
	side_open(&s, 4096, ND_MR_FLAG_ALLOW_LOCAL_WRITE, &sa, -1);
	printf("   %-8s %10s %10s  %s\n", "wait", "wall ms", "cpu us", "status");
	for (int i = 0; i < 3; i++) {
		int64_t w0 = now_ns(), c0 = clock_ns(CLOCK_PROCESS_CPUTIME_ID);
		nd_status st = nd_cq_wait(s.cq, 500);
		int64_t c1 = clock_ns(CLOCK_PROCESS_CPUTIME_ID), w1 = now_ns();

		cpu[i] = (double)(c1 - c0) / 1e3;
		wall[i] = (double)(w1 - w0) / 1e6;
		printf("   %-8d %10.1f %10.1f  %s%s\n", i + 1, wall[i], cpu[i], nd_strstatus(st),
		       st == ND_TIMEOUT ? "" : " (unexpected: nothing was sent)");
	}
	reap(&p);
	side_close(&s);
	printf("   %-8s %10.1f %10.1f\n", "median", quantile(wall, 3, 0.5), quantile(cpu, 3, 0.5));
	return quantile(cpu, 3, 0.5);
}

/* ---- main --------------------------------------------------------------- */

static const char *verdict(int met)
{
	return met ? "MET" : "MISSED";
}

int main(void)
{
	static double nd_x[ITERS_X], raw_x[ITERS_X], wait_x[ITERS_X], nd_1[ITERS_1],
		      tcp_1[ITERS_1], spi_poll_x[SPI_ROUNDS_X * SPI_ITERS_X],
		      spi_port_x[SPI_ROUNDS_X * SPI_ITERS_X];
	const struct spp_cfg spi_pollc = { 0, SPI_ITERS_X }, spi_portc = { 1, SPI_ITERS_X };
	struct lat lspi_poll, lspi_port;
	double spi_rr;
	const char *tp = getenv("WSD_TRANSPORT");
	const char *hdr = "   %-34s %9s %9s\n";
	struct pp_cfg nd_xc = { LINK_ND, ITERS_X, 1, 0, NULL },
		      spin = { LINK_SPIN, ITERS_X, 1, 0, NULL },
		      nd_1c = { LINK_ND, ITERS_1, 0, 1, NULL },
		      tcp = { LINK_TCP, ITERS_1, 0, 0, NULL },
		      wait_xc = { LINK_ND, ITERS_X, 1, 1, NULL };
	struct lat lnd, lraw, l1, ltcp;
	double rr, idle_cpu, spin_us = 50;
	const char *env = getenv("WSD_SPIN_US");

	alarm(85);      /* the last resort; every loop has its own bound */
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (sched_getaffinity(0, sizeof(orig_mask), &orig_mask) < 0)
		fail("sched_getaffinity failed");
	cpu_a = cpu_b = -1;
	for (int c = 0; c < CPU_SETSIZE && cpu_b < 0; c++)
		if (CPU_ISSET(c, &orig_mask))
			*(cpu_a < 0 ? &cpu_a : &cpu_b) = c;
	one_cpu = cpu_b < 0;
	if (one_cpu)
		cpu_b = cpu_a;
	if (env && *env)
		spin_us = atof(env);
	printf("bench_nd: wsd endpoint layer, same-host process pairs; %d CPU(s) usable, "
	       "WSD_SPIN_US=%g\n", CPU_COUNT(&orig_mask), spin_us);
	if (one_cpu)
		printf("bench_nd: only one CPU is usable: the cross-core runs share cpu %d, "
		       "and busy pollers yield\n", cpu_a);

	rr = bench_read();

	printf("\n== 2. 64-byte ping-pong across cores (cpu %d <-> cpu %d), busy polling, "
	       "%d round trips in %d alternating rounds, each after %d warm-up\n", cpu_a, cpu_b,
	       ITERS_X, ROUNDS_X, WARM);
	/* A B A B ...: drift in the machine's speed touches both alike. */
	nd_xc.iters = spin.iters = ITERS_X / ROUNDS_X;
	for (int r = 0; r < ROUNDS_X; r++) {
		pingpong(&nd_xc, nd_x + r * (ITERS_X / ROUNDS_X));
		pingpong(&spin, raw_x + r * (ITERS_X / ROUNDS_X));
	}
	printf(hdr, "", "p50 us", "p99 us");
	lnd = lat_row("wsd send/receive, nd_cq_poll", nd_x, ITERS_X);
	lraw = lat_row("raw shared-memory spin", raw_x, ITERS_X);
	printf("   ratio of p50s %.2f\n", lnd.p50 / lraw.p50);

	printf("\n== 3. 64-byte ping-pong on one core (cpu %d), nd_cq_wait vs TCP loopback, "
	       "%d round trips after %d warm-up\n", cpu_a, ITERS_1, WARM);
	pingpong(&nd_1c, nd_1);
	pingpong(&tcp, tcp_1);
	printf(hdr, "", "p50 us", "p99 us");
	l1 = lat_row("wsd send/receive, nd_cq_wait", nd_1, ITERS_1);
	ltcp = lat_row("TCP loopback, TCP_NODELAY", tcp_1, ITERS_1);
	printf("   ratio of p50s %.2f, of p99s %.2f\n", l1.p50 / ltcp.p50, l1.p99 / ltcp.p99);

	idle_cpu = bench_idle();

	printf("\n== 5. (information) 64-byte ping-pong across cores (cpu %d <-> cpu %d), "
	       "nd_cq_wait, %d round trips after %d warm-up\n", cpu_a, cpu_b, ITERS_X, WARM);
	pingpong(&wait_xc, wait_x);
	printf(hdr, "", "p50 us", "p99 us");
	(void)lat_row("wsd send/receive, nd_cq_wait", wait_x, ITERS_X);
	printf("   %-34s %9.2f %9.2f\n", "(busy polling, from 2)", lnd.p50, lnd.p99);

	/* The SPI opens its adapter by WSD_TRANSPORT: shm unless one is named. */
	if (!tp || !*tp)
		setenv("WSD_TRANSPORT", "shm", 1);
	spi_rr = bench_spi_read();

	printf("\n== 7. (information) 64-byte overlapped WSPSend/WSPRecv round trip across cores "
	       "(cpu %d <-> cpu %d), %d round trips of each kind in %d alternating rounds, each "
	       "after %d warm-up; the next WSPRecv is posted before sending\n", cpu_a, cpu_b,
	       SPI_ROUNDS_X * SPI_ITERS_X, SPI_ROUNDS_X, WARM);
	for (int r = 0; r < SPI_ROUNDS_X; r++) {
		spi_pingpong(&spi_pollc, spi_poll_x + r * SPI_ITERS_X);
		spi_pingpong(&spi_portc, spi_port_x + r * SPI_ITERS_X);
	}
	printf(hdr, "", "p50 us", "p99 us");
	lspi_poll = lat_row("SPI, WSPGetOverlappedResult poll", spi_poll_x,
			    SPI_ROUNDS_X * SPI_ITERS_X);
	lspi_port = lat_row("SPI, completion port wait", spi_port_x, SPI_ROUNDS_X * SPI_ITERS_X);
	printf("   %-34s %9.2f %9.2f\n", "(endpoint busy polling, from 2)", lnd.p50, lnd.p99);
	printf("   mean poll %.2f us, port %.2f us; slowest poll %.1f us, port %.1f us\n",
	       mean_us(spi_poll_x, SPI_ROUNDS_X * SPI_ITERS_X),
	       mean_us(spi_port_x, SPI_ROUNDS_X * SPI_ITERS_X),
	       quantile(spi_poll_x, SPI_ROUNDS_X * SPI_ITERS_X, 1) / 1e3,
	       quantile(spi_port_x, SPI_ROUNDS_X * SPI_ITERS_X, 1) / 1e3);

	printf("\n== summary\n");
	printf("bench: read_1MiB_ratio %.3f (target >= 0.90) %s\n", rr, verdict(rr >= 0.90));
	printf("bench: pingpong_xcore_p50_ratio %.2f (target <= 3.00) %s%s\n",
	       lnd.p50 / lraw.p50, verdict(lnd.p50 <= 3 * lraw.p50),
	       one_cpu ? " (one CPU: not across cores)" : "");
	printf("bench: pingpong_1core_vs_tcp_p50_ratio %.2f (target <= 1.00) %s\n",
	       l1.p50 / ltcp.p50, verdict(l1.p50 <= ltcp.p50));
	printf("bench: idle_wait_cpu_us %.1f (target <= %.0f) %s\n", idle_cpu,
	       spin_us + 3000, verdict(idle_cpu <= spin_us + 3000));
	printf("bench: spi_read_1MiB_ratio %.3f (target >= 0.95) %s\n", spi_rr,
	       verdict(spi_rr >= 0.95));
	printf("bench: spi_pingpong_poll_p50_us %.2f\n", lspi_poll.p50);
	printf("bench: spi_pingpong_port_p50_us %.2f\n", lspi_port.p50);
	printf("bench: spi_pingpong_nd_poll_p50_us %.2f\n", lnd.p50);
	return 0;
}

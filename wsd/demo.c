/* SPDX-License-Identifier: MIT */
/*
 * wsd demo: two processes connect through the endpoint API and move data,
 * first by Send/Receive, then by Read from a memory window, each stream
 * checksummed on both ends and compared.
 */
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "wsd/cmd.h"
#include "wsd/checksum.h"
#include "wsd/nd.h"

#define PATTERN (8u << 20)
#define NRECV 16

struct side {
	struct nd_adapter *ad;
	struct nd_cq *cq;
	struct nd_ep *ep;
	uint8_t *buf;          /* receive slots, or the pattern */
	struct nd_mr *mr;
	bool held;             /* a receive that came while we waited for another kind */
	struct nd_result held_r;
};


static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int die(const char *what, nd_status st)
{
	fprintf(stderr, "wsd demo: %s: %s\n", what, nd_strstatus(st));
	exit(1);
}

#define TRY(what, call) do { nd_status st_ = (call); if (st_ != ND_SUCCESS) die(what, st_); } while (0)

static struct nd_result wait_one(struct side *s)
{
	struct nd_result r;

	while (nd_cq_poll(s->cq, &r, 1) == 0)
		nd_cq_wait(s->cq, 1000);
	if (r.status != ND_SUCCESS)
		die("request failed", r.status);
	return r;
}

/*
 * The next completion of kind op.  A receive that completes first is kept
 * for the next wait for a receive: a send completes only when the peer has
 * taken it, and the peer may answer at once, so the answer can be reported
 * before the send that asked for it.
 */
static struct nd_result wait_op(struct side *s, enum nd_op op)
{
	for (;;) {
		struct nd_result r;

		if (op == ND_OP_RECEIVE && s->held) {
			s->held = false;
			return s->held_r;
		}
		r = wait_one(s);
		if (r.op == op)
			return r;
		if (r.op == ND_OP_RECEIVE) {
			if (s->held)
				die("two receives unclaimed", ND_FAILURE);
			s->held = true;
			s->held_r = r;
		}
	}
}

static void side_open(struct side *s, size_t buflen)
{
	struct nd_ep_attr a = { .inbound_entries = 64, .outbound_entries = 64, .inbound_sge = 1,
				.outbound_sge = 1, .inbound_read_limit = 8 };

	TRY("open adapter", nd_adapter_open(NULL, &s->ad));
	TRY("create cq", nd_cq_create(s->ad, 256, &s->cq));
	a.inbound_cq = a.outbound_cq = s->cq;
	TRY("create endpoint", nd_ep_create(s->ad, &a, &s->ep));
	buflen = (buflen + 4095) & ~(size_t)4095;
	s->buf = aligned_alloc(4096, buflen);
	if (!s->buf)
		die("memory", ND_NO_MEMORY);
	memset(s->buf, 0, buflen);
	TRY("register", nd_mr_register(s->ad, s->buf, buflen, ND_MR_FLAG_ALLOW_LOCAL_WRITE |
				       ND_MR_FLAG_ALLOW_REMOTE_READ, &s->mr));
}

static void side_close(struct side *s)
{
	TRY("destroy endpoint", nd_ep_destroy(s->ep));
	TRY("deregister", nd_mr_deregister(s->mr));
	TRY("destroy cq", nd_cq_destroy(s->cq));
	TRY("close adapter", nd_adapter_close(s->ad));
	free(s->buf);
}

static void post_recv(struct side *s, size_t msg, unsigned slot)
{
	struct nd_sge sge = { s->buf + (size_t)slot * msg, (uint32_t)msg, s->mr };

	TRY("receive", nd_ep_receive(s->ep, (void *)(uintptr_t)slot, &sge, 1));
}

/* The process that listens: receives the stream, then offers a window. */
static int server(struct sockaddr_in *sa, uint64_t bytes, size_t msg, int ready_fd)
{
	struct side s = { 0 };
	struct nd_listener *l;
	struct nd_conn_request *req;
	struct nd_mw *mw;
	struct nd_mw_descriptor d;
	uint64_t got = 0, h = 0xcbf29ce484222325ull, peer_h;
	size_t slots = NRECV * msg;

	side_open(&s, slots + PATTERN + 64);
	TRY("listen", nd_listen(s.ad, (struct sockaddr *)sa, sizeof(*sa), 4, &l));
	if (write(ready_fd, "r", 1) != 1)
		return 1;
	TRY("get request", nd_listen_get_request(l, 10000, &req));
	for (unsigned i = 0; i < NRECV; i++)
		post_recv(&s, msg, i);
	TRY("accept", nd_ep_accept(s.ep, req, NULL, 0, 10000));
	while (got < bytes) {
		struct nd_result r = wait_one(&s);
		unsigned slot = (unsigned)(uintptr_t)r.request_context;

		if (r.op != ND_OP_RECEIVE)
			continue;
		h = checksum_step(h, s.buf + (size_t)slot * msg, r.bytes);
		got += r.bytes;
		post_recv(&s, msg, slot);
	}
	/* the sender's checksum comes last */
	{
		struct nd_result r = wait_op(&s, ND_OP_RECEIVE);

		memcpy(&peer_h, s.buf + (size_t)(uintptr_t)r.request_context * msg, 8);
		post_recv(&s, msg, (unsigned)(uintptr_t)r.request_context);
	}
	if (peer_h != h) {
		fprintf(stderr, "wsd demo: send/receive checksum MISMATCH\n");
		return 1;
	}
	/* Offer a window over a random pattern; its checksum rides with the descriptor. */
	{
		uint8_t *pat = s.buf + slots;
		uint64_t x = 88172645463325252ull, msgbuf[4];
		struct nd_sge sge = { msgbuf, sizeof(msgbuf), NULL };
		struct nd_mr *mmr;

		for (size_t i = 0; i < PATTERN; i += 8) {
			x ^= x << 13; x ^= x >> 7; x ^= x << 17;
			memcpy(pat + i, &x, 8);
		}
		TRY("create window", nd_mw_create(s.ad, &mw));
		TRY("bind", nd_ep_bind(s.ep, NULL, s.mr, mw, pat, PATTERN, ND_OP_FLAG_ALLOW_READ, &d));
		(void)wait_op(&s, ND_OP_BIND);
		msgbuf[0] = d.base;
		msgbuf[1] = d.length;
		msgbuf[2] = d.token;
		msgbuf[3] = checksum_step(0xcbf29ce484222325ull, pat, PATTERN);
		TRY("register", nd_mr_register(s.ad, msgbuf, sizeof(msgbuf), 0, &mmr));
		sge.mr = mmr;
		TRY("send descriptor", nd_ep_send(s.ep, NULL, &sge, 1, 0));
		(void)wait_op(&s, ND_OP_SEND);
		/* The reader says it is done with a send-and-invalidate of our window. */
		(void)wait_op(&s, ND_OP_RECEIVE);
		nd_mr_deregister(mmr);
	}
	/* the peer's disconnect may already have ended the connection */
	nd_ep_disconnect(s.ep);
	TRY("destroy window", nd_mw_destroy(mw));
	TRY("close listener", nd_listen_close(l));
	side_close(&s);
	return 0;
}

static int client(struct sockaddr_in *sa, uint64_t bytes, size_t msg)
{
	struct side s = { 0 };
	uint8_t *pat;
	uint64_t x = 88172645463325252ull, h = 0xcbf29ce484222325ull, sent = 0, off = 0;
	uint64_t d[4];
	unsigned outstanding = 0;
	double t0, t1;

	side_open(&s, PATTERN + msg + 4096);
	pat = s.buf;
	for (size_t i = 0; i < PATTERN; i += 8) {
		x ^= x << 13; x ^= x >> 7; x ^= x << 17;
		memcpy(pat + i, &x, 8);
	}
	post_recv(&s, 64, (PATTERN + msg) / 64);
	TRY("connect", nd_ep_connect(s.ep, (struct sockaddr *)sa, sizeof(*sa), NULL, 0, 10000));
	printf("connected over the %s transport\n", nd_ep_transport(s.ep));
	t0 = now_s();
	while (sent < bytes) {
		size_t n = bytes - sent < msg ? bytes - sent : msg;
		struct nd_sge sge = { pat + off, (uint32_t)n, s.mr };

		if (outstanding == 32) {
			struct nd_result r = wait_one(&s);

			if (r.op == ND_OP_SEND)
				outstanding--;
			continue;
		}
		TRY("send", nd_ep_send(s.ep, NULL, &sge, 1, 0));
		h = checksum_step(h, pat + off, n);
		outstanding++;
		sent += n;
		off = (off + n + 4093) % (PATTERN - msg);
	}
	while (outstanding) {
		if (wait_one(&s).op == ND_OP_SEND)
			outstanding--;
	}
	t1 = now_s();
	{
		uint8_t *tail = s.buf + PATTERN;
		struct nd_sge sge = { tail, 8, s.mr };

		memcpy(tail, &h, 8);
		TRY("send checksum", nd_ep_send(s.ep, NULL, &sge, 1, 0));
		(void)wait_op(&s, ND_OP_SEND);
	}
	printf("send/receive: %" PRIu64 " bytes in %zu-byte messages, %.3f s, %.0f MB/s, "
	       "checksum %016" PRIx64 " verified by the receiver\n",
	       sent, msg, t1 - t0, sent / (t1 - t0) / 1e6, h);
	/* the descriptor of the server's window (which may have come first) */
	(void)wait_op(&s, ND_OP_RECEIVE);
	memcpy(d, s.buf + (size_t)(PATTERN + msg) / 64 * 64, sizeof(d));
	{
		struct nd_mw_descriptor desc = { d[0], d[1], d[2] };
		uint64_t read = 0, rounds = 0;
		const size_t chunk = 1u << 20;

		t0 = now_s();
		while (read < bytes) {
			uint64_t hh = 0xcbf29ce484222325ull;

			for (uint64_t o = 0; o < desc.length; o += chunk) {
				struct nd_sge sge = { pat + o, (uint32_t)chunk, s.mr };

				TRY("read", nd_ep_read(s.ep, NULL, &sge, 1, &desc, o, 0));
				(void)wait_op(&s, ND_OP_READ);
			}
			hh = checksum_step(hh, pat, desc.length);
			if (hh != d[3]) {
				fprintf(stderr, "wsd demo: read checksum MISMATCH\n");
				return 1;
			}
			read += desc.length;
			rounds++;
		}
		t1 = now_s();
		printf("read:         %" PRIu64 " bytes in 1 MiB reads from a %" PRIu64
		       "-byte window, %.3f s, %.0f MB/s, checksum %016" PRIx64
		       " verified %" PRIu64 " times\n", read, desc.length, t1 - t0,
		       read / (t1 - t0) / 1e6, d[3], rounds);
		{
			struct nd_sge sge = { s.buf + PATTERN, 0, s.mr };

			TRY("send and invalidate",
			    nd_ep_send_invalidate(s.ep, NULL, &sge, 0, &desc, 0));
			(void)wait_op(&s, ND_OP_SEND_INVALIDATE);
		}
	}
	/* either end may disconnect first; the other then finds it done */
	(void)nd_ep_disconnect(s.ep);
	side_close(&s);
	return 0;
}

static uint64_t parse_size(const char *s)
{
	char *end;
	uint64_t v = strtoull(s, &end, 10);

	switch (*end) {
	case 'G': case 'g': v <<= 30; break;
	case 'M': case 'm': v <<= 20; break;
	case 'K': case 'k': v <<= 10; break;
	default: break;
	}
	return v;
}

int cmd_demo(int argc, char **argv)
{
	uint64_t bytes = 1ull << 30;
	size_t msg = 64 << 10;
	struct sockaddr_in sa = { .sin_family = AF_INET,
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int fds[2], status, rc;
	pid_t pid;
	char c;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--bytes") && i + 1 < argc)
			bytes = parse_size(argv[++i]);
		else if (!strcmp(argv[i], "--msg") && i + 1 < argc)
			msg = parse_size(argv[++i]);
		else {
			fprintf(stderr, "usage: wsd demo [--bytes N[K|M|G]] [--msg N[K|M]]\n");
			return 2;
		}
	}
	if (msg < 64 || msg > (1u << 24) || !bytes) {
		fprintf(stderr, "wsd demo: --msg must be 64 B to 16 MiB, --bytes above 0\n");
		return 2;
	}
	sa.sin_port = htons((uint16_t)(40000 + getpid() % 20000));
	if (pipe(fds) < 0)
		return 1;
	pid = fork();
	if (pid < 0)
		return 1;
	if (pid == 0) {
		close(fds[0]);
		_exit(server(&sa, bytes, msg, fds[1]));
	}
	close(fds[1]);
	if (read(fds[0], &c, 1) != 1) {
		fprintf(stderr, "wsd demo: the listening process failed\n");
		return 1;
	}
	printf("wsd demo: two processes (%d and %d), %" PRIu64 " bytes each way\n",
	       (int)getpid(), (int)pid, bytes);
	fflush(stdout);
	rc = client(&sa, bytes, msg);
	if (rc)
		kill(pid, SIGKILL);
	if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status))
		rc = 1;
	printf("wsd demo: %s\n", rc ? "FAILED" : "all checksums verified");
	return rc;
}

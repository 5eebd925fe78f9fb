/* SPDX-License-Identifier: MIT */
/*
 * nd_xfer: move a checksummed stream between two processes, possibly on two
 * hosts, through the public endpoint API, on whatever transport
 * nd_adapter_open(NULL) picks (WSD_TRANSPORT).  Used by the VM rig
 * (tests/vm/) to run the verbs transport across two network namespaces.
 *
 *   nd_xfer server ADDR PORT
 *   nd_xfer client ADDR PORT BYTES[K|M|G]
 *
 * Protocol, on one connection:
 *   client -> server  header   { XFER_MAGIC, BYTES }
 *   client -> server  BYTES of data in 64 KiB messages
 *   client -> server  trailer  { TRAILER_MAGIC, running hash of the data }
 *   server -> client  offer    { OFFER_MAGIC, stream verdict, server's hash,
 *                                window base, length, token, pattern hash }
 *   client             reads the whole window in 256 KiB nd_ep_read()s
 *   client -> server  send-and-invalidate of the window, carrying
 *                              { DONE_MAGIC, window verdict }
 * Each side exits 0 only when every checksum matched.  Every wait gives up
 * after WAIT_LIMIT_S seconds without a result.
 */
#include <inttypes.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "wsd/checksum.h"
#include "wsd/nd.h"

#define MSG_SIZE      (64u << 10)
#define READ_SIZE     (256u << 10)
#define WINDOW_SIZE   (8u << 20)
#define SOURCE_SIZE   (1u << 20)   /* the client's data is drawn from here */
#define NRECV         16           /* receives the server keeps posted */
#define MAX_SENDS     8            /* sends the client keeps in flight */
#define MAX_READS     4            /* reads the client keeps in flight */
#define CQ_DEPTH      256
#define WAIT_STEP_MS  1000
#define WAIT_LIMIT_S  60
#define CONNECT_MS    10000
#define CONNECT_RETRY_S 30

#define XFER_MAGIC    0x31524546585f444eull   /* "ND_XFER1" */
#define TRAILER_MAGIC 0x4c49415254524546ull
#define OFFER_MAGIC   0x524546464f524546ull
#define DONE_MAGIC    0x454e4f44524546ull

#define HASH_SEED     0xcbf29ce484222325ull

struct hdr_msg     { uint64_t magic, bytes; };
struct trailer_msg { uint64_t magic, hash; };
struct offer_msg   { uint64_t magic, stream_ok, server_hash, base, length, token, pattern_hash; };
struct done_msg    { uint64_t magic, window_ok; };

static const char *role = "nd_xfer";

static void fail(const char *fmt, ...)
{
	va_list ap;

	fflush(stdout);
	fprintf(stderr, "%s: FAIL: ", role);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

static void try(const char *what, nd_status st)
{
	if (st != ND_SUCCESS)
		fail("%s: %s", what, nd_strstatus(st));
}

static void say(const char *fmt, ...)
{
	va_list ap;

	printf("%s: ", role);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static double rate_mb(uint64_t bytes, double secs)
{
	return secs > 0 ? bytes / secs / 1e6 : 0.0;
}


static void fill_random(uint8_t *p, size_t n, uint64_t x)
{
	for (size_t i = 0; i + 8 <= n; i += 8) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		memcpy(p + i, &x, 8);
	}
}

static uint64_t parse_size(const char *s)
{
	char *end;
	unsigned long long v;

	if (!*s || *s == '-')
		fail("bad size '%s'", s);
	v = strtoull(s, &end, 10);
	switch (*end) {
	case 'G': case 'g': v <<= 30; end++; break;
	case 'M': case 'm': v <<= 20; end++; break;
	case 'K': case 'k': v <<= 10; end++; break;
	default: break;
	}
	if (*end)
		fail("bad size '%s'", s);
	return v;
}

static socklen_t parse_addr(const char *host, const char *port, struct sockaddr_storage *ss)
{
	struct addrinfo hints = { .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV,
				  .ai_socktype = SOCK_STREAM };
	struct addrinfo *ai;
	socklen_t len;
	int rc = getaddrinfo(host, port, &hints, &ai);

	if (rc)
		fail("address %s port %s: %s", host, port, gai_strerror(rc));
	memcpy(ss, ai->ai_addr, ai->ai_addrlen);
	len = ai->ai_addrlen;
	freeaddrinfo(ai);
	return len;
}

/* ---- one side of the connection ----------------------------------------- */

struct side {
	struct nd_adapter *ad;
	struct nd_adapter_info info;
	struct nd_cq *cq;
	struct nd_ep *ep;
	struct nd_ep_attr attr;
	uint8_t *buf;
	size_t buflen;
	struct nd_mr *mr;
};

static uint32_t min_u32(uint32_t a, uint32_t b)
{
	return a < b ? a : b;
}

static void side_open(struct side *s, size_t buflen, uint32_t mr_flags, uint32_t read_limit)
{
	memset(s, 0, sizeof(*s));
	try("open adapter (WSD_TRANSPORT chooses)", nd_adapter_open(NULL, &s->ad));
	try("query adapter", nd_adapter_query(s->ad, &s->info));
	if (s->info.max_transfer_length < READ_SIZE)
		fail("the adapter's largest transfer (%" PRIu64 " bytes) is below %u",
		     s->info.max_transfer_length, READ_SIZE);
	try("create completion queue",
	    nd_cq_create(s->ad, min_u32(CQ_DEPTH, s->info.max_cq_entries), &s->cq));
	s->attr.inbound_cq = s->attr.outbound_cq = s->cq;
	s->attr.inbound_entries = min_u32(32, s->info.max_inbound_requests);
	s->attr.outbound_entries = min_u32(32, s->info.max_outbound_requests);
	s->attr.inbound_sge = 1;
	s->attr.outbound_sge = 1;
	s->attr.inbound_read_limit = min_u32(read_limit, s->info.max_inbound_read_limit);
	if (s->attr.inbound_entries < NRECV + 2 || s->attr.outbound_entries < MAX_SENDS + 2)
		fail("the adapter allows too few outstanding requests (%u in, %u out)",
		     s->info.max_inbound_requests, s->info.max_outbound_requests);
	try("create endpoint", nd_ep_create(s->ad, &s->attr, &s->ep));
	s->buflen = (buflen + 4095) & ~(size_t)4095;
	s->buf = aligned_alloc(4096, s->buflen);
	if (!s->buf)
		fail("cannot allocate %zu bytes", s->buflen);
	memset(s->buf, 0, s->buflen);
	try("register memory", nd_mr_register(s->ad, s->buf, s->buflen, mr_flags, &s->mr));
}

static void side_close(struct side *s)
{
	try("destroy endpoint", nd_ep_destroy(s->ep));
	try("deregister memory", nd_mr_deregister(s->mr));
	try("destroy completion queue", nd_cq_destroy(s->cq));
	try("close adapter", nd_adapter_close(s->ad));
	free(s->buf);
}

static const char *op_name(enum nd_op op)
{
	switch (op) {
	case ND_OP_SEND: return "send";
	case ND_OP_SEND_INVALIDATE: return "send-and-invalidate";
	case ND_OP_RECEIVE: return "receive";
	case ND_OP_READ: return "read";
	case ND_OP_WRITE: return "write";
	case ND_OP_BIND: return "bind";
	case ND_OP_INVALIDATE: return "invalidate";
	case ND_OP_REMOTE_INVALIDATE: return "remote invalidate";
	}
	return "?";
}

/* Next result, successful; fails after WAIT_LIMIT_S seconds without one. */
static struct nd_result next_result(struct side *s, const char *waiting_for)
{
	struct nd_result r;
	double give_up = now_s() + WAIT_LIMIT_S;
	int n;

	while ((n = nd_cq_poll(s->cq, &r, 1)) == 0) {
		nd_status st;

		if (now_s() > give_up)
			fail("no completion for %d s while waiting for %s", WAIT_LIMIT_S,
			     waiting_for);
		st = nd_cq_wait(s->cq, WAIT_STEP_MS);
		if (st != ND_SUCCESS && st != ND_TIMEOUT)
			fail("waiting for %s: nd_cq_wait: %s", waiting_for, nd_strstatus(st));
	}
	if (n < 0)
		fail("waiting for %s: nd_cq_poll: %s", waiting_for, nd_strstatus((nd_status)-n));
	if (r.status != ND_SUCCESS)
		fail("%s failed while waiting for %s: %s", op_name(r.op), waiting_for,
		     nd_strstatus(r.status));
	return r;
}

static struct nd_result next_of(struct side *s, enum nd_op op, const char *waiting_for)
{
	struct nd_result r = next_result(s, waiting_for);

	if (r.op != op)
		fail("unexpected %s result while waiting for %s", op_name(r.op), waiting_for);
	return r;
}

/* ---- server ------------------------------------------------------------- */

static void post_slot(struct side *s, unsigned slot)
{
	struct nd_sge sge = { s->buf + (size_t)slot * MSG_SIZE, MSG_SIZE, s->mr };

	try("post receive", nd_ep_receive(s->ep, (void *)(uintptr_t)slot, &sge, 1));
}

static const uint8_t *slot_data(struct side *s, const struct nd_result *r)
{
	return s->buf + (size_t)(uintptr_t)r->request_context * MSG_SIZE;
}

static int server(const char *host, const char *port)
{
	struct sockaddr_storage ss;
	socklen_t sslen = parse_addr(host, port, &ss);
	struct side s;
	struct nd_listener *l;
	struct nd_conn_request *req;
	struct nd_mw *mw;
	struct nd_mw_descriptor d;
	struct nd_result r, final;
	struct hdr_msg hdr;
	struct trailer_msg tr;
	struct done_msg done;
	struct offer_msg *offer;
	const size_t slots = (size_t)NRECV * MSG_SIZE;
	uint8_t *pattern;
	uint64_t want, got = 0, msgs = 0, h = HASH_SEED, pattern_hash;
	int bind_ctx, stream_ok, invalidated = 0;
	double t0, t1;

	role = "nd_xfer server";
	side_open(&s, slots + WINDOW_SIZE + 4096,
		  ND_MR_FLAG_ALLOW_LOCAL_WRITE | ND_MR_FLAG_ALLOW_REMOTE_READ, 8);
	if (s.info.max_window_size < WINDOW_SIZE)
		fail("the adapter's largest window (%" PRIu64 " bytes) is below %u",
		     s.info.max_window_size, WINDOW_SIZE);
	pattern = s.buf + slots;
	offer = (struct offer_msg *)(pattern + WINDOW_SIZE);
	try("listen", nd_listen(s.ad, (struct sockaddr *)&ss, sslen, 4, &l));
	say("transport %s, listening on %s port %s", s.info.transport, host, port);

	try("wait for a connection request", nd_listen_get_request(l, WAIT_LIMIT_S * 1000, &req));
	for (unsigned i = 0; i < NRECV; i++)
		post_slot(&s, i);
	try("accept", nd_ep_accept(s.ep, req, NULL, 0, CONNECT_MS));
	say("connected");

	r = next_of(&s, ND_OP_RECEIVE, "the header");
	if (r.bytes != sizeof(hdr))
		fail("header of %" PRIu64 " bytes, expected %zu", r.bytes, sizeof(hdr));
	memcpy(&hdr, slot_data(&s, &r), sizeof(hdr));
	if (hdr.magic != XFER_MAGIC)
		fail("the peer does not speak the nd_xfer protocol");
	want = hdr.bytes;
	post_slot(&s, (unsigned)(uintptr_t)r.request_context);

	t0 = now_s();
	while (got < want) {
		r = next_of(&s, ND_OP_RECEIVE, "data");
		if (r.bytes == 0 || r.bytes > want - got)
			fail("message %" PRIu64 " of %" PRIu64 " bytes after %" PRIu64
			     " of %" PRIu64 " bytes", msgs, r.bytes, got, want);
		h = checksum_step(h, slot_data(&s, &r), r.bytes);
		got += r.bytes;
		msgs++;
		post_slot(&s, (unsigned)(uintptr_t)r.request_context);
	}
	t1 = now_s();
	r = next_of(&s, ND_OP_RECEIVE, "the checksum");
	if (r.bytes != sizeof(tr))
		fail("checksum message of %" PRIu64 " bytes, expected %zu", r.bytes, sizeof(tr));
	memcpy(&tr, slot_data(&s, &r), sizeof(tr));
	if (tr.magic != TRAILER_MAGIC)
		fail("checksum message has a bad magic");
	post_slot(&s, (unsigned)(uintptr_t)r.request_context);
	stream_ok = tr.hash == h;
	say("received %" PRIu64 " bytes in %" PRIu64 " messages, %.3f s, %.1f MB/s, "
	    "checksum %016" PRIx64 ", client's %016" PRIx64 ": %s", got, msgs, t1 - t0,
	    rate_mb(got, t1 - t0), h, tr.hash, stream_ok ? "match" : "MISMATCH");

	/* Offer a window over a random pattern, with the verdict on the stream. */
	fill_random(pattern, WINDOW_SIZE, 0x9e3779b97f4a7c15ull ^ h);
	pattern_hash = checksum_step(HASH_SEED, pattern, WINDOW_SIZE);
	try("create window", nd_mw_create(s.ad, &mw));
	try("bind window", nd_ep_bind(s.ep, &bind_ctx, s.mr, mw, pattern, WINDOW_SIZE,
				      ND_OP_FLAG_ALLOW_READ, &d));
	r = next_of(&s, ND_OP_BIND, "the bind");
	offer->magic = OFFER_MAGIC;
	offer->stream_ok = (uint64_t)stream_ok;
	offer->server_hash = h;
	offer->base = d.base;
	offer->length = d.length;
	offer->token = d.token;
	offer->pattern_hash = pattern_hash;
	{
		struct nd_sge sge = { offer, sizeof(*offer), s.mr };

		try("send window descriptor", nd_ep_send(s.ep, NULL, &sge, 1, 0));
	}
	say("bound a %u-byte window, checksum %016" PRIx64 "; sending its descriptor",
	    WINDOW_SIZE, pattern_hash);
	if (!stream_ok)
		fail("send/receive checksum mismatch");

	/* The client ends with a send-and-invalidate: first the invalidation, then
	 * the receive that took its message.  Both may come before our send's result. */
	for (int sent = 0, last = 0; !sent || !last; ) {
		r = next_result(&s, "the client's send-and-invalidate");
		switch (r.op) {
		case ND_OP_SEND:
			sent = 1;
			break;
		case ND_OP_REMOTE_INVALIDATE:
			if (r.request_context != &bind_ctx)
				fail("remote invalidation carries the wrong context");
			invalidated = 1;
			break;
		case ND_OP_RECEIVE:
			if (last)
				fail("a message after the client's last one");
			last = 1;
			final = r;
			break;
		default:
			fail("unexpected %s result while waiting for the invalidation",
			     op_name(r.op));
		}
	}
	r = final;
	if (!invalidated)
		fail("the client's last message came without invalidating the window");
	if (r.bytes != sizeof(done))
		fail("last message of %" PRIu64 " bytes, expected %zu", r.bytes, sizeof(done));
	memcpy(&done, slot_data(&s, &r), sizeof(done));
	if (done.magic != DONE_MAGIC)
		fail("last message has a bad magic");
	if (!done.window_ok)
		fail("the client read the window with a wrong checksum");
	say("window invalidated by the client, which verified its checksum");

	/* The window is unbound now: tear down in order (window, endpoint, region). */
	try("destroy window", nd_mw_destroy(mw));
	(void)nd_ep_disconnect(s.ep);   /* the client may have ended it already */
	try("close listener", nd_listen_close(l));
	side_close(&s);
	say("OK: transport %s, stream of %" PRIu64 " bytes and window of %u bytes verified",
	    s.info.transport, got, WINDOW_SIZE);
	return 0;
}

/* ---- client ------------------------------------------------------------- */

static void client_connect(struct side *s, const struct sockaddr *sa, socklen_t salen,
			   struct nd_sge *offer_sge)
{
	double give_up = now_s() + CONNECT_RETRY_S;

	for (;;) {
		nd_status st;

		try("post receive", nd_ep_receive(s->ep, NULL, offer_sge, 1));
		st = nd_ep_connect(s->ep, sa, salen, NULL, 0, CONNECT_MS);
		if (st == ND_SUCCESS)
			return;
		if (st != ND_CONNECTION_REFUSED)
			fail("connect: %s", nd_strstatus(st));
		if (now_s() > give_up)
			fail("connect: %s (retried for %d s)", nd_strstatus(st), CONNECT_RETRY_S);
		/* Nobody listens yet: start over on a fresh endpoint. */
		try("destroy endpoint", nd_ep_destroy(s->ep));
		while (nd_cq_poll(s->cq, &(struct nd_result){ 0 }, 1) > 0)
			;
		try("create endpoint", nd_ep_create(s->ad, &s->attr, &s->ep));
		usleep(250000);
	}
}

static int client(const char *host, const char *port, uint64_t bytes)
{
	struct sockaddr_storage ss;
	socklen_t sslen = parse_addr(host, port, &ss);
	struct side s;
	uint8_t *source, *window, *ctl;
	struct offer_msg offer;
	struct nd_sge offer_sge;
	struct nd_result r;
	struct nd_mw_descriptor d;
	uint64_t sent = 0, msgs = 0, off = 0, h = HASH_SEED, wh;
	unsigned inflight = 0;
	int window_ok;
	double t0, t1;

	role = "nd_xfer client";
	side_open(&s, SOURCE_SIZE + WINDOW_SIZE + 4096, ND_MR_FLAG_ALLOW_LOCAL_WRITE, 0);
	source = s.buf;
	window = s.buf + SOURCE_SIZE;
	ctl = window + WINDOW_SIZE;   /* 4 KiB: header, trailer, offer, done */
	fill_random(source, SOURCE_SIZE, 88172645463325252ull);
	offer_sge = (struct nd_sge){ ctl + 1024, sizeof(offer), s.mr };
	say("transport %s, connecting to %s port %s", s.info.transport, host, port);
	client_connect(&s, (struct sockaddr *)&ss, sslen, &offer_sge);
	say("connected; sending %" PRIu64 " bytes in %u-byte messages", bytes, MSG_SIZE);

	{
		struct hdr_msg hdr = { XFER_MAGIC, bytes };
		struct nd_sge sge = { ctl, sizeof(hdr), s.mr };

		memcpy(ctl, &hdr, sizeof(hdr));
		try("send header", nd_ep_send(s.ep, NULL, &sge, 1, 0));
		r = next_of(&s, ND_OP_SEND, "the header's send");
	}

	t0 = now_s();
	while (sent < bytes || inflight) {
		if (sent < bytes && inflight < MAX_SENDS) {
			uint32_t n = bytes - sent < MSG_SIZE ? (uint32_t)(bytes - sent) : MSG_SIZE;
			struct nd_sge sge = { source + off, n, s.mr };

			try("send", nd_ep_send(s.ep, NULL, &sge, 1, 0));
			h = checksum_step(h, source + off, n);
			sent += n;
			msgs++;
			inflight++;
			/* vary the data: every message starts somewhere else */
			off = (off + n + 4093) % (SOURCE_SIZE - MSG_SIZE);
			continue;
		}
		r = next_of(&s, ND_OP_SEND, "data sends");
		inflight--;
	}
	t1 = now_s();
	{
		struct trailer_msg tr = { TRAILER_MAGIC, h };
		struct nd_sge sge = { ctl + 64, sizeof(tr), s.mr };

		memcpy(ctl + 64, &tr, sizeof(tr));
		try("send checksum", nd_ep_send(s.ep, NULL, &sge, 1, 0));
	}
	say("sent %" PRIu64 " bytes in %" PRIu64 " messages, %.3f s, %.1f MB/s, checksum %016"
	    PRIx64, sent, msgs, t1 - t0, rate_mb(sent, t1 - t0), h);

	/* The server's answer may arrive before our send's result. */
	for (int sent_ok = 0, got_offer = 0; !sent_ok || !got_offer; ) {
		r = next_result(&s, "the window descriptor");
		if (r.op == ND_OP_SEND) {
			sent_ok = 1;
		} else if (r.op == ND_OP_RECEIVE && !got_offer) {
			got_offer = 1;
			if (r.bytes != sizeof(offer))
				fail("descriptor message of %" PRIu64 " bytes, expected %zu",
				     r.bytes, sizeof(offer));
		} else {
			fail("unexpected %s result while waiting for the window descriptor",
			     op_name(r.op));
		}
	}
	memcpy(&offer, ctl + 1024, sizeof(offer));
	if (offer.magic != OFFER_MAGIC)
		fail("descriptor message has a bad magic");
	if (!offer.stream_ok || offer.server_hash != h)
		fail("the server's checksum %016" PRIx64 " differs from ours %016" PRIx64,
		     offer.server_hash, h);
	say("send/receive checksum %016" PRIx64 " matches the server's", h);
	if (offer.length != WINDOW_SIZE)
		fail("window of %" PRIu64 " bytes, expected %u", offer.length, WINDOW_SIZE);

	d = (struct nd_mw_descriptor){ offer.base, offer.length, offer.token };
	{
		uint64_t posted = 0, reads = 0;
		unsigned outstanding = 0;

		t0 = now_s();
		while (posted < d.length || outstanding) {
			if (posted < d.length && outstanding < MAX_READS) {
				uint32_t n = d.length - posted < READ_SIZE ?
					     (uint32_t)(d.length - posted) : READ_SIZE;
				struct nd_sge sge = { window + posted, n, s.mr };

				try("read", nd_ep_read(s.ep, NULL, &sge, 1, &d, posted, 0));
				posted += n;
				reads++;
				outstanding++;
				continue;
			}
			r = next_of(&s, ND_OP_READ, "reads");
			outstanding--;
		}
		t1 = now_s();
		wh = checksum_step(HASH_SEED, window, d.length);
		window_ok = wh == offer.pattern_hash;
		say("read %" PRIu64 " bytes in %" PRIu64 " reads of %u bytes, %.3f s, %.1f MB/s, "
		    "checksum %016" PRIx64 ", server's %016" PRIx64 ": %s", d.length, reads,
		    READ_SIZE, t1 - t0, rate_mb(d.length, t1 - t0), wh, offer.pattern_hash,
		    window_ok ? "match" : "MISMATCH");
	}
	{
		struct done_msg dm = { DONE_MAGIC, (uint64_t)window_ok };
		struct nd_sge sge = { ctl + 128, sizeof(dm), s.mr };

		memcpy(ctl + 128, &dm, sizeof(dm));
		try("send and invalidate",
		    nd_ep_send_invalidate(s.ep, NULL, &sge, 1, &d, 0));
		r = next_of(&s, ND_OP_SEND_INVALIDATE, "the send-and-invalidate");
	}
	if (!window_ok)
		fail("read checksum mismatch");
	(void)nd_ep_disconnect(s.ep);   /* the server may have ended it already */
	side_close(&s);
	say("OK: transport %s, %" PRIu64 " bytes sent and a %u-byte window read, "
	    "checksums verified", s.info.transport, sent, WINDOW_SIZE);
	return 0;
}

static void usage(void)
{
	fprintf(stderr, "usage: nd_xfer server ADDR PORT\n"
			"       nd_xfer client ADDR PORT BYTES[K|M|G]\n"
			"The transport comes from WSD_TRANSPORT (auto, shm or verbs).\n");
	exit(2);
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 4 && !strcmp(argv[1], "server"))
		return server(argv[2], argv[3]);
	if (argc == 5 && !strcmp(argv[1], "client"))
		return client(argv[2], argv[3], parse_size(argv[4]));
	usage();
	return 2;
}

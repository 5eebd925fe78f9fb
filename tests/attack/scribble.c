/* SPDX-License-Identifier: MIT */
/*
 * A peer that passes every check a wsd server makes of who it is (it holds
 * its TCP connection and proves it) and then writes what wsd-protocol(7)
 * forbids into the server's region: records and control words out of
 * bounds.  For tests/attack/scribble_check.sh.
 *
 *   scribble PORT [ADDR]      every case in turn, each on a connection of
 *                             its own; a line per case
 *
 * Each case must end in the server resetting that connection (our TCP
 * stream ends with a reset or an end of file) within 10 s.  Exit 0 when
 * every case did.  Bounded: every wait has a limit.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "tests/attack/peer.h"

#define RING 16384u                  /* ours; the server's is theirs.ring_size */
#define STAGE (128u << 10)

struct conn {
	int fd;                      /* the TCP connection */
	SOCKET ws;                   /* the provider connection */
	uint8_t *region;             /* ours: control area and ring */
	uint8_t *stage;              /* what we write, registered */
	uint64_t stage_h;
	struct p_hello mine, theirs;
	uint64_t pos;                /* our position in the server's ring */
	uint64_t bells;              /* doorbells we wrote on the stream */
};

static const char *addr = "127.0.0.1";
static uint8_t *region, *stage;

static int64_t now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static int dial(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	int one = 1, fd = socket(AF_INET, SOCK_STREAM, 0);

	inet_pton(AF_INET, addr, &a.sin_addr);
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a))) {
		perror("scribble: connect");
		exit(2);
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &(struct timeval){ 10, 0 },
		   sizeof(struct timeval));   /* every blocking read is bounded */
	return fd;
}

/* A control word of ours that the server wrote, when its check holds. */
static uint64_t word(const struct conn *c, int w)
{
	const volatile uint64_t *p = (const volatile uint64_t *)(c->region + 16 * w);
	uint64_t v = p[0];

	return p[1] == ~v ? v : 0;
}

/* A control word into the server's region: value, then its check. */
static int put_word(struct conn *c, int w, uint64_t v)
{
	uint64_t pair[2] = { v, ~v };

	memcpy(c->stage, pair, sizeof(pair));
	return p_write(c->ws, c->stage, 16, c->stage_h, c->theirs.desc,
		       c->theirs.slot_off + 16 * (uint64_t)w);
}

/*
 * A record into the server's ring at our position, in the pieces and the
 * order the page gives: len and type, the stamp, the payload, the trailer.
 * size: the bytes it takes (the caller's lie, for a malformed one).
 */
static int put_record(struct conn *c, uint32_t len, uint32_t type, const void *payload,
		      uint32_t plen, uint32_t size)
{
	uint32_t ring = c->theirs.ring_size;
	uint64_t off = P_CTL + c->pos % ring, stamp = c->pos ^ c->theirs.key;
	uint32_t hdr[2] = { len, type };
	uint64_t trailer[2] = { stamp, 0 };
	/* the trailer where len puts it, when that is inside the ring */
	uint64_t room = P_CTL + ring - off - 32;
	uint32_t padded = ((uint64_t)len + 15u) / 16u * 16u <= room && len <= STAGE - 64 ?
			  (len + 15u) & ~15u : (plen + 15u) & ~15u;

	memcpy(c->stage, hdr, 8);
	memcpy(c->stage + 8, &stamp, 8);
	memset(c->stage + 16, 0, padded);
	if (plen)
		memcpy(c->stage + 16, payload, plen);
	memcpy(c->stage + 16 + padded, trailer, 16);
	off += c->theirs.slot_off;   /* the server's slot in its segment */
	if (p_write(c->ws, c->stage, 8, c->stage_h, c->theirs.desc, off) ||
	    p_write(c->ws, c->stage + 8, 8, c->stage_h, c->theirs.desc, off + 8) ||
	    (padded && p_write(c->ws, c->stage + 16, padded, c->stage_h, c->theirs.desc,
			       off + 16)) ||
	    (type != P_PAD && p_write(c->ws, c->stage + 16 + padded, 16, c->stage_h,
				      c->theirs.desc, off + 16 + padded)))
		return -1;
	c->pos += size;
	return 0;
}

static int put_data(struct conn *c, const char *s)
{
	uint32_t n = (uint32_t)strlen(s);

	return put_record(c, n, P_DATA, s, n, 32 + ((n + 15u) & ~15u));
}

static int put_word(struct conn *c, int w, uint64_t v);

/* A doorbell as the page has it: counted in bells first, bell i the byte i mod 256. */
static void bell(struct conn *c)
{
	uint8_t b = (uint8_t)(c->bells + 1);

	if (put_word(c, W_BELLS, c->bells << 1 | 1))
		return;
	if (send(c->fd, &b, 1, MSG_NOSIGNAL | MSG_DONTWAIT) == 1)
		c->bells++;
	else
		put_word(c, W_BELLS, c->bells << 1);
}

/* Wait up to ms for a word of ours to become nonzero. */
static uint64_t await_word(const struct conn *c, int w, int ms)
{
	int64_t end = now_ms() + ms;
	uint64_t v;

	while (!(v = word(c, w)) && now_ms() < end)
		usleep(1000);
	return v;
}

/*
 * Connect, upgrade as an honest switch would, switch our direction and
 * prove it: after this the server reads our ring.  0, or -1 with why.
 */
static int open_conn(struct conn *c, int port, const char **why)
{
	struct p_tuple t;
	uint32_t dl = 32;
	uint64_t n = 0;
	char echo;
	int err;

	memset(c, 0, sizeof(*c));
	c->fd = dial(port);
	p_tuple_of(c->fd, &t);
	c->ws = p_request(addr, port, &t);
	if (c->ws == INVALID_SOCKET)
		return *why = "no provider connection", -1;
	/*
	 * One region and one stage for every case, registered anew on each
	 * connection: memory freed and allocated again at the same address
	 * would meet the provider's registration cache still holding the old
	 * pages (the memory hooks, which would tell it, are not here).
	 */
	if (!region)
		region = aligned_alloc(4096, (P_CTL + RING + 4095) / 4096 * 4096);
	if (!stage)
		stage = aligned_alloc(4096, STAGE);
	if (!region || !stage)
		return *why = "out of memory", -1;
	c->region = region;
	c->stage = stage;
	memset(c->region, 0, P_CTL + RING);
	c->mine = (struct p_hello){ .magic = P_MAGIC, .version = P_VERSION, .kind = P_HELLO,
				    .ring_size = RING, .region_fd = -1,
				    .seg_len = P_SEG_LEN(RING) };
	if (getrandom(&c->mine.key, 8, 0) != 8 || getrandom(c->mine.nonce, 16, 0) != 16)
		return *why = "getrandom", -1;
	c->mine.key |= 1;
	if (p_procs.lpWSPRegisterRdmaMemory(c->ws, c->region, P_CTL + RING, MEM_WRITE,
					    c->mine.desc, &dl, &err))
		return *why = "cannot register our region", -1;
	c->stage_h = p_procs.lpWSPRegisterMemory(c->ws, c->stage, STAGE, MEM_READ, &err);
	if (!c->stage_h)
		return *why = "cannot register the stage", -1;
	if (p_send(c->ws, &c->mine) || p_recv(c->ws, &c->theirs, 10000))
		return *why = "no answer to HELLO", -1;
	if (c->theirs.kind != P_ACCEPT || c->theirs.ring_size < 16384) {
		static char r[64];

		snprintf(r, sizeof(r), "refused (kind %u, reason %u)", c->theirs.kind,
			 c->theirs.reason);
		return *why = r, -1;
	}
	/*
	 * A byte by the stream first, as a program would: the server says it
	 * is ready for the ring once no read of its program waits on the
	 * stream.  Its echo comes back by the stream.
	 */
	for (int i = 0; i < 100 && !word(c, W_RX_READY); i++, n++) {
		ssize_t k;

		if (send(c->fd, "a", 1, MSG_NOSIGNAL) != 1)
			return *why = "cannot send by the stream", -1;
		/* the provider's threads may interrupt us with a signal: not the server's doing */
		do
			k = recv(c->fd, &echo, 1, MSG_WAITALL);
		while (k < 0 && errno == EINTR);
		if (k != 1 || echo != ('a' ^ 0x5a)) {
			static char b[96];

			snprintf(b, sizeof(b), "no echo by the stream (recv %zd, %s, byte 0x%02x)", k,
				 k < 0 ? strerror(errno) : "-", k == 1 ? (uint8_t)echo : 0);
			return *why = b, -1;
		}
		/* as the page says: switch only once the server is ready for it */
		await_word(c, W_RX_READY, 100);
	}
	if (!word(c, W_RX_READY))
		return *why = "no rx_ready", -1;
	if (put_record(c, 8, P_SWITCH, &n, 8, 48))
		return *why = "cannot write SWITCH", -1;
	if (send(c->fd, c->theirs.nonce, 16, MSG_NOSIGNAL) != 16)
		return *why = "cannot write the proof", -1;
	/* and let the server send to us by ring too */
	if (put_word(c, W_RX_READY, 1))
		return *why = "cannot write rx_ready", -1;
	return 0;
}

/*
 * The end of the case: the server resets (ECONNRESET) or ends the stream
 * within 10 s, ringing it the while (a doorbell: we are in RING).  0, or
 * -1 with why.
 */
static int expect_reset(struct conn *c, const char **why)
{
	int64_t end = now_ms() + 10000;

	while (now_ms() < end) {
		struct pollfd q = { .fd = c->fd, .events = POLLIN };
		char b[256];
		ssize_t n;

		bell(c);
		if (poll(&q, 1, 100) <= 0)
			continue;
		n = recv(c->fd, b, sizeof(b), MSG_DONTWAIT);
		if (n == 0 || (n < 0 && errno == ECONNRESET))
			return 0;
		if (n < 0 && errno != EAGAIN && errno != EINTR)
			return *why = "the stream failed otherwise", -1;
		/* its proof, its doorbells, an echo by the stream: not what we wait for */
	}
	return *why = "no reset in 10 s", -1;
}

static void close_conn(struct conn *c)
{
	int err;

	if (c->stage_h)
		p_procs.lpWSPDeregisterMemory(c->ws, c->stage_h, &err);
	if (c->region)
		p_procs.lpWSPDeregisterRdmaMemory(c->ws, c->mine.desc, 32, &err);
	if (c->ws != INVALID_SOCKET)
		p_procs.lpWSPCloseSocket(c->ws, &err);
	close(c->fd);
}

/* ---- the cases: each writes one forbidden thing (or a few) ---------------- */

static int len_wrap(struct conn *c)
{
	/* 2^32 - 16: rounded up to 16 it wraps to 0 in 32 bits */
	return put_record(c, 0xfffffff0u, P_DATA, NULL, 0, 32);
}

static int pad_zero(struct conn *c)
{
	return put_record(c, 0, P_PAD, NULL, 0, 16);
}

static int pad_short(struct conn *c)
{
	return put_record(c, 16, P_PAD, NULL, 0, 16);
}

static int type_unknown(struct conn *c)
{
	uint64_t x = 0;

	return put_record(c, 8, 99, &x, 8, 48);
}

static int data_too_long(struct conn *c)
{
	/* longer than the page's limit for DATA: 65536 (or a quarter of the ring) */
	uint32_t len = c->theirs.ring_size / 4 < 65536 ? c->theirs.ring_size / 4 : 65536 + 16;

	return put_record(c, len, P_DATA, NULL, 0, 32 + len);
}

static int switch_twice(struct conn *c)
{
	uint64_t n = 0;

	return put_data(c, "x") || put_record(c, 8, P_SWITCH, &n, 8, 48);
}

static int zc_huge(struct conn *c)
{
	struct { uint64_t len; uint8_t desc[32]; } z = { 1ull << 40, { 0 } };

	return put_record(c, 40, P_ZC, &z, 40, 32 + 48);
}

static int wzc_unasked(struct conn *c)
{
	uint64_t w[2] = { 7, 1u << 20 };   /* an offer it never made, a length it has not */

	return put_record(c, 16, P_WZC, w, 16, 48);
}

static int split_unasked(struct conn *c)
{
	uint64_t sp[7] = { 7, 4096, 4096 };   /* an offer it never made; no descriptor */

	return put_record(c, 56, P_SPLIT, sp, 56, 96);
}

static int back_unannounced(struct conn *c)
{
	uint64_t bells = 1000;   /* back_bells never set to 1001 */

	return put_record(c, 8, P_BACK, &bells, 8, 48);
}

static int closed_bad(struct conn *c)
{
	return put_word(c, W_CLOSED, 7) || put_data(c, "x");
}

/* The server's credits: consumed beyond what it ever sent us. */
static int consumed_ahead(struct conn *c)
{
	return put_word(c, W_CONSUMED, 1ull << 40) || put_data(c, "echo me");
}

static const struct {
	const char *name;
	int (*fn)(struct conn *);
} cases[] = {
	{ "record length near 2^32", len_wrap },
	{ "PAD of length 0", pad_zero },
	{ "PAD short of the ring's end", pad_short },
	{ "record of an unknown type", type_unknown },
	{ "DATA longer than the page allows", data_too_long },
	{ "a second SWITCH", switch_twice },
	{ "ZC of 2^40 bytes", zc_huge },
	{ "WZC answering no offer", wzc_unasked },
	{ "SPLIT answering no offer", split_unasked },
	{ "BACK without its count", back_unannounced },
	{ "closed = 7", closed_bad },
	{ "consumed beyond what was sent", consumed_ahead },
};

int main(int argc, char **argv)
{
	int port, failed = 0;

	if (argc < 2 || argc > 3) {
		fprintf(stderr, "usage: scribble PORT [ADDR]\n");
		return 2;
	}
	port = atoi(argv[1]);
	if (argc == 3)
		addr = argv[2];
	if (p_start()) {
		fprintf(stderr, "scribble: no provider\n");
		return 2;
	}
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct conn c;
		const char *why = NULL;
		int r = open_conn(&c, port, &why);

		/*
		 * A write may fail part way: the server can judge a record by
		 * its header and reset before the rest lands.  The reset is
		 * what counts.
		 */
		if (!r) {
			(void)cases[i].fn(&c);
			r = expect_reset(&c, &why);
		}
		printf("%s: %s%s%s\n", cases[i].name, r ? "FAIL: " : "reset", r ? why : "", "");
		fflush(stdout);
		failed += r != 0;
		close_conn(&c);
	}
	printf("%d of %zu cases failed\n", failed, sizeof(cases) / sizeof(cases[0]));
	return failed ? 1 : 0;
}

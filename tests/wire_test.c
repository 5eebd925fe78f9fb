/* SPDX-License-Identifier: MIT */
/*
 * The checks of what a peer wrote (switch/wire.c): for each kind of message,
 * a valid one passes, each malformed field fails (for that reason), and the
 * boundaries sit where wsd-protocol(7) puts them.  The record tests build a
 * ring as a sender does and drive the very walk the switch runs.
 */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "switch/wire.h"

static const char *why;

#define VALID(e) do { why = NULL; int r_ = (e); ck_assert_msg(r_ == 0, "%s: %d (%s)", #e, r_, \
							  why ? why : ""); } while (0)
/* fails with -EPROTO, and names the check that failed (a word of it) */
#define BROKEN(e, word) do { why = NULL; int r_ = (e); ck_assert_int_eq(r_, -EPROTO); \
			     ck_assert_ptr_nonnull(why); \
			     ck_assert_msg(strstr(why, word), "%s: %s, want %s", #e, why, word); \
			} while (0)

/* ---- handshake ------------------------------------------------------------------- */

static struct wsd_hello hello(uint16_t kind)
{
	struct wsd_hello h = { .magic = WSD_PROTO_MAGIC, .version = WSD_PROTO_VERSION,
			       .kind = kind, .ring_size = 262144, .key = 0x1234567887654321ull,
			       .pid = 0, .region_fd = -1, .seg = 3, .slot_off = 0,
			       .seg_len = 67108864 + 2 * WSD_SEG_PAGE, .seg_tag = 7 };

	memset(h.desc, 0xab, sizeof(h.desc));
	memset(h.nonce, 0x5c, sizeof(h.nonce));
	return h;
}

START_TEST(hello_valid)
{
	struct wsd_hello h = hello(MSG_HELLO), a = hello(MSG_ACCEPT);
	struct wsd_hello f = { .magic = WSD_PROTO_MAGIC, .version = WSD_PROTO_VERSION,
			       .kind = MSG_REFUSE, .reason = 6 };

	VALID(wsd_wire_hello_check(&h, MSG_HELLO, &why));
	VALID(wsd_wire_hello_check(&a, MSG_ACCEPT, &why));
	/* a REFUSE is an answer too, with any reason (the receiver maps unknown ones) */
	VALID(wsd_wire_hello_check(&f, MSG_ACCEPT, &why));
	f.reason = 0xffffffffu;
	VALID(wsd_wire_hello_check(&f, MSG_ACCEPT, &why));
	/* moved: the one refusal with a field, the port of the registry to ask */
	f.seg = 40000;
	BROKEN(wsd_wire_hello_check(&f, MSG_ACCEPT, &why), "fields");
	f.reason = WSD_REASON_MOVED;
	VALID(wsd_wire_hello_check(&f, MSG_ACCEPT, &why));
	f.seg = 0;
	BROKEN(wsd_wire_hello_check(&f, MSG_ACCEPT, &why), "fields");
	f.seg = 65536;
	BROKEN(wsd_wire_hello_check(&f, MSG_ACCEPT, &why), "fields");
	f.seg = 40000;
	f.pid = 7;
	BROKEN(wsd_wire_hello_check(&f, MSG_ACCEPT, &why), "fields");
	f.pid = 0;
	/* policy: its seg says "every connection to the port", or nothing */
	f.reason = WSD_REASON_POLICY;
	BROKEN(wsd_wire_hello_check(&f, MSG_ACCEPT, &why), "fields");
	f.seg = WSD_REFUSE_EVERY;
	VALID(wsd_wire_hello_check(&f, MSG_ACCEPT, &why));
	f.seg = 0;
	VALID(wsd_wire_hello_check(&f, MSG_ACCEPT, &why));
	f.seg = 2;
	BROKEN(wsd_wire_hello_check(&f, MSG_ACCEPT, &why), "fields");
	/* shm: a pid and its memfd's descriptor */
	h.pid = 4242;
	h.region_fd = 0;
	VALID(wsd_wire_hello_check(&h, MSG_HELLO, &why));
}
END_TEST

START_TEST(hello_ring_size)
{
	static const struct { uint32_t size; bool ok; } cases[] = {
		{ 0, false }, { 1, false }, { 8192, false }, { 16383, false }, { 16384, true },
		{ 16385, false }, { 24576, false }, { 32768, true }, { 1u << 20, true },
		{ 67108864, true }, { 67108864 + 16, false }, { 134217728, false },
		{ 0x80000000u, false }, { 0xffffffffu, false },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct wsd_hello h = hello(MSG_HELLO);

		h.ring_size = cases[i].size;
		if (cases[i].ok)
			VALID(wsd_wire_hello_check(&h, MSG_HELLO, &why));
		else
			BROKEN(wsd_wire_hello_check(&h, MSG_HELLO, &why), "ring_size");
	}
}
END_TEST

START_TEST(hello_fields)
{
	struct wsd_hello h;

	h = hello(MSG_HELLO);
	h.magic ^= 1;
	BROKEN(wsd_wire_hello_check(&h, MSG_HELLO, &why), "magic");
	h = hello(MSG_HELLO);
	h.version = WSD_PROTO_VERSION + 1;
	ck_assert_int_eq(wsd_wire_hello_check(&h, MSG_HELLO, &why), -EPROTONOSUPPORT);
	h = hello(MSG_HELLO);
	h.version = WSD_PROTO_VERSION - 1;
	ck_assert_int_eq(wsd_wire_hello_check(&h, MSG_HELLO, &why), -EPROTONOSUPPORT);
	h = hello(MSG_ACCEPT);
	BROKEN(wsd_wire_hello_check(&h, MSG_HELLO, &why), "kind");
	h = hello(MSG_HELLO);
	BROKEN(wsd_wire_hello_check(&h, MSG_ACCEPT, &why), "kind");
	h = hello(MSG_REFUSE);
	h.reason = 5;
	BROKEN(wsd_wire_hello_check(&h, MSG_HELLO, &why), "kind");
	h = hello(9);
	BROKEN(wsd_wire_hello_check(&h, MSG_ACCEPT, &why), "kind");
	h = hello(MSG_HELLO);
	h.reason = 1;
	BROKEN(wsd_wire_hello_check(&h, MSG_HELLO, &why), "reason");
	h = hello(MSG_HELLO);
	h.key &= ~1ull;
	BROKEN(wsd_wire_hello_check(&h, MSG_HELLO, &why), "key");
	h = hello(MSG_HELLO);
	h.pid = 7;                  /* a pid without a descriptor */
	BROKEN(wsd_wire_hello_check(&h, MSG_HELLO, &why), "pid");
	h = hello(MSG_HELLO);
	h.region_fd = 3;            /* a descriptor without a pid */
	BROKEN(wsd_wire_hello_check(&h, MSG_HELLO, &why), "pid");
	/* the slot must lie whole in its segment, before the tag page */
	h = hello(MSG_HELLO);
	h.slot_off = h.seg_len - 2 * WSD_SEG_PAGE;  /* the ring would run into the tag */
	BROKEN(wsd_wire_hello_check(&h, MSG_HELLO, &why), "slot");
	h = hello(MSG_HELLO);
	h.seg_len = 262144 + WSD_SEG_PAGE + WSD_SEG_PAGE;
	h.slot_off = WSD_SEG_PAGE - CTL_SIZE;      /* not page-aligned */
	BROKEN(wsd_wire_hello_check(&h, MSG_HELLO, &why), "slot");
	h.slot_off = 0;
	VALID(wsd_wire_hello_check(&h, MSG_HELLO, &why));
	h.seg_len -= WSD_SEG_PAGE;                  /* no room for the tag page */
	BROKEN(wsd_wire_hello_check(&h, MSG_HELLO, &why), "slot");
	h = hello(MSG_HELLO);
	h.slot_off = 0xfffff000u;                   /* past 4 GiB with the ring: no wrap */
	h.seg_len = 0xfffff000u;
	BROKEN(wsd_wire_hello_check(&h, MSG_HELLO, &why), "slot");
	h = hello(MSG_HELLO);
	memset(h.nonce, 0, sizeof(h.nonce));
	BROKEN(wsd_wire_hello_check(&h, MSG_HELLO, &why), "challenge");
	h = hello(MSG_HELLO);
	memset(h.nonce, 0, sizeof(h.nonce) - 1);   /* a challenge with one byte set is one */
	VALID(wsd_wire_hello_check(&h, MSG_HELLO, &why));
}
END_TEST

START_TEST(refuse_fields)
{
	struct wsd_hello f = { .magic = WSD_PROTO_MAGIC, .version = WSD_PROTO_VERSION,
			       .kind = MSG_REFUSE, .reason = 5 };

	f.reason = 0;
	BROKEN(wsd_wire_hello_check(&f, MSG_ACCEPT, &why), "reason");
	f.reason = 5;
	f.ring_size = 262144;
	BROKEN(wsd_wire_hello_check(&f, MSG_ACCEPT, &why), "fields");
	f.ring_size = 0;
	f.seg_tag = 1;
	BROKEN(wsd_wire_hello_check(&f, MSG_ACCEPT, &why), "fields");
	f.seg_tag = 0;
	f.nonce[0] = 1;
	BROKEN(wsd_wire_hello_check(&f, MSG_ACCEPT, &why), "fields");
	f.nonce[0] = 0;
	f.magic = 0;
	BROKEN(wsd_wire_hello_check(&f, MSG_ACCEPT, &why), "magic");
	/* a REFUSE of another version: not ours to read past its kind */
	f.magic = WSD_PROTO_MAGIC;
	f.version = 3;
	ck_assert_int_eq(wsd_wire_hello_check(&f, MSG_ACCEPT, &why), -EPROTONOSUPPORT);
}
END_TEST

/* ---- channel messages ------------------------------------------------------------ */

static struct wsd_tuple tuple(void);

START_TEST(chmsg_checks)
{
	struct wsd_chmsg m = { .h = hello(MSG_OPEN), .req = 9 }, z;

	m.t = tuple();
	VALID(wsd_wire_chmsg_check(&m, &why));
	m.taken = 12345;                            /* any kind carries the credit word */
	VALID(wsd_wire_chmsg_check(&m, &why));
	m.t.magic = 0;                              /* an OPEN names its connection */
	BROKEN(wsd_wire_chmsg_check(&m, &why), "tuple");
	m.t = tuple();
	m.h.ring_size = 1000;                       /* its slot is checked as a HELLO's */
	BROKEN(wsd_wire_chmsg_check(&m, &why), "ring_size");
	m.h = hello(MSG_OPENED);
	BROKEN(wsd_wire_chmsg_check(&m, &why), "tuple");   /* an answer names none */
	memset(&m.t, 0, sizeof(m.t));
	VALID(wsd_wire_chmsg_check(&m, &why));
	m.h.kind = 99;
	BROKEN(wsd_wire_chmsg_check(&m, &why), "kind");
	m.h.version = WSD_PROTO_VERSION - 1;
	BROKEN(wsd_wire_chmsg_check(&m, &why), "version");

	memset(&z, 0, sizeof(z));
	z.h.magic = WSD_PROTO_MAGIC;
	z.h.version = WSD_PROTO_VERSION;
	z.h.kind = MSG_DECLINE;
	z.req = 4;
	BROKEN(wsd_wire_chmsg_check(&z, &why), "reason");
	z.h.reason = 10;
	VALID(wsd_wire_chmsg_check(&z, &why));
	z.h.key = 1;
	BROKEN(wsd_wire_chmsg_check(&z, &why), "fields");
	z.h.key = 0;
	z.h.seg = 40000;
	BROKEN(wsd_wire_chmsg_check(&z, &why), "fields");
	z.h.reason = WSD_REASON_MOVED;
	VALID(wsd_wire_chmsg_check(&z, &why));
	z.h.seg = 0;
	BROKEN(wsd_wire_chmsg_check(&z, &why), "fields");
	z.h.reason = WSD_REASON_POLICY;
	VALID(wsd_wire_chmsg_check(&z, &why));
	z.h.seg = WSD_REFUSE_EVERY;
	VALID(wsd_wire_chmsg_check(&z, &why));
	z.h.seg = 40000;
	BROKEN(wsd_wire_chmsg_check(&z, &why), "fields");

	memset(&z, 0, sizeof(z));
	z.h.magic = WSD_PROTO_MAGIC;
	z.h.version = WSD_PROTO_VERSION;
	z.h.kind = MSG_SHUT;
	z.h.seg = 5;
	z.h.slot_off = 8 * WSD_SEG_PAGE;
	VALID(wsd_wire_chmsg_check(&z, &why));
	z.req = 1;
	BROKEN(wsd_wire_chmsg_check(&z, &why), "fields");
	z.req = 0;
	z.h.kind = MSG_MAPPED;                      /* names a segment, not a slot */
	BROKEN(wsd_wire_chmsg_check(&z, &why), "fields");
	z.h.slot_off = 0;
	VALID(wsd_wire_chmsg_check(&z, &why));
	z.h.kind = MSG_CREDIT;                      /* the credit word alone */
	BROKEN(wsd_wire_chmsg_check(&z, &why), "fields");
	z.h.seg = 0;
	z.taken = 77;
	VALID(wsd_wire_chmsg_check(&z, &why));
	z.h.slot_off = WSD_SEG_PAGE;
	BROKEN(wsd_wire_chmsg_check(&z, &why), "fields");
	z.h.slot_off = 0;
	z.req = 3;
	BROKEN(wsd_wire_chmsg_check(&z, &why), "fields");
}
END_TEST

/* ---- the connect request's tuple ----------------------------------------------------- */

static struct wsd_tuple tuple(void)
{
	struct wsd_tuple t = { .magic = WSD_TUPLE_MAGIC, .version = WSD_PROTO_VERSION };

	t.client = (struct wsd_stat_addr){ .family = AF_INET, .port = 40000,
					   .addr = { 127, 0, 0, 1 } };
	t.server = (struct wsd_stat_addr){ .family = AF_INET6, .port = 80,
					   .addr = { [15] = 1 } };
	return t;
}

START_TEST(tuple_checks)
{
	struct wsd_tuple t = tuple(), out;
	uint8_t buf[sizeof(t) + 1];

	VALID(wsd_wire_tuple_check(&t, sizeof(t), &out, &why));
	ck_assert_mem_eq(&t, &out, sizeof(t));
	BROKEN(wsd_wire_tuple_check(NULL, 0, &out, &why), "length");
	BROKEN(wsd_wire_tuple_check(&t, sizeof(t) - 1, &out, &why), "length");
	memcpy(buf, &t, sizeof(t));
	BROKEN(wsd_wire_tuple_check(buf, sizeof(buf), &out, &why), "length");

	t = tuple();
	t.magic = 0x5755;
	BROKEN(wsd_wire_tuple_check(&t, sizeof(t), &out, &why), "magic");
	t = tuple();
	t.version = 3;
	ck_assert_int_eq(wsd_wire_tuple_check(&t, sizeof(t), &out, &why), -EPROTONOSUPPORT);
	t = tuple();
	t.pad = 1;
	BROKEN(wsd_wire_tuple_check(&t, sizeof(t), &out, &why), "pad");
	for (int fam = 0; fam < 256; fam++) {
		t = tuple();
		t.server.family = (uint8_t)fam;
		if (fam == AF_INET6) {
			VALID(wsd_wire_tuple_check(&t, sizeof(t), &out, &why));
		} else if (fam == AF_INET) {
			/* its address has bytes past 4 set */
			BROKEN(wsd_wire_tuple_check(&t, sizeof(t), &out, &why), "IPv4");
		} else {
			BROKEN(wsd_wire_tuple_check(&t, sizeof(t), &out, &why), "family");
		}
	}
	t = tuple();
	t.client.pad = 2;
	BROKEN(wsd_wire_tuple_check(&t, sizeof(t), &out, &why), "pad");
	t = tuple();
	t.client.port = 0;
	BROKEN(wsd_wire_tuple_check(&t, sizeof(t), &out, &why), "port");
	t = tuple();
	t.client.addr[4] = 1;
	BROKEN(wsd_wire_tuple_check(&t, sizeof(t), &out, &why), "IPv4");
	t = tuple();
	t.client.port = 65535;
	VALID(wsd_wire_tuple_check(&t, sizeof(t), &out, &why));
}
END_TEST

/* ---- records --------------------------------------------------------------------------- */

START_TEST(rec_header_bounds)
{
	const uint32_t ring = 16384;       /* max DATA: 4096 - 32 */

	VALID(wsd_wire_rec_check(1, REC_DATA, 0, ring, &why));
	VALID(wsd_wire_rec_check(4064, REC_DATA, 0, ring, &why));
	BROKEN(wsd_wire_rec_check(4065, REC_DATA, 0, ring, &why), "DATA");
	BROKEN(wsd_wire_rec_check(0, REC_DATA, 0, ring, &why), "DATA");
	/* 65536 at most, whatever the ring */
	VALID(wsd_wire_rec_check(65536, REC_DATA, 0, 1u << 20, &why));
	BROKEN(wsd_wire_rec_check(65537, REC_DATA, 0, 1u << 20, &why), "DATA");
	/* wraps a 32-bit size computation: must be refused, not taken as small */
	BROKEN(wsd_wire_rec_check(0xfffffff0u, REC_DATA, 0, ring, &why), "DATA");
	BROKEN(wsd_wire_rec_check(0xffffffffu, REC_ZC, 0, ring, &why), "ZC");
	/* a record must end inside the ring */
	VALID(wsd_wire_rec_check(8, REC_SWITCH, ring - 48, ring, &why));
	BROKEN(wsd_wire_rec_check(8, REC_SWITCH, ring - 32, ring, &why), "past");
	VALID(wsd_wire_rec_check(0, REC_FIN, ring - 32, ring, &why));
	BROKEN(wsd_wire_rec_check(0, REC_FIN, ring - 16, ring, &why), "past");
	VALID(wsd_wire_rec_check(4064, REC_DATA, ring - 4096, ring, &why));
	BROKEN(wsd_wire_rec_check(4064, REC_DATA, ring - 4080, ring, &why), "past");
	/* fixed lengths */
	VALID(wsd_wire_rec_check(40, REC_ZC, 0, ring, &why));
	BROKEN(wsd_wire_rec_check(39, REC_ZC, 0, ring, &why), "ZC");
	VALID(wsd_wire_rec_check(8, REC_BACK, 0, ring, &why));
	BROKEN(wsd_wire_rec_check(16, REC_BACK, 0, ring, &why), "BACK");
	BROKEN(wsd_wire_rec_check(0, REC_SWITCH, 0, ring, &why), "SWITCH");
	BROKEN(wsd_wire_rec_check(1, REC_FIN, 0, ring, &why), "FIN");
	VALID(wsd_wire_rec_check(16, REC_WZC, 0, ring, &why));
	BROKEN(wsd_wire_rec_check(8, REC_WZC, 0, ring, &why), "WZC");
	VALID(wsd_wire_rec_check(sizeof(struct wsd_split), REC_SPLIT, 0, ring, &why));
	BROKEN(wsd_wire_rec_check(sizeof(struct wsd_zc), REC_SPLIT, 0, ring, &why), "SPLIT");
	/* types */
	BROKEN(wsd_wire_rec_check(0, 0, 0, ring, &why), "type");
	BROKEN(wsd_wire_rec_check(8, 9, 0, ring, &why), "type");
	BROKEN(wsd_wire_rec_check(8, 0xffffffffu, 0, ring, &why), "type");
	/* PAD: a nonzero multiple of 16 reaching exactly the ring's end */
	VALID(wsd_wire_rec_check(16, REC_PAD, ring - 16, ring, &why));
	VALID(wsd_wire_rec_check(ring, REC_PAD, 0, ring, &why));
	BROKEN(wsd_wire_rec_check(0, REC_PAD, ring - 16, ring, &why), "PAD");
	BROKEN(wsd_wire_rec_check(0, REC_PAD, 0, ring, &why), "PAD");
	BROKEN(wsd_wire_rec_check(8, REC_PAD, ring - 8, ring, &why), "PAD");
	BROKEN(wsd_wire_rec_check(32, REC_PAD, ring - 16, ring, &why), "PAD");
	BROKEN(wsd_wire_rec_check(16, REC_PAD, ring - 32, ring, &why), "PAD");
	BROKEN(wsd_wire_rec_check(0xfffffff0u, REC_PAD, 16, ring, &why), "PAD");
}
END_TEST

/* A ring written as a sender writes it (write_record): PAD first when the record does not fit. */
struct tring {
	struct wire_ring rg;
	uint8_t *mem;
	uint64_t pos;
};

static void t_open(struct tring *t, uint32_t size, uint64_t start)
{
	t->mem = calloc(1, size);
	ck_assert_ptr_nonnull(t->mem);
	t->rg = (struct wire_ring){ t->mem, size, 0x5a5a5a5a12345679ull };
	t->pos = start;
}

static void t_raw(struct tring *t, uint32_t len, uint32_t type, const void *payload,
		  uint32_t plen, bool trailer)
{
	uint64_t off = t->pos % t->rg.size, stamp = t->pos ^ t->rg.key;
	uint64_t size = type == REC_PAD ? len : rec_size(plen);

	memcpy(t->mem + off, &len, 4);
	memcpy(t->mem + off + 4, &type, 4);
	memcpy(t->mem + off + 8, &stamp, 8);
	if (type != REC_PAD) {
		if (plen)
			memcpy(t->mem + off + 16, payload, plen);
		if (trailer)
			memcpy(t->mem + off + size - 16, &stamp, 8);
	}
	t->pos += size;
}

static void t_put(struct tring *t, uint32_t type, const void *payload, uint32_t len)
{
	uint64_t off = t->pos % t->rg.size;

	if (off + rec_size(len) > t->rg.size)
		t_raw(t, (uint32_t)(t->rg.size - off), REC_PAD, NULL, 0, false);
	t_raw(t, len, type, payload, len, true);
}

START_TEST(ring_walk)
{
	static uint8_t data[4064];
	uint64_t eight = 8;
	struct tring t;
	struct wire_rec r;
	uint64_t p;
	int n = 0;

	/* start late in a later lap: positions are 64-bit, offsets wrap */
	t_open(&t, 16384, 3 * 16384 + 16384 - 4096);
	p = t.pos;
	t_put(&t, REC_SWITCH, &eight, 8);
	t_put(&t, REC_DATA, data, 4064);        /* does not fit: PAD, then at offset 0 */
	t_put(&t, REC_DATA, data, 100);
	t_put(&t, REC_FIN, NULL, 0);

	ck_assert_int_eq(wsd_wire_rec_at(&t.rg, p, p, &r, &why), 1);
	ck_assert_int_eq(r.type, REC_SWITCH);
	ck_assert_int_eq(r.next - r.pos, 48);
	ck_assert_ptr_eq(r.payload, t.mem + (p % 16384) + 16);
	/* the PAD is skipped, its length taken as the bytes to the end */
	ck_assert_int_eq(wsd_wire_walk(&t.rg, p, r.next, WIRE_SKIP(REC_PAD), &r, &why), 1);
	ck_assert_int_eq(r.type, REC_DATA);
	ck_assert_int_eq(r.len, 4064);
	ck_assert_uint_eq(r.pos % 16384, 0);
	/* to FIN past everything else */
	ck_assert_int_eq(wsd_wire_walk(&t.rg, p, p, ~WIRE_SKIP(REC_FIN), &r, &why), 1);
	ck_assert_int_eq(r.type, REC_FIN);
	/* to the end */
	ck_assert_int_eq(wsd_wire_walk(&t.rg, p, p, ~0u, &r, &why), 0);
	ck_assert_uint_eq(r.pos, t.pos);
	for (p = 3 * 16384 + 16384 - 4096;
	     wsd_wire_rec_at(&t.rg, 3 * 16384 + 16384 - 4096, p, &r, &why) == 1; p = r.next)
		n++;
	ck_assert_int_eq(n, 5);
	free(t.mem);
}
END_TEST

START_TEST(ring_incomplete)
{
	uint64_t eight = 8;
	struct tring t;
	struct wire_rec r;

	t_open(&t, 16384, 0);
	/* zeroed memory: nothing there (the key is odd) */
	ck_assert_int_eq(wsd_wire_rec_at(&t.rg, 0, 0, &r, &why), 0);
	/* header without its trailer: being written */
	t_raw(&t, 8, REC_SWITCH, &eight, 8, false);
	ck_assert_int_eq(wsd_wire_rec_at(&t.rg, 0, 0, &r, &why), 0);
	/* a record of the last lap (its stamp names another position) */
	t.pos = 0;
	t.rg.key ^= 16384;
	t_put(&t, REC_SWITCH, &eight, 8);
	t.rg.key ^= 16384;
	ck_assert_int_eq(wsd_wire_rec_at(&t.rg, 0, 0, &r, &why), 0);
	free(t.mem);
}
END_TEST

START_TEST(ring_malformed)
{
	uint64_t eight = 8;
	struct tring t;
	struct wire_rec r;

	t_open(&t, 16384, 0);
	/* the length that wrapped rec_size(): refused, never read */
	t_raw(&t, 0xffffffe0u, REC_DATA, NULL, 0, false);
	BROKEN(wsd_wire_rec_at(&t.rg, 0, 0, &r, &why), "DATA");
	/* PAD of 0: the walk that looped for ever */
	t.pos = 0;
	t_raw(&t, 0, REC_PAD, NULL, 0, false);
	BROKEN(wsd_wire_walk(&t.rg, 0, 0, WIRE_SKIP(REC_PAD), &r, &why), "PAD");
	/* PAD short of the end */
	t.pos = 0;
	t_raw(&t, 16, REC_PAD, NULL, 0, false);
	BROKEN(wsd_wire_walk(&t.rg, 0, 0, WIRE_SKIP(REC_PAD), &r, &why), "PAD");
	/* unknown type */
	t.pos = 0;
	t_raw(&t, 8, 77, &eight, 8, true);
	BROKEN(wsd_wire_rec_at(&t.rg, 0, 0, &r, &why), "type");
	/* a record the sender had no credit for: more than a ring past our position */
	free(t.mem);
	{
		const uint64_t at = 2 * 16384 + 16336;   /* ends at the end of a lap */

		t_open(&t, 16384, at);
		t_put(&t, REC_SWITCH, &eight, 8);
		/* it may end a ring past the receiver at most */
		ck_assert_int_eq(wsd_wire_rec_at(&t.rg, at + 48 - 16384, at, &r, &why), 1);
		BROKEN(wsd_wire_rec_at(&t.rg, at + 32 - 16384, at, &r, &why), "ring past");
		free(t.mem);
	}
}
END_TEST

START_TEST(payload_checks)
{
	struct wsd_zc z = { .len = 1 };
	struct wsd_wzc w = { .gen = 3, .len = 100 };
	uint64_t got;

	/* SWITCH */
	VALID(wsd_wire_switch_check(10, 10, &why));
	VALID(wsd_wire_switch_check(10, 0, &why));
	BROKEN(wsd_wire_switch_check(9, 10, &why), "SWITCH");
	/* ZC */
	VALID(wsd_wire_zc_check(&z, &why));
	z.len = 1u << 30;
	VALID(wsd_wire_zc_check(&z, &why));
	z.len++;
	BROKEN(wsd_wire_zc_check(&z, &why), "ZC");
	z.len = 0;
	BROKEN(wsd_wire_zc_check(&z, &why), "ZC");
	z.len = UINT64_MAX;
	BROKEN(wsd_wire_zc_check(&z, &why), "ZC");
	/* partly read records */
	VALID(wsd_wire_resume_check(REC_FIN, 0, 0, &why));
	VALID(wsd_wire_resume_check(REC_DATA, 100, 99, &why));
	BROKEN(wsd_wire_resume_check(REC_DATA, 100, 100, &why), "shrank");
	BROKEN(wsd_wire_resume_check(REC_ZC, 10, 4000, &why), "shrank");
	BROKEN(wsd_wire_resume_check(REC_PAD, 0, 16, &why), "type");
	BROKEN(wsd_wire_resume_check(REC_WZC, 0, 1, &why), "type");
	/* WZC: the open offer, clamped to its buffer */
	VALID(wsd_wire_wzc_check(&w, 3, true, 100, &got, &why));
	ck_assert_uint_eq(got, 100);
	BROKEN(wsd_wire_wzc_check(&w, 3, true, 99, &got, &why), "offered");
	ck_assert_uint_eq(got, 0);
	w.len = 0;              /* declined after a withdrawal */
	VALID(wsd_wire_wzc_check(&w, 3, true, 99, &got, &why));
	ck_assert_uint_eq(got, 0);
	/* an answer to an offer let go: skipped, whatever its length */
	w.len = UINT64_MAX;
	VALID(wsd_wire_wzc_check(&w, 3, false, 99, &got, &why));
	ck_assert_uint_eq(got, 0);
	VALID(wsd_wire_wzc_check(&w, 4, true, 99, &got, &why));
	ck_assert_uint_eq(got, 0);
	/* offers never made */
	BROKEN(wsd_wire_wzc_check(&w, 2, true, 99, &got, &why), "never");
	w.gen = 0;
	BROKEN(wsd_wire_wzc_check(&w, 2, true, 99, &got, &why), "never");
	/* SPLIT: the open offer, both parts inside its buffer */
	{
		struct wsd_split sp = { .gen = 3, .wlen = 60, .zc = { .len = 40 } };
		int take;

		VALID(wsd_wire_split_check(&sp, 3, true, 100, &take, &why));
		ck_assert_int_eq(take, 1);
		BROKEN(wsd_wire_split_check(&sp, 3, true, 99, &take, &why), "offered");
		ck_assert_int_eq(take, 0);
		sp.wlen = UINT64_MAX - 10;    /* no wrap past the room check */
		BROKEN(wsd_wire_split_check(&sp, 3, true, 100, &take, &why), "written");
		sp.wlen = 60;
		sp.zc.len = UINT64_MAX - 30;
		BROKEN(wsd_wire_split_check(&sp, 3, true, 100, &take, &why), "ZC");
		sp.zc.len = 0;
		BROKEN(wsd_wire_split_check(&sp, 3, true, 100, &take, &why), "ZC");
		sp.zc.len = 40;
		sp.wlen = 0;
		BROKEN(wsd_wire_split_check(&sp, 3, true, 100, &take, &why), "written");
		sp.wlen = 60;
		/* an offer let go: acknowledged, not taken */
		VALID(wsd_wire_split_check(&sp, 3, false, 100, &take, &why));
		ck_assert_int_eq(take, 0);
		VALID(wsd_wire_split_check(&sp, 4, true, 100, &take, &why));
		ck_assert_int_eq(take, 0);
		BROKEN(wsd_wire_split_check(&sp, 2, true, 100, &take, &why), "never");
		sp.gen = 0;
		BROKEN(wsd_wire_split_check(&sp, 2, true, 100, &take, &why), "never");
	}
	/* BACK */
	VALID(wsd_wire_back_check(5, 6, 5, &why));
	VALID(wsd_wire_back_check(0, 1, 0, &why));
	BROKEN(wsd_wire_back_check(5, 7, 0, &why), "back_bells");
	BROKEN(wsd_wire_back_check(UINT64_MAX, 0, 0, &why), "back_bells");
	BROKEN(wsd_wire_back_check(4, 5, 5, &why), "fewer");
}
END_TEST

START_TEST(bells_checks)
{
	const uint8_t ok[] = { 3, 4, 5 }, late[] = { 3, 5 }, zero[] = { 0 };
	uint8_t wrap[] = { 255, 0, 1 };
	const char *why;

	/* bells 3, 4 and 5 after 2 read, with 5 announced (count 4, one more on its way) */
	ck_assert_uint_eq(wsd_bells_announced(4 << 1 | 1), 5);
	ck_assert_uint_eq(wsd_bells_announced(4 << 1), 4);
	VALID(wsd_wire_bells_check(ok, 3, 2, wsd_bells_announced(4 << 1 | 1), &why));
	VALID(wsd_wire_bells_check(ok, 0, 5, 5, &why));
	/* one more byte than announced: written behind the switch's back */
	BROKEN(wsd_wire_bells_check(ok, 3, 2, 4, &why), "more bytes");
	BROKEN(wsd_wire_bells_check(ok, 1, 6, 5, &why), "more bytes");
	/* a bell missing before the next (read behind its back), or a data byte */
	BROKEN(wsd_wire_bells_check(late, 2, 2, 10, &why), "not the next");
	BROKEN(wsd_wire_bells_check(zero, 1, 0, 10, &why), "not the next");
	/* bell 256 is 0 */
	VALID(wsd_wire_bells_check(wrap, 3, 254, 300, &why));
	wrap[1] = 1;
	BROKEN(wsd_wire_bells_check(wrap, 3, 254, 300, &why), "not the next");
	/* counts near 2^64 do not wrap past the bound */
	BROKEN(wsd_wire_bells_check(ok, 3, UINT64_MAX - 1, UINT64_MAX, &why), "more bytes");
}
END_TEST

START_TEST(post_checks)
{
	struct wsd_post p = { .gen = 2, .pos = 4096, .len = 1u << 20 };

	VALID(wsd_wire_post_check(&p, 2, 4096, &why));
	VALID(wsd_wire_post_check(&p, 2, 8192, &why));
	BROKEN(wsd_wire_post_check(&p, 2, 4080, &why), "position");
	BROKEN(wsd_wire_post_check(&p, 3, 4096, &why), "generation");
	p.len = 0;
	BROKEN(wsd_wire_post_check(&p, 2, 4096, &why), "length");
	p.len = (1u << 30) + 1;
	BROKEN(wsd_wire_post_check(&p, 2, 4096, &why), "length");
	p.len = 1u << 30;
	VALID(wsd_wire_post_check(&p, 2, 4096, &why));
	p.pad = 1;
	BROKEN(wsd_wire_post_check(&p, 2, 4096, &why), "zero");
}
END_TEST

START_TEST(word_checks)
{
	/* positions and counts: never back, never past what we sent */
	VALID(wsd_wire_word_check(CW_CONSUMED, 100, 50, 100, &why));
	BROKEN(wsd_wire_word_check(CW_CONSUMED, 101, 50, 100, &why), "beyond");
	BROKEN(wsd_wire_word_check(CW_CONSUMED, 49, 50, 100, &why), "back");
	VALID(wsd_wire_word_check(CW_ZC_DONE, 3, 3, 3, &why));
	BROKEN(wsd_wire_word_check(CW_ZC_DONE, 4, 3, 3, &why), "zc_done");
	VALID(wsd_wire_word_check(CW_CLAIM, 2, 1, 2, &why));
	BROKEN(wsd_wire_word_check(CW_CLAIM, 3, 1, 2, &why), "never");
	VALID(wsd_wire_word_check(CW_POST, 9, 8, UINT64_MAX, &why));
	BROKEN(wsd_wire_word_check(CW_POST, 7, 8, UINT64_MAX, &why), "back");
	BROKEN(wsd_wire_word_check(CW_POST_CANCEL, 7, 8, UINT64_MAX, &why), "back");
	/* flags */
	VALID(wsd_wire_word_check(CW_RX_READY, 1, 0, UINT64_MAX, &why));
	BROKEN(wsd_wire_word_check(CW_RX_READY, 2, 0, UINT64_MAX, &why), "range");
	VALID(wsd_wire_word_check(CW_BACK_REQ, 1, 0, UINT64_MAX, &why));
	BROKEN(wsd_wire_word_check(CW_BACK_REQ, 5, 0, UINT64_MAX, &why), "range");
	VALID(wsd_wire_word_check(CW_CLOSED, 2, 0, UINT64_MAX, &why));
	VALID(wsd_wire_word_check(CW_CLOSED, 1, 2, UINT64_MAX, &why));   /* reset, then closed */
	VALID(wsd_wire_word_check(CW_CLOSED, 3, 0, UINT64_MAX, &why));   /* reset: bypass */
	VALID(wsd_wire_word_check(CW_CLOSED, WSD_CLOSING_NO_PROOF, 0, UINT64_MAX, &why));   /* closing */
	BROKEN(wsd_wire_word_check(CW_CLOSED, 7, 0, UINT64_MAX, &why), "range");
	VALID(wsd_wire_word_check(CW_MAPPED, 2, 0, UINT64_MAX, &why));
	BROKEN(wsd_wire_word_check(CW_MAPPED, UINT64_MAX, 0, UINT64_MAX, &why), "range");
	/* bells: the count grows, its "one more" bit comes and goes */
	VALID(wsd_wire_word_check(CW_BELLS, 5, 0, UINT64_MAX, &why));
	VALID(wsd_wire_word_check(CW_BELLS, 4, 5, UINT64_MAX, &why));   /* the bell not sent */
	VALID(wsd_wire_word_check(CW_BELLS, 7, 4, UINT64_MAX, &why));
	BROKEN(wsd_wire_word_check(CW_BELLS, 3, 4, UINT64_MAX, &why), "went back");
	BROKEN(wsd_wire_word_check(CW_BELLS, 0, 2, UINT64_MAX, &why), "went back");
	/* back_bells: once */
	VALID(wsd_wire_word_check(CW_BACK_BELLS, 7, 0, UINT64_MAX, &why));
	VALID(wsd_wire_word_check(CW_BACK_BELLS, 7, 7, UINT64_MAX, &why));
	BROKEN(wsd_wire_word_check(CW_BACK_BELLS, 8, 7, UINT64_MAX, &why), "changed");
	/* arms: generations, any value (compared only for a change) */
	VALID(wsd_wire_word_check(CW_DATA_ARM, 1, 100, 0, &why));
	VALID(wsd_wire_word_check(CW_SPACE_ARM, UINT64_MAX, 0, 0, &why));
	BROKEN(wsd_wire_word_check(CW_N, 0, 0, 0, &why), "no such");
}
END_TEST

static void word_put(struct wsd_ctl *c, int idx, uint64_t v, uint64_t check)
{
	atomic_store(&c->w[idx].v, v);
	atomic_store(&c->w[idx].check, check);
}

START_TEST(word_get)
{
	struct wsd_ctl *c = calloc(1, sizeof(*c));
	_Atomic uint64_t seen = 0;
	uint64_t v = 1;

	ck_assert_ptr_nonnull(c);
	/* zeroed: fails the check, reads as 0 */
	VALID(wsd_wire_word_get(c, CW_CONSUMED, &seen, 1000, &v, &why));
	ck_assert_uint_eq(v, 0);
	word_put(c, CW_CONSUMED, 500, ~500ull);
	VALID(wsd_wire_word_get(c, CW_CONSUMED, &seen, 1000, &v, &why));
	ck_assert_uint_eq(v, 500);
	ck_assert_uint_eq(seen, 500);
	/* half written: the last whole value */
	word_put(c, CW_CONSUMED, 600, ~500ull);
	VALID(wsd_wire_word_get(c, CW_CONSUMED, &seen, 1000, &v, &why));
	ck_assert_uint_eq(v, 500);
	/* beyond what we sent: refused, the last good value kept */
	word_put(c, CW_CONSUMED, 2000, ~2000ull);
	BROKEN(wsd_wire_word_get(c, CW_CONSUMED, &seen, 1000, &v, &why), "beyond");
	ck_assert_uint_eq(v, 500);
	ck_assert_uint_eq(seen, 500);
	/* back */
	word_put(c, CW_CONSUMED, 400, ~400ull);
	BROKEN(wsd_wire_word_get(c, CW_CONSUMED, &seen, 1000, &v, &why), "back");
	ck_assert_uint_eq(v, 500);
	/* the same read, saying whether it found the word whole (the drain's) */
	word_put(c, CW_BELLS, 9, ~7ull);
	ck_assert_int_eq(wsd_wire_word_try(c, CW_BELLS, &seen, UINT64_MAX, &v, &why), 0);
	ck_assert_uint_eq(v, 500);
	seen = 0;
	word_put(c, CW_BELLS, 9, ~9ull);
	ck_assert_int_eq(wsd_wire_word_try(c, CW_BELLS, &seen, UINT64_MAX, &v, &why), 1);
	ck_assert_uint_eq(v, 9);
	word_put(c, CW_BELLS, 6, ~6ull);
	BROKEN(wsd_wire_word_try(c, CW_BELLS, &seen, UINT64_MAX, &v, &why), "went back");
	ck_assert_uint_eq(v, 9);
	free(c);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("wire");
	TCase *tc = tcase_create("checks");
	SRunner *sr;
	int failed;

	tcase_add_test(tc, hello_valid);
	tcase_add_test(tc, hello_ring_size);
	tcase_add_test(tc, hello_fields);
	tcase_add_test(tc, refuse_fields);
	tcase_add_test(tc, tuple_checks);
	tcase_add_test(tc, chmsg_checks);
	tcase_add_test(tc, rec_header_bounds);
	tcase_add_test(tc, ring_walk);
	tcase_add_test(tc, ring_incomplete);
	tcase_add_test(tc, ring_malformed);
	tcase_add_test(tc, payload_checks);
	tcase_add_test(tc, post_checks);
	tcase_add_test(tc, bells_checks);
	tcase_add_test(tc, word_checks);
	tcase_add_test(tc, word_get);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}

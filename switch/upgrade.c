/* SPDX-License-Identifier: MIT */
/*
 * Upgrade: finding out whether the peer runs wsd, and taking a connection
 * over when it does (wsd-protocol(7), "Handshake").
 *
 * A listening socket registers its port with the SPI: an SPI listener on
 * the same port number, which on the shm transport is an abstract unix
 * socket, so it is scoped to the network namespace and checks its peer's
 * credentials.  The connecting side, once a connection has carried some
 * traffic, connects to that listener from a worker thread and sends a HELLO
 * naming the TCP 4-tuple; the listening process matches it against the
 * connections it accepted (or will accept) and answers ACCEPT or REFUSE.
 * The application never waits for any of this: it keeps using the kernel
 * stream until each direction switches.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "provider/fault.h"
#include "provider/internal.h"
#include "switch/chan.h"
#include "switch/session.h"

#define ANSWER_MS 5000               /* each side waits this for the other's message */
#define PENDING_MS 10000             /* a HELLO waits this for the application's accept */
/*
 * Requests a process has in hand at once: handshakes waiting for their
 * HELLO (each on a thread of its own, so that a silent one delays nobody
 * else), and HELLOs waiting for the program's accept.  Past these the
 * registry answers REFUSE busy at once: a peer cannot make it hold more
 * provider connections or memory than this.
 */
#define MAX_HANDSHAKES 32
#define MAX_PENDING 64

/* ---- parameters ------------------------------------------------------------- */

static struct wsd_switch_params params;
static pthread_once_t params_once = PTHREAD_ONCE_INIT;

/*
 * What an upgrade costs the process: a new channel (measured: 9
 * descriptors for its provider connection, memory, eventfds and completion
 * path; about as many for the provider's start and a listener's registry
 * entry) and its rings' memory; a connection on a channel that exists
 * takes no descriptor, and its ring's pages only as it uses them.  The
 * switch takes them only with room to spare (wsd_guard_room).
 */
#define UPGRADE_FDS 10
#define START_FDS 12
#define upgrade_bytes() (2 * (uint64_t)wsd_switch_params()->ring_size + (1u << 20))
#define SLOT_BYTES ((uint64_t)64 << 10)

static void params_init(void)
{
	long ring = wsd_param_long("WSD_SWITCH_RING"), zc;

	params.enabled = wsd_param_long("WSD_SWITCH") != 0;
	if (ring < 16384 || ring > (64l << 20) || (ring & (ring - 1)))
		ring = 262144;
	params.ring_size = (uint32_t)ring;
	params.upgrade_bytes = (uint64_t)wsd_param_long("WSD_UPGRADE_BYTES");
	params.upgrade_ns = (uint64_t)wsd_param_long("WSD_UPGRADE_US") * 1000;
	zc = wsd_param_long("WSD_ZCOPY_THRESHOLD");
	/*
	 * By default (-1) none where the ring is mapped: measured on shm, a round
	 * trip of 64 KiB to 16 MiB by the mapped ring took a third of the time
	 * zero copy through the provider did (wsd(7), WSD_ZCOPY_THRESHOLD).
	 */
	params.zcopy_by_path = zc < 0;
	params.zcopy_threshold = zc < 0 ? 262144 : zc == 0 || zc > UINT32_MAX ? UINT32_MAX :
										 (uint32_t)zc;
}

const struct wsd_switch_params *wsd_switch_params(void)
{
	pthread_once(&params_once, params_init);
	return &params;
}

static void set_reason(struct wsd_sock *s, enum wsd_reason r)
{
	wsd_stat_begin(s->stat);
	s->stat->reason = (uint8_t)r;
	wsd_stat_end(s->stat);
	if (r != R_NONE && r != R_PENDING && r != R_LISTENER)
		wsd_stat_add(s->stat, &s->stat->fallbacks, 1);
}

/* ---- the SPI instance -------------------------------------------------------- */

static pthread_mutex_t up_lock = PTHREAD_MUTEX_INITIALIZER;
static WSPPROC_TABLE procs;
static WSAPROTOCOL_INFO proto;
static bool spi_started, spi_failed;

WSPPROC_TABLE *wsd_spi(void)
{
	if (__atomic_load_n(&spi_started, __ATOMIC_ACQUIRE))
		return &procs;
	pthread_mutex_lock(&up_lock);
	if (!spi_started && !spi_failed) {
		WSPDATA d;
		WSPUPCALLTABLE up = { sizeof(up), NULL };

		procs.cbSize = sizeof(procs);
		if (WSPStartup(WSP_VERSION, &d, &proto, &up, &procs) == 0)
			__atomic_store_n(&spi_started, true, __ATOMIC_RELEASE);
		else
			spi_failed = true;
	}
	pthread_mutex_unlock(&up_lock);
	return spi_started ? &procs : NULL;
}

/* ---- addresses ------------------------------------------------------------------ */

/* Normalised: an IPv4-mapped IPv6 address is the IPv4 address. */
static void to_addr(const struct sockaddr_storage *ss, struct wsd_stat_addr *a)
{
	memset(a, 0, sizeof(*a));
	if (ss->ss_family == AF_INET) {
		const struct sockaddr_in *in = (const void *)ss;

		a->family = AF_INET;
		a->port = ntohs(in->sin_port);
		memcpy(a->addr, &in->sin_addr, 4);
	} else if (ss->ss_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const void *)ss;

		a->port = ntohs(in6->sin6_port);
		if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
			a->family = AF_INET;
			memcpy(a->addr, in6->sin6_addr.s6_addr + 12, 4);
		} else {
			a->family = AF_INET6;
			memcpy(a->addr, &in6->sin6_addr, 16);
		}
	}
}

/* Learn the 4-tuple of a connected socket (and publish it). */
static int learn_tuple(struct wsd_sock *s)
{
	socklen_t l1 = sizeof(s->local), l2 = sizeof(s->peer);
	int r = 0;

	if (s->tuple_known)
		return 0;
	pthread_mutex_lock(&s->mu);
	if (!s->tuple_known) {
		if (getsockname(s->fd, (struct sockaddr *)&s->local, &l1) ||
		    getpeername(s->fd, (struct sockaddr *)&s->peer, &l2)) {
			r = -errno;
		} else {
			wsd_stat_begin(s->stat);
			to_addr(&s->local, &s->stat->local);
			to_addr(&s->peer, &s->stat->peer);
			wsd_stat_end(s->stat);
			s->tuple_known = true;
		}
	}
	pthread_mutex_unlock(&s->mu);
	return r;
}

static bool same(const struct wsd_stat_addr *a, const struct wsd_stat_addr *b)
{
	return a->family == b->family && a->port == b->port &&
	       !memcmp(a->addr, b->addr, a->family == AF_INET ? 4 : 16);
}

/* ---- handshake messages --------------------------------------------------------- */

static int send_msg(SOCKET ws, struct wsd_hello *h)
{
	WSABUF b = { sizeof(*h), (char *)h };
	uint32_t n;
	int err;

	return procs.lpWSPSend(ws, &b, 1, &n, 0, NULL, NULL, NULL, &err) ? -1 : 0;
}

/*
 * Receive one message within ms; 0 or -1.  A receive still pending when
 * the time is up would later write into h and into this frame's
 * overlapped: the socket is closed then, which ends the request before we
 * return, and *ws becomes INVALID_SOCKET (the caller closes nothing).
 */
static int recv_msg(SOCKET *wsp, struct wsd_hello *h, int ms)
{
	SOCKET ws = *wsp;
	WSABUF b = { sizeof(*h), (char *)h };
	WSAOVERLAPPED ov = { .hEvent = (void *)1 };
	uint32_t n = 0, fl = 0;
	int err = 0;
	int64_t end = wsd_now_ms() + ms;

	memset(h, 0, sizeof(*h));
	if (procs.lpWSPRecv(ws, &b, 1, &n, &fl, &ov, NULL, NULL, &err) == 0)
		return n == sizeof(*h) ? 0 : -1;
	if (err != WSA_IO_PENDING)
		return -1;
	while (!procs.lpWSPGetOverlappedResult(ws, &ov, &n, 0, &fl, &err)) {
		if (err != WSA_IO_INCOMPLETE || wsd_now_ms() > end) {
			procs.lpWSPCloseSocket(ws, &err);   /* aborts the request */
			*wsp = INVALID_SOCKET;
			return -1;
		}
		usleep(200);
	}
	return n == sizeof(*h) && h->magic == WSD_PROTO_MAGIC ? 0 : -1;
}

static enum wsd_path path_of(SOCKET ws)
{
	char name[16] = "";
	uint32_t n;
	int err;

	procs.lpWSPIoctl(ws, SIO_WSP_TRANSPORT, NULL, 0, name, sizeof(name), &n, NULL, NULL,
			 NULL, &err);
	return !strcmp(name, "verbs") ? PATH_VERBS : PATH_SHM;
}

static void refuse(SOCKET ws, enum wsd_reason why)
{
	struct wsd_hello h = { .magic = WSD_PROTO_MAGIC, .version = WSD_PROTO_VERSION,
			       .kind = MSG_REFUSE, .reason = why };
	int err;

	wsd_stat_refused(why);
	send_msg(ws, &h);
	procs.lpWSPCloseSocket(ws, &err);
}

/* A channel's request answered DECLINE. */
static void decline(struct wsd_chan *ch, uint64_t req, enum wsd_reason why)
{
	struct wsd_chmsg m = { .h = { .magic = WSD_PROTO_MAGIC, .version = WSD_PROTO_VERSION,
				      .kind = MSG_DECLINE, .reason = why }, .req = req };

	wsd_stat_refused(why);
	wsd_chan_send(ch, &m);
}

/* A request that gets no answer at all (it broke the protocol): counted, closed. */
static void drop(SOCKET ws)
{
	int err;

	wsd_stat_refused(R_PROTOCOL);
	procs.lpWSPCloseSocket(ws, &err);
}

/* ---- the listening side ---------------------------------------------------------- */

struct reg {
	struct reg *next;
	uint16_t port;
	int refs;
	SOCKET ls;
	/*
	 * When the last listener on the port closed (ms clock), or 0.  The
	 * registry stays a while after: connections accepted before the close
	 * upgrade later (one-shot servers close the listener at once).
	 */
	_Atomic int64_t closed_at;
};

#define REG_GRACE_MS 10000

/* What the acceptor's condition function learnt of the request it took. */
struct acceptor_req {
	uint16_t port;               /* the registry's */
	struct wsd_tuple t;
};

/*
 * A request waiting for the program's accept: a HELLO on a new SPI
 * connection (ws; ch NULL), or an OPEN on a channel (ch held; req).
 */
struct pending {
	struct pending *next;
	SOCKET ws;
	struct wsd_chan *ch;
	uint64_t req;
	struct wsd_hello h;
	struct wsd_tuple t;
	uint64_t when_ms;
};

static struct reg *regs;
static struct pending *pendings;
static int npending;                 /* pend_lock */
static _Atomic int handshakes;       /* take_hello threads running */
static pthread_mutex_t pend_lock = PTHREAD_MUTEX_INITIALIZER;

/* The accepted connection a connect request names, held, or NULL. */
struct find { const struct wsd_tuple *t; struct wsd_sock *found; };

static void match(int fd, struct wsd_sock *s, void *arg)
{
	struct find *f = arg;

	(void)fd;
	if (f->found || s->listening || s->connected_side)
		return;
	/* accept() leaves the tuple to be learnt here, off the application's path */
	if (!s->tuple_known && learn_tuple(s))
		return;
	if (same(&s->stat->local, &f->t->server) && same(&s->stat->peer, &f->t->client)) {
		wsd_sock_hold(s);
		f->found = s;
	}
}

/*
 * Urgent data waits on the socket: its sender's kernel counted a byte that
 * our stream never shows (it is out of band), so no handover count could
 * be right.  Such a connection stays on TCP (libwsd(7), MSG_OOB).
 */
static bool urgent_seen(const struct wsd_sock *s)
{
	struct pollfd p = { .fd = s->fd, .events = POLLPRI };

	return real.poll(&p, 1, 0) > 0 && (p.revents & POLLPRI);
}

/*
 * The request to answer: a HELLO on a new SPI connection (ws), which makes
 * a channel, or an OPEN on a channel (ch, req).
 */
struct request {
	SOCKET ws;
	struct wsd_chan *ch;
	uint64_t req;
	const struct wsd_hello *h;
};

static void answer_no(const struct request *q, enum wsd_reason why)
{
	if (q->ch)
		decline(q->ch, q->req, why);
	else
		refuse(q->ws, why);
}

static void server_attach(struct wsd_sock *s, const struct request *q)
{
	struct wsd_session *ss;
	struct wsd_chan *ch = q->ch;
	struct wsd_chmsg a = { 0 };
	int expect = UP_NONE;
	enum wsd_reason why;
	long ms;

	if (urgent_seen(s)) {
		answer_no(q, R_UNSUPPORTED);
		set_reason(s, R_UNSUPPORTED);
		return;
	}
	if (s->no_upgrade || !atomic_compare_exchange_strong(&s->upgrade_state, &expect,
							      UP_RUNNING)) {
		answer_no(q, s->no_upgrade ? (enum wsd_reason)s->why_not : R_REFUSED);
		return;
	}
	why = R_RESOURCES;
	if (!wsd_guard_room(ch ? 0 : UPGRADE_FDS, ch ? SLOT_BYTES : upgrade_bytes()))
		goto no;
	why = R_PROVIDER;
	if (!ch && !(ch = wsd_chan_new(q->ws, path_of(q->ws), false, NULL)))
		goto no;
	ss = wsd_session_new(ch);
	if (!ss) {
		if (!q->ch)
			wsd_chan_put(ch);   /* closes q->ws with it: refused below, on nothing */
		goto no_ch;
	}
	wsd_session_peer(ss, q->h);
	wsd_session_hello(ss, &a.h, q->ch ? MSG_OPENED : MSG_ACCEPT);
	a.req = q->req;
	if (wsd_fault("accept-delay", &ms))
		usleep((useconds_t)ms * 1000);
	if (q->ch ? wsd_chan_send(ch, &a) : send_msg(q->ws, &a.h)) {
		wsd_session_free(ss);
		if (!q->ch)
			wsd_chan_put(ch);
		atomic_store(&s->upgrade_state, UP_FAILED);
		set_reason(s, R_PROVIDER);
		return;
	}
	wsd_session_known(ss);
	if (!q->ch) {
		wsd_chan_start(ch, q->h->pid);
		wsd_chan_put(ch);   /* the session holds it */
	}
	wsd_session_attach(s, ss);
	return;
no:
	answer_no(q, why);
	atomic_store(&s->upgrade_state, UP_FAILED);
	set_reason(s, why);
	return;
no_ch:
	if (q->ch)
		decline(q->ch, q->req, R_PROVIDER);
	else
		wsd_stat_refused(R_PROVIDER);
	atomic_store(&s->upgrade_state, UP_FAILED);
	set_reason(s, R_PROVIDER);
}

/*
 * The acceptor's condition function: a request is taken only when its
 * connect data names a TCP connection to this listener's port.  Another
 * version of the protocol is taken too, to be told so (take_hello).
 */
static int on_request(WSABUF *caller_id, WSABUF *caller_data, void *sqos, void *gqos,
		      WSABUF *callee_id, WSABUF *callee_data, unsigned *g, uintptr_t arg)
{
	struct acceptor_req *a = (struct acceptor_req *)arg;

	(void)caller_id; (void)sqos; (void)gqos; (void)callee_id; (void)g;
	const char *why;

	callee_data->len = 0;
	/* another version is taken, to be refused with reason protocol (take_hello) */
	if ((wsd_wire_tuple_check(caller_data ? caller_data->buf : NULL,
				  caller_data ? caller_data->len : 0, &a->t, &why) == -EPROTO) ||
	    a->t.server.port != a->port) {
		wsd_debug("switch: a connect request refused: %s", a->t.server.port != a->port ?
			  "tuple: not this port" : why);
		wsd_stat_refused(R_PROTOCOL);
		return CF_REJECT;
	}
	return CF_ACCEPT;
}

/* pend_lock held: HELLOs that waited too long, unlinked onto *old. */
static void pending_expire(uint64_t now, struct pending **old)
{
	struct pending **pp, *p;

	for (pp = &pendings; (p = *pp);) {
		if (now - p->when_ms > PENDING_MS) {
			*pp = p->next;
			p->next = *old;
			*old = p;
			npending--;
		} else {
			pp = &p->next;
		}
	}
}

static void pending_refuse(struct pending *old)
{
	while (old) {
		struct pending *p = old->next;

		if (old->ch) {
			decline(old->ch, old->req, R_NO_MATCH);
			wsd_chan_put(old->ch);
		} else {
			refuse(old->ws, R_NO_MATCH);
		}
		free(old);
		old = p;
	}
}

static void take_hello(SOCKET ws, const struct wsd_tuple *t)
{
	struct wsd_hello h;
	struct find f = { t, NULL };
	struct pending *p = NULL, *old = NULL;
	bool full = false;
	const char *why;
	int e;

	if (recv_msg(&ws, &h, ANSWER_MS) || h.kind != MSG_HELLO || h.magic != WSD_PROTO_MAGIC) {
		if (ws != INVALID_SOCKET)
			drop(ws);
		else
			wsd_stat_refused(R_PROTOCOL);
		return;
	}
	wsd_guard_scan();   /* an io_uring of the program's own: nothing upgrades */
	e = wsd_wire_hello_check(&h, MSG_HELLO, &why);
	if (e || t->version != WSD_PROTO_VERSION) {
		wsd_debug("switch: a HELLO refused: %s", e ? why : "tuple: another version");
		refuse(ws, R_PROTOCOL);
		return;
	}
	pthread_mutex_lock(&pend_lock);
	wsd_fd_each(match, &f);
	if (!f.found) {
		pending_expire((uint64_t)wsd_now_ms(), &old);
		full = npending >= MAX_PENDING;
		p = full ? NULL : calloc(1, sizeof(*p));
		if (p) {
			p->ws = ws;
			p->h = h;
			p->t = *t;
			p->when_ms = (uint64_t)wsd_now_ms();
			p->next = pendings;
			pendings = p;
			npending++;
		}
	}
	pthread_mutex_unlock(&pend_lock);
	pending_refuse(old);
	if (f.found) {
		server_attach(f.found, &(struct request){ .ws = ws, .h = &h });
		wsd_sock_put(f.found);
	} else if (!p) {
		refuse(ws, full ? R_BUSY : R_PROVIDER);
	}
}

/* An OPEN on a channel: as a HELLO, without a new SPI connection. */
void wsd_upgrade_on_open(struct wsd_chan *ch, const struct wsd_chmsg *m)
{
	struct find f = { &m->t, NULL };
	struct pending *p = NULL, *old = NULL;
	bool full = false;

	wsd_guard_scan();   /* an io_uring of the program's own: nothing upgrades */
	pthread_mutex_lock(&pend_lock);
	wsd_fd_each(match, &f);
	if (!f.found) {
		pending_expire((uint64_t)wsd_now_ms(), &old);
		full = npending >= MAX_PENDING;
		p = full ? NULL : calloc(1, sizeof(*p));
		if (p) {
			wsd_chan_hold(ch);
			p->ch = ch;
			p->ws = INVALID_SOCKET;
			p->req = m->req;
			p->h = m->h;
			p->t = m->t;
			p->when_ms = (uint64_t)wsd_now_ms();
			p->next = pendings;
			pendings = p;
			npending++;
		}
	}
	pthread_mutex_unlock(&pend_lock);
	pending_refuse(old);
	if (f.found) {
		server_attach(f.found, &(struct request){ .ch = ch, .req = m->req, .h = &m->h });
		wsd_sock_put(f.found);
	} else if (!p) {
		decline(ch, m->req, full ? R_BUSY : R_PROVIDER);
	}
}

struct handshake {
	SOCKET ws;
	struct wsd_tuple t;
};

static void *handshake_main(void *arg)
{
	struct handshake *hs = arg;

	take_hello(hs->ws, &hs->t);
	free(hs);
	atomic_fetch_sub(&handshakes, 1);
	return NULL;
}

/* The request's HELLO is awaited on a thread of its own, within the caps. */
static void handshake_start(SOCKET ws, const struct wsd_tuple *t)
{
	struct handshake *hs = NULL;
	pthread_attr_t at;
	pthread_t th;
	bool ok = false;

	if (atomic_fetch_add(&handshakes, 1) < MAX_HANDSHAKES && (hs = malloc(sizeof(*hs)))) {
		hs->ws = ws;
		hs->t = *t;
		pthread_attr_init(&at);
		pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
		ok = pthread_create(&th, &at, handshake_main, hs) == 0;
		pthread_attr_destroy(&at);
	}
	if (!ok) {
		free(hs);
		atomic_fetch_sub(&handshakes, 1);
		refuse(ws, R_BUSY);
	}
}

static void *acceptor(void *arg)
{
	struct reg *r = arg;
	struct acceptor_req a = { .port = r->port };
	int err;

	for (;;) {
		SOCKET ws;
		int64_t closed;

		atomic_fetch_sub(&wsd_threads_busy, 1);   /* waiting (wsd_threads_idle) */
		ws = procs.lpWSPAccept(r->ls, NULL, NULL, on_request, (uintptr_t)&a, &err);
		atomic_fetch_add(&wsd_threads_busy, 1);
		closed = atomic_load(&r->closed_at);

		if (closed && wsd_now_ms() - closed > REG_GRACE_MS) {
			struct reg **pp;
			bool gone = false;

			pthread_mutex_lock(&up_lock);
			if (atomic_load(&r->closed_at)) {   /* not revived meanwhile */
				for (pp = &regs; *pp; pp = &(*pp)->next)
					if (*pp == r) {
						*pp = r->next;
						break;
					}
				gone = true;
			}
			pthread_mutex_unlock(&up_lock);
			if (gone) {
				if (ws != INVALID_SOCKET)
					refuse(ws, R_REFUSED);
				break;
			}
		}
		if (ws == INVALID_SOCKET) {
			if (err == WSAENETDOWN || err == WSAENOTSOCK)
				break;
			continue;
		}
		handshake_start(ws, &a.t);
	}
	procs.lpWSPCloseSocket(r->ls, &err);
	free(r);
	atomic_fetch_sub(&wsd_threads_busy, 1);
	return NULL;
}

void wsd_upgrade_listen(struct wsd_sock *s)
{
	struct sockaddr_storage a;
	socklen_t al = sizeof(a);
	/*
	 * The registry takes the listener's family: an IPv6 wildcard takes
	 * IPv4 requests too (rdma_cm, as TCP, unless bindv6only), as the
	 * program's IPv6 socket takes IPv4 connections.
	 */
	struct sockaddr_in6 any6 = { .sin6_family = AF_INET6, .sin6_addr = IN6ADDR_ANY_INIT };
	struct sockaddr_in any4 = { .sin_family = AF_INET };
	struct wsd_stat_addr sa;
	struct reg *r;
	pthread_attr_t at;
	pthread_t t;
	int err;

	s->listening = true;
	if (getsockname(s->fd, (struct sockaddr *)&a, &al))
		return;
	to_addr(&a, &sa);
	wsd_stat_begin(s->stat);
	s->stat->local = sa;
	s->stat->listening = 1;
	s->stat->reason = R_LISTENER;
	wsd_stat_end(s->stat);
	if (!wsd_switch_params()->enabled)
		return;
	if (!wsd_guard_room(START_FDS, 0)) {
		set_reason(s, R_RESOURCES);
		wsd_debug("switch: the listener on port %u stays plain: near the descriptor limit",
			  sa.port);
		return;
	}
	if (!wsd_spi())
		return;
	pthread_mutex_lock(&up_lock);
	for (r = regs; r; r = r->next)
		if (r->port == sa.port)
			break;
	if (r) {
		r->refs++;
		atomic_store(&r->closed_at, 0);
		pthread_mutex_unlock(&up_lock);
		return;
	}
	r = calloc(1, sizeof(*r));
	if (!r)
		goto out;
	r->port = sa.port;
	r->refs = 1;
	r->ls = procs.lpWSPSocket(a.ss_family, SOCK_STREAM, 0, &proto, 0, 0, &err);
	any4.sin_port = any6.sin6_port = htons(sa.port);
	if (r->ls == INVALID_SOCKET ||
	    procs.lpWSPBind(r->ls, a.ss_family == AF_INET6 ? (struct sockaddr *)&any6
							  : (struct sockaddr *)&any4,
			    a.ss_family == AF_INET6 ? sizeof(any6) : sizeof(any4), &err) ||
	    /* connectors check that we hold this TCP listener (wsd-protocol(7)) */
	    procs.lpWSPSetSockOpt(r->ls, SOL_WSP, SO_WSP_TCP_LISTENER, &s->fd, sizeof(s->fd),
				  &err) ||
	    procs.lpWSPListen(r->ls, 128, &err)) {
		/* another process has this port's registry (SO_REUSEPORT): stay plain */
		wsd_debug("switch: no registry for port %u (%d)", sa.port, err);
		if (r->ls != INVALID_SOCKET)
			procs.lpWSPCloseSocket(r->ls, &err);
		free(r);
		goto out;
	}
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	atomic_fetch_add(&wsd_threads_busy, 1);   /* until its first wait */
	if (pthread_create(&t, &at, acceptor, r)) {
		atomic_fetch_sub(&wsd_threads_busy, 1);
		procs.lpWSPCloseSocket(r->ls, &err);
		free(r);
	} else {
		r->next = regs;
		regs = r;
	}
	pthread_attr_destroy(&at);
out:
	pthread_mutex_unlock(&up_lock);
}

void wsd_upgrade_unlisten(struct wsd_sock *s)
{
	struct reg **pp, *r;

	if (!s->listening)
		return;
	pthread_mutex_lock(&up_lock);
	for (pp = &regs; (r = *pp); pp = &r->next) {
		if (r->port != s->stat->local.port)
			continue;
		if (r->refs > 0 && --r->refs == 0)
			atomic_store(&r->closed_at, wsd_now_ms());   /* the acceptor ends it */
		break;
	}
	pthread_mutex_unlock(&up_lock);
}

void wsd_upgrade_accepted(struct wsd_sock *s)
{
	struct pending **pp, *p, *hit = NULL, *old = NULL;

	pthread_mutex_lock(&pend_lock);
	if (!pendings) {
		pthread_mutex_unlock(&pend_lock);
		return;
	}
	pthread_mutex_unlock(&pend_lock);
	if (learn_tuple(s))
		return;
	pthread_mutex_lock(&pend_lock);
	pending_expire((uint64_t)wsd_now_ms(), &old);
	for (pp = &pendings; (p = *pp); pp = &p->next) {
		if (same(&s->stat->local, &p->t.server) && same(&s->stat->peer, &p->t.client)) {
			*pp = p->next;
			hit = p;
			npending--;
			break;
		}
	}
	pthread_mutex_unlock(&pend_lock);
	pending_refuse(old);
	if (hit) {
		server_attach(s, &(struct request){ .ws = hit->ws, .ch = hit->ch, .req = hit->req,
						     .h = &hit->h });
		wsd_chan_put(hit->ch);
		free(hit);
	}
}

/* ---- the connecting side ---------------------------------------------------------- */

struct job { struct job *next; struct wsd_sock *s; };

static struct job *jobs, **jobs_tail = &jobs;
static pthread_cond_t jobs_cv = PTHREAD_COND_INITIALIZER;
static bool worker_up;

static void fail(struct wsd_sock *s, enum wsd_reason why)
{
	/* wsd stat names the connection that stays on TCP, whatever stopped it */
	(void)learn_tuple(s);
	atomic_store(&s->upgrade_state, UP_FAILED);
	set_reason(s, why);
	wsd_debug("switch: fd %d stays on TCP: %s", s->fd, wsd_reason_name(why));
}

/*
 * The peer's switch listens on the peer's address and port: as an IPv4
 * address when the peer's is one (mapped or not), else as IPv6, the scope
 * of a link-local address included.  Returns the length.
 */
static socklen_t peer_addr(const struct wsd_sock *s, struct sockaddr_storage *to)
{
	const struct wsd_stat_addr *p = &s->stat->peer;

	memset(to, 0, sizeof(*to));
	if (p->family == AF_INET) {
		struct sockaddr_in *in = (struct sockaddr_in *)to;

		in->sin_family = AF_INET;
		in->sin_port = htons(p->port);
		memcpy(&in->sin_addr, p->addr, 4);
		return sizeof(*in);
	}
	memcpy(to, &s->peer, sizeof(struct sockaddr_in6));
	return sizeof(struct sockaddr_in6);
}

/* ---- requests on a channel (the connecting side) ---------------------------------- */

/* An OPEN we sent, until its answer: the socket and the session it is for. */
struct open_req {
	struct open_req *next;
	uint64_t req;
	struct wsd_chan *ch;
	struct wsd_sock *s;          /* held */
	struct wsd_session *ss;
};

static struct open_req *opens;        /* pend_lock */
static uint64_t next_req = 1;

static void open_fail(struct wsd_sock *s, struct wsd_session *ss, enum wsd_reason why)
{
	wsd_session_free(ss);
	fail(s, why);
	wsd_sock_put(s);
}

/* The connection's upgrade is one message on the channel, answered later. */
static void client_open(struct wsd_sock *s, struct wsd_chan *ch, const struct wsd_tuple *t)
{
	struct wsd_chmsg m = { .t = *t };
	struct open_req *o = calloc(1, sizeof(*o));
	struct wsd_session *ss = o ? wsd_session_new(ch) : NULL;

	if (!ss) {
		free(o);
		return fail(s, R_PROVIDER);
	}
	wsd_session_hello(ss, &m.h, MSG_OPEN);
	wsd_sock_hold(s);
	o->ch = ch;
	o->s = s;
	o->ss = ss;
	pthread_mutex_lock(&pend_lock);
	o->req = m.req = next_req++;
	o->next = opens;
	opens = o;
	pthread_mutex_unlock(&pend_lock);
	if (wsd_chan_send(ch, &m) == 0)
		return;
	/* not sent: unless the channel's death took it first, it is ours to end */
	pthread_mutex_lock(&pend_lock);
	for (struct open_req **pp = &opens; *pp; pp = &(*pp)->next)
		if (*pp == o) {
			*pp = o->next;
			pthread_mutex_unlock(&pend_lock);
			open_fail(s, ss, R_PROVIDER);
			free(o);
			return;
		}
	pthread_mutex_unlock(&pend_lock);
}

void wsd_upgrade_on_answer(struct wsd_chan *ch, uint64_t req, const struct wsd_chmsg *m)
{
	struct open_req *o = NULL;

	pthread_mutex_lock(&pend_lock);
	for (struct open_req **pp = &opens; *pp; pp = &(*pp)->next)
		if ((*pp)->ch == ch && (*pp)->req == req) {
			o = *pp;
			*pp = o->next;
			break;
		}
	pthread_mutex_unlock(&pend_lock);
	if (!o) {
		wsd_debug("switch: channel %u: an answer to no request", wsd_chan_id(ch));
		return;
	}
	if (m && m->h.kind == MSG_OPENED) {
		wsd_session_peer(o->ss, &m->h);
		wsd_session_known(o->ss);
		wsd_session_attach(o->s, o->ss);
		wsd_debug("switch: fd %d upgraded on channel %u", o->s->fd, wsd_chan_id(ch));
		wsd_sock_put(o->s);
	} else {
		open_fail(o->s, o->ss, m && m->h.reason < R_NREASONS ? (enum wsd_reason)m->h.reason
								     : R_PEER_PLAIN);
	}
	free(o);
}

void wsd_upgrade_chan_dead(struct wsd_chan *ch)
{
	struct open_req *mine = NULL;
	struct pending *drop_p = NULL;

	pthread_mutex_lock(&pend_lock);
	for (struct open_req **pp = &opens; *pp;) {
		struct open_req *o = *pp;

		if (o->ch == ch) {
			*pp = o->next;
			o->next = mine;
			mine = o;
		} else {
			pp = &o->next;
		}
	}
	for (struct pending **pp = &pendings; *pp;) {
		struct pending *p = *pp;

		if (p->ch == ch) {
			*pp = p->next;
			p->next = drop_p;
			drop_p = p;
			npending--;
		} else {
			pp = &p->next;
		}
	}
	pthread_mutex_unlock(&pend_lock);
	while (mine) {
		struct open_req *o = mine;

		mine = o->next;
		open_fail(o->s, o->ss, R_PEER_PLAIN);
		free(o);
	}
	while (drop_p) {
		struct pending *p = drop_p;

		drop_p = p->next;
		wsd_chan_put(p->ch);
		free(p);
	}
}

/* A new channel: a new SPI connection to the peer's registry, HELLO and ACCEPT. */
static void client_upgrade(struct wsd_sock *s)
{
	struct sockaddr_storage to;
	socklen_t tolen;
	struct wsd_session *ss;
	struct wsd_chan *ch;
	struct wsd_hello h = { 0 }, a;
	struct wsd_tuple t = { .magic = WSD_TUPLE_MAGIC, .version = WSD_PROTO_VERSION };
	WSABUF caller = { sizeof(t), (char *)&t };
	const char *why;
	SOCKET ws;
	int err, e;
	long ms;

	if (atomic_load(&s->nfds) == 0 || s->no_upgrade)
		return fail(s, s->no_upgrade ? (enum wsd_reason)s->why_not : R_FORKED);
	if (urgent_seen(s))
		return fail(s, R_UNSUPPORTED);
	if (learn_tuple(s))
		return fail(s, R_PEER_PLAIN);
	t.client = s->stat->local;
	t.server = s->stat->peer;
	ch = wsd_chan_find(&s->stat->peer);
	if (ch) {
		client_open(s, ch, &t);
		wsd_chan_put(ch);
		return;
	}
	if (!wsd_guard_room(UPGRADE_FDS, upgrade_bytes()))
		return fail(s, R_RESOURCES);
	tolen = peer_addr(s, &to);
	ws = procs.lpWSPSocket(to.ss_family, SOCK_STREAM, 0, &proto, 0, 0, &err);
	if (ws == INVALID_SOCKET)
		return fail(s, R_PROVIDER);
	/* only the process that holds the TCP listener may take this over (shm) */
	if (procs.lpWSPSetSockOpt(ws, SOL_WSP, SO_WSP_TCP_LISTENER, &(int){ 1 }, sizeof(int),
				  &err) ||
	    procs.lpWSPConnect(ws, (struct sockaddr *)&to, tolen, &caller, NULL, NULL,
			       NULL, &err)) {
		procs.lpWSPCloseSocket(ws, &err);
		return fail(s, err == WSAEACCES ? R_ACCESS : R_PEER_PLAIN);
	}
	ch = wsd_chan_new(ws, path_of(ws), true, &s->stat->peer);
	if (!ch) {
		procs.lpWSPCloseSocket(ws, &err);
		return fail(s, R_PROVIDER);
	}
	ss = wsd_session_new(ch);
	wsd_chan_put(ch);   /* the session's now, or closed */
	if (!ss)
		return fail(s, R_PROVIDER);
	wsd_session_hello(ss, &h, MSG_HELLO);
	if (wsd_fault("hello-delay", &ms))
		usleep((useconds_t)ms * 1000);
	if (send_msg(ws, &h) || recv_msg(&ws, &a, ANSWER_MS)) {
		if (ws == INVALID_SOCKET)
			wsd_chan_lost_socket(ch);
		wsd_session_free(ss);
		return fail(s, R_NO_MATCH);
	}
	e = wsd_wire_hello_check(&a, MSG_ACCEPT, &why);
	if (e || a.kind != MSG_ACCEPT) {
		wsd_session_free(ss);
		if (e)
			wsd_debug("switch: fd %d: the peer's answer: %s", s->fd, why);
		/* a well-formed REFUSE gives the peer's reason, anything else protocol */
		return fail(s, !e && a.reason < R_NREASONS ? (enum wsd_reason)a.reason : R_PROTOCOL);
	}
	wsd_session_peer(ss, &a);
	wsd_session_known(ss);
	wsd_chan_start(ch, a.pid);
	wsd_session_attach(s, ss);
	wsd_debug("switch: fd %d upgraded at %lld ms, channel %u", s->fd, (long long)wsd_now_ms(),
		  wsd_chan_id(ch));
}

static void *worker(void *arg)
{
	(void)arg;
	wsd_spi();   /* the provider's start-up (tens of ms) is paid here, early */
	for (;;) {
		struct job *j;

		pthread_mutex_lock(&up_lock);
		atomic_fetch_sub(&wsd_threads_busy, 1);   /* waiting (wsd_threads_idle) */
		while (!jobs)
			pthread_cond_wait(&jobs_cv, &up_lock);
		atomic_fetch_add(&wsd_threads_busy, 1);
		j = jobs;
		jobs = j->next;
		if (!jobs)
			jobs_tail = &jobs;
		pthread_mutex_unlock(&up_lock);
		atomic_store(&j->s->upgrade_state, UP_RUNNING);
		client_upgrade(j->s);
		wsd_sock_put(j->s);
		free(j);
	}
	return NULL;
}

/* up_lock held: one worker per process, started on demand. */
static bool start_worker(void)
{
	if (!worker_up) {
		pthread_attr_t at;
		pthread_t t;

		pthread_attr_init(&at);
		pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
		atomic_fetch_add(&wsd_threads_busy, 1);   /* until its first wait */
		worker_up = pthread_create(&t, &at, worker, NULL) == 0;
		if (!worker_up)
			atomic_fetch_sub(&wsd_threads_busy, 1);
		pthread_attr_destroy(&at);
	}
	return worker_up;
}

void wsd_upgrade_prestart(void)
{
	if (__atomic_load_n(&worker_up, __ATOMIC_RELAXED) || !wsd_switch_params()->enabled ||
	    !wsd_guard_room(START_FDS, 0))
		return;
	pthread_mutex_lock(&up_lock);
	start_worker();
	pthread_mutex_unlock(&up_lock);
}

void wsd_upgrade_maybe(struct wsd_sock *s)
{
	const struct wsd_switch_params *p;
	struct timespec ts;
	struct job *j;
	int expect = UP_NONE;

	if (!s->connected_side) {
		/*
		 * The accepting side upgrades when asked; until then wsd stat
		 * shows its addresses from its first data call (two system
		 * calls once, not on every accept: most short ones never ask).
		 */
		if (!s->tuple_known && !s->listening)
			(void)learn_tuple(s);
		return;
	}
	if (atomic_load_explicit(&s->upgrade_state, memory_order_relaxed) != UP_NONE)
		return;
	p = wsd_switch_params();
	if (s->no_upgrade || !p->enabled) {
		if (atomic_compare_exchange_strong(&s->upgrade_state, &expect, UP_FAILED))
			set_reason(s, p->enabled ? (enum wsd_reason)s->why_not : R_DISABLED);
		return;
	}
	/*
	 * A connection to a peer we have a channel with upgrades at once:
	 * it costs one message, not a provider connection.  Looked at on the
	 * first data call only (two system calls for the addresses, once).
	 */
	if (!s->chan_looked) {
		struct wsd_chan *ch;

		s->chan_looked = true;
		if (!learn_tuple(s) && (ch = wsd_chan_find(&s->stat->peer))) {
			s->chan_known = true;
			wsd_chan_put(ch);
		}
	}
	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	if (!s->chan_known && s->tcp_tx + s->tcp_rx < p->upgrade_bytes &&
	    (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec - s->created_ns <
	    p->upgrade_ns)
		return;
	wsd_guard_scan();   /* an io_uring of the program's own: nothing upgrades */
	if (s->no_upgrade) {
		if (atomic_compare_exchange_strong(&s->upgrade_state, &expect, UP_FAILED))
			set_reason(s, (enum wsd_reason)s->why_not);
		return;
	}
	if (!atomic_compare_exchange_strong(&s->upgrade_state, &expect, UP_QUEUED))
		return;
	if (s->chan_known ? !wsd_guard_room(0, SLOT_BYTES) :
	    !wsd_guard_room(UPGRADE_FDS + (worker_up ? 0 : START_FDS), upgrade_bytes())) {
		fail(s, R_RESOURCES);
		return;
	}
	if (!wsd_spi() || !(j = calloc(1, sizeof(*j)))) {
		fail(s, R_PROVIDER);
		return;
	}
	wsd_sock_hold(s);
	j->s = s;
	pthread_mutex_lock(&up_lock);
	if (!start_worker()) {
		pthread_mutex_unlock(&up_lock);
		wsd_sock_put(s);
		free(j);
		fail(s, R_PROVIDER);
		return;
	}
	wsd_debug("switch: fd %d upgrade queued at %lld ms", s->fd, (long long)wsd_now_ms());
	*jobs_tail = j;
	jobs_tail = &j->next;
	pthread_cond_signal(&jobs_cv);
	pthread_mutex_unlock(&up_lock);
}

/* ---- fork ---------------------------------------------------------------------------- */

/*
 * The child starts with no threads: no worker, no acceptors, and the
 * parent's SPI instance is not its own.  Sockets both processes now hold
 * never upgrade (the peer's data would go to only one of them); upgraded
 * ones stay the parent's.
 */
static void mark_child(int fd, struct wsd_sock *s, void *arg)
{
	(void)fd;
	(void)arg;
	s->no_upgrade = true;
	if (!s->why_not)
		s->why_not = R_FORKED;
	if (s->sess) {
		s->sess->ws = INVALID_SOCKET;   /* the parent's: not ours to close */
		if (!(s->rx_back && s->tx_back)) {
			/* it did not go back to the stream before fork: the parent's alone */
			s->detached = true;
			set_reason(s, R_FORKED);
		}
	}
}

void wsd_upgrade_atfork_child(void)
{
	atomic_store(&wsd_threads_busy, 0);   /* the child has none of our threads */
	pthread_mutex_init(&up_lock, NULL);
	pthread_mutex_init(&pend_lock, NULL);
	pthread_cond_init(&jobs_cv, NULL);
	spi_started = false;
	spi_failed = false;
	worker_up = false;
	jobs = NULL;
	jobs_tail = &jobs;
	regs = NULL;
	pendings = NULL;
	npending = 0;
	opens = NULL;
	wsd_chan_atfork_child();
	atomic_store(&handshakes, 0);
	wsd_fd_each(mark_child, NULL);
}

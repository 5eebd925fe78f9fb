/* SPDX-License-Identifier: MIT */
/*
 * The listening side of the upgrade (wsd-protocol(7), "Handshake",
 * "Channels").  A listening socket registers its port with the SPI (an
 * acceptor thread per port); a connect request's HELLO, or an OPEN on a
 * channel, is matched against the connections the program accepted, or
 * waits for its accept (at most MAX_PENDING HELLOs and MAX_PENDING_OPENS
 * OPENs, PENDING_MS each), and is
 * answered ACCEPT/OPENED or REFUSE/DECLINE.  Locks: pend_lock guards the
 * requests in hand; up_lock the registry list.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "provider/fault.h"
#include "provider/internal.h"
#include "switch/chan.h"
#include "switch/session.h"
#include "switch/upgrade_int.h"

/* ---- the listening side ---------------------------------------------------------- */

/*
 * A registration's page, shared with the fork children that inherit its
 * listener (MAP_SHARED): they count themselves in it at their first
 * accept, and one that opened a registry of its own (its parent keeps the
 * port's) notes there each connection it accepts, so that the port's
 * registry can send a request for it on (R_MOVED).  Only the processes of
 * one program write it; a slot is one 64-bit store: the tuple's hash in
 * the high 48 bits, the child's registry port in the low 16.  A later
 * connection with the same slot overwrites: its request is then answered
 * shared and asked again, or stays on TCP.
 */
#define REG_SLOTS 511

struct wsd_reg_page {
	_Atomic uint32_t count;
	uint32_t pad;
	_Atomic uint64_t slot[REG_SLOTS];
};
_Static_assert(sizeof(struct wsd_reg_page) == 4096, "the registration's page is one page");

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
	/*
	 * Processes that accept on its listener besides this one: fork
	 * children count themselves at their first accept, in a page they
	 * share with us (MAP_SHARED).  Over `self` (1 when we took the
	 * registration over from a parent, having counted ourselves), the
	 * listener is shared: a connection we have not accepted is likely in
	 * another's hands, so a request we find no connection for is answered
	 * R_SHARED at once (R_MOVED when a child noted it in the page), and
	 * no channel is made ahead nor mailbox granted.
	 */
	struct wsd_reg_page *page;
	uint32_t self;
	bool own_page;               /* a page of ours, unmapped with the registry */
	/*
	 * A fork child's own registry, for the connections it accepts on port
	 * while its parent keeps the port's: the provider port it listens on,
	 * held in TCP by side_fd (bound, never listening) so that no server
	 * that will listen on it finds the name taken.  0 and -1 otherwise.
	 */
	uint16_t side_port;
	int side_fd;
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
static pid_t fork_parent;            /* in a fork child: the process that forked it */
/* oldest first (pend_lock): expiry looks at the head, and the program
 * accepts in about the order its peers connected */
static struct pending *pendings, **pend_tail = &pendings;
static int npending, npending_ws;    /* pend_lock: all, and those holding an SPI connection */
static _Atomic int handshakes;       /* take_hello threads running */
pthread_mutex_t pend_lock = PTHREAD_MUTEX_INITIALIZER;

/* FNV-1a over what same() compares of the connection's two ends. */
static uint64_t tuple_hash(const struct wsd_stat_addr *client, const struct wsd_stat_addr *server)
{
	const struct wsd_stat_addr *e[2] = { client, server };
	uint64_t h = 0xcbf29ce484222325ull;

	for (int i = 0; i < 2; i++) {
		uint8_t b[19] = { e[i]->family, (uint8_t)(e[i]->port >> 8), (uint8_t)e[i]->port };
		size_t n = 3 + (e[i]->family == AF_INET ? 4 : 16);

		memcpy(b + 3, e[i]->addr, n - 3);
		for (size_t k = 0; k < n; k++)
			h = (h ^ b[k]) * 0x100000001b3ull;
	}
	return h;
}

#define SLOT_TAG 0xffffffffffff0000ull
_Static_assert(R_MOVED == WSD_REASON_MOVED, "the wire's moved");

/*
 * The registry of t's port is shared (struct reg): false if not; else
 * true, and *moved the port of the registry of the child that noted t's
 * connection, or 0.  A child's own registry is never shared.
 */
static bool port_shared(const struct wsd_tuple *t, uint16_t *moved)
{
	bool shared = false;

	*moved = 0;
	pthread_mutex_lock(&up_lock);
	for (struct reg *r = regs; r; r = r->next)
		if (r->port == t->server.port && !r->side_port) {
			shared = r->page && atomic_load(&r->page->count) > r->self;
			if (shared && t->client.family) {
				uint64_t h = tuple_hash(&t->client, &t->server);
				uint64_t v = atomic_load(&r->page->slot[h % REG_SLOTS]);

				if (v && (v & SLOT_TAG) == (h & SLOT_TAG))
					*moved = (uint16_t)v;
			}
			break;
		}
	pthread_mutex_unlock(&up_lock);
	return shared;
}

/* A child's own registry for its port (struct reg, side_port), or none (false). */
static bool side_reg_of(uint16_t port)
{
	bool found = false;

	pthread_mutex_lock(&up_lock);
	for (struct reg *r = regs; r && !found; r = r->next)
		found = r->port == port && r->side_port;
	pthread_mutex_unlock(&up_lock);
	return found;
}

/* The accepted connection a connect request names, held, or NULL. */
struct find { const struct wsd_tuple *t; struct wsd_sock *found; };

static void match(int fd, struct wsd_sock *s, void *arg)
{
	struct find *f = arg;

	(void)fd;
	if (f->found || s->listening || s->connected_side || !wsd_stat_own(s->stat))
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
bool urgent_seen(const struct wsd_sock *s)
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
	bool boxed;                  /* an OPEN posted in our mailbox, at entry box */
	int box;
	struct wsd_sock *sock;       /* ...for this accepted socket */
	struct wsd_session *grant;   /* ...and the session the entry granted */
	int fd;                      /* ...and the poster's descriptor of the connection, or -1 */
};

/* An answer to an OPEN: in the mailbox entry it came in, else a message. */
static int answer(const struct request *q, struct wsd_chmsg *a)
{
	if (!q->boxed)
		return wsd_chan_send(q->ch, a);
	/* a DECLINE gives the grant back: the peer may have written its slot */
	wsd_chan_box_reply(q->ch, q->box, a, a->h.kind == MSG_DECLINE ? q->grant : NULL,
			   a->h.kind == MSG_OPENED ? q->sock : NULL);
	return 0;
}

/* port: a moved answer's (the registry to ask), else 0 */
static void answer_no_port(const struct request *q, enum wsd_reason why, uint16_t port)
{
	struct wsd_chmsg m = decline_msg(q->req, why);

	m.h.seg = port;
	if (q->boxed) {
		wsd_stat_refused(why);
		answer(q, &m);
	} else if (q->ch) {
		wsd_stat_refused(why);
		wsd_chan_send(q->ch, &m);
	} else {
		refuse_port(q->ws, why, port);
	}
}

static void answer_no(const struct request *q, enum wsd_reason why)
{
	answer_no_port(q, why, 0);
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
	/* a grant's slot was made ahead, within the room of its time */
	if (!q->grant &&
	    !wsd_guard_room(ch ? 0 : UPGRADE_FDS, ch ? SLOT_BYTES : upgrade_bytes()))
		goto no;
	why = R_PROVIDER;
	if (!ch && !(ch = wsd_chan_new(q->ws, path_of(q->ws), false, NULL)))
		goto no;
	ss = q->grant ? q->grant : wsd_session_new(ch);
	if (ss && q->grant) {
		ss->granted = true;
		/* the poster holds the connection: no proof to wait for, from it or for our sends */
		ss->proof_waived = wsd_chan_box_held(ch, q->fd, s);
		a.flags = ss->proof_waived ? WSD_OPENED_HELD : 0;
	}
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
	if (q->ch ? answer(q, &a) : send_msg(q->ws, &a.h)) {
		wsd_session_free(ss);
		if (!q->ch)
			wsd_chan_put(ch);
		atomic_store(&s->upgrade_state, UP_FAILED);
		set_reason(s, R_PROVIDER);
		return;
	}
	wsd_session_known(ss);
	if (!q->ch) {
		/*
		 * its peer's first-byte OPENs could name connections of another
		 * process; and none come to a child's own registry
		 */
		uint16_t moved;
		struct wsd_tuple lt = { .server = s->stat->local };

		if (port_shared(&lt, &moved) || side_reg_of(s->stat->local.port))
			wsd_chan_no_box(ch);
		wsd_chan_start(ch, q->h->pid);
		wsd_chan_put(ch);   /* the session holds it */
	}
	if (ss->proof_waived)
		atomic_store(&s->proven, true);
	wsd_session_attach(s, ss);
	return;
no:
	answer_no(q, why);
	atomic_store(&s->upgrade_state, UP_FAILED);
	set_reason(s, why);
	return;
no_ch:
	if (q->ch)
		answer_no(q, R_PROVIDER);
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

/* pend_lock held: *pp out of the list. */
static struct pending *pending_unlink(struct pending **pp)
{
	struct pending *p = *pp;

	*pp = p->next;
	if (pend_tail == &p->next)
		pend_tail = pp;
	npending--;
	npending_ws -= !p->ch;
	p->next = NULL;
	return p;
}

/* pend_lock held: requests that waited too long, unlinked onto *old. */
static void pending_expire(uint64_t now, struct pending **old)
{
	while (pendings && now - pendings->when_ms > PENDING_MS) {
		struct pending *p = pending_unlink(&pendings);

		p->next = *old;
		*old = p;
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

/*
 * A request that passed its checks: attached to the accepted connection it
 * names, or kept until the program accepts it (within the caps).
 */
static void take_request(const struct request *q, const struct wsd_tuple *t)
{
	struct find f = { t, NULL };
	struct pending *p = NULL, *old = NULL;
	bool full = false, shared = false;
	uint16_t moved = 0;

	pthread_mutex_lock(&pend_lock);
	wsd_fd_each(match, &f);
	/*
	 * Not ours yet, on a shared port: not kept, as the connection is
	 * likely another process's: the one that noted it (R_MOVED), or
	 * R_SHARED, to be asked again.  up_lock inside pend_lock: no path
	 * takes them the other way.
	 */
	if (!f.found)
		shared = port_shared(t, &moved);
	if (!f.found && !shared) {
		pending_expire((uint64_t)wsd_now_ms(), &old);
		full = q->ch ? npending - npending_ws >= MAX_PENDING_OPENS :
			       npending_ws >= MAX_PENDING;
		p = full ? NULL : calloc(1, sizeof(*p));
		if (p) {
			if (q->ch)
				wsd_chan_hold(q->ch);
			p->ch = q->ch;
			p->ws = q->ws;
			p->req = q->req;
			p->h = *q->h;
			p->t = *t;
			p->when_ms = (uint64_t)wsd_now_ms();
			*pend_tail = p;
			pend_tail = &p->next;
			npending++;
			npending_ws += !p->ch;
		}
	}
	pthread_mutex_unlock(&pend_lock);
	pending_refuse(old);
	if (f.found) {
		server_attach(f.found, q);
		wsd_sock_put(f.found);
	} else if (moved) {
		answer_no_port(q, R_MOVED, moved);
	} else if (!p) {
		answer_no(q, shared ? R_SHARED : full ? R_BUSY : R_PROVIDER);
	}
}

/*
 * A HELLO that names no connection: a channel made ahead, for the peer's
 * later connections (probe.c on its side).  On shm only, where the kernel
 * named the peer's process and the transport checked it may write our
 * memory, and AHEAD_MAX channels per peer process at most; its session
 * ends at once (both sides SHUT each other's slot).
 */
#define AHEAD_MAX 4

static void take_channel(SOCKET ws, const struct wsd_hello *h, uint16_t port)
{
	struct wsd_hello a = { 0 };
	struct wsd_session *ss;
	struct wsd_chan *ch;

	if (path_of(ws) != PATH_SHM || !peer_pid_is(ws, h->pid)) {
		refuse(ws, R_UNSUPPORTED);
		return;
	}
	/* its later connections may come to another process: none would use it */
	if (port_shared(&(struct wsd_tuple){ .server = { .port = port } }, &(uint16_t){ 0 })) {
		refuse(ws, R_SHARED);
		return;
	}
	/* one a port it listens on, say: a few, not as many as it likes */
	if (wsd_chan_with(h->pid) >= AHEAD_MAX) {
		refuse(ws, R_BUSY);
		return;
	}
	if (!wsd_guard_room(UPGRADE_FDS, upgrade_bytes())) {
		refuse(ws, R_RESOURCES);
		return;
	}
	if (!(ch = wsd_chan_new(ws, PATH_SHM, false, NULL))) {
		refuse(ws, R_PROVIDER);
		return;
	}
	ss = wsd_session_new(ch);
	if (ss) {
		wsd_session_peer(ss, h);
		wsd_session_hello(ss, &a, MSG_ACCEPT);
	}
	if (!ss || send_msg(ws, &a)) {
		wsd_session_free(ss);
		wsd_chan_put(ch);   /* closes ws */
		wsd_stat_refused(R_PROVIDER);
		return;
	}
	wsd_session_known(ss);
	wsd_chan_start(ch, h->pid);
	wsd_chan_put(ch);   /* its receive holds it */
	wsd_session_free(ss);
	wsd_debug("switch: channel %u made ahead by process %u", wsd_chan_id(ch), h->pid);
}

static void take_hello(SOCKET ws, const struct wsd_tuple *t)
{
	struct wsd_hello h;
	const char *why;
	int e;

	if (recv_msg(&ws, &h, ANSWER_MS, NULL) || h.kind != MSG_HELLO || h.magic != WSD_PROTO_MAGIC) {
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
	if (!t->client.family) {
		take_channel(ws, &h, t->server.port);
		return;
	}
	take_request(&(struct request){ .ws = ws, .ch = NULL, .h = &h }, t);
}

/* An OPEN on a channel: as a HELLO, without a new SPI connection. */
void wsd_upgrade_on_open(struct wsd_chan *ch, const struct wsd_chmsg *m)
{
	wsd_guard_scan();   /* an io_uring of the program's own: nothing upgrades */
	take_request(&(struct request){ .ws = INVALID_SOCKET, .ch = ch, .req = m->req,
					.h = &m->h }, &m->t);
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
	bool ok = false;

	if (atomic_fetch_add(&handshakes, 1) < MAX_HANDSHAKES && (hs = malloc(sizeof(*hs)))) {
		hs->ws = ws;
		hs->t = *t;
		ok = wsd_thread_start(handshake_main, hs, false) == 0;
	}
	if (!ok) {
		free(hs);
		atomic_fetch_sub(&handshakes, 1);
		refuse(ws, R_BUSY);
	}
}

static void reg_free(struct reg *r)
{
	if (r->own_page)
		munmap(r->page, sizeof(*r->page));
	if (r->side_fd >= 0) {
		wsd_fd_named(r->side_fd, false);
		real.close(r->side_fd);
	}
	free(r);
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
	reg_free(r);
	atomic_fetch_sub(&wsd_threads_busy, 1);
	return NULL;
}

/* s listens: a registry for its port, made or taken; false if none. */
static bool reg_open(struct wsd_sock *s)
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
	int err;
	bool ok = false;

	s->listening = true;
	if (getsockname(s->fd, (struct sockaddr *)&a, &al))
		return false;
	to_addr(&a, &sa);
	wsd_stat_begin(s->stat);
	s->stat->local = sa;
	s->stat->listening = 1;
	s->stat->reason = R_LISTENER;
	wsd_stat_end(s->stat);
	if (!wsd_switch_params()->enabled)
		return false;
	if (!wsd_guard_room(START_FDS, 0)) {
		set_reason(s, R_RESOURCES);
		wsd_debug("switch: the listener on port %u stays plain: near the descriptor limit",
			  sa.port);
		return false;
	}
	if (!wsd_spi())
		return false;
	pthread_mutex_lock(&up_lock);
	for (r = regs; r; r = r->next)
		if (r->port == sa.port && !r->side_port)
			break;
	if (r) {
		r->refs++;
		s->reg_page = r->page;
		atomic_store(&r->closed_at, 0);
		pthread_mutex_unlock(&up_lock);
		return true;
	}
	r = calloc(1, sizeof(*r));
	if (!r)
		goto out;
	r->port = sa.port;
	r->refs = 1;
	r->side_fd = -1;
	if (s->reg_lost && s->reg_page) {
		/* a fork child's: its parent's page, where its siblings count too */
		r->page = s->reg_page;
		r->self = s->reg_counted;
	} else {
		r->page = mmap(NULL, sizeof(*r->page), PROT_READ | PROT_WRITE,
			       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
		if (r->page == MAP_FAILED)
			r->page = NULL;   /* never shared: as before fork children counted */
		r->own_page = r->page != NULL;
	}
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
		reg_free(r);
		goto out;
	}
	if (wsd_thread_start(acceptor, r, true)) {
		procs.lpWSPCloseSocket(r->ls, &err);
		reg_free(r);
	} else {
		r->next = regs;
		regs = r;
		ok = true;
		s->reg_page = r->page;
	}
out:
	pthread_mutex_unlock(&up_lock);
	return ok;
}

void wsd_upgrade_listen(struct wsd_sock *s)
{
	(void)reg_open(s);
}

/*
 * A fork child that accepts on l while its parent keeps the port's
 * registry: a registry of its own, on a provider port that a TCP socket
 * of ours holds (bound, wildcard, never listening: no server can want it
 * then), naming l to connectors, who check that we hold l's port
 * (SO_WSP_TCP_PORT).  The connections we accept are noted in the page
 * (wsd_upgrade_side_accepted), where the port's registry looks to send
 * their requests here.
 */
static uint16_t side_open(struct wsd_sock *l)
{
	struct sockaddr_storage a = { .ss_family = (sa_family_t)l->family };
	socklen_t al = l->family == AF_INET6 ? sizeof(struct sockaddr_in6) :
					       sizeof(struct sockaddr_in);
	struct wsd_stat_addr sa;
	struct reg *r = calloc(1, sizeof(*r));
	int err;

	if (!r)
		return 0;
	r->port = l->stat->local.port;
	r->refs = 1;
	r->side_fd = real.socket(l->family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (r->side_fd < 0 || real.bind(r->side_fd, (struct sockaddr *)&a, al) ||
	    getsockname(r->side_fd, (struct sockaddr *)&a, &al))
		goto fail;
	wsd_fd_named(r->side_fd, true);   /* a child of ours takes a port of its own */
	to_addr(&a, &sa);
	r->side_port = sa.port;
	r->ls = procs.lpWSPSocket(l->family, SOCK_STREAM, 0, &proto, 0, 0, &err);
	if (r->ls == INVALID_SOCKET ||
	    procs.lpWSPBind(r->ls, (struct sockaddr *)&a, al, &err) ||
	    procs.lpWSPSetSockOpt(r->ls, SOL_WSP, SO_WSP_TCP_LISTENER, &l->fd, sizeof(l->fd),
				  &err) ||
	    procs.lpWSPListen(r->ls, 128, &err)) {
		if (r->ls != INVALID_SOCKET)
			procs.lpWSPCloseSocket(r->ls, &err);
		goto fail;
	}
	pthread_mutex_lock(&up_lock);
	if (wsd_thread_start(acceptor, r, true)) {
		pthread_mutex_unlock(&up_lock);
		procs.lpWSPCloseSocket(r->ls, &err);
		goto fail;
	}
	r->next = regs;
	regs = r;
	pthread_mutex_unlock(&up_lock);
	wsd_debug("switch: a registry of our own for port %u, on %u", r->port, r->side_port);
	return sa.port;
fail:
	wsd_debug("switch: no registry of our own for port %u", r->port);
	if (r->side_fd >= 0) {
		wsd_fd_named(r->side_fd, false);
		real.close(r->side_fd);
	}
	free(r);
	return 0;
}

void wsd_upgrade_side_accepted(struct wsd_sock *l, struct wsd_sock *s)
{
	uint64_t h;

	if (!wsd_stat_own(s->stat) || learn_tuple(s))
		return;
	h = tuple_hash(&s->stat->peer, &s->stat->local);
	atomic_store(&l->reg_page->slot[h % REG_SLOTS], (h & SLOT_TAG) | l->side_port);
}

/*
 * An accept on a listener a fork child inherited (reg_lost): the parent's
 * registry does not see our connections (and a fork child holds none of
 * it: the provider closed its copy), so count ourselves among those that
 * accept on it (the registry is shared from now on), and ask for one of
 * our own.  Its name is free when the parent closed its listener or
 * exited (a server that forks and exits, a daemon).  Taken: asked again
 * after RELISTEN_MS.
 */
#define RELISTEN_MS 1000
#define RELISTEN_WAIT_MS 256

void wsd_upgrade_relisten(struct wsd_sock *l)
{
	int64_t now = wsd_now_ms();

	pthread_mutex_lock(&l->mu);
	if (!l->reg_lost || now < l->reg_try_ms) {
		pthread_mutex_unlock(&l->mu);
		return;
	}
	l->reg_try_ms = now + RELISTEN_MS;
	if (!l->reg_counted && l->reg_page) {
		atomic_fetch_add(&l->reg_page->count, 1);
		l->reg_counted = true;
	}
	pthread_mutex_unlock(&l->mu);
	/*
	 * A parent gone (a daemon's) frees the name once the kernel has
	 * ended its io_uring requests, a little after its exit: wait for
	 * that, RELISTEN_WAIT_MS at most, once.  A parent that keeps it (a
	 * server that forks its workers): a registry of our own beside it,
	 * once, and the name asked for again later.
	 */
	for (int ms = 1; !reg_open(l); ms *= 2) {
		if (getppid() == fork_parent) {
			uint16_t side = !l->side_port && l->reg_page ? side_open(l) : 0;

			if (side) {
				pthread_mutex_lock(&l->mu);
				l->side_port = side;
				pthread_mutex_unlock(&l->mu);
			}
			return;
		}
		if (ms > RELISTEN_WAIT_MS)
			return;
		real.poll(NULL, 0, ms);
	}
	pthread_mutex_lock(&l->mu);
	l->reg_lost = false;
	pthread_mutex_unlock(&l->mu);
}

void wsd_upgrade_unlisten(struct wsd_sock *s)
{
	struct reg **pp, *r;

	if (!s->listening)
		return;
	pthread_mutex_lock(&up_lock);
	/* the port's registry and a child's own, both */
	for (pp = &regs; (r = *pp); pp = &r->next) {
		if (r->port != s->stat->local.port || (r->side_port && r->side_port != s->side_port))
			continue;
		if (r->refs > 0 && --r->refs == 0)
			atomic_store(&r->closed_at, wsd_now_ms());   /* the acceptor ends it */
	}
	pthread_mutex_unlock(&up_lock);
}

/*
 * An accepted connection whose peer posted its OPEN in our mailbox (shm):
 * answered here, in the program's accept or first receive, where a message
 * would wait for our channel thread.  Cheap when no OPEN waits.
 */
void wsd_upgrade_box(struct wsd_sock *s)
{
	struct wsd_chan *ch;
	struct wsd_chmsg m;
	struct wsd_session *grant = NULL;
	const char *why = NULL;
	int idx;

	if (s->listening || s->connected_side || s->sess || s->no_upgrade ||
	    atomic_load(&s->upgrade_state) != UP_NONE)
		return;
	if (!wsd_chan_box_any()) {
		wsd_chan_box_refill();   /* grants the peers used or gave up, made again */
		return;
	}
	if (!wsd_stat_own(s->stat) || (!s->tuple_known && learn_tuple(s)))
		return;
	ch = wsd_chan_box_take(&s->stat->local, &s->stat->peer, &idx, &m, &grant);
	if (!ch)
		return;
	wsd_guard_scan();   /* an io_uring of the program's own: nothing upgrades */
	if (wsd_wire_chmsg_check(&m, &why) || m.h.kind != MSG_OPEN ||
	    m.t.version != WSD_PROTO_VERSION) {
		wsd_debug("switch: channel %u: a posted OPEN refused: %s", wsd_chan_id(ch),
			  m.h.kind != MSG_OPEN ? "not an OPEN" : why ? why : "tuple: another version");
		answer_no(&(struct request){ .ch = ch, .req = m.req, .boxed = true, .box = idx,
					     .grant = grant }, R_PROTOCOL);
	} else {
		server_attach(s, &(struct request){ .ws = INVALID_SOCKET, .ch = ch, .req = m.req,
						     .h = &m.h, .boxed = true, .box = idx,
						     .grant = grant, .sock = s, .fd = m.fd });
	}
	wsd_chan_box_grant(ch);   /* the entry's next grant, when the peer freed it */
	wsd_chan_put(ch);
}

/*
 * The first blocking receive of an accepted connection, in a process that
 * granted its peers entries in its mailboxes: such a peer posts its OPEN a
 * few microseconds after its connect returns, often after our accept, and
 * a receive asleep in the kernel would leave the OPEN to be taken back and
 * the first bytes to go by the stream.  So wait, spinning, for the OPEN or
 * for data, whichever comes first, up to BOX_FIRST_NS: a plain peer's
 * bytes end the wait as they come.
 */
#define BOX_FIRST_NS 100000
#define BOX_POLL_MS 50

int wsd_upgrade_box_first(struct wsd_sock *s, bool nonblock)
{
	int64_t end;

	if (s->first_waited)
		return 0;
	s->first_waited = true;
	wsd_upgrade_box(s);
	if (nonblock || s->sess || atomic_load(&s->upgrade_state) != UP_NONE ||
	    !wsd_chan_box_busy())
		return 0;
	end = wsd_now_ns() + BOX_FIRST_NS;
	for (int i = 0; wsd_now_ns() < end; i++) {
		char c;

		if (wsd_chan_box_any()) {
			wsd_upgrade_box(s);
			if (atomic_load(&s->upgrade_state) != UP_NONE)
				return 0;
		}
		if (i % 16 == 0 && real.recv(s->fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) >= 0) {
			wsd_upgrade_box(s);   /* posted just before the bytes came */
			return 0;             /* data, or the end: the stream's */
		}
		/* the peer may share our CPU: it must run to post */
		sched_yield();
	}
	/*
	 * Still nothing (a peer slow to post): wait for the stream in poll,
	 * BOX_POLL_MS at most, and look once more before any byte of it is
	 * read.  A peer that posted writes nothing on the stream before our
	 * answer but what a call its switch did not see wrote: taken first,
	 * its OPEN makes those bytes fail its proof, and the connection is
	 * reset rather than handing them over ahead of its first bytes.
	 */
	for (int k = 0; k < BOX_POLL_MS / 10; k++) {
		struct pollfd p = { .fd = s->fd, .events = POLLIN };
		int r = real.poll(&p, 1, 10);

		if (r < 0 && errno == EINTR)
			return -EINTR;
		wsd_upgrade_box(s);
		if (r != 0 || atomic_load(&s->upgrade_state) != UP_NONE)
			return 0;
	}
	return 0;
}

void wsd_upgrade_accepted(struct wsd_sock *s)
{
	struct pending **pp, *p, *hit = NULL, *old = NULL;

	wsd_upgrade_box(s);

	pthread_mutex_lock(&pend_lock);
	if (!pendings) {
		pthread_mutex_unlock(&pend_lock);
		return;
	}
	pthread_mutex_unlock(&pend_lock);
	if (!wsd_stat_own(s->stat) || learn_tuple(s))
		return;
	pthread_mutex_lock(&pend_lock);
	pending_expire((uint64_t)wsd_now_ms(), &old);
	for (pp = &pendings; (p = *pp); pp = &p->next) {
		if (same(&s->stat->local, &p->t.server) && same(&s->stat->peer, &p->t.client)) {
			hit = pending_unlink(pp);
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

/* The channel died: the OPENs on it waiting for an accept go (no answer can reach it). */
void accept_chan_dead(struct wsd_chan *ch)
{
	struct pending *drop_p = NULL;

	pthread_mutex_lock(&pend_lock);
	for (struct pending **pp = &pendings; *pp;) {
		struct pending *p = *pp;

		if (p->ch == ch) {
			pending_unlink(pp);
			p->next = drop_p;
			drop_p = p;
		} else {
			pp = &p->next;
		}
	}
	pthread_mutex_unlock(&pend_lock);
	while (drop_p) {
		struct pending *p = drop_p;

		drop_p = p->next;
		wsd_chan_put(p->ch);
		free(p);
	}
}

/* fork, in the child: no acceptor threads, no requests in hand. */
void accept_atfork_child(void)
{
	pthread_mutex_init(&pend_lock, NULL);
	fork_parent = getppid();
	regs = NULL;
	pendings = NULL;
	pend_tail = &pendings;
	npending = npending_ws = 0;
	atomic_store(&handshakes, 0);
}

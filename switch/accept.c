/* SPDX-License-Identifier: MIT */
/*
 * The listening side of the upgrade (wsd-protocol(7), "Handshake",
 * "Channels").  A connect request's HELLO that a port's registry took
 * (registry.c), or an OPEN on a channel, is matched against the
 * connections the program accepted, or
 * waits for its accept (at most MAX_PENDING HELLOs and MAX_PENDING_OPENS
 * OPENs, PENDING_MS or OPEN_PENDING_MS each), and is
 * answered ACCEPT/OPENED or REFUSE/DECLINE.  Of the handshakes and of
 * the requests kept, one peer holds no more than its share
 * (PEER_SHARE_OF).  pend_lock guards the requests in hand and the
 * handshakes running.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "provider/fault.h"
#include "provider/internal.h"
#include "switch/chan.h"
#include "switch/session.h"
#include "switch/upgrade_int.h"

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
	uint16_t moved;              /* accept_pending_reshare: the answer's port */
	uint32_t peer;               /* a HELLO's: the process the kernel named, or 0 */
};

/* oldest first (pend_lock): expiry looks at the head, and the program
 * accepts in about the order its peers connected */
static struct pending *pendings, **pend_tail = &pendings;
static int npending, npending_ws;    /* pend_lock: all, and those holding an SPI connection */

/*
 * Accepted connections that closed lately, never upgraded (pend_lock, the
 * oldest overwritten).  An OPEN for one (sent by message as the peer's
 * connection began, and taken by our channel thread only after the program
 * was done with it) is declined at once: kept, it would wait OPEN_PENDING_MS
 * for an accept that will not come, the peer's closed socket held as long.
 * A 4-tuple used again this soon by a new connection not yet accepted is
 * declined too, and stays on TCP: a lost upgrade, never a wrong one.
 */
#define CLOSED_KEEP 64
static struct closed_tuple {
	struct wsd_stat_addr server, client;
} closed[CLOSED_KEEP];
static unsigned closed_next;
/* pend_lock: the take_hello threads running, and the process each is with (0: not known) */
static struct { bool used; uint32_t peer; } handshakes[MAX_HANDSHAKES];
pthread_mutex_t pend_lock = PTHREAD_MUTEX_INITIALIZER;
/*
 * pend_lock: the handshakes handed to a thread that waits for one, and
 * how many such threads are not yet given one.  A thread that ended its
 * handshake waits HANDSHAKE_LINGER_MS for the next before it ends: a
 * thread per request would start and end near the program's forks, and a
 * sanitizer's allocator left locked by a thread ending across a fork
 * hangs the child (a fork holds only threads at work, not their ends).
 */
#define HANDSHAKE_LINGER_MS 30000
static struct handshake *hs_queue;
static int hs_unclaimed;
static pthread_cond_t hs_cv;

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
	uint32_t peer;               /* a HELLO's: the process the kernel named at ws's end, or 0 */
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

/*
 * A connection of ours that a fork child may be serving or about to: one
 * we handed a child at fork (it takes it over at its first data call and
 * its registry gets the request once we let go of our copy), or, in a
 * process that has forked such handlers before, one we have not sent or
 * received on yet (attached now, the fork of its handler would send it
 * back to the stream).  Its peer is answered shared, and asks again
 * (connect.c).
 */
static bool forked_copy(const struct wsd_sock *s)
{
	return s->reg_page && s->no_upgrade && s->why_not == R_FORKED;
}

static bool maybe_handed(const struct wsd_sock *s)
{
	if (!s->reg_page || s->sess)
		return false;
	if (s->no_upgrade)
		return forked_copy(s);
	return wsd_handlers_forked && !s->data_called;
}

static void server_attach(struct wsd_sock *s, const struct request *q)
{
	struct wsd_session *ss;
	struct wsd_chan *ch = q->ch;
	struct wsd_chmsg a = { 0 };
	int expect = UP_NONE;
	enum policy_word pw;
	enum wsd_reason why;
	long ms;

	if (maybe_handed(s)) {
		wsd_debug("switch: fd %d: its peer's request answered shared: a fork child may "
			  "serve it", s->fd);
		answer_no(q, R_SHARED);
		return;
	}
	if (urgent_seen(s)) {
		answer_no(q, R_UNSUPPORTED);
		set_reason(s, R_UNSUPPORTED);
		return;
	}
	/* the policy file's word, unless the accept had it (its addresses unknown then) */
	pw = policy_check(s);
	if (pw == POLICY_TCP)
		set_reason(s, R_POLICY);
	if (pw == POLICY_LATER || s->no_upgrade ||
	    !atomic_compare_exchange_strong(&s->upgrade_state, &expect, UP_RUNNING)) {
		why = s->no_upgrade ? (enum wsd_reason)s->why_not : R_REFUSED;
		wsd_debug("switch: fd %d: its peer's %s declined: %s", s->fd,
			  q->boxed ? "posted OPEN" : q->ch ? "OPEN" : "HELLO", wsd_reason_name(why));
		answer_no(q, why);
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
		why = errno == ENOSPC ? R_RESOURCES : R_PROVIDER;   /* a full channel */
		if (!q->ch)
			wsd_chan_put(ch);   /* closes q->ws with it: refused below, on nothing */
		goto no_ch;
	}
	wsd_session_peer(ss, q->h);
	/* by copy the peer's ring is mapped or not written at all (no RDMA): TCP */
	if (wsd_chan_copy(ch) && !wsd_session_mapped(ss)) {
		wsd_session_free(ss);
		if (!q->ch) {
			wsd_chan_lost_socket(ch);   /* q->ws: refused below */
			wsd_chan_put(ch);
		}
		why = R_RESOURCES;
		goto no;
	}
	wsd_session_hello(ss, &a.h, q->ch ? MSG_OPENED : MSG_ACCEPT);
	a.req = q->req;
	if (wsd_fault("accept-delay", &ms))
		usleep((useconds_t)ms * 1000);
	/* a new channel's receives first: the peer may send the moment it has ACCEPT */
	if (q->ch ? answer(q, &a) : wsd_chan_receive(ch, q->h->pid) || send_msg(q->ws, &a.h)) {
		wsd_session_free(ss);
		if (!q->ch) {
			wsd_chan_end(ch);   /* receives posted: they end, and the reader lets go */
			wsd_chan_put(ch);
		}
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
		if (!registry_boxes(s->stat->local.port))
			wsd_chan_no_box(ch);
		wsd_chan_start(ch, q->h->pid);
		wsd_chan_put(ch);   /* the session holds it */
	}
	if (ss->proof_waived)
		atomic_store(&s->proven, true);
	wsd_session_attach_new(s, ss);
	accept_publish(s, false);   /* upgraded: nobody else is to find it */
	return;
no:
	answer_no(q, why);
	atomic_store(&s->upgrade_state, UP_FAILED);
	set_reason(s, why);
	return;
no_ch:
	if (q->ch)
		answer_no(q, why);
	else
		wsd_stat_refused(why);
	atomic_store(&s->upgrade_state, UP_FAILED);
	set_reason(s, why);
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

/*
 * pend_lock held: requests that waited too long, unlinked onto *old.  The
 * list is oldest first, and no request expires sooner than PENDING_MS: the
 * walk ends at the first younger than that.
 */
static void pending_expire(uint64_t now, struct pending **old)
{
	struct pending **pp = &pendings, *p;

	while ((p = *pp) && now - p->when_ms > PENDING_MS) {
		if (p->ch && now - p->when_ms <= OPEN_PENDING_MS) {
			pp = &p->next;
			continue;
		}
		pending_unlink(pp);
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

/* pend_lock held: t names a connection we accepted and closed lately. */
static bool closed_lately(const struct wsd_tuple *t)
{
	for (unsigned i = 0; i < CLOSED_KEEP && i < closed_next; i++)
		if (same(&closed[i].server, &t->server) && same(&closed[i].client, &t->client))
			return true;
	return false;
}

/*
 * The rendezvous directory (WSD_RENDEZVOUS_DIR): an accepted connection's
 * entry, published through its port's registry at the accept so that a
 * client in another network namespace finds us by its own end, and
 * withdrawn once it upgraded or closed.
 */
void accept_publish(struct wsd_sock *s, bool on)
{
	struct sockaddr_storage peer;
	socklen_t len;

	if (on == s->rdv_published)
		return;
	if (on && (!*wsd_param_str("WSD_RENDEZVOUS_DIR") || s->listening || s->connected_side ||
		   !wsd_stat_own(s->stat) || learn_tuple(s)))
		return;
	len = peer_addr(s, &peer);
	if (registry_publish(s->stat->local.port, (const struct sockaddr *)&peer, len, on) == 0 ||
	    !on)
		s->rdv_published = on;
}

/*
 * Through the rendezvous directory the request's server end is the address
 * the client dialled, which a DNAT rule may have changed on the way: the
 * connection is the one we published for its client end, on port.
 */
static void match_client(int fd, struct wsd_sock *s, void *arg)
{
	struct find *f = arg;

	(void)fd;
	if (f->found || !s->rdv_published || s->listening || s->connected_side ||
	    !wsd_stat_own(s->stat) || !s->tuple_known)
		return;
	if (s->stat->local.port == f->t->server.port && same(&s->stat->peer, &f->t->client)) {
		wsd_sock_hold(s);
		f->found = s;
	}
}

bool accept_rdv_server(struct wsd_tuple *t, uint16_t port)
{
	struct wsd_tuple want = *t;
	struct find f = { &want, NULL };

	want.server.port = port;
	wsd_fd_each(match_client, &f);
	if (!f.found)
		return false;
	t->server = f.found->stat->local;
	wsd_sock_put(f.found);
	return true;
}

void wsd_upgrade_accepted_closed(struct wsd_sock *s)
{
	struct closed_tuple *c;

	accept_publish(s, false);
	if (s->listening || s->connected_side || s->sess || !s->tuple_known ||
	    !wsd_stat_own(s->stat))
		return;
	/* a fork child holds it still, and may take it over: not gone (maybe_handed) */
	if (forked_copy(s))
		return;
	pthread_mutex_lock(&pend_lock);
	c = &closed[closed_next++ % CLOSED_KEEP];
	c->server = s->stat->local;
	c->client = s->stat->peer;
	pthread_mutex_unlock(&pend_lock);
}

/*
 * pend_lock held: q's peer (its channel, or the process at ws's end) has
 * its share of the requests kept: a quarter of the cap, once half of it
 * is in use.  A HELLO from a process we cannot name is bound by the cap.
 */
static bool past_share(const struct request *q)
{
	int cap = q->ch ? MAX_PENDING_OPENS : MAX_PENDING, mine = 0;

	if ((q->ch ? npending - npending_ws : npending_ws) < cap / 2 || (!q->ch && !q->peer))
		return false;
	for (const struct pending *p = pendings; p; p = p->next)
		mine += q->ch ? p->ch == q->ch : !p->ch && p->peer == q->peer;
	return mine >= PEER_SHARE_OF(cap);
}

/*
 * A request that passed its checks: attached to the accepted connection it
 * names, or kept until the program accepts it (within the caps, and its
 * peer's share of them).
 */
static void take_request(const struct request *q, const struct wsd_tuple *t)
{
	struct find f = { t, NULL };
	struct pending *p = NULL, *old = NULL;
	bool full = false, over = false, shared = false, gone;
	uint16_t moved = 0;

	/* the port's every connection stays on TCP: the peer is told so, once for all */
	if (policy_port_tcp(t->server.port)) {
		answer_no_port(q, R_POLICY, WSD_REFUSE_EVERY);
		return;
	}
	pthread_mutex_lock(&pend_lock);
	wsd_fd_each(match, &f);
	/*
	 * Not ours yet, on a shared port: not kept, as the connection is
	 * likely another process's: the one that noted it (R_MOVED), or
	 * R_SHARED, to be asked again.  up_lock inside pend_lock: no path
	 * takes them the other way.
	 */
	if (!f.found)
		moved = registry_moved(t->server.port, t, &shared);
	gone = !f.found && !moved && !shared && closed_lately(t);
	if (!f.found && !shared && !gone) {
		pending_expire((uint64_t)wsd_now_ms(), &old);
		over = past_share(q);
		full = q->ch ? npending - npending_ws >= MAX_PENDING_OPENS :
			       npending_ws >= MAX_PENDING;
		p = full || over ? NULL : calloc(1, sizeof(*p));
		if (p) {
			if (q->ch)
				wsd_chan_hold(q->ch);
			p->ch = q->ch;
			p->ws = q->ws;
			p->req = q->req;
			p->h = *q->h;
			p->t = *t;
			p->peer = q->peer;
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
	} else if (gone) {
		wsd_debug("switch: a request for a connection accepted and closed lately: declined");
		answer_no(q, R_NO_MATCH);
	} else if (!p) {
		answer_no(q, shared ? R_SHARED : over ? R_PEER_LIMIT : full ? R_BUSY : R_PROVIDER);
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
	bool shared;

	if (path_of(ws) != PATH_SHM || !peer_pid_is(ws, h->pid)) {
		refuse(ws, R_UNSUPPORTED);
		return;
	}
	/* the policy keeps the port's connections on TCP: none would use it */
	if (policy_port_tcp(port)) {
		refuse_port(ws, R_POLICY, WSD_REFUSE_EVERY);
		return;
	}
	/* its later connections may come to another process: none would use it */
	(void)registry_moved(port, NULL, &shared);
	if (shared) {
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
	/* its receives first: the peer may send the moment it has ACCEPT */
	if (!ss || wsd_chan_receive(ch, h->pid) || send_msg(ws, &a)) {
		wsd_session_free(ss);
		wsd_chan_end(ch);   /* receives posted: they end, and the reader lets go */
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

static void take_hello(SOCKET ws, const struct wsd_tuple *t, uint32_t peer)
{
	struct wsd_hello h;
	const char *why;
	int e;

	int r = recv_msg(&ws, &h, ANSWER_MS, NULL, NULL);

	if (r || h.kind != MSG_HELLO || h.magic != WSD_PROTO_MAGIC) {
		if (ws != INVALID_SOCKET)
			drop(ws);
		else   /* a connector silent for ANSWER_MS: counted apart */
			wsd_stat_refused(r == -ETIMEDOUT ? R_TIMEOUT : R_PROTOCOL);
		return;
	}
	wsd_guard_scan();   /* an io_uring of the program's own: nothing upgrades */
	e = wsd_wire_hello_check(&h, MSG_HELLO, &why);
	if (e || t->version != WSD_PROTO_VERSION) {
		wsd_debug("switch: a HELLO refused: %s", e ? why : "tuple: another version");
		refuse(ws, R_PROTOCOL);
		return;
	}
	/* a process of a user the policy does not pair with (peer-users): each connection */
	if (!peer_user_ok(ws)) {
		refuse_port(ws, R_POLICY, WSD_REFUSE_EVERY);
		return;
	}
	if (!t->client.family) {
		take_channel(ws, &h, t->server.port);
		return;
	}
	take_request(&(struct request){ .ws = ws, .ch = NULL, .h = &h, .peer = peer }, t);
}

/* An OPEN on a channel: as a HELLO, without a new SPI connection. */
void wsd_upgrade_on_open(struct wsd_chan *ch, const struct wsd_chmsg *m)
{
	wsd_guard_scan();   /* an io_uring of the program's own: nothing upgrades */
	take_request(&(struct request){ .ws = INVALID_SOCKET, .ch = ch, .req = m->req,
					.h = &m->h }, &m->t);
}

struct handshake {
	struct handshake *next;      /* in hs_queue */
	SOCKET ws;
	struct wsd_tuple t;
	int place;                   /* in handshakes[] */
	uint32_t peer;
};

__attribute__((constructor)) static void hs_cv_init(void)
{
	pthread_condattr_t ca;

	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&hs_cv, &ca);
	pthread_condattr_destroy(&ca);
}

static void handshake_end(int place)
{
	pthread_mutex_lock(&pend_lock);
	handshakes[place].used = false;
	pthread_mutex_unlock(&pend_lock);
}

/* pend_lock held: the next handshake handed over, or NULL after the linger. */
static struct handshake *hs_next(void)
{
	struct timespec until;
	struct handshake *hs;

	clock_gettime(CLOCK_MONOTONIC, &until);
	until.tv_sec += HANDSHAKE_LINGER_MS / 1000;
	hs_unclaimed++;
	while (!hs_queue && pthread_cond_timedwait(&hs_cv, &pend_lock, &until) != ETIMEDOUT)
		;
	if ((hs = hs_queue))
		hs_queue = hs->next;   /* its giver counted it out of hs_unclaimed */
	else
		hs_unclaimed--;
	return hs;
}

static void *handshake_main(void *arg)
{
	struct handshake *hs = arg;

	while (hs) {
		take_hello(hs->ws, &hs->t, hs->peer);
		handshake_end(hs->place);
		free(hs);
		pthread_mutex_lock(&pend_lock);
		wsd_threads_rest();   /* waiting (wsd_threads_hold) */
		hs = hs_next();
		pthread_mutex_unlock(&pend_lock);
		if (hs)
			wsd_threads_work();
	}
	return NULL;
}

/* To a thread that waits for one, or a new thread; false when neither. */
static bool hs_give(struct handshake *hs)
{
	pthread_mutex_lock(&pend_lock);
	if (hs_unclaimed > 0) {
		hs_unclaimed--;
		hs->next = hs_queue;
		hs_queue = hs;
		pthread_cond_signal(&hs_cv);
		pthread_mutex_unlock(&pend_lock);
		return true;
	}
	pthread_mutex_unlock(&pend_lock);
	return wsd_thread_start(handshake_main, hs) == 0;
}

/*
 * A place in handshakes[] for one with peer (0: not known), or -1 and why
 * not: every place taken (busy), or the peer has its share (peer-limit),
 * counted as the requests kept are (past_share).
 */
static int handshake_place(uint32_t peer, enum wsd_reason *why)
{
	int place = -1, used = 0, mine = 0;

	pthread_mutex_lock(&pend_lock);
	for (int i = 0; i < MAX_HANDSHAKES; i++) {
		if (!handshakes[i].used) {
			if (place < 0)
				place = i;
			continue;
		}
		used++;
		mine += peer && handshakes[i].peer == peer;
	}
	*why = mine >= PEER_SHARE_OF(MAX_HANDSHAKES) && used >= MAX_HANDSHAKES / 2 ?
	       R_PEER_LIMIT : R_BUSY;
	if (*why == R_PEER_LIMIT)
		place = -1;
	if (place >= 0) {
		handshakes[place].used = true;
		handshakes[place].peer = peer;
	}
	pthread_mutex_unlock(&pend_lock);
	return place;
}

/* The process the kernel named at ws's other end (shm), or 0. */
static uint32_t peer_of(SOCKET ws)
{
	socklen_t len = sizeof(int);
	int pid = 0, err;

	if (procs.lpWSPGetSockOpt(ws, SOL_WSP, SO_WSP_PEER_PID, &pid, &len, &err) || pid <= 0)
		return 0;
	return (uint32_t)pid;
}

/* The request's HELLO is awaited on a thread of its own, within the caps. */
void accept_handshake(SOCKET ws, const struct wsd_tuple *t)
{
	struct handshake *hs = NULL;
	enum wsd_reason why;
	uint32_t peer = peer_of(ws);
	int place = handshake_place(peer, &why);

	if (place >= 0 && (hs = malloc(sizeof(*hs)))) {
		hs->ws = ws;
		hs->t = *t;
		hs->place = place;
		hs->peer = peer;
		if (hs_give(hs))
			return;
		why = R_BUSY;
	}
	free(hs);
	if (place >= 0)
		handshake_end(place);
	refuse(ws, why);
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

	/*
	 * One kept on TCP (the policy, stdio, an io_uring) looks all the same:
	 * an OPEN posted for it is declined with its reason at once, where
	 * left alone it would hold its poster's first bytes until taken back,
	 * and come again by message.
	 */
	if (s->listening || s->connected_side || s->sess ||
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
		if (wsd_chan_box_any()) {
			wsd_upgrade_box(s);
			if (atomic_load(&s->upgrade_state) != UP_NONE)
				return 0;
		}
		if (i % 16 == 0 && wsd_kernel_readable(s->fd)) {
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

	/*
	 * The policy file's word first: wsd stat says it from the accept on,
	 * and a request that came before is declined with it (below).
	 */
	if (wsd_switch_params()->enabled && policy_check(s) == POLICY_TCP)
		set_reason(s, R_POLICY);
	else if (wsd_switch_params()->enabled && !s->no_upgrade)
		accept_publish(s, true);
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

/*
 * The registry of port, shared since (a fork child's first accept on its
 * listener counted it): the requests kept for that port may name
 * connections the child accepted or will accept, which this process will
 * never see.  They are answered as take_request would answer them now:
 * moved to the child's registry that noted the connection, else shared
 * (the peer asks again later).  side: we are a fork child and this our
 * own registry, on that port: only the requests for connections a sibling
 * noted are answered, moved to its registry (a peer guessed us, its
 * last connection having been ours: connect.c, probe_routed).  The
 * registry's acceptor calls this at each wake, at least every 200 ms.
 */
void accept_pending_reshare(uint16_t port, uint16_t side)
{
	struct pending *gone = NULL, **tail = &gone;
	bool shared;

	pthread_mutex_lock(&pend_lock);
	for (struct pending **pp = &pendings; *pp;) {
		struct pending *p = *pp;
		uint16_t moved;

		if (p->t.server.port != port) {
			pp = &p->next;
			continue;
		}
		/* up_lock inside pend_lock, as in take_request */
		if (side) {
			moved = registry_sibling(port, side, &p->t);
			if (!moved) {
				pp = &p->next;
				continue;
			}
		} else {
			moved = registry_moved(port, &p->t, &shared);
			if (!shared)
				break;       /* not shared: none of the port's requests is */
		}
		pending_unlink(pp);
		p->moved = moved;
		*tail = p;
		tail = &p->next;
	}
	pthread_mutex_unlock(&pend_lock);
	while (gone) {
		struct pending *p = gone;
		struct request q = { .ws = p->ws, .ch = p->ch, .req = p->req, .h = &p->h };

		gone = p->next;
		if (p->moved)
			answer_no_port(&q, R_MOVED, p->moved);
		else
			answer_no(&q, R_SHARED);
		wsd_chan_put(p->ch);
		free(p);
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
	registry_atfork_child();
	pendings = NULL;
	pend_tail = &pendings;
	npending = npending_ws = 0;
	closed_next = 0;   /* the parent's connections are not ours to decline */
	memset(handshakes, 0, sizeof(handshakes));
	hs_queue = NULL;   /* the parent's threads', not ours */
	hs_unclaimed = 0;
	hs_cv_init();
}

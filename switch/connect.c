/* SPDX-License-Identifier: MIT */
/*
 * The connecting side of the upgrade (wsd-protocol(7), "Handshake",
 * "Channels").  A data call on a connected socket decides when to upgrade
 * (at once when a channel to the peer exists, else after some traffic)
 * and queues it for the worker thread, which sends an OPEN on the channel
 * (answered later, on the channel's reader) or makes a new channel
 * (HELLO, ACCEPT).  Locks: up_lock guards the job queue; pend_lock the
 * OPENs in flight.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "provider/fault.h"
#include "provider/internal.h"
#include "switch/chan.h"
#include "switch/session.h"
#include "switch/upgrade_int.h"

/* ---- the connecting side ---------------------------------------------------------- */

struct job { struct job *next; struct wsd_sock *s; };

static struct job *jobs, **jobs_tail = &jobs;
static pthread_cond_t jobs_cv = PTHREAD_COND_INITIALIZER;
static bool worker_up;

/* A peer busy with requests is asked again after 50 ms, doubling, BUSY_TRIES times. */
#define BUSY_RETRY_NS 50000000ull
#define BUSY_TRIES 6

static uint64_t coarse_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void fail(struct wsd_sock *s, enum wsd_reason why)
{
	/* wsd stat names the connection that stays on TCP, whatever stopped it */
	(void)learn_tuple(s);
	set_reason(s, why);
	if (why == R_BUSY && s->busy_tries < BUSY_TRIES) {
		/* the peer had too much in hand: its next data call after the pause asks again */
		s->retry_ns = coarse_ns() + (BUSY_RETRY_NS << s->busy_tries++);
		atomic_store(&s->upgrade_state, UP_NONE);
		wsd_debug("switch: fd %d: the peer is busy; asks again", s->fd);
		return;
	}
	atomic_store(&s->upgrade_state, UP_FAILED);
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
	pthread_mutex_unlock(&pend_lock);
	accept_chan_dead(ch);
	while (mine) {
		struct open_req *o = mine;

		mine = o->next;
		open_fail(o->s, o->ss, R_PEER_PLAIN);
		free(o);
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
	if (!worker_up)
		worker_up = wsd_thread_start(worker, NULL, true) == 0;
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
	struct job *j;
	int expect = UP_NONE;
	uint64_t now;

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
	 * first data call only, by the address connect() dialled: no system
	 * call on the way of a connection whose peer is plain.
	 */
	if (!s->chan_looked) {
		struct wsd_stat_addr key;
		struct wsd_chan *ch;

		s->chan_looked = true;
		to_addr(&s->peer, &key);
		if (key.family && (ch = wsd_chan_find(&key))) {
			s->chan_known = true;
			wsd_chan_put(ch);
		}
	}
	now = coarse_ns();
	if (!s->chan_known && s->tcp_tx + s->tcp_rx < p->upgrade_bytes &&
	    now - s->created_ns < p->upgrade_ns)
		return;
	if (now < s->retry_ns)
		return;
	wsd_guard_scan();   /* an io_uring of the program's own: nothing upgrades */
	if (s->no_upgrade) {
		if (atomic_compare_exchange_strong(&s->upgrade_state, &expect, UP_FAILED))
			set_reason(s, (enum wsd_reason)s->why_not);
		return;
	}
	if (!atomic_compare_exchange_strong(&s->upgrade_state, &expect, UP_QUEUED))
		return;
	/* without a slot of its own its tuple is not its own (stat.c) */
	if (!wsd_stat_own(s->stat)) {
		fail(s, R_RESOURCES);
		return;
	}
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

/* fork, in the child: no worker, no requests of ours in flight. */
void connect_atfork_child(void)
{
	pthread_cond_init(&jobs_cv, NULL);
	worker_up = false;
	jobs = NULL;
	jobs_tail = &jobs;
	opens = NULL;
}

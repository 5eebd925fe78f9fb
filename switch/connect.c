/* SPDX-License-Identifier: MIT */
/*
 * The connecting side of the upgrade (wsd-protocol(7), "Handshake",
 * "Channels").  A data call on a connected socket decides when to upgrade
 * (at once when a channel to the peer exists, else after some traffic)
 * and queues it for a worker thread, which sends an OPEN on the channel
 * (open.c) or makes a new channel (HELLO, ACCEPT).  up_lock guards the
 * job queue.
 *
 * A new channel waits on another process (its registry's connect, proof
 * and answer), each step within its deadline; a process that squats a
 * registry's name or never answers must not hold up the upgrades to
 * anyone else.  So jobs run on up to MAX_WORKERS threads, started as jobs
 * find none free, and one peer address has one job running at a time
 * (the second to a peer finds the channel the first made, and sends an
 * OPEN on it).
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
#include "switch/policy.h"
#include "switch/session.h"
#include "switch/upgrade_int.h"

/* ---- the connecting side ---------------------------------------------------------- */

/*
 * A connection to upgrade (s), or a channel to make ahead (s NULL, probe);
 * key: the peer's address, one job to it running at a time.
 */
struct job { struct job *next; struct wsd_sock *s; struct probe_job probe;
	     struct wsd_stat_addr key; };

#define MAX_WORKERS 8
/*
 * A peer address whose registry did not answer in time (a squatter that
 * never accepts, a silent process on the name): the jobs to it for the
 * next SLOW_MS fail at once (timeout, and ask again later as a busy peer
 * is), not each after its own deadline.
 */
#define SLOW_MS 1000
#define SLOW_PEERS 16
static struct { struct wsd_stat_addr key; int64_t until_ms; } slow[SLOW_PEERS];

static struct job *jobs;
static pthread_cond_t jobs_cv = PTHREAD_COND_INITIALIZER;
static bool worker_up;                 /* a worker started (the provider's start is paid) */
static int workers, idle;              /* worker threads, and those waiting for a job */
static struct wsd_stat_addr running[MAX_WORKERS];   /* the keys of the jobs running */
static bool run_used[MAX_WORKERS];

/* A peer busy with requests is asked again after 50 ms, doubling, BUSY_TRIES times. */
#define BUSY_RETRY_NS 50000000ull
#define BUSY_TRIES 6

static uint64_t coarse_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static bool queue_job(struct wsd_sock *s);

void connect_fail(struct wsd_sock *s, enum wsd_reason why)
{
	/* wsd stat names the connection that stays on TCP, whatever stopped it */
	(void)learn_tuple(s);
	/*
	 * Asked first at the process the peer's registry sent its last
	 * connection on to (routed), which did not have this one (another
	 * child's, or gone): no more guesses for a while, and the port's
	 * registry asked as for any connection (or the process that one
	 * named, followed as any moved).
	 */
	if (s->routed) {
		s->routed = false;
		probe_route(&s->stat->peer, 0, true);
		if (why != R_MOVED)
			s->moved_port = 0;
		wsd_debug("switch: fd %d: not where the last one went (%s)", s->fd,
			  wsd_reason_name(why));
		why = R_MOVED;
	}
	set_reason(s, why);
	/*
	 * The peer's registry answered for a process it forked: one that has
	 * the connection, whose registry the worker asks at once (moved_port
	 * set by the caller, once); or none yet, asked again as a busy peer
	 * is, and the address left alone for a while when none ever does.
	 */
	if (why == R_MOVED) {
		atomic_store(&s->upgrade_state, UP_QUEUED);
		s->chan_known = false;   /* the channel that answered is not that process's */
		if (queue_job(s)) {
			wsd_debug("switch: fd %d: moved to the registry on port %u", s->fd,
				  s->moved_port);
			return;
		}
	}
	/* a short connection, closed before its answer came: it will not ask again */
	if (why == R_SHARED && atomic_load(&s->nfds) == 0) {
		probe_shared_lost(&s->stat->peer);
		atomic_store(&s->upgrade_state, UP_FAILED);
		return;
	}
	if ((why == R_BUSY || why == R_SHARED || why == R_TIMEOUT) && s->busy_tries < BUSY_TRIES) {
		/*
		 * The peer had too much in hand, or did not answer in time (a
		 * registry whose process was exiting, a daemon's, whose child
		 * opens its own a moment later): its next data call after the
		 * pause asks again.
		 */
		s->retry_ns = coarse_ns() + (BUSY_RETRY_NS << s->busy_tries++);
		s->shared_asked |= why == R_SHARED;
		atomic_store(&s->upgrade_state, UP_NONE);
		wsd_debug("switch: fd %d: the peer is %s; asks again", s->fd, wsd_reason_name(why));
		return;
	}
	if (why == R_SHARED)
		probe_refused(&s->stat->peer, R_SHARED);
	atomic_store(&s->upgrade_state, UP_FAILED);
	wsd_debug("switch: fd %d stays on TCP: %s", s->fd, wsd_reason_name(why));
}

/*
 * A refusal or decline that names another process's registry (R_MOVED,
 * its port in seg): followed once; a second is the peer's error.
 */
enum wsd_reason connect_follow(struct wsd_sock *s, enum wsd_reason why, uint32_t port)
{
	if (why != R_MOVED)
		return why;
	if ((s->moved_port && !s->routed) || !port || port > 65535)
		return R_PROTOCOL;
	if (!s->routed)
		probe_route(&s->stat->peer, (uint16_t)port, false);   /* the next ones ask there */
	s->moved_port = (uint16_t)port;
	return R_MOVED;
}

/*
 * The peer's switch listens on the peer's address and port: as an IPv4
 * address when the peer's is one (mapped or not), else as IPv6, the scope
 * of a link-local address included.  Returns the length.
 */
socklen_t peer_addr(const struct wsd_sock *s, struct sockaddr_storage *to)
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

/*
 * Our end of the connection t names, as an address of family (the SPI
 * socket's), for SO_WSP_TCP_FROM: its length, or 0 when t names none.
 */
static socklen_t tuple_from(const struct wsd_tuple *t, int family, struct sockaddr_storage *out)
{
	const struct wsd_stat_addr *c = &t->client;

	memset(out, 0, sizeof(*out));
	if (!c->port || c->family != family)
		return 0;
	if (family == AF_INET) {
		struct sockaddr_in *in = (struct sockaddr_in *)out;

		in->sin_family = AF_INET;
		in->sin_port = htons(c->port);
		memcpy(&in->sin_addr, c->addr, 4);
		return sizeof(*in);
	}
	((struct sockaddr_in6 *)out)->sin6_family = AF_INET6;
	((struct sockaddr_in6 *)out)->sin6_port = htons(c->port);
	memcpy(&((struct sockaddr_in6 *)out)->sin6_addr, c->addr, 16);
	return sizeof(struct sockaddr_in6);
}

/* The connection may upgrade, and its 4-tuple is in t; else it failed (false). */
static bool client_tuple(struct wsd_sock *s, struct wsd_tuple *t)
{
	if (atomic_load(&s->nfds) == 0)
		return connect_fail(s, R_CLOSED), false;
	if (s->no_upgrade)
		return connect_fail(s, s->why_not ? (enum wsd_reason)s->why_not : R_FORKED), false;
	if (urgent_seen(s))
		return connect_fail(s, R_UNSUPPORTED), false;
	if (learn_tuple(s))
		return connect_fail(s, R_PEER_PLAIN), false;
	*t = (struct wsd_tuple){ .magic = WSD_TUPLE_MAGIC, .version = WSD_PROTO_VERSION,
				 .client = s->stat->local, .server = s->stat->peer };
	return true;
}

/*
 * In the program's thread, a connection to a peer we have a channel with:
 * at its connect, the OPEN posted in a grant of the peer's mailbox (shm),
 * so that it is there when the peer accepts and the first bytes go by
 * ring, or nothing yet (no grant: its first data call asks); at a data
 * call, the same or an OPEN message.  false when the channel is gone: a
 * job for the worker, which makes a new one.
 */
static bool client_open_now(struct wsd_sock *s, bool at_connect)
{
	struct wsd_tuple t;
	struct wsd_chan *ch;

	struct wsd_stat_addr key;

	/* not connected yet (a non-blocking connect), or moved: the worker asks */
	if ((s->moved_port && !s->routed) || learn_tuple(s))
		return false;
	key = s->stat->peer;
	if (s->moved_port)
		key.port = s->moved_port;   /* routed: where the last one went */
	if (!(ch = wsd_chan_find(&key)))
		return false;
	atomic_store(&s->upgrade_state, UP_RUNNING);
	/*
	 * In the peer's mailbox, unless one posted there went unread: the
	 * peer looks there only at its accept and first receive, and would
	 * never see another (box_look); a message it reads at any time.
	 */
	if (client_tuple(s, &t) && (s->box_missed || !open_post(s, ch, &t))) {
		if (at_connect)
			atomic_store(&s->upgrade_state, UP_NONE);   /* its first data call asks */
		else
			open_send(s, ch, &t);
	}
	wsd_chan_put(ch);
	return true;
}

/*
 * The registry at key answered why for the connection t names, and would
 * for each to that port (probe_refused); not one a process it forked has
 * (key's port is another than t's).
 */
static void refused_for_each(const struct wsd_stat_addr *key, const struct wsd_tuple *t,
			     enum wsd_reason why)
{
	if (key->port == t->server.port)
		probe_refused(key, why);
}

/* SPI socket ws's peer process runs as a user the policy pairs with (peer-users). */
bool peer_user_ok(SOCKET ws)
{
	int64_t uid = wsd_chan_sock_uid(ws);

	return uid < 0 || wsd_policy_user_ok(wsd_policy_get(), (uint32_t)uid, (uint32_t)geteuid());
}

/* Was SPI socket ws connected through the rendezvous directory (SO_WSP_RENDEZVOUS)? */
static bool chan_rdv(SOCKET ws)
{
	int rdv = 0, err;
	socklen_t len = sizeof(rdv);

	return !procs.lpWSPGetSockOpt(ws, SOL_WSP, SO_WSP_RENDEZVOUS, (char *)&rdv, &len, &err) &&
	       rdv == 1;
}

/*
 * A new channel to the registry at to (the channel's key: key): a new SPI
 * connection, HELLO (for the connection t names, or for none: its client
 * zero) and ACCEPT, the answer waited for until *gone (the connection's
 * last fd closed: the peer, which no longer has it, answers only when its
 * wait for the accept ends).  The session its handshake made, or NULL and
 * *why.
 */
static struct wsd_session *new_channel(const struct sockaddr_storage *to, socklen_t tolen,
				       const struct wsd_stat_addr *key, struct wsd_tuple *t,
				       const _Atomic bool *gone, enum wsd_reason *why,
				       uint32_t *moved)
{
	struct wsd_session *ss;
	struct wsd_chan *ch;
	struct wsd_hello h = { 0 }, a;
	WSABUF caller = { sizeof(*t), (char *)t };
	struct sockaddr_storage from;
	socklen_t fl = tuple_from(t, to->ss_family, &from);
	const char *bad;
	SOCKET ws;
	int err, e;
	long ms;

	*why = R_PROVIDER;
	ws = procs.lpWSPSocket(to->ss_family, SOCK_STREAM, 0, &proto, 0, 0, &err);
	if (ws == INVALID_SOCKET)
		return NULL;
	/*
	 * only the process that holds the TCP listener may take this over
	 * (shm): the connection's port, when we dial a registry on another
	 */
	if (procs.lpWSPSetSockOpt(ws, SOL_WSP, SO_WSP_TCP_LISTENER, &(int){ 1 }, sizeof(int),
				  &err) ||
	    procs.lpWSPSetSockOpt(ws, SOL_WSP, SO_WSP_TCP_PORT,
				  &(int){ key->port == t->server.port ? 0 : t->server.port },
				  sizeof(int), &err) ||
	    /* our end: a forked handler of another user may show the connection's other end */
	    (fl > 0 && procs.lpWSPSetSockOpt(ws, SOL_WSP, SO_WSP_TCP_FROM, &from, fl, &err)) ||
	    /* a registry of another user too, as TCP would connect, unless the policy says not */
	    procs.lpWSPSetSockOpt(ws, SOL_WSP, SO_WSP_PEER_USERS,
				  &(int){ wsd_policy_other_users(wsd_policy_get()) }, sizeof(int),
				  &err) ||
	    procs.lpWSPConnect(ws, (const struct sockaddr *)to, tolen, &caller, NULL, NULL,
			       NULL, &err)) {
		procs.lpWSPCloseSocket(ws, &err);
		/* WSAENOBUFS: no room there now, asked again as a busy peer is */
		*why = err == WSAEACCES ? R_ACCESS : err == WSAETIMEDOUT ? R_TIMEOUT :
		       err == WSAENOBUFS ? R_BUSY : R_PEER_PLAIN;
		/*
		 * The transport turns this process away, or no registry
		 * listens there (a plain program; told on this host, where the
		 * shm transport tells it from a listener with no room, or with
		 * a rendezvous directory, where a second of looking found
		 * nothing published): each connection would be.
		 */
		if (*why == R_ACCESS ||
		    (err == WSAECONNREFUSED &&
		     (!t->client.family || probe_local(&t->server, &t->client))) ||
		    (*why == R_PEER_PLAIN && *wsd_param_str("WSD_RENDEZVOUS_DIR")))
			refused_for_each(key, t, *why);
		return NULL;
	}
	/* a registry of a user the policy does not pair with: each connection would be */
	if (!peer_user_ok(ws)) {
		procs.lpWSPCloseSocket(ws, &err);
		*why = R_POLICY;
		refused_for_each(key, t, *why);
		return NULL;
	}
	/*
	 * Made through the rendezvous directory, for this connection alone:
	 * found by no later one (whose address, a DNAT rule's service address
	 * perhaps, may lead to another process), so no mailbox either.
	 */
	ch = wsd_chan_new(ws, path_of(ws), true, chan_rdv(ws) ? NULL : key);
	if (!ch) {
		procs.lpWSPCloseSocket(ws, &err);
		return NULL;
	}
	ss = wsd_session_new(ch);
	wsd_chan_put(ch);   /* the session's now, or closed */
	if (!ss)
		return NULL;
	wsd_session_hello(ss, &h, MSG_HELLO);
	if (wsd_fault("busy-delay", &ms))
		usleep((useconds_t)ms * 1000);   /* counted at work: a thread the scheduler does not run */
	if (wsd_fault("hello-delay", &ms)) {
		bool away = wsd_threads_away();   /* as a slow peer is waited for */

		usleep((useconds_t)ms * 1000);
		wsd_threads_back(away);
	}
	/* the answer's receive posted before the HELLO goes */
	if ((e = recv_msg(&ws, &a, ANSWER_MS, gone, &h))) {
		if (ws == INVALID_SOCKET)
			wsd_chan_lost_socket(ch);
		wsd_session_free(ss);
		*why = e == -ETIMEDOUT ? R_TIMEOUT : R_NO_MATCH;
		return NULL;
	}
	e = wsd_wire_hello_check(&a, MSG_ACCEPT, &bad);
	if (e || a.kind != MSG_ACCEPT) {
		wsd_session_free(ss);
		if (e)
			wsd_debug("switch: the peer's answer: %s", bad);
		/* a well-formed REFUSE gives the peer's reason, anything else protocol */
		*why = !e && a.reason < R_NREASONS ? (enum wsd_reason)a.reason : R_PROTOCOL;
		*moved = *why == R_MOVED ? a.seg : 0;
		/* the port's policy keeps each of its connections on TCP */
		if (*why == R_POLICY && a.seg == WSD_REFUSE_EVERY)
			refused_for_each(key, t, R_POLICY);
		return NULL;
	}
	wsd_session_peer(ss, &a);
	/*
	 * by copy the peer's ring is mapped or not written at all (no RDMA):
	 * the channel goes, and the peer, which reads no proof from us, keeps
	 * the connection on TCP
	 */
	if (wsd_chan_copy(ch) && !wsd_session_mapped(ss)) {
		wsd_session_free(ss);
		*why = R_RESOURCES;
		return NULL;
	}
	wsd_session_known(ss);
	wsd_chan_start(ch, a.pid);
	return ss;
}

/*
 * A new channel for s's connection, or an OPEN on one we have: with the
 * registry of the peer's port, or of the process it said has the
 * connection (moved_port, wsd-protocol(7) "Servers that fork").
 */
static void client_upgrade(struct wsd_sock *s)
{
	struct sockaddr_storage to;
	struct wsd_stat_addr key;
	struct wsd_session *ss;
	struct wsd_chan *ch;
	struct wsd_tuple t;
	enum wsd_reason why;
	socklen_t tolen;
	uint32_t moved;
	bool route = !s->moved_port;

	if (!client_tuple(s, &t))
		return;
again:
	key = s->stat->peer;
	/*
	 * Queued before the answer that taught us the route came (a burst
	 * of connections): asked where the last one went, as in
	 * wsd_upgrade_maybe, if we still have a channel there.
	 */
	if (route && (key.port = probe_routed(&s->stat->peer))) {
		s->routed = true;
		s->moved_port = key.port;
	}
	route = false;
	key.port = s->moved_port ? s->moved_port : s->stat->peer.port;
	ch = wsd_chan_find(&key);
	if (ch) {
		open_send(s, ch, &t);
		wsd_chan_put(ch);
		return;
	}
	if (s->routed) {
		/* that channel ended: the port's registry, as for any */
		s->routed = false;
		s->moved_port = 0;
		goto again;
	}
	/* refused for each connection while this one waited in the queue */
	if (!s->moved_port && (why = probe_refusal(&key)) != R_NONE)
		return connect_fail(s, why);
	if (!wsd_guard_room(UPGRADE_FDS, upgrade_bytes()))
		return connect_fail(s, R_RESOURCES);
	tolen = peer_addr(s, &to);
	if (to.ss_family == AF_INET)
		((struct sockaddr_in *)&to)->sin_port = htons(key.port);
	else
		((struct sockaddr_in6 *)&to)->sin6_port = htons(key.port);
	if (!(ss = new_channel(&to, tolen, &key, &t, &s->closed, &why, &moved))) {
		why = connect_follow(s, why, moved);
		if (why == R_MOVED)
			goto again;   /* that process's registry, at once */
		return connect_fail(s, why);
	}
	wsd_session_attach_new(s, ss);
	wsd_debug("switch: fd %d upgraded at %lld ms, channel %u", s->fd, (long long)wsd_now_ms(),
		  wsd_chan_id(ss->ch));
}

/*
 * A channel and nothing else (probe.c): its HELLO names no connection, and
 * the session its handshake made is ended at once.  R_NONE when made (or
 * there already), else why not.
 */
static enum wsd_reason client_channel(const struct probe_job *p)
{
	struct wsd_tuple t = { .magic = WSD_TUPLE_MAGIC, .version = WSD_PROTO_VERSION,
			       .server = p->key };
	struct wsd_session *ss = NULL;
	struct wsd_chan *ch;
	enum wsd_reason why = R_NONE;

	if ((ch = wsd_chan_find(&p->key))) {
		wsd_chan_put(ch);
		return R_NONE;
	}
	/* the provider's start, here on the worker (the program's close never waits for it) */
	if (!wsd_spi())
		why = R_PROVIDER;
	else if (!wsd_guard_room(UPGRADE_FDS, upgrade_bytes()))
		why = R_RESOURCES;
	else
		ss = new_channel(&p->to, p->tolen, &p->key, &t, NULL, &why, &(uint32_t){ 0 });
	if (!ss) {
		wsd_debug("switch: no channel made ahead: %s", wsd_reason_name(why));
		return why;
	}
	wsd_debug("switch: channel %u made ahead at %lld ms", wsd_chan_id(ss->ch),
		  (long long)wsd_now_ms());
	wsd_session_free(ss);
	return R_NONE;
}

/* up_lock held: a queued job whose peer has none running (unlinked, its key noted), or NULL. */
static struct job *take_job(int *slot)
{
	for (struct job **pj = &jobs; *pj; pj = &(*pj)->next) {
		struct job *j = *pj;
		int free_at = -1;
		bool busy = false;

		for (int i = 0; i < MAX_WORKERS && !busy; i++) {
			if (!run_used[i])
				free_at = free_at < 0 ? i : free_at;
			else
				busy = same(&running[i], &j->key);
		}
		if (busy || free_at < 0)
			continue;
		*pj = j->next;
		running[free_at] = j->key;
		run_used[free_at] = true;
		*slot = free_at;
		return j;
	}
	return NULL;
}

/* up_lock held: key timed out a moment ago. */
static bool slow_peer(const struct wsd_stat_addr *key)
{
	int64_t now = wsd_now_ms();

	for (int i = 0; i < SLOW_PEERS; i++)
		if (slow[i].until_ms > now && same(&slow[i].key, key))
			return true;
	return false;
}

/* up_lock held: key timed out; the oldest entry makes room. */
static void slow_note(const struct wsd_stat_addr *key)
{
	int k = 0;

	for (int i = 0; i < SLOW_PEERS; i++) {
		if (same(&slow[i].key, key)) {
			k = i;
			break;
		}
		if (slow[i].until_ms < slow[k].until_ms)
			k = i;
	}
	slow[k].key = *key;
	slow[k].until_ms = wsd_now_ms() + SLOW_MS;
}

static void *worker(void *arg)
{
	(void)arg;
	wsd_spi();   /* the provider's start-up (tens of ms) is paid here, early */
	for (;;) {
		enum wsd_reason why;
		struct job *j;
		bool late;
		int slot;

		pthread_mutex_lock(&up_lock);
		wsd_threads_rest();   /* waiting (wsd_threads_hold) */
		idle++;
		while (!(j = take_job(&slot)))
			pthread_cond_wait(&jobs_cv, &up_lock);
		idle--;
		wsd_threads_work();
		/* (a connection asking again is let through: its own pause came first) */
		late = (!j->s || !j->s->busy_tries) && slow_peer(&j->key);
		pthread_mutex_unlock(&up_lock);
		if (!j->s) {
			why = late ? R_TIMEOUT : client_channel(&j->probe);
			probe_done(&j->probe, why);
		} else {
			atomic_store(&j->s->upgrade_state, UP_RUNNING);
			if (late)
				connect_fail(j->s, R_TIMEOUT);
			else
				client_upgrade(j->s);
			why = (enum wsd_reason)j->s->stat->reason;
			wsd_sock_put(j->s);
		}
		pthread_mutex_lock(&up_lock);
		if (why == R_TIMEOUT && !late)
			slow_note(&j->key);
		free(j);
		run_used[slot] = false;
		if (jobs)
			pthread_cond_broadcast(&jobs_cv);   /* one kept back for this peer may run */
		pthread_mutex_unlock(&up_lock);
	}
	return NULL;
}

/*
 * up_lock held, a job just queued: a worker free to take it, or a new one
 * while there are fewer than MAX_WORKERS (none busy for long: one).
 */
static bool start_worker(void)
{
	if (idle > 0 && worker_up)
		return true;
	if (workers < MAX_WORKERS && wsd_thread_start(worker, NULL) == 0) {
		workers++;
		worker_up = true;
	}
	return worker_up;
}

/* up_lock held: j queued last, and a worker told. */
static void add_job(struct job *j)
{
	struct job **pj = &jobs;

	while (*pj)
		pj = &(*pj)->next;
	*pj = j;
	pthread_cond_broadcast(&jobs_cv);
}

void wsd_upgrade_prestart(void)
{
	/* (a policy that keeps every connection on TCP asks for no upgrade: nothing to start) */
	if (__atomic_load_n(&worker_up, __ATOMIC_RELAXED) || !wsd_switch_params()->enabled ||
	    wsd_policy_all_tcp(wsd_policy_get()) || !wsd_guard_room(START_FDS, 0))
		return;
	pthread_mutex_lock(&up_lock);
	if (!worker_up)
		start_worker();
	pthread_mutex_unlock(&up_lock);
}

static void upgrade_maybe(struct wsd_sock *s, bool at_connect)
{
	const struct wsd_switch_params *p;
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
		if (s->handoff)
			wsd_upgrade_handoff(s);   /* a fork child's first call on one inherited */
		return;
	}
	if (atomic_load_explicit(&s->upgrade_state, memory_order_relaxed) != UP_NONE) {
		/* an OPEN in the peer's mailbox: its answer taken if there */
		if (s->chan_known && atomic_load(&s->upgrade_state) == UP_RUNNING)
			open_box_wait(s, false, false);
		return;
	}
	p = wsd_switch_params();
	/* the policy file may keep it on TCP: its reason published below, as any other */
	if (p->enabled && policy_check(s) == POLICY_LATER)
		return;
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
	if (!s->chan_known && !s->moved_port && !s->route_looked) {
		/*
		 * The peer's registry sent its last connection on to a process
		 * (a fork child) we have a channel with: this one asks there at
		 * once, not at that registry first (looked at once, here, where
		 * the connection would cost the worker a registry connection).
		 */
		struct wsd_stat_addr key;
		struct wsd_chan *ch;

		s->route_looked = true;
		to_addr(&s->peer, &key);
		if (key.family && (key.port = probe_routed(&key)) && (ch = wsd_chan_find(&key))) {
			s->chan_known = s->routed = true;
			s->moved_port = key.port;
			wsd_chan_put(ch);
			wsd_debug("switch: fd %d asks on port %u, where the last one went", s->fd,
				  key.port);
		}
	}
	if (!s->chan_known) {
		/*
		 * A peer that refused one connection for a reason that holds
		 * for each (its listener shared with its fork children, its
		 * policy, our user): not asked for a while.
		 */
		struct wsd_stat_addr key;
		enum wsd_reason why;

		to_addr(&s->peer, &key);
		if (key.family && (why = probe_refusal(&key)) != R_NONE) {
			if (atomic_compare_exchange_strong(&s->upgrade_state, &expect, UP_FAILED)) {
				(void)learn_tuple(s);   /* wsd stat names it, as connect_fail does */
				set_reason(s, why);
			}
			return;
		}
	}
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
		connect_fail(s, R_RESOURCES);
		return;
	}
	if (s->chan_known ? !wsd_guard_room(0, SLOT_BYTES) :
	    !wsd_guard_room(UPGRADE_FDS + (worker_up ? 0 : START_FDS), upgrade_bytes())) {
		connect_fail(s, R_RESOURCES);
		return;
	}
	if (!wsd_spi()) {
		connect_fail(s, R_PROVIDER);
		return;
	}
	if (s->chan_known && client_open_now(s, at_connect))
		return;
	if (!queue_job(s))
		connect_fail(s, R_PROVIDER);
}

/* s's upgrade (UP_QUEUED) for the worker; false if it could not be queued. */
static bool queue_job(struct wsd_sock *s)
{
	struct job *j = calloc(1, sizeof(*j));

	if (!j)
		return false;
	wsd_sock_hold(s);
	j->s = s;
	to_addr(&s->peer, &j->key);
	pthread_mutex_lock(&up_lock);
	if (!start_worker()) {
		pthread_mutex_unlock(&up_lock);
		wsd_sock_put(s);
		free(j);
		return false;
	}
	wsd_debug("switch: fd %d upgrade queued at %lld ms", s->fd, (long long)wsd_now_ms());
	add_job(j);
	pthread_mutex_unlock(&up_lock);
	return true;
}

/* A channel to make ahead, for the worker (probe.c decided). false: not queued. */
bool probe_queue(const struct probe_job *p)
{
	struct job *j = calloc(1, sizeof(*j));

	if (!j)
		return false;
	j->probe = *p;
	j->key = p->key;
	pthread_mutex_lock(&up_lock);
	if (!start_worker()) {
		pthread_mutex_unlock(&up_lock);
		free(j);
		return false;
	}
	add_job(j);
	pthread_mutex_unlock(&up_lock);
	return true;
}

/* fork, in the child: no worker, no requests of ours in flight. */
void connect_atfork_child(void)
{
	pthread_cond_init(&jobs_cv, NULL);
	worker_up = false;
	workers = idle = 0;
	memset(run_used, 0, sizeof(run_used));
	memset(slow, 0, sizeof(slow));
	jobs = NULL;   /* the parent's (its sockets' references with them) */
	open_atfork_child();
}

void wsd_upgrade_maybe(struct wsd_sock *s)
{
	upgrade_maybe(s, false);
}

void wsd_upgrade_connected(struct wsd_sock *s)
{
	upgrade_maybe(s, true);
}

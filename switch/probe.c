/* SPDX-License-Identifier: MIT */
/*
 * Channels made ahead (wsd-protocol(7), "Channels", "A channel made
 * ahead").  A connection upgrades only once it has carried some traffic
 * (WSD_UPGRADE_BYTES, WSD_UPGRADE_US), so a program that only ever makes
 * short connections to a peer would never get a channel, and none of
 * their bytes would go by it.  When such a connection to a process on this
 * host closes before it upgraded, the worker (connect.c) makes a channel to
 * its peer with a HELLO that names no connection; later connections to
 * that peer then go by channel from their first byte.  A peer that refuses
 * (plain, or not on shm) is not asked again for PROBE_BACKOFF_MS, so a
 * plain peer costs one registry connection attempt now and then, and never
 * one on a connection's way; one busy or slow to answer, after
 * PROBE_RETRY_MS.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <string.h>

#include "provider/internal.h"
#include "switch/upgrade_int.h"

#define PROBE_BACKOFF_MS 30000
#define ROUTE_MS 30000               /* a route learnt, and one that missed, last this long */
#define PROBE_RETRY_MS 1000
#define PROBE_PEERS 32
#define PLAIN_FIRST_MS 1000          /* no registry: left alone this long, doubling */
#define PLAIN_STRIKES 5
#define SHARED_LOST 4                /* short connections in a row a shared listener left on TCP */

/* Peers asked (or being asked) lately: a small table, the oldest entry reused. */
static struct probe_peer {
	struct wsd_stat_addr key;
	int64_t until_ms;            /* not asked again before then */
	/*
	 * An answer that holds for every connection to it (probe_refused):
	 * none asks before refused_until_ms, and each stays on TCP with
	 * refused_why.
	 */
	int64_t refused_until_ms;
	uint8_t refused_why;
	uint8_t plain_strikes;       /* R_PEER_PLAIN answers in a row: the next pause doubles */
	/*
	 * Its registry sent a connection on to the registry on this port of
	 * the same address (R_MOVED: a fork child's); until route_until_ms
	 * later connections ask there first (probe_routed).  One asked there
	 * that was not there (another child's) stops that until
	 * no_route_until_ms.
	 */
	uint16_t route;
	int64_t route_until_ms, no_route_until_ms;
	bool busy;                   /* a job for it is queued or running */
	uint8_t shared_lost;         /* connections answered shared that closed before asking again */
} peers[PROBE_PEERS];
static pthread_mutex_t probe_lock = PTHREAD_MUTEX_INITIALIZER;

/* probe_lock held: key's entry, or a free (or the oldest) one taken for it. */
static struct probe_peer *entry(const struct wsd_stat_addr *key, bool take)
{
	struct probe_peer *old = &peers[0];

	for (int i = 0; i < PROBE_PEERS; i++) {
		if (peers[i].key.family && same(&peers[i].key, key))
			return &peers[i];
		if (!peers[i].busy && peers[i].until_ms < old->until_ms)
			old = &peers[i];
	}
	if (!take || old->busy)
		return NULL;
	memset(old, 0, sizeof(*old));
	old->key = *key;
	return old;
}

/* p is an address of this host as seen from l: loopback, or l itself. */
bool probe_local(const struct wsd_stat_addr *p, const struct wsd_stat_addr *l)
{
	static const uint8_t v6_loop[16] = { [15] = 1 };

	if (p->family == AF_INET && p->addr[0] == 127)
		return true;
	if (p->family == AF_INET6 && !memcmp(p->addr, v6_loop, 16))
		return true;
	return p->family == l->family && !memcmp(p->addr, l->addr, 16);
}

static bool on_this_host(const struct wsd_sock *s)
{
	return probe_local(&s->stat->peer, &s->stat->local);
}

void wsd_upgrade_closing(struct wsd_sock *s)
{
	const struct wsd_switch_params *pr = wsd_switch_params();
	struct probe_job j;
	struct probe_peer *e;
	struct wsd_chan *ch;
	int64_t now;
	int st;

	if (s->connected_side && s->shared_asked && !s->sess) {
		to_addr(&s->peer, &j.key);
		if (j.key.family)
			probe_shared_lost(&j.key);
	}

	/* a short connection of ours that carried bytes and never asked */
	st = atomic_load(&s->upgrade_state);
	/* (one the worker has in hand fails as the socket goes: its wait ends) */
	if (!s->connected_side || s->sess || s->no_upgrade || !pr->enabled || s->chan_known ||
	    (st != UP_NONE && st != UP_QUEUED && st != UP_RUNNING) || s->tcp_tx + s->tcp_rx == 0)
		return;
	/* the address it dialled, as the channel's key (upgrade_maybe's) */
	to_addr(&s->peer, &j.key);
	if (!j.key.family)
		return;
	if ((ch = wsd_chan_find(&j.key))) {
		wsd_chan_put(ch);
		return;
	}
	now = wsd_now_ms();
	pthread_mutex_lock(&probe_lock);
	e = entry(&j.key, true);
	if (!e || e->busy || e->until_ms > now) {
		pthread_mutex_unlock(&probe_lock);
		return;
	}
	e->busy = true;
	pthread_mutex_unlock(&probe_lock);
	/* another host's peer is asked by its connections' own upgrades (verbs) */
	if (learn_tuple(s) || !same(&s->stat->peer, &j.key) || !on_this_host(s)) {
		probe_done(&j, R_PEER_PLAIN);
		return;
	}
	j.tolen = peer_addr(s, &j.to);
	wsd_debug("switch: fd %d closes at %lld ms: a channel to its peer asked for ahead", s->fd,
		  (long long)now);
	if (!probe_queue(&j))
		probe_done(&j, R_PROVIDER);
}

void probe_done(const struct probe_job *p, enum wsd_reason why)
{
	/*
	 * A peer that is not ours to join (plain, elsewhere, refusing, of
	 * another version), or a provider of ours that failed, waits out the
	 * long pause; one that was busy, slow to answer, or short of room here
	 * is asked again soon.
	 */
	bool passing = why == R_BUSY || why == R_NO_MATCH || why == R_RESOURCES;
	struct probe_peer *e;

	pthread_mutex_lock(&probe_lock);
	e = entry(&p->key, false);
	if (e) {
		e->busy = false;
		if (why == R_NONE)
			e->plain_strikes = 0;
		/* made: asked again only if the channel ends and a short connection closes */
		e->until_ms = why == R_NONE ? 0 :
			      wsd_now_ms() + (passing ? PROBE_RETRY_MS : PROBE_BACKOFF_MS);
	}
	pthread_mutex_unlock(&probe_lock);
}

/*
 * A peer answered with a refusal that holds for each of its connections
 * (wsd-protocol(7), "Refusals that last"): its listener is shared with
 * processes it forked and the connection was in another's hands
 * (R_SHARED), its policy keeps every connection to the port on TCP
 * (R_POLICY), or its transport turned us away (R_ACCESS: another user).
 * Its later connections do not ask (each a registry connection or a
 * mailbox entry, and a wait, refused at once) for PROBE_BACKOFF_MS; nor
 * is a channel made ahead to it.
 */
void probe_refused(const struct wsd_stat_addr *key, enum wsd_reason why)
{
	int64_t ms = PROBE_BACKOFF_MS;
	struct probe_peer *e;

	pthread_mutex_lock(&probe_lock);
	e = entry(key, true);
	if (e) {
		/*
		 * No registry there (a plain program): 1 s, then twice as long
		 * each time again, up to PROBE_BACKOFF_MS.  A server that began
		 * its registry a moment after its listener took our first ask
		 * is found soon; a plain one costs a registry connection in 30 s.
		 */
		if (why == R_PEER_PLAIN) {
			ms = PLAIN_FIRST_MS << e->plain_strikes;
			if (ms > PROBE_BACKOFF_MS)
				ms = PROBE_BACKOFF_MS;
			if (e->plain_strikes < PLAIN_STRIKES)
				e->plain_strikes++;
		}
		e->refused_until_ms = wsd_now_ms() + ms;
		e->refused_why = (uint8_t)why;
		if (e->until_ms < e->refused_until_ms)
			e->until_ms = e->refused_until_ms;
	}
	pthread_mutex_unlock(&probe_lock);
	wsd_debug("switch: the peer refuses each connection (%s): none asks for %lld ms",
		  wsd_reason_name(why), (long long)ms);
}

/*
 * A connection the peer answered R_SHARED closed before it asked again
 * (request, answer, close: a pre-forked server's short connections).
 * Each such ask cost a provider connection and a registry's look for
 * nothing: after SHARED_LOST of them in a row, the peer is left alone as
 * probe_refused leaves it.  One connection to it upgraded starts the count
 * again (probe_upgraded).
 */
void probe_shared_lost(const struct wsd_stat_addr *key)
{
	struct probe_peer *e;
	bool now_shared = false;

	pthread_mutex_lock(&probe_lock);
	e = entry(key, true);
	if (e && ++e->shared_lost >= SHARED_LOST) {
		e->shared_lost = 0;
		now_shared = true;
	}
	pthread_mutex_unlock(&probe_lock);
	if (now_shared) {
		wsd_debug("switch: %d short connections in a row to a shared listener: not asked "
			  "for a while", SHARED_LOST);
		probe_refused(key, R_SHARED);
	}
}

void probe_upgraded(struct wsd_sock *s)
{
	struct wsd_stat_addr key;
	struct probe_peer *e;

	if (!s->connected_side)
		return;
	to_addr(&s->peer, &key);
	pthread_mutex_lock(&probe_lock);
	e = key.family ? entry(&key, false) : NULL;
	if (e)
		e->shared_lost = e->plain_strikes = 0;
	pthread_mutex_unlock(&probe_lock);
}

enum wsd_reason probe_refusal(const struct wsd_stat_addr *key)
{
	enum wsd_reason r = R_NONE;
	struct probe_peer *e;

	pthread_mutex_lock(&probe_lock);
	e = entry(key, false);
	if (e && e->refused_until_ms > wsd_now_ms())
		r = (enum wsd_reason)e->refused_why;
	pthread_mutex_unlock(&probe_lock);
	return r;
}

void probe_route(const struct wsd_stat_addr *key, uint16_t port, bool missed)
{
	struct probe_peer *e;
	int64_t now = wsd_now_ms();

	pthread_mutex_lock(&probe_lock);
	e = entry(key, !missed);
	if (e && missed) {
		e->route = 0;
		e->no_route_until_ms = now + ROUTE_MS;
	} else if (e && e->no_route_until_ms <= now) {
		e->route = port;
		e->route_until_ms = now + ROUTE_MS;
	}
	pthread_mutex_unlock(&probe_lock);
}

uint16_t probe_routed(const struct wsd_stat_addr *key)
{
	struct probe_peer *e;
	uint16_t port = 0;

	pthread_mutex_lock(&probe_lock);
	e = entry(key, false);
	if (e && e->route && e->route_until_ms > wsd_now_ms())
		port = e->route;
	pthread_mutex_unlock(&probe_lock);
	return port;
}

/* fork, in the child: no jobs of ours in flight. */
void probe_atfork_child(void)
{
	pthread_mutex_init(&probe_lock, NULL);
	for (int i = 0; i < PROBE_PEERS; i++)
		peers[i].busy = false;
}

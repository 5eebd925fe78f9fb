/* SPDX-License-Identifier: MIT */
/*
 * The registrations of the ports this process listens on (wsd-protocol(7),
 * "Transport and registry", "Servers that fork"): a provider listener and
 * an acceptor thread per port, whose requests accept.c answers; the page
 * a registration shares with the fork children that inherit its listener,
 * where they count themselves and note the connections they accept; and
 * the registry of a fork child's own, for those connections, beside its
 * parent's.  up_lock guards the list.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "provider/engine.h"
#include "provider/internal.h"
#include "switch/policy.h"
#include "switch/regpage.h"
#include "switch/upgrade_int.h"

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
	struct regpage_seen seen;    /* what we read of the page (regpage.h), up_lock held */
	bool own_page;               /* a page of ours, unmapped with the registry */
	/*
	 * A fork child's own registry, for the connections it accepts on port
	 * while its parent keeps the port's: the provider port it listens on,
	 * held in TCP by side_fd (bound, never listening) so that no server
	 * that will listen on it finds the name taken.  0 and -1 otherwise.
	 */
	uint16_t side_port;
	int side_fd;
	/*
	 * A fork child's own registry for connections it inherited at fork
	 * and took over (wsd_upgrade_handoff): refs counts them, not
	 * listeners.
	 */
	bool handed;
	/* the provider listener's refusals counted in wsd stat so far (the acceptor's) */
	uint64_t refused_seen[WSD_LREF_N];
};

#define REG_GRACE_MS 10000
#define ACCEPTOR_WAKE_MS 200

/* What the acceptor's condition function learnt of the request it took. */
struct acceptor_req {
	uint16_t port;               /* the registry's */
	bool rdv;                    /* through the rendezvous directory (an AF_UNIX caller) */
	struct wsd_tuple t;
};

static struct reg *regs;
static pid_t fork_parent;            /* in a fork child: the process that forked it */

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

_Static_assert(R_MOVED == WSD_REASON_MOVED, "the wire's moved");
_Static_assert(R_POLICY == WSD_REASON_POLICY, "the wire's policy");

/*
 * up_lock held: r is the registration of port (not a child's own) and
 * shared.  The count is checked, and once over self stays so (it only
 * grows); a bad page is shared (regpage_count).
 */
static bool reg_shared(struct reg *r, uint16_t port)
{
	return r->port == port && !r->side_port && r->page &&
	       regpage_count(r->page, &r->seen) > r->self;
}

/*
 * up_lock held: the port of the child's registry that noted the connection
 * whose tuple hashes to h, or 0.  The page full, or not as an honest
 * process writes it, and the connection is routed nowhere (counted as
 * page when a request's answer is at stake: count).
 */
static uint16_t reg_find(struct reg *r, uint64_t h, bool count)
{
	int port = regpage_find(r->page, h, r->port, &r->seen);

	if (port >= 0)
		return (uint16_t)port;
	if (count)
		wsd_stat_refused(R_PAGE);
	wsd_debug("switch: port %u's shared page %s: a request not sent on", r->port,
		  port == -ENOSPC ? "full" : "written as no child of ours writes it");
	return 0;
}

uint16_t registry_moved(uint16_t port, const struct wsd_tuple *t, bool *shared)
{
	uint16_t moved = 0;

	*shared = false;
	pthread_mutex_lock(&up_lock);
	for (struct reg *r = regs; r && !*shared; r = r->next)
		if ((*shared = reg_shared(r, port)) && t && t->client.family) {
			moved = reg_find(r, tuple_hash(&t->client, &t->server), true);
		}
	pthread_mutex_unlock(&up_lock);
	return moved;
}

uint16_t registry_sibling(uint16_t port, uint16_t side, const struct wsd_tuple *t)
{
	uint16_t moved = 0;

	pthread_mutex_lock(&up_lock);
	for (struct reg *r = regs; r; r = r->next)
		if (r->port == port && r->side_port == side && r->page) {
			moved = reg_find(r, tuple_hash(&t->client, &t->server), false);
			break;
		}
	pthread_mutex_unlock(&up_lock);
	return moved == side ? 0 : moved;
}

bool registry_boxes(uint16_t port)
{
	bool boxes = true;

	pthread_mutex_lock(&up_lock);
	for (struct reg *r = regs; r && boxes; r = r->next)
		boxes = !reg_shared(r, port) && !(r->port == port && r->side_port);
	pthread_mutex_unlock(&up_lock);
	return boxes;
}

int registry_publish(uint16_t port, const struct sockaddr *peer, socklen_t len, bool on)
{
	int ret = -1, err;

	pthread_mutex_lock(&up_lock);
	for (struct reg *r = regs; r; r = r->next)
		if (r->port == port && !r->side_port && !r->handed &&
		    !atomic_load(&r->closed_at)) {
			ret = procs.lpWSPIoctl(r->ls, on ? SIO_WSP_PUBLISH : SIO_WSP_UNPUBLISH,
					       (void *)peer, len, NULL, 0, NULL, NULL, NULL,
					       NULL, &err) ? -1 : 0;
			break;
		}
	pthread_mutex_unlock(&up_lock);
	return ret;
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
	/*
	 * Through the rendezvous directory the server end is the one the
	 * client dialled, a DNAT rule's service address perhaps: the acceptor
	 * puts ours in its place (accept_rdv_server), by the client end.
	 */
	a->rdv = caller_id && caller_id->len >= sizeof(sa_family_t) && caller_id->buf &&
		 ((const struct sockaddr *)caller_id->buf)->sa_family == AF_UNIX;
	/* another version is taken, to be refused with reason protocol (take_hello) */
	if ((wsd_wire_tuple_check(caller_data ? caller_data->buf : NULL,
				  caller_data ? caller_data->len : 0, &a->t, &why) == -EPROTO) ||
	    (a->t.server.port != a->port && !a->rdv)) {
		wsd_debug("switch: a connect request refused: %s", a->t.server.port != a->port ?
			  "tuple: not this port" : why);
		wsd_stat_refused(R_PROTOCOL);
		return CF_REJECT;
	}
	return CF_ACCEPT;
}

/*
 * The acceptor's look, at each wake: its port shared since the requests in
 * hand were kept (a fork child's first accept counted it)?
 */
static bool port_shared(struct reg *r)
{
	bool shared;

	pthread_mutex_lock(&up_lock);
	shared = reg_shared(r, r->port);
	pthread_mutex_unlock(&up_lock);
	return shared;
}

static void reg_free(struct reg *r)
{
	if (r->own_page)
		regpage_free(r->page);
	if (r->side_fd >= 0) {
		wsd_fd_named(r->side_fd, false);
		real.close(r->side_fd);
	}
	free(r);
}

/*
 * What the provider's listener turned away since the last look (its uid
 * check, proof, deadline and per-process share: private.h), into wsd stat
 * by reason; the switch never saw those connectors.
 */
static void count_refused(struct reg *r)
{
	static const uint8_t reason[WSD_LREF_N] = {
		[WSD_LREF_USER] = R_ACCESS, [WSD_LREF_PROOF] = R_ACCESS,
		[WSD_LREF_TIMEOUT] = R_TIMEOUT, [WSD_LREF_PEER] = R_PEER_LIMIT,
		[WSD_LREF_EVICTED] = R_PEER_LIMIT, [WSD_LREF_PROTOCOL] = R_PROTOCOL,
	};
	uint64_t now[WSD_LREF_N];

	if (wsd_listen_refused(r->ls, now))
		return;
	for (int i = 0; i < WSD_LREF_N; i++)
		for (; r->refused_seen[i] < now[i]; r->refused_seen[i]++)
			wsd_stat_refused(reason[i]);
}

static void *acceptor(void *arg)
{
	struct reg *r = arg;
	struct acceptor_req a = { .port = r->port };
	int err;

	/* back at least this often, with no request: a registry closed, a port shared */
	(void)procs.lpWSPSetSockOpt(r->ls, SOL_WSP, SO_WSP_ACCEPT_MS, &(int){ ACCEPTOR_WAKE_MS },
				    sizeof(int), &err);
	for (;;) {
		SOCKET ws;
		int64_t closed;

		/* counted: the provider rests where it blocks, not before it allocates */
		ws = procs.lpWSPAccept(r->ls, NULL, NULL, on_request, (uintptr_t)&a, &err);
		count_refused(r);
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
		if (r->side_port)
			accept_pending_reshare(r->port, r->side_port);
		else if (port_shared(r))
			accept_pending_reshare(r->port, 0);
		if (ws == INVALID_SOCKET) {
			if (err == WSAENETDOWN || err == WSAENOTSOCK)
				break;
			continue;
		}
		if (a.rdv && a.t.client.family && !accept_rdv_server(&a.t, r->port)) {
			wsd_debug("switch: a request through the rendezvous directory names no "
				  "connection published");
			refuse(ws, R_NO_MATCH);
			continue;
		}
		accept_handshake(ws, &a.t);
	}
	procs.lpWSPCloseSocket(r->ls, &err);
	reg_free(r);
	return NULL;   /* counted_start stops counting us */
}

/* s listens: a registry for its port, made or taken; false if none. */
static bool reg_open(struct wsd_sock *s, bool alt_ok)
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
		r->page = regpage_new();   /* none: never shared, as before fork children counted */
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
	    /* connectors of other users too, as TCP takes them (by copy), unless the policy says not */
	    procs.lpWSPSetSockOpt(r->ls, SOL_WSP, SO_WSP_PEER_USERS,
				  &(int){ wsd_policy_other_users(wsd_policy_get()) }, sizeof(int),
				  &err) ||
	    procs.lpWSPListen(r->ls, 128, &err)) {
		/* another process has this port's registry (SO_REUSEPORT): stay plain */
		wsd_debug("switch: no registry for port %u (%d)", sa.port, err);
		if (r->ls != INVALID_SOCKET)
			procs.lpWSPCloseSocket(r->ls, &err);
		reg_free(r);
		goto out;
	}
	{
		/* another user held its name: listening under an alternate (wsd stat says) */
		int taken = -1;
		socklen_t tl = sizeof(taken);

		if (!procs.lpWSPGetSockOpt(r->ls, SOL_WSP, SO_WSP_NAME_TAKEN, &taken, &tl, &err) &&
		    taken >= 0) {
			/*
			 * a fork child's parent of another user holds it (a root
			 * master, its workers www-data): as a parent of ours would,
			 * it sends our connections' peers on to a registry of our
			 * own (wsd_upgrade_relisten), which an alternate name for
			 * the port would only hide from them
			 */
			if (!alt_ok) {
				procs.lpWSPCloseSocket(r->ls, &err);
				reg_free(r);
				goto out;
			}
			wsd_debug("switch: port %u's registry name is uid %d's: an alternate taken",
				  sa.port, taken);
			wsd_stat_reg_taken(sa.port, (uint32_t)taken);
		}
	}
	if (wsd_thread_start(acceptor, r)) {
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
	(void)reg_open(s, true);
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
static uint16_t side_open_on(int family, uint16_t port, struct wsd_reg_page *page, int tcp_fd,
			     bool handed)
{
	struct sockaddr_storage a = { .ss_family = (sa_family_t)family };
	socklen_t al = family == AF_INET6 ? sizeof(struct sockaddr_in6) :
					    sizeof(struct sockaddr_in);
	struct wsd_stat_addr sa;
	struct reg *r = calloc(1, sizeof(*r));
	int err;

	if (!r)
		return 0;
	r->port = port;
	r->refs = 1;                 /* the listener, or the first connection handed to us */
	r->handed = handed;
	r->page = page;              /* the parent's, where our siblings note theirs too */
	r->side_fd = real.socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (r->side_fd < 0 || real.bind(r->side_fd, (struct sockaddr *)&a, al) ||
	    getsockname(r->side_fd, (struct sockaddr *)&a, &al))
		goto fail;
	wsd_fd_named(r->side_fd, true);   /* a child of ours takes a port of its own */
	to_addr(&a, &sa);
	r->side_port = sa.port;
	r->ls = procs.lpWSPSocket(family, SOCK_STREAM, 0, &proto, 0, 0, &err);
	if (r->ls == INVALID_SOCKET ||
	    procs.lpWSPBind(r->ls, (struct sockaddr *)&a, al, &err) ||
	    procs.lpWSPSetSockOpt(r->ls, SOL_WSP, SO_WSP_TCP_LISTENER, &tcp_fd, sizeof(tcp_fd),
				  &err) ||
	    procs.lpWSPSetSockOpt(r->ls, SOL_WSP, SO_WSP_PEER_USERS,
				  &(int){ wsd_policy_other_users(wsd_policy_get()) }, sizeof(int),
				  &err) ||
	    procs.lpWSPListen(r->ls, 128, &err)) {
		if (r->ls != INVALID_SOCKET)
			procs.lpWSPCloseSocket(r->ls, &err);
		goto fail;
	}
	pthread_mutex_lock(&up_lock);
	if (wsd_thread_start(acceptor, r)) {
		pthread_mutex_unlock(&up_lock);
		procs.lpWSPCloseSocket(r->ls, &err);
		goto fail;
	}
	r->next = regs;
	regs = r;
	pthread_mutex_unlock(&up_lock);
	wsd_debug("switch: a registry of our own for port %u, on %u%s", r->port, r->side_port,
		  handed ? ", for connections handed to us at fork" : "");
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

static uint16_t side_open(struct wsd_sock *l)
{
	return side_open_on(l->family, l->stat->local.port, l->reg_page, l->fd, false);
}

void wsd_upgrade_side_accepted(struct wsd_sock *l, struct wsd_sock *s)
{
	uint64_t h;
	int e;

	if (!wsd_stat_own(s->stat) || learn_tuple(s))
		return;
	h = tuple_hash(&s->stat->peer, &s->stat->local);
	e = regpage_note(l->reg_page, h, l->side_port);
	if (!e) {
		s->reg_page = l->reg_page;
		s->reg_noted = regpage_value(h, l->side_port);
		s->reg_noted_pid = wsd_pid();
	} else {
		/* the port's registry cannot send its request here: TCP, unless asked here */
		set_reason(s, R_PAGE);
		wsd_debug("switch: fd %d not noted in port %u's shared page (%d)", s->fd,
			  l->stat->local.port, e);
	}
}

/*
 * A connection noted for the registry on side gone: when that registry is
 * one for connections handed to us and this was its last, it ends (after
 * its grace).  A pre-fork child's registry counts its listeners instead.
 */
static void handed_release(uint16_t side)
{
	pthread_mutex_lock(&up_lock);
	for (struct reg *r = regs; r; r = r->next)
		if (r->handed && r->side_port == side && r->refs > 0 && --r->refs == 0)
			atomic_store(&r->closed_at, wsd_now_ms());
	pthread_mutex_unlock(&up_lock);
}

void wsd_upgrade_side_closed(struct wsd_sock *s)
{
	/* a fork child of ours holds a copy: the connection is still ours */
	if (s->reg_page && s->reg_noted_pid == wsd_pid()) {
		regpage_forget(s->reg_page, s->reg_noted);
		handed_release((uint16_t)(s->reg_noted & 0xffff));
	}
	s->reg_noted = 0;
}

/*
 * A server that accepts and forks a handler for the connection (inetd,
 * PostgreSQL's postmaster): the handler, at its first data call on a
 * connection it inherited, takes it over.  A registry of its own (one for
 * all it takes on that port), standing on the connection itself: the
 * connector checks that our process holds a TCP connection whose local
 * end it dialled (provider/shm/owner.c), as for a one-shot server whose
 * listener is gone.  We count ourselves in the listener's page, which
 * makes the port's registry (our parent's) shared, and note the
 * connection there: once our parent has let go of its copy, it sends the
 * peer's request here (R_MOVED); while it holds one, it answers shared and
 * the peer asks again (accept.c, maybe_handed).  Nothing new is trusted:
 * the page only routes, and the proof on the stream binds the ring to the
 * connection we hold.  Any failure leaves it on TCP, reason forked.
 */
void wsd_upgrade_handoff(struct wsd_sock *s)
{
	struct wsd_reg_page *page = s->reg_page;
	struct wsd_stat_slot *slot;
	uint16_t port, side = 0;
	uint64_t h;
	int e;

	pthread_mutex_lock(&s->mu);
	if (!s->handoff) {
		pthread_mutex_unlock(&s->mu);
		return;
	}
	s->handoff = false;
	pthread_mutex_unlock(&s->mu);
	if (!page || !wsd_switch_params()->enabled)
		return;
	/*
	 * A slot of our own in wsd stat: the inherited one lies in the
	 * parent's table, private and unread here since the fork (stat.c);
	 * it stays where it is, unused.  The tuple is learnt again into it.
	 */
	slot = wsd_sock_slot(s->fd);
	if (!wsd_stat_own(slot))
		return;
	pthread_mutex_lock(&s->mu);
	s->stat = slot;
	s->tuple_known = false;
	pthread_mutex_unlock(&s->mu);
	if (learn_tuple(s) || !wsd_spi())
		return;
	port = s->stat->local.port;
	/* one registry for all we take on the port: revived if it was ending */
	pthread_mutex_lock(&up_lock);
	for (struct reg *r = regs; r; r = r->next)
		if (r->handed && r->port == port && r->page == page) {
			side = r->side_port;
			r->refs++;
			atomic_store(&r->closed_at, 0);
			break;
		}
	pthread_mutex_unlock(&up_lock);
	if (!side) {
		side = side_open_on(s->family, port, page, s->fd, true);
		if (!side)
			return;
		regpage_count_self(page);   /* the port is shared from now on */
	}
	h = tuple_hash(&s->stat->peer, &s->stat->local);
	e = regpage_note(page, h, side);
	if (e) {
		wsd_debug("switch: fd %d, inherited, not noted in port %u's page (%d): stays on TCP",
			  s->fd, port, e);
		handed_release(side);
		return;
	}
	pthread_mutex_lock(&s->mu);
	s->reg_noted = regpage_value(h, side);
	s->reg_noted_pid = wsd_pid();
	if (s->why_not == R_FORKED) {
		s->no_upgrade = false;
		s->why_not = R_NONE;
	}
	pthread_mutex_unlock(&s->mu);
	wsd_debug("switch: fd %d, inherited at fork, taken over: its peer is sent to port %u",
		  s->fd, side);
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
		regpage_count_self(l->reg_page);
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
	for (int ms = 1; !reg_open(l, getppid() != fork_parent); ms *= 2) {
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

/* fork, in the child: no acceptor threads; the registrations are the parent's. */
void registry_atfork_child(void)
{
	fork_parent = getppid();
	regs = NULL;
}

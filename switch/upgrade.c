/* SPDX-License-Identifier: MIT */
/*
 * Upgrade: finding out whether the peer runs wsd, and taking a connection
 * over when it does (wsd-protocol(7), "Handshake", "Channels").  This file
 * holds what both sides share: the parameters, the policy file's word on
 * a connection, the SPI instance, the addresses, the handshake messages,
 * and fork; accept.c is the listening side, connect.c the connecting side
 * (upgrade_int.h between them).
 *
 * A listening socket registers its port with the SPI: an SPI listener on
 * the same port number, which on the shm transport is an abstract unix
 * socket, so it is scoped to the network namespace and checks its peer's
 * credentials.  The connecting side, once a connection has carried some
 * traffic, connects to that listener from a worker thread and sends a HELLO
 * naming the TCP 4-tuple; the listening process matches it against the
 * connections it accepted (or will accept) and answers ACCEPT or REFUSE.
 * That SPI connection becomes the channel between the two processes
 * (chan.h); the next connections between them are a message on it.  The
 * application never waits for any of this: it keeps using the kernel
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
#include "switch/policy.h"
#include "switch/session.h"
#include "switch/upgrade_int.h"

/* ---- parameters ------------------------------------------------------------- */

static struct wsd_switch_params params;
static pthread_once_t params_once = PTHREAD_ONCE_INIT;


static void params_init(void)
{
	long ring = wsd_param_long("WSD_SWITCH_RING"), zc;

	params.enabled = wsd_param_long("WSD_SWITCH") != 0;
	if (ring < 16384 || ring > (64l << 20) || (ring & (ring - 1)))
		ring = 0;   /* by path (chan.c) */
	params.ring_size = (uint32_t)ring;
	params.upgrade_bytes = (uint64_t)wsd_param_long("WSD_UPGRADE_BYTES");
	params.upgrade_ns = (uint64_t)wsd_param_long("WSD_UPGRADE_US") * 1000;
	/* a second at most: the program's first receive may wait that long */
	params.hold_ns = wsd_param_long("WSD_HOLD_US") > 1000000 ? 1000000000 :
			 wsd_param_long("WSD_HOLD_US") * 1000;
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

void set_reason(struct wsd_sock *s, enum wsd_reason r)
{
	wsd_stat_begin(s->stat);
	s->stat->reason = (uint8_t)r;
	wsd_stat_end(s->stat);
	if (r != R_NONE && r != R_PENDING && r != R_LISTENER)
		wsd_stat_add(s->stat, &s->stat->fallbacks, 1);
}

/* ---- the policy file ---------------------------------------------------------- */

enum policy_word policy_check(struct wsd_sock *s)
{
	struct wsd_policy_conn c = { .program = program_invocation_short_name };
	const struct wsd_policy *pol;
	enum wsd_policy_action act;
	enum policy_word w = POLICY_OK;
	unsigned line;

	if (s->policy_ok || s->no_upgrade)
		return POLICY_OK;
	pol = wsd_policy_get();
	if (pol->needs_addr) {
		if (learn_tuple(s))
			return POLICY_LATER;
		to_addr(&s->local, &c.local);
		to_addr(&s->peer, &c.peer);
	}
	act = wsd_policy_match(pol, &c, &line);
	/* both sides may ask at once (the accept, a request): one marks it */
	pthread_mutex_lock(&s->mu);
	if (!s->no_upgrade && act == WSD_POLICY_TCP) {
		s->no_upgrade = true;
		s->why_not = R_POLICY;
		w = POLICY_TCP;
	} else if (!s->no_upgrade) {
		s->policy_ok = true;
	}
	pthread_mutex_unlock(&s->mu);
	if (w == POLICY_TCP) {
		(void)learn_tuple(s);   /* wsd stat names the connection */
		if (line)
			wsd_debug("switch: fd %d stays on TCP: policy, %s:%u", s->fd, pol->path,
				  line);
		else
			wsd_debug("switch: fd %d stays on TCP: policy (%s unusable)", s->fd,
				  pol->path);
	}
	return w;
}

bool policy_port_tcp(uint16_t port)
{
	return wsd_policy_port_tcp(wsd_policy_get(), program_invocation_short_name, port);
}

/* ---- the SPI instance -------------------------------------------------------- */

pthread_mutex_t up_lock = PTHREAD_MUTEX_INITIALIZER;
bool wsd_listeners_inherited;
bool wsd_handlers_forked;
WSPPROC_TABLE procs;
WSAPROTOCOL_INFO proto;
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
		int64_t t0 = wsd_now_ms();

		if (WSPStartup(WSP_VERSION, &d, &proto, &up, &procs) == 0)
			__atomic_store_n(&spi_started, true, __ATOMIC_RELEASE);
		else
			spi_failed = true;
		wsd_debug("switch: the provider %s at %lld ms, in %lld ms",
			  spi_failed ? "failed to start" : "started", (long long)wsd_now_ms(),
			  (long long)(wsd_now_ms() - t0));
	}
	pthread_mutex_unlock(&up_lock);
	return spi_started ? &procs : NULL;
}

struct thread_start { void *(*fn)(void *); void *arg; };

/*
 * A new thread is counted busy once it runs, not from its creation: a
 * fork does not wait for a thread the scheduler has not started yet (on a
 * loaded machine, for a long time), and one that starts during a fork
 * waits for its end first (wsd_threads_work).  Counted before anything
 * else (free may take the allocator's lock), and no longer once fn ends.
 * The sanitizer build counts it from its creation: the sanitizers' own
 * start of a thread runs before counted_start and may take their
 * allocator's lock, which has no fork handling (a fork child then hung in
 * calloc: tests/sock/uring.pair, kernel 6.18, 5 runs of 5).
 */
static void *counted_start(void *p)
{
	struct thread_start t = *(struct thread_start *)p;
	void *r;

#ifdef WSD_SANITIZERS
	wsd_threads_rest();   /* counted from its creation (wsd_thread_start) */
#endif
	wsd_threads_work();
	free(p);
	r = t.fn(t.arg);
	(void)wsd_threads_away();   /* ended: not counted (unless fn rested last) */
	return r;
}

int wsd_thread_start(void *(*fn)(void *), void *arg)
{
	struct thread_start *t = malloc(sizeof(*t));
	pthread_attr_t at;
	pthread_t th;
	int r;

	if (!t)
		return -EAGAIN;
	*t = (struct thread_start){ fn, arg };
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
#ifdef WSD_SANITIZERS
	atomic_fetch_add(&wsd_threads_busy, 1);
#endif
	r = pthread_create(&th, &at, counted_start, t);
	if (r) {
#ifdef WSD_SANITIZERS
		atomic_fetch_sub(&wsd_threads_busy, 1);
#endif
		free(t);
	}
	pthread_attr_destroy(&at);
	return r ? -EAGAIN : 0;
}

/* ---- addresses ------------------------------------------------------------------ */

/* Normalised: an IPv4-mapped IPv6 address is the IPv4 address. */
void to_addr(const struct sockaddr_storage *ss, struct wsd_stat_addr *a)
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

/*
 * Learn the 4-tuple of a connected socket (and publish it): the peer's
 * address as connect or accept gave it when they did (a system call less
 * on every short connection's way), else from the kernel.
 */
int learn_tuple(struct wsd_sock *s)
{
	socklen_t l1 = sizeof(s->local), l2 = sizeof(s->peer);
	int r = 0;

	if (s->tuple_known)
		return 0;
	pthread_mutex_lock(&s->mu);
	if (!s->tuple_known) {
		if (getsockname(s->fd, (struct sockaddr *)&s->local, &l1) ||
		    (!s->peer_known && getpeername(s->fd, (struct sockaddr *)&s->peer, &l2))) {
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

bool same(const struct wsd_stat_addr *a, const struct wsd_stat_addr *b)
{
	return a->family == b->family && a->port == b->port &&
	       !memcmp(a->addr, b->addr, a->family == AF_INET ? 4 : 16);
}

/* ---- handshake messages --------------------------------------------------------- */

int send_msg(SOCKET ws, struct wsd_hello *h)
{
	WSABUF b = { sizeof(*h), (char *)h };
	uint32_t n;
	int err;

	return procs.lpWSPSend(ws, &b, 1, &n, 0, NULL, NULL, NULL, &err) ? -1 : 0;
}

#define RECV_NAP_MAX_US 10000         /* recv_msg's longest sleep between two looks */

/*
 * Receive one message within ms; 0, -ETIMEDOUT when the time ran out, or
 * -1 (an error, *gone, a short or foreign message).  first, when given, is sent once
 * the receive is posted (the handshake's HELLO: on verbs an answer that
 * found no receive would be refused, RNR, and sent again only after a
 * timer).  A receive still pending when the time is up (or the send
 * failed) would later write into h and into this frame's overlapped: the
 * socket is closed then, which ends the request before we return, and *ws
 * becomes INVALID_SOCKET (the caller closes nothing).
 */
int recv_msg(SOCKET *wsp, struct wsd_hello *h, int ms, const _Atomic bool *gone,
	     struct wsd_hello *first)
{
	SOCKET ws = *wsp;
	WSABUF b = { sizeof(*h), (char *)h };
	WSAOVERLAPPED ov = { .hEvent = (void *)1 };
	uint32_t n = 0, fl = 0;
	int err = 0;
	int64_t end = wsd_now_ms() + ms;
	unsigned nap = 200, looks = 0;
	bool done;

	memset(h, 0, sizeof(*h));
	done = procs.lpWSPRecv(ws, &b, 1, &n, &fl, &ov, NULL, NULL, &err) == 0;
	if (!done && err != WSA_IO_PENDING)
		return -1;
	if (first && send_msg(ws, first)) {
		/* the peer answered before it read ours, and went: a refusal it owed no HELLO */
		if (done || procs.lpWSPGetOverlappedResult(ws, &ov, &n, 0, &fl, &err))
			return n == sizeof(*h) && h->magic == WSD_PROTO_MAGIC ? 0 : -1;
		if (!done) {
			procs.lpWSPCloseSocket(ws, &err);   /* aborts the request */
			*wsp = INVALID_SOCKET;
		}
		return -1;
	}
	if (done)
		return n == sizeof(*h) ? 0 : -1;
	while (!procs.lpWSPGetOverlappedResult(ws, &ov, &n, 0, &fl, &err)) {
		bool late = wsd_now_ms() > end;

		if (err != WSA_IO_INCOMPLETE || late || (gone && atomic_load(gone))) {
			procs.lpWSPCloseSocket(ws, &err);   /* aborts the request */
			*wsp = INVALID_SOCKET;
			return late ? -ETIMEDOUT : -1;
		}
		/* a wait on another process: a fork need not wait for it (wsd_threads_hold) */
		bool away = wsd_threads_away();

		usleep(nap);
		wsd_threads_back(away);
		/*
		 * An answer comes within microseconds when it comes; past the first
		 * 2 ms the peer is slow or gone, and a wait of seconds at 200 us a
		 * look cost the process an eighth of a core (hangup_check.sh)
		 */
		if (++looks > 10 && nap < RECV_NAP_MAX_US)
			nap *= 2;
	}
	return n == sizeof(*h) && h->magic == WSD_PROTO_MAGIC ? 0 : -1;
}

bool peer_pid_is(SOCKET ws, uint32_t pid)
{
	socklen_t len = sizeof(int);
	int got = 0, err;

	return !procs.lpWSPGetSockOpt(ws, SOL_WSP, SO_WSP_PEER_PID, &got, &len, &err) && got > 0 &&
	       (uint32_t)got == pid;
}

enum wsd_path path_of(SOCKET ws)
{
	char name[16] = "";
	uint32_t n;
	int err;

	procs.lpWSPIoctl(ws, SIO_WSP_TRANSPORT, NULL, 0, name, sizeof(name), &n, NULL, NULL,
			 NULL, &err);
	return !strcmp(name, "verbs") ? PATH_VERBS : PATH_SHM;
}

/*
 * The reason a REFUSE or DECLINE carries for one counted why: peer-limit
 * is ours to count, and the asker is told busy, to ask again later
 * (wsd-protocol(7), Reason codes).
 */
static uint32_t wire_reason(enum wsd_reason why)
{
	return why == R_PEER_LIMIT ? R_BUSY : why;
}

/*
 * port: a moved refusal's (wsd-protocol(7), Servers that fork), else 0.
 * The REFUSE waits for a receive the peer may never post: REFUSE_MS at
 * most, then the close ends it (and the peer sees the end).  The
 * registry's acceptor refuses too, and must not wait on any one peer.
 */
void refuse_port(SOCKET ws, enum wsd_reason why, uint16_t port)
{
	struct wsd_hello h = { .magic = WSD_PROTO_MAGIC, .version = WSD_PROTO_VERSION,
			       .kind = MSG_REFUSE, .reason = wire_reason(why), .seg = port };
	WSABUF b = { sizeof(h), (char *)&h };
	WSAOVERLAPPED ov = { .hEvent = (void *)1 };
	int64_t end = wsd_now_ms() + REFUSE_MS;
	uint32_t n, fl;
	int err;

	wsd_stat_refused(why);
	if (procs.lpWSPSend(ws, &b, 1, &n, 0, &ov, NULL, NULL, &err) && err == WSA_IO_PENDING)
		while (!procs.lpWSPGetOverlappedResult(ws, &ov, &n, 0, &fl, &err) &&
		       err == WSA_IO_INCOMPLETE && wsd_now_ms() <= end) {
			bool away = wsd_threads_away();   /* a wait on another process */

			usleep(200);
			wsd_threads_back(away);
		}
	procs.lpWSPCloseSocket(ws, &err);   /* aborts a send still waiting, before h goes */
}

void refuse(SOCKET ws, enum wsd_reason why)
{
	refuse_port(ws, why, 0);
}

struct wsd_chmsg decline_msg(uint64_t req, enum wsd_reason why)
{
	return (struct wsd_chmsg){ .h = { .magic = WSD_PROTO_MAGIC, .version = WSD_PROTO_VERSION,
					  .kind = MSG_DECLINE, .reason = wire_reason(why) },
				 .req = req };
}

/* A channel's request answered DECLINE. */
void decline(struct wsd_chan *ch, uint64_t req, enum wsd_reason why)
{
	struct wsd_chmsg m = decline_msg(req, why);

	wsd_stat_refused(why);
	wsd_chan_send(ch, &m);
}

/* A request that gets no answer at all (it broke the protocol): counted, closed. */
void drop(SOCKET ws)
{
	int err;

	wsd_stat_refused(R_PROTOCOL);
	procs.lpWSPCloseSocket(ws, &err);
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
	pid_t parent = *(const pid_t *)arg;

	(void)fd;
	s->no_upgrade = true;
	if (!s->why_not)
		s->why_not = R_FORKED;
	/*
	 * A connection our parent accepted on a listener with a page, never
	 * upgraded: ours to take over at our first data call, if we are its
	 * handler (wsd_upgrade_handoff; doc/fork-servers.md).  Not one our
	 * parent inherited in turn: it holds a copy no registry of its own
	 * answers for, so nothing would keep the peer off the ring while it
	 * does.
	 */
	s->handoff = !s->listening && !s->connected_side && s->reg_page && !s->sess &&
		     s->accepted_by == parent && atomic_load(&s->upgrade_state) == UP_NONE;
	s->data_called = false;
	if (s->listening) {
		wsd_listeners_inherited = true;
		s->reg_lost = true;   /* the registry is the parent's: ours at an accept */
		s->reg_try_ms = 0;
		s->reg_counted = false;
		s->side_port = 0;   /* the parent's own registry, if any: not ours */
	}
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
	wsd_handlers_forked = false;          /* set again if we fork handlers of our own */
	pthread_mutex_init(&up_lock, NULL);
	spi_started = false;
	spi_failed = false;
	accept_atfork_child();
	connect_atfork_child();
	probe_atfork_child();
	wsd_chan_atfork_child();
	{
		pid_t parent = getppid();

		wsd_fd_each(mark_child, &parent);
	}
}

/* SPDX-License-Identifier: MIT */
/*
 * Provider instances, socket handles, and request completion.  A request
 * completes in whichever thread polls its socket's CQ first: the caller
 * that posted it (an immediate completion), a caller waiting for it, or the
 * instance's completion thread, which sleeps on every CQ through the
 * completion engine while nobody else polls.
 */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "provider/spi/spi.h"

/* ---- socket handles ------------------------------------------------------ */

/* A handle is a slot index and the slot's generation: stale handles miss. */
static pthread_mutex_t handles_lock = PTHREAD_MUTEX_INITIALIZER;
static struct wsp_socket **slots;
static uint32_t *gens;
static size_t nslots;

static SOCKET handle_of(size_t i)
{
	return ((SOCKET)gens[i] << 24) | (SOCKET)(i + 1);
}

struct wsp_socket *wsp_sock_get(SOCKET h, int *err)
{
	size_t i = (size_t)(h & 0xffffff);
	struct wsp_socket *s = NULL;

	pthread_mutex_lock(&handles_lock);
	if (i >= 1 && i <= nslots && slots[i - 1] && handle_of(i - 1) == h) {
		s = slots[i - 1];
		s->refs++;
	}
	pthread_mutex_unlock(&handles_lock);
	if (!s)
		*err = WSAENOTSOCK;
	return s;
}

static void sock_free(struct wsp_socket *s)
{
	free(s);
}

void wsp_sock_ref(struct wsp_socket *s)
{
	pthread_mutex_lock(&handles_lock);
	s->refs++;
	pthread_mutex_unlock(&handles_lock);
}

void wsp_sock_put(struct wsp_socket *s)
{
	bool last;

	pthread_mutex_lock(&handles_lock);
	last = --s->refs == 0;
	pthread_mutex_unlock(&handles_lock);
	if (last)
		sock_free(s);
}

SOCKET wsp_sock_new(struct wsp_provider *pv, int af, int *err, struct wsp_socket **out)
{
	struct wsp_socket *s = calloc(1, sizeof(*s));
	size_t i;

	if (!s) {
		*err = WSAENOBUFS;
		return INVALID_SOCKET;
	}
	s->pv = pv;
	s->af = af;
	s->rdma_threshold = (uint32_t)pv->info.rdma_threshold;
	s->tcp_listener = -1;
	s->refs = 1;    /* the open handle's */
	pthread_mutex_lock(&handles_lock);
	for (i = 0; i < nslots && slots[i]; i++)
		;
	if (i == nslots) {
		size_t n = nslots ? nslots * 2 : 64;
		struct wsp_socket **ns = realloc(slots, n * sizeof(*ns));
		uint32_t *ng = ns ? realloc(gens, n * sizeof(*ng)) : NULL;

		if (ns)
			slots = ns;
		if (!ng || n > 0xffffff) {
			pthread_mutex_unlock(&handles_lock);
			free(s);
			*err = WSAENOBUFS;
			return INVALID_SOCKET;
		}
		gens = ng;
		memset(slots + nslots, 0, (n - nslots) * sizeof(*slots));
		memset(gens + nslots, 0, (n - nslots) * sizeof(*gens));
		nslots = n;
	}
	gens[i] = (gens[i] + 1) & 0xffffff;
	slots[i] = s;
	s->handle = handle_of(i);
	pthread_mutex_unlock(&handles_lock);
	pthread_mutex_lock(&pv->lock);
	s->next = pv->socks;
	pv->socks = s;
	pthread_mutex_unlock(&pv->lock);
	*out = s;
	return s->handle;
}

/* The handle stops working; the object lives on until its last lookup ends. */
void wsp_sock_release_handle(struct wsp_socket *s)
{
	size_t i = (size_t)(s->handle & 0xffffff) - 1;
	struct wsp_provider *pv = s->pv;

	pthread_mutex_lock(&pv->lock);
	for (struct wsp_socket **p = &pv->socks; *p; p = &(*p)->next) {
		if (*p == s) {
			*p = s->next;
			break;
		}
	}
	pthread_mutex_unlock(&pv->lock);
	pthread_mutex_lock(&handles_lock);
	if (i < nslots && slots[i] == s)
		slots[i] = NULL;
	pthread_mutex_unlock(&handles_lock);
	wsp_sock_put(s);
}

/* ---- requests ------------------------------------------------------------ */

struct wsp_req *wsp_req_new(struct wsp_socket *s, enum req_kind kind, WSAOVERLAPPED *ov)
{
	struct wsp_req *r = calloc(1, sizeof(*r));

	if (!r)
		return NULL;
	r->s = s;
	r->kind = kind;
	r->ov = ov;
	r->in_call = true;
	if (ov) {
		ov->Internal = WSA_IO_PENDING;
		ov->InternalHigh = 0;
	}
	/* lock held by the caller */
	r->next = s->reqs;
	if (s->reqs)
		s->reqs->prev = r;
	s->reqs = r;
	wsp_sock_ref(s);   /* a request keeps its socket object alive */
	return r;
}

static void req_unlink(struct wsp_req *r)
{
	struct wsp_socket *s = r->s;

	if (r->prev)
		r->prev->next = r->next;
	else if (s->reqs == r)
		s->reqs = r->next;
	if (r->next)
		r->next->prev = r->prev;
	r->next = r->prev = NULL;
}

/*
 * Lock held.  A request's memory goes once nobody can reach it: the
 * endpoint layer has given it back (or its CQ is gone) and no call is
 * posting it or waiting for it.
 */
static void req_free(struct wsp_req *r)
{
	struct wsp_socket *s = r->s;

	for (unsigned i = 0; i < r->nregs; i++)
		wsp_rc_put(s->pv, r->regs[i]);
	req_unlink(r);
	free(r);
	/* the socket's last reference may go here; the handle table decides */
	pthread_mutex_lock(&handles_lock);
	s->refs--;
	pthread_mutex_unlock(&handles_lock);
}

static void req_maybe_free(struct wsp_req *r)
{
	if (r->done && !r->nd_pending && !r->in_call && !r->waiting)
		req_free(r);
}

/* Lock held.  The posting call gives the request up (say, its post failed). */
void wsp_req_release(struct wsp_req *r)
{
	r->in_call = false;
	r->done = true;
	req_maybe_free(r);
}

/* Lock held.  The socket's CQ is gone: no result will come back for these. */
void wsp_reqs_orphan_all(struct wsp_socket *s)
{
	for (struct wsp_req *r = s->reqs, *n; r; r = n) {
		n = r->next;
		r->nd_pending = false;
		req_maybe_free(r);
	}
}

int wsp_notify(SOCKET s, WSAOVERLAPPED *ov, uint32_t error, uint32_t bytes)
{
	struct wsp_socket *so;
	int err = 0;
	struct wsd_port *port;
	uintptr_t key;

	so = wsp_sock_get(s, &err);
	if (!so)
		return SOCKET_ERROR;
	port = so->port;
	key = so->key;
	wsp_sock_put(so);
	(void)error;
	if (port)
		return wsd_port_post(port, bytes, key, ov) < 0 ? SOCKET_ERROR : 0;
	return 0;
}

/* Notifications to make once the provider lock is dropped. */
struct pending {
	SOCKET s;
	WSAOVERLAPPED *ov;
	uint32_t error, bytes;
};

static bool wants_notice(const WSAOVERLAPPED *ov)
{
	return ov && !((uintptr_t)ov->hEvent & 1);
}

/*
 * Lock held.  A request is done: record its outcome, and finish it unless
 * the call that posted it is still running (that call decides).
 */
static void req_complete(struct wsp_req *r, int error, uint32_t bytes, struct pending *p,
			 int *np)
{
	struct wsp_provider *pv = r->s->pv;

	r->done = true;
	r->error = error;
	r->bytes = error ? 0 : bytes;
	pthread_cond_broadcast(&pv->cond);
	if (r->in_call || !r->ov)
		return;
	r->ov->InternalHigh = r->bytes;
	__atomic_store_n(&r->ov->Internal, (uintptr_t)r->error, __ATOMIC_RELEASE);
	if (wants_notice(r->ov) && p) {
		p[*np] = (struct pending){ r->s->handle, r->ov, (uint32_t)r->error, r->bytes };
		(*np)++;
	}
	r->ov = NULL;   /* the caller may reuse it from now on */
}

/* The WSA code for a result, and what it says about the connection. */
static int result_error(struct wsp_socket *s, const struct nd_result *res)
{
	switch (res->status) {
	case ND_SUCCESS:
		return 0;
	case ND_CANCELED:
		/* our own close or full shutdown canceled it */
		if (s->closing || (s->shut_send && s->shut_recv))
			return WSA_OPERATION_ABORTED;
		if (!s->fail)
			s->fail = s->shut_send && s->shut_recv ? WSAESHUTDOWN : WSAECONNRESET;
		return s->fail;
	case ND_BUFFER_OVERFLOW:
		s->fail = WSAECONNABORTED;
		return WSAEMSGSIZE;
	case ND_ACCESS_VIOLATION:
	case ND_LOCAL_LENGTH:
	case ND_FAILURE:
		s->fail = WSAECONNABORTED;
		return WSAEFAULT;
	case ND_REMOTE_ERROR:
		s->fail = WSAECONNABORTED;
		return res->op == ND_OP_READ || res->op == ND_OP_WRITE ? WSAEFAULT : WSAECONNABORTED;
	default:
		s->fail = WSAECONNABORTED;
		return WSAECONNABORTED;
	}
}

static void run_pending(struct wsp_provider *pv, struct pending *p, int n)
{
	for (int i = 0; i < n; i++) {
		int err = 0;

		if (pv->up.lpWPUCompleteOverlappedRequest)
			pv->up.lpWPUCompleteOverlappedRequest(p[i].s, p[i].ov, p[i].error,
							      p[i].bytes, &err);
		else
			wsp_notify(p[i].s, p[i].ov, p[i].error, p[i].bytes);
	}
}

#define HARVEST 32

/* Lock held.  Complete what the socket's CQ has; notifications go to p. */
static int harvest_into(struct wsp_socket *s, struct pending *p)
{
	struct nd_result res[HARVEST];
	int n, np = 0;

	if (!s->cq)
		return 0;
	n = nd_cq_poll(s->cq, res, HARVEST);
	for (int i = 0; i < n; i++) {
		struct wsp_req *r = res[i].request_context;

		if (!r)
			continue;
		r->nd_pending = false;
		if (!r->done)
			req_complete(r, result_error(s, &res[i]), (uint32_t)res[i].bytes, p, &np);
		req_maybe_free(r);
	}
	return np;
}

/*
 * Lock held.  Poll inline; notifications are made with the lock dropped
 * and taken again, so callers must not hold pointers across this.
 */
int wsp_harvest(struct wsp_socket *s)
{
	struct pending p[HARVEST];
	int np = harvest_into(s, p);

	if (np) {
		pthread_mutex_unlock(&s->pv->lock);
		run_pending(s->pv, p, np);
		pthread_mutex_lock(&s->pv->lock);
	}
	return np;
}

/*
 * Lock held.  The posting call is over: 0 and the byte count when the
 * request completed already (it is notified like any other), or
 * SOCKET_ERROR with WSA_IO_PENDING, or the request's error.
 */
int wsp_req_finish_call(struct wsp_req *r, uint32_t *bytes, int *err)
{
	struct wsp_socket *s = r->s;
	WSAOVERLAPPED *ov = r->ov;
	struct pending p;
	int error;

	r->in_call = false;
	if (!r->done) {
		*err = WSA_IO_PENDING;
		return SOCKET_ERROR;
	}
	error = r->error;
	ov->InternalHigh = r->bytes;
	__atomic_store_n(&ov->Internal, (uintptr_t)error, __ATOMIC_RELEASE);
	if (bytes)
		*bytes = r->bytes;
	p = (struct pending){ s->handle, ov, (uint32_t)error, r->bytes };
	r->ov = NULL;
	req_maybe_free(r);
	if (error) {
		*err = error;   /* failed at once: no notification, as with any failed call */
		return SOCKET_ERROR;
	}
	if (wants_notice(ov)) {
		pthread_mutex_unlock(&s->pv->lock);
		run_pending(s->pv, &p, 1);
		pthread_mutex_lock(&s->pv->lock);
	}
	return 0;
}


/*
 * A sleeping caller looks for its completion itself this often, whatever
 * wakes it or fails to (every caller of wsp_wait_step harvests between
 * steps).  Its completion is the peer's device answering, a wait on
 * another machine, and so has a deadline of its own: a wakeup the
 * completion thread loses costs this, never the connection.  (A device
 * that never completes is verbs/data.c's DEAD_NS.)
 */
#define WAIT_STEP_NS 10000000

/*
 * Lock held.  One step of waiting for a completion: yield while the spin
 * period lasts (a peer sharing the core can run), then sleep until the
 * next completion anywhere in the instance, or WAIT_STEP_NS.
 */
void wsp_wait_step(struct wsp_provider *pv, int64_t spin_end)
{
	struct timespec ts;

	if (wsd_now_ns() < spin_end) {
		pthread_mutex_unlock(&pv->lock);
		sched_yield();
		pthread_mutex_lock(&pv->lock);
		return;
	}
	ts = wsd_timespec_in(CLOCK_MONOTONIC, WAIT_STEP_NS);
	bool away = wsd_threads_away();   /* blocks: a fork need not wait for it */

	pthread_cond_timedwait(&pv->cond, &pv->lock, &ts);
	if (away) {   /* held by a fork meanwhile: not with the lock */
		pthread_mutex_unlock(&pv->lock);
		wsd_threads_back(away);
		pthread_mutex_lock(&pv->lock);
	}
}

/*
 * Lock held.  Wait for an internal request (no overlapped structure): poll
 * for the spin period, then sleep until the completion thread finishes it.
 * Returns its WSA code (and byte count) and lets it go.
 */
int wsp_req_wait(struct wsp_req *r, uint32_t *bytes)
{
	struct wsp_socket *s = r->s;
	int64_t spin_end = wsd_now_ns() + wsd_spin_ns();
	int error;

	r->in_call = false;
	r->waiting = true;
	while (!r->done) {
		wsp_harvest(s);
		if (r->done)
			break;
		wsp_wait_step(s->pv, spin_end);
	}
	error = r->error;
	if (bytes)
		*bytes = r->bytes;
	r->waiting = false;
	req_maybe_free(r);
	return error;
}

/* The WSA code for a request the endpoint layer refused at once. */
int wsp_posted_error(struct wsp_socket *s, nd_status st)
{
	switch (st) {
	case ND_CONNECTION_INVALID:
		if (!s->fail)
			s->fail = s->state == S_CONNECTED ? WSAECONNRESET : WSAENOTCONN;
		return s->state == S_CONNECTED ? s->fail : WSAENOTCONN;
	case ND_NO_MORE_ENTRIES:
	case ND_DATA_OVERRUN:
	case ND_NO_MEMORY:
	case ND_INSUFFICIENT_RESOURCES:
		return WSAENOBUFS;
	case ND_BUFFER_OVERFLOW:
		return WSAEMSGSIZE;
	case ND_REMOTE_ERROR:
	case ND_ACCESS_VIOLATION:
		return WSAEFAULT;
	case ND_INVALID_PARAMETER:
		return WSAEINVAL;
	case ND_NOT_SUPPORTED:
		return WSAEOPNOTSUPP;   /* RDMA on a connection between users (SO_WSP_PEER_USERS) */
	default:
		return WSAENETDOWN;
	}
}

/* Lock held.  Requests still outstanding end with WSA_OPERATION_ABORTED. */
void wsp_abort_all(struct wsp_socket *s)
{
	struct pending p[HARVEST];
	int np;

	s->closing = true;
	do {
		np = 0;
		for (struct wsp_req *r = s->reqs, *n; r && np < HARVEST; r = n) {
			n = r->next;
			if (!r->done) {
				req_complete(r, WSA_OPERATION_ABORTED, 0, p, &np);
				req_maybe_free(r);
			}
		}
		if (np) {
			pthread_mutex_unlock(&s->pv->lock);
			run_pending(s->pv, p, np);
			pthread_mutex_lock(&s->pv->lock);
		}
	} while (np == HARVEST);
}

/* ---- the completion thread ----------------------------------------------- */

/* Lock held.  Let the completion thread watch this socket's CQ. */
int wsp_sock_watch(struct wsp_socket *s)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = s };

	if (epoll_ctl(s->pv->epfd, EPOLL_CTL_ADD, nd_cq_fd(s->cq), &ev) < 0)
		return -errno;
	s->in_epoll = true;
	s->watched = true;
	(void)eventfd_write(s->pv->efd, 1);
	return 0;
}

/*
 * Lock held.  Take a reference on every socket with a CQ: a socket may be
 * closed while the lock is dropped to notify, and must not vanish under us.
 */
static unsigned snapshot(struct wsp_provider *pv, struct wsp_socket ***out, unsigned *cap)
{
	unsigned n = 0;

	for (struct wsp_socket *s = pv->socks; s; s = s->next) {
		if (!s->cq)
			continue;
		if (n == *cap) {
			unsigned c = *cap ? *cap * 2 : 16;
			struct wsp_socket **a = realloc(*out, c * sizeof(*a));

			if (!a)
				break;   /* the rest waits for the next round */
			*out = a;
			*cap = c;
		}
		wsp_sock_ref(s);
		(*out)[n++] = s;
	}
	return n;
}

/* Lock held. */
static bool needs_thread(const struct wsp_socket *s)
{
	for (const struct wsp_req *r = s->reqs; r; r = r->next)
		if (!r->done && (!r->ov || wants_notice(r->ov) || s->ov_sleepers))
			return true;
	return false;
}

/*
 * Lock held.  A request was posted that the completion thread must see
 * through (a call will sleep on it, or it posts a completion): wake the
 * thread if this socket's CQ is not armed.
 */
void wsp_kick(struct wsp_socket *s, const WSAOVERLAPPED *ov)
{
	if ((!ov || wants_notice(ov) || s->ov_sleepers) && !s->armed) {
		s->armed = true;
		(void)eventfd_write(s->pv->efd, 1);
	}
}

/*
 * Lock held.  The thread's epoll set reports a socket's CQ only while it is
 * armed for it.  Reading the CQ's own doorbell, as it did, leaves what the
 * transport attached to it: a peer that hung up leaves its socket there
 * readable for good (EPOLLRDHUP), and the thread woke on it again and
 * again while the owner of a request polled for itself (a registry
 * handshake waiting 5 s for a HELLO spun a core: prefork_check).
 */
static void watch(struct wsp_socket *s)
{
	struct epoll_event ev = { .events = s->armed ? EPOLLIN : 0, .data.ptr = s };

	if (!s->cq || !s->in_epoll || s->watched == s->armed)
		return;
	if (epoll_ctl(s->pv->epfd, EPOLL_CTL_MOD, nd_cq_fd(s->cq), &ev) == 0)
		s->watched = s->armed;
}

/*
 * While a request it watches is outstanding, the thread also wakes every
 * BACKSTOP_NS and looks without being told.  A backstop: once, in CI, a
 * completion-port packet never came (bench_nd's ping-pong through a port,
 * one request of some ten thousand; not seen again in two million round
 * trips here), so somewhere a wakeup can be lost.  It now costs a tenth of
 * a second, not the connection; WSD_DEBUG reports each time the backstop
 * finds work, to find the cause by.
 */
#define BACKSTOP_NS 100000000

static void *completion_thread(void *arg)
{
	struct wsp_provider *pv = arg;
	struct wsp_socket **socks = NULL;
	unsigned cap = 0;
	eventfd_t junk;
	bool timed_out = false;

	nd_adapter_background(pv->ad);   /* counted busy, from before its creation */
	pthread_mutex_lock(&pv->lock);
	while (!pv->down) {
		unsigned n = snapshot(pv, &socks, &cap);
		bool watching = false;

		for (unsigned i = 0; i < n; i++) {
			struct wsp_socket *s = socks[i];
			int found = wsp_harvest(s);

			if (found && timed_out)
				wsd_debug("spi: socket %llu: %d notification(s) found by the "
					  "backstop, with no wakeup",
					  (unsigned long long)s->handle, found);
			/*
			 * Arm only for requests someone waits on here: a call asleep,
			 * or a completion to post.  Requests polled by their owner
			 * (hEvent's low bit) need no thread, and the switch's stream
			 * of RDMA writes would otherwise wake it for every one.
			 */
			s->armed = s->cq && needs_thread(s);   /* closed meanwhile: no CQ */
			if (s->armed)
				nd_cq_notify(s->cq, ND_CQ_NOTIFY_ANY);   /* forgets old doorbells */
			watch(s);   /* unarmed, its fd is not reported: nothing to quiet */
			watching |= s->armed;
		}
		pthread_mutex_unlock(&pv->lock);
		for (unsigned i = 0; i < n; i++)
			wsp_sock_put(socks[i]);
		wsd_threads_rest();
		timed_out = wsd_engine_wait_fd(&pv->engine, pv->epfd,
					       watching ? BACKSTOP_NS : -1) == 0;
		wsd_threads_work();
		(void)eventfd_read(pv->efd, &junk);
		pthread_mutex_lock(&pv->lock);
	}
	wsd_threads_rest();
	pthread_mutex_unlock(&pv->lock);
	free(socks);
	return NULL;
}

/* ---- startup and cleanup ------------------------------------------------- */

/*
 * A reader-writer lock: the memory hooks walk the instances while a thread
 * may hold one instance's lock and free() inside it (which walks them too).
 */
static pthread_rwlock_t instances_lock = PTHREAD_RWLOCK_INITIALIZER;
static struct wsp_provider *instances;

/*
 * A forked child has none of the parent's threads, and the parent's
 * instances' locks may have been held by them: the child starts with no
 * instances (the parent's are left alone, not freed).
 */
static void instances_atfork_child(void)
{
	pthread_rwlock_init(&instances_lock, NULL);
	pthread_mutex_init(&handles_lock, NULL);
	instances = NULL;
}

__attribute__((constructor)) static void instances_init(void)
{
	pthread_atfork(NULL, NULL, instances_atfork_child);
}

/* Every live instance, for WSPMemoryRegistrationCacheCallback. */
void wsp_for_each_provider(void (*fn)(struct wsp_provider *, void *), void *arg)
{
	pthread_rwlock_rdlock(&instances_lock);
	for (struct wsp_provider *pv = instances; pv; pv = pv->next)
		fn(pv, arg);
	pthread_rwlock_unlock(&instances_lock);
}

static const WSPPROC_TABLE procs = {
	.cbSize = sizeof(WSPPROC_TABLE),
	.lpWSPSocket = WSPSocket,
	.lpWSPBind = WSPBind,
	.lpWSPListen = WSPListen,
	.lpWSPAccept = WSPAccept,
	.lpWSPConnect = WSPConnect,
	.lpWSPSend = WSPSend,
	.lpWSPRecv = WSPRecv,
	.lpWSPShutdown = WSPShutdown,
	.lpWSPCloseSocket = WSPCloseSocket,
	.lpWSPGetSockOpt = WSPGetSockOpt,
	.lpWSPSetSockOpt = WSPSetSockOpt,
	.lpWSPIoctl = WSPIoctl,
	.lpWSPGetOverlappedResult = WSPGetOverlappedResult,
	.lpWSPRegisterMemory = WSPRegisterMemory,
	.lpWSPDeregisterMemory = WSPDeregisterMemory,
	.lpWSPRegisterRdmaMemory = WSPRegisterRdmaMemory,
	.lpWSPDeregisterRdmaMemory = WSPDeregisterRdmaMemory,
	.lpWSPMemoryRegistrationCacheCallback = WSPMemoryRegistrationCacheCallback,
	.lpWSPRdmaRead = WSPRdmaRead,
	.lpWSPRdmaWrite = WSPRdmaWrite,
	.lpWSPCleanup = WSPCleanup,
};

static void provider_free(struct wsp_provider *pv)
{
	if (pv->efd >= 0)
		close(pv->efd);
	if (pv->epfd >= 0)
		close(pv->epfd);
	wsd_engine_fini(&pv->engine);
	if (pv->ad)
		nd_adapter_close(pv->ad);
	pthread_mutex_destroy(&pv->lock);
	pthread_cond_destroy(&pv->cond);
	free(pv);
}

int WSPStartup(uint16_t version, WSPDATA *data, WSAPROTOCOL_INFO *info,
	       const WSPUPCALLTABLE *upcalls, WSPPROC_TABLE *table)
{
	struct wsp_provider *pv;
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = NULL };
	size_t want;

	if (!data || !info || !table)
		return WSAEFAULT;
	/* as MAKEWORD builds it: the major version in the low byte */
	if ((version & 0xff) != 2)
		return WSAVERNOTSUPPORTED;
	if (table->cbSize < sizeof(table->cbSize))
		return WSAEINVAL;
	pv = calloc(1, sizeof(*pv));
	if (!pv)
		return WSAENOBUFS;
	{
		/*
		 * Recursive: the memory hooks' free() runs inside the provider
		 * too (it frees its own requests under this lock) and takes it
		 * to look for registrations over the freed block.
		 */
		pthread_mutexattr_t ma;

		pthread_mutexattr_init(&ma);
		pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
		pthread_mutex_init(&pv->lock, &ma);
		pthread_mutexattr_destroy(&ma);
		pthread_spin_init(&pv->inval_lock, PTHREAD_PROCESS_PRIVATE);
	}
	{
		/* timed waits on the monotonic clock (wsp_wait_step) */
		pthread_condattr_t ca;

		pthread_condattr_init(&ca);
		pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
		pthread_cond_init(&pv->cond, &ca);
		pthread_condattr_destroy(&ca);
	}
	pv->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	pv->epfd = epoll_create1(EPOLL_CLOEXEC);
	pv->next_handle = 1;
	if (upcalls && upcalls->cbSize >= sizeof(upcalls->cbSize))
		memcpy(&pv->up, upcalls, upcalls->cbSize < sizeof(pv->up) ? upcalls->cbSize :
			sizeof(pv->up));
	if (pv->efd < 0 || pv->epfd < 0 || epoll_ctl(pv->epfd, EPOLL_CTL_ADD, pv->efd, &ev) < 0 ||
	    wsd_engine_init(&pv->engine) < 0) {
		provider_free(pv);
		return WSAENOBUFS;
	}
	if (nd_adapter_open(NULL, &pv->ad) != ND_SUCCESS) {
		pv->ad = NULL;
		provider_free(pv);
		return WSAENETDOWN;
	}
	nd_adapter_query(pv->ad, &pv->info);
	atomic_fetch_add(&wsd_threads_busy, 1);   /* until its first wait */
	if (pthread_create(&pv->thread, NULL, completion_thread, pv)) {
		wsd_threads_rest();
		provider_free(pv);
		return WSAENOBUFS;
	}
	pv->thread_started = true;
	want = table->cbSize < sizeof(procs) ? table->cbSize : sizeof(procs);
	memcpy(table, &procs, want);
	table->cbSize = want;
	data->wVersion = 0x0202;
	data->wHighVersion = 0x0202;
	snprintf(data->szDescription, sizeof(data->szDescription), "wsd SAN provider (%s)",
		 pv->info.transport);
	info->provider = pv;
	snprintf(info->transport, sizeof(info->transport), "%s", pv->info.transport);
	pthread_rwlock_wrlock(&instances_lock);
	pv->next = instances;
	instances = pv;
	pthread_rwlock_unlock(&instances_lock);
	return 0;
}

/*
 * The instance stops: its thread ends, outstanding requests are aborted,
 * and its sockets answer WSAENETDOWN until closed.  The adapter stays
 * until the last socket closes, so their handles stay safe to use.
 */
int WSPCleanup(struct wsp_provider *pv, int *err)
{
	if (!pv) {
		*err = WSAEINVAL;
		return SOCKET_ERROR;
	}
	pthread_mutex_lock(&pv->lock);
	if (pv->down) {
		pthread_mutex_unlock(&pv->lock);
		*err = WSAENETDOWN;
		return SOCKET_ERROR;
	}
	pv->down = true;
	(void)eventfd_write(pv->efd, 1);
	pthread_mutex_unlock(&pv->lock);
	pthread_join(pv->thread, NULL);
	pthread_mutex_lock(&pv->lock);
	for (struct wsp_socket *s = pv->socks; s; s = s->next) {
		s->fail = WSAENETDOWN;
		wsp_abort_all(s);
		s->closing = false;
	}
	pthread_mutex_unlock(&pv->lock);
	pthread_rwlock_wrlock(&instances_lock);
	for (struct wsp_provider **p = &instances; *p; p = &(*p)->next) {
		if (*p == pv) {
			*p = pv->next;
			break;
		}
	}
	pthread_rwlock_unlock(&instances_lock);
	/* nothing is left open: free it now; else the last close frees it */
	pthread_mutex_lock(&pv->lock);
	if (!pv->socks) {
		pthread_mutex_unlock(&pv->lock);
		wsp_rc_drop_all(pv);
		provider_free(pv);
		return 0;
	}
	pthread_mutex_unlock(&pv->lock);
	return 0;
}

/* After WSPCleanup, the last socket to close frees the instance. */
void wsp_provider_maybe_free(struct wsp_provider *pv)
{
	bool last;

	pthread_mutex_lock(&pv->lock);
	last = pv->down && !pv->socks;
	pthread_mutex_unlock(&pv->lock);
	if (last) {
		wsp_rc_drop_all(pv);
		provider_free(pv);
	}
}

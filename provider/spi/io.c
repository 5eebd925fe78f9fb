/* SPDX-License-Identifier: MIT */
/* SPI data transfer: WSPSend, WSPRecv, WSPRdmaRead/Write, overlapped results. */
#include <errno.h>
#include <sched.h>
#include <string.h>
#include <time.h>

#include "provider/spi/spi.h"

static int fail(struct wsp_socket *s, int code, int *err)
{
	if (s)
		wsp_sock_put(s);
	*err = code;
	return SOCKET_ERROR;
}

/* A connected socket of a live instance, or NULL with *err set. */
static struct wsp_socket *connected(SOCKET h, int *err)
{
	struct wsp_socket *s = wsp_sock_get(h, err);

	if (!s)
		return NULL;
	if (s->pv->down) {
		fail(s, WSAENETDOWN, err);
		return NULL;
	}
	if (s->state != S_CONNECTED) {
		fail(s, WSAENOTCONN, err);
		return NULL;
	}
	return s;
}

/*
 * Post a request built by post(), then see at once whether it completed.
 * Overlapped: 0 with the byte count, or SOCKET_ERROR and WSA_IO_PENDING or
 * the error.  Not overlapped: wait for it.
 */
typedef nd_status (*post_fn)(struct wsp_socket *s, struct wsp_req *r, void *arg);

static int submit(struct wsp_socket *s, enum req_kind kind, WSAOVERLAPPED *ov, post_fn post,
		  void *arg, struct rc_entry **regs, unsigned nregs, uint32_t *bytes, int *err)
{
	struct wsp_req *r;
	nd_status st;
	int ret;

	pthread_mutex_lock(&s->pv->lock);
	r = wsp_req_new(s, kind, ov);
	if (!r) {
		pthread_mutex_unlock(&s->pv->lock);
		for (unsigned i = 0; i < nregs; i++)
			wsp_rc_put(s->pv, regs[i]);
		return fail(s, WSAENOBUFS, err);
	}
	memcpy(r->regs, regs, nregs * sizeof(*regs));
	r->nregs = nregs;
	st = post(s, r, arg);
	if (st != ND_SUCCESS) {
		int code = wsp_posted_error(s, st);

		if (ov)
			ov->Internal = (uintptr_t)code;
		wsp_req_release(r);
		pthread_mutex_unlock(&s->pv->lock);
		return fail(s, code, err);
	}
	r->nd_pending = true;
	wsp_kick(s, ov);
	wsp_harvest(s);
	if (ov) {
		ret = wsp_req_finish_call(r, bytes, err);
	} else {
		int e = wsp_req_wait(r, bytes);

		ret = e ? SOCKET_ERROR : 0;
		if (e)
			*err = e;
	}
	pthread_mutex_unlock(&s->pv->lock);
	wsp_sock_put(s);
	return ret;
}

/* ---- send and receive ----------------------------------------------------- */

struct msg_args {
	struct nd_sge sge[WSP_MAX_BUFS];
	uint32_t n;
};

static nd_status post_send(struct wsp_socket *s, struct wsp_req *r, void *arg)
{
	struct msg_args *a = arg;

	return nd_ep_send(s->ep, r, a->sge, a->n, 0);
}

static nd_status post_recv(struct wsp_socket *s, struct wsp_req *r, void *arg)
{
	struct msg_args *a = arg;

	return nd_ep_receive(s->ep, r, a->sge, a->n);
}

/* Register (through the cache) the caller's plain buffers for one request. */
static int msg_buffers(struct wsp_socket *s, WSABUF *bufs, uint32_t n, uint32_t flags,
		       struct msg_args *a, struct rc_entry **regs)
{
	int err = 0;

	if (n > WSP_MAX_BUFS || (n && !bufs))
		return n > WSP_MAX_BUFS ? WSAENOBUFS : WSAEFAULT;
	a->n = 0;
	for (uint32_t i = 0; i < n; i++) {
		struct rc_entry *e;

		if (!bufs[i].len)
			continue;
		pthread_mutex_lock(&s->pv->lock);
		e = wsp_rc_get(s->pv, bufs[i].buf, bufs[i].len, flags, &err);
		pthread_mutex_unlock(&s->pv->lock);
		if (!e) {
			pthread_mutex_lock(&s->pv->lock);
			for (uint32_t k = 0; k < a->n; k++)
				wsp_rc_put(s->pv, regs[k]);
			pthread_mutex_unlock(&s->pv->lock);
			return err;
		}
		regs[a->n] = e;
		a->sge[a->n] = (struct nd_sge){ bufs[i].buf, bufs[i].len, e->mr };
		a->n++;
	}
	return 0;
}

int WSPSend(SOCKET h, WSABUF *bufs, uint32_t n, uint32_t *sent, uint32_t flags,
	    WSAOVERLAPPED *ov, LPWSAOVERLAPPED_COMPLETION_ROUTINE routine, WSATHREADID *tid,
	    int *err)
{
	struct wsp_socket *s = connected(h, err);
	struct rc_entry *regs[WSP_MAX_BUFS];
	struct msg_args a;
	int e;

	(void)tid;
	if (!s)
		return SOCKET_ERROR;
	if (flags || routine)
		return fail(s, WSAEINVAL, err);
	if (s->shut_send)
		return fail(s, WSAESHUTDOWN, err);
	if (s->fail)
		return fail(s, s->fail, err);
	e = msg_buffers(s, bufs, n, MEM_READ, &a, regs);
	if (e)
		return fail(s, e, err);
	return submit(s, REQ_SEND, ov, post_send, &a, regs, a.n, sent, err);
}

int WSPRecv(SOCKET h, WSABUF *bufs, uint32_t n, uint32_t *got, uint32_t *flags,
	    WSAOVERLAPPED *ov, LPWSAOVERLAPPED_COMPLETION_ROUTINE routine, WSATHREADID *tid,
	    int *err)
{
	struct wsp_socket *s = connected(h, err);
	struct rc_entry *regs[WSP_MAX_BUFS];
	struct msg_args a;
	int e;

	(void)tid;
	if (!s)
		return SOCKET_ERROR;
	if ((flags && *flags) || routine)
		return fail(s, WSAEINVAL, err);
	if (s->shut_recv)
		return fail(s, WSAESHUTDOWN, err);
	if (s->fail)
		return fail(s, s->fail, err);
	e = msg_buffers(s, bufs, n, MEM_WRITE, &a, regs);
	if (e)
		return fail(s, e, err);
	return submit(s, REQ_RECV, ov, post_recv, &a, regs, a.n, got, err);
}

/* ---- RDMA ---------------------------------------------------------------- */

struct rdma_args {
	enum nd_op op;
	struct nd_sge sge[WSP_MAX_BUFS];
	uint32_t n;
	struct nd_mw_descriptor d;
	uint64_t offset;
};

static nd_status post_rdma(struct wsp_socket *s, struct wsp_req *r, void *arg)
{
	struct rdma_args *a = arg;

	if (a->op == ND_OP_READ)
		return nd_ep_read(s->ep, r, a->sge, a->n, &a->d, a->offset, 0);
	return nd_ep_write(s->ep, r, a->sge, a->n, &a->d, a->offset, 0);
}

/*
 * The buffer array is copied here, before the call returns, so callers
 * may build it on the stack.  Each buffer must lie inside the registration
 * its handle names, with the access the transfer needs.
 */
static int rdma(SOCKET h, enum nd_op op, WSABUFEX *bufs, uint32_t n, void *desc,
		uint32_t desclen, uint32_t offset, uint32_t *bytes, uint32_t flags,
		WSAOVERLAPPED *ov, LPWSAOVERLAPPED_COMPLETION_ROUTINE routine, int *err)
{
	struct wsp_socket *s = wsp_sock_get(h, err);
	struct rc_entry *regs[WSP_MAX_BUFS];
	struct rdma_args a = { .op = op, .offset = offset };
	struct wire_desc w;
	uint32_t need = op == ND_OP_READ ? MEM_WRITE : MEM_READ;
	uint64_t total = 0;

	if (!s)
		return SOCKET_ERROR;
	if (s->pv->down)
		return fail(s, WSAENETDOWN, err);
	if (flags || routine || !ov || desclen != WSP_RDMA_DESCRIPTOR_SIZE)
		return fail(s, WSAEINVAL, err);
	if (s->state != S_CONNECTED)
		return fail(s, WSAENOTCONN, err);
	if (s->fail)
		return fail(s, s->fail, err);
	if (!desc || (n && !bufs))
		return fail(s, WSAEFAULT, err);
	if (n > WSP_MAX_BUFS)
		return fail(s, WSAENOBUFS, err);
	memcpy(&w, desc, sizeof(w));
	if (w.magic != DESC_MAGIC)
		return fail(s, WSAEFAULT, err);
	pthread_mutex_lock(&s->pv->lock);
	for (uint32_t i = 0; i < n; i++) {
		struct rc_entry *e = wsp_rc_find(s->pv, bufs[i].handle);
		uintptr_t b = (uintptr_t)bufs[i].buf;

		if (!e || (e->flags & need) != need || b < e->addr ||
		    bufs[i].len > e->len || b - e->addr > e->len - bufs[i].len) {
			for (uint32_t k = 0; k < i; k++)
				wsp_rc_put(s->pv, regs[k]);
			pthread_mutex_unlock(&s->pv->lock);
			return fail(s, WSAEFAULT, err);
		}
		e->refs++;   /* held until the request completes */
		regs[i] = e;
		a.sge[i] = (struct nd_sge){ bufs[i].buf, bufs[i].len, e->mr };
		total += bufs[i].len;
	}
	pthread_mutex_unlock(&s->pv->lock);
	a.n = n;
	/* the peer's buffer must hold the whole range */
	if ((uint64_t)offset > w.length || total > w.length - offset ||
	    (op == ND_OP_READ && !(w.access & MEM_READ)) ||
	    (op == ND_OP_WRITE && !(w.access & MEM_WRITE))) {
		pthread_mutex_lock(&s->pv->lock);
		for (uint32_t k = 0; k < n; k++)
			wsp_rc_put(s->pv, regs[k]);
		pthread_mutex_unlock(&s->pv->lock);
		return fail(s, WSAEFAULT, err);
	}
	a.d = (struct nd_mw_descriptor){ w.base, w.length, w.token };
	return submit(s, op == ND_OP_READ ? REQ_READ : REQ_WRITE, ov, post_rdma, &a, regs, n,
		      bytes, err);
}

int WSPRdmaRead(SOCKET s, WSABUFEX *bufs, uint32_t n, void *desc, uint32_t desclen,
		uint32_t offset, uint32_t *bytes, uint32_t flags, WSAOVERLAPPED *ov,
		LPWSAOVERLAPPED_COMPLETION_ROUTINE routine, WSATHREADID *tid, int *err)
{
	(void)tid;
	return rdma(s, ND_OP_READ, bufs, n, desc, desclen, offset, bytes, flags, ov, routine,
		    err);
}

int WSPRdmaWrite(SOCKET s, WSABUFEX *bufs, uint32_t n, void *desc, uint32_t desclen,
		 uint32_t offset, uint32_t *bytes, uint32_t flags, WSAOVERLAPPED *ov,
		 LPWSAOVERLAPPED_COMPLETION_ROUTINE routine, WSATHREADID *tid, int *err)
{
	(void)tid;
	return rdma(s, ND_OP_WRITE, bufs, n, desc, desclen, offset, bytes, flags, ov, routine,
		    err);
}

/* ---- results ------------------------------------------------------------- */


int WSPGetOverlappedResult(SOCKET h, WSAOVERLAPPED *ov, uint32_t *bytes, int wait,
			   uint32_t *flags, int *err)
{
	struct wsp_socket *s = wsp_sock_get(h, err);
	int64_t spin_end;
	uintptr_t st;

	if (!s)
		return 0;
	if (!ov) {
		fail(s, WSAEFAULT, err);
		return 0;
	}
	spin_end = wait ? wsd_now_ns() + wsd_spin_ns() : 0;
	pthread_mutex_lock(&s->pv->lock);
	for (;;) {
		st = __atomic_load_n(&ov->Internal, __ATOMIC_ACQUIRE);
		if (st != WSA_IO_PENDING || s->pv->down)
			break;
		/* whoever asks drives the transfer: no thread hop when polling */
		wsp_harvest(s);
		st = __atomic_load_n(&ov->Internal, __ATOMIC_ACQUIRE);
		if (st != WSA_IO_PENDING || !wait)
			break;
		if (wsd_now_ns() < spin_end) {
			/*
			 * Yield, never sleep: wsp_wait_step() sleeps once spin_end
			 * has passed, which it may have since we looked, and the
			 * completion thread is not armed for us yet (below).
			 */
			pthread_mutex_unlock(&s->pv->lock);
			sched_yield();
			pthread_mutex_lock(&s->pv->lock);
			continue;
		}
		/*
		 * Past the spin: sleep until the completion thread sees it done.
		 * A request polled by its owner (hEvent's low bit) does not arm
		 * the thread by itself, so a sleeper here must.
		 */
		s->ov_sleepers++;
		wsp_kick(s, NULL);
		wsp_wait_step(s->pv, 0);
		s->ov_sleepers--;
	}
	pthread_mutex_unlock(&s->pv->lock);
	if (flags)
		*flags = 0;
	if (st == WSA_IO_PENDING) {
		fail(s, s->pv->down ? WSAENETDOWN : WSA_IO_INCOMPLETE, err);
		return 0;
	}
	if (bytes)
		*bytes = (uint32_t)ov->InternalHigh;
	wsp_sock_put(s);
	if (st) {
		*err = (int)st;
		return 0;
	}
	return 1;
}

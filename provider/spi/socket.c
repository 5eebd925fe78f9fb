/* SPDX-License-Identifier: MIT */
/* SPI sockets: creation, connection setup, options, shutdown and close. */
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <sys/epoll.h>

#include "provider/spi/spi.h"

/*
 * WSPConnect and WSPAccept take no timeout: the provider's set-up waits
 * this long at most for a peer's answers (a registry name that does not
 * answer at all gives up sooner, see the shm transport).
 */
#define CONNECT_TIMEOUT_MS 30000
#define QUEUE_DEPTH 256u

/* Look the socket up and check its instance is up; NULL with *err set. */
static struct wsp_socket *live(SOCKET h, int *err)
{
	struct wsp_socket *s = wsp_sock_get(h, err);

	if (s && s->pv->down) {
		*err = WSAENETDOWN;
		wsp_sock_put(s);
		return NULL;
	}
	return s;
}

static int fail_with(struct wsp_socket *s, int code, int *err)
{
	if (s)
		wsp_sock_put(s);
	*err = code;
	return SOCKET_ERROR;
}

SOCKET WSPSocket(int af, int type, int protocol, WSAPROTOCOL_INFO *info, unsigned g,
		 uint32_t flags, int *err)
{
	struct wsp_socket *s;

	(void)g;
	(void)flags;
	if (!info || !info->provider) {
		*err = WSAEINVAL;
		return INVALID_SOCKET;
	}
	if (info->provider->down) {
		*err = WSAENETDOWN;
		return INVALID_SOCKET;
	}
	if (af != AF_INET && af != AF_INET6) {
		*err = WSAEAFNOSUPPORT;
		return INVALID_SOCKET;
	}
	if (type != SOCK_STREAM) {
		*err = WSAEINVAL;
		return INVALID_SOCKET;
	}
	if (protocol != 0 && protocol != IPPROTO_TCP) {
		*err = WSAEPROTONOSUPPORT;
		return INVALID_SOCKET;
	}
	return wsp_sock_new(info->provider, af, err, &s);
}

int WSPBind(SOCKET h, const struct sockaddr *name, socklen_t len, int *err)
{
	struct wsp_socket *s = live(h, err);

	if (!s)
		return SOCKET_ERROR;
	if (!name)
		return fail_with(s, WSAEFAULT, err);
	if (s->bound || s->state != S_NEW || len > sizeof(s->local) || name->sa_family != s->af ||
	    len < (s->af == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6)))
		return fail_with(s, WSAEINVAL, err);
	memcpy(&s->local, name, len);
	s->local_len = len;
	s->bound = true;
	wsp_sock_put(s);
	return 0;
}

int WSPListen(SOCKET h, int backlog, int *err)
{
	struct wsp_socket *s = live(h, err);
	nd_status st;
	int r;

	if (!s)
		return SOCKET_ERROR;
	if (s->state == S_CONNECTED)
		return fail_with(s, WSAEISCONN, err);
	if (!s->bound || s->state != S_NEW)
		return fail_with(s, WSAEINVAL, err);
	st = nd_listen(s->pv->ad, (struct sockaddr *)&s->local, s->local_len, backlog, &s->l);
	if (st != ND_SUCCESS)
		return fail_with(s, st == ND_ADDRESS_IN_USE ? WSAEADDRINUSE : WSAEINVAL, err);
	/* naming the TCP listener may name the registry too (shm), so it may be in use */
	if (s->tcp_listener >= 0 && (r = wsd_listen_owner(s->l, s->tcp_listener)) < 0) {
		nd_listen_close(s->l);
		s->l = NULL;
		return fail_with(s, r == -EADDRINUSE ? WSAEADDRINUSE : WSAEINVAL, err);
	}
	wsd_listen_other_users(s->l, s->peer_users);
	s->state = S_LISTENING;
	wsp_sock_put(s);
	return 0;
}

/*
 * Lock not held.  The CQ and endpoint a connected socket moves data on.
 * The CQ is the socket's (s->cq) only once both exist, under the lock: the
 * completion thread polls every socket's CQ with the lock held.
 */
static int make_endpoint(struct wsp_socket *s)
{
	const struct nd_adapter_info *in = &s->pv->info;
	struct nd_cq *cq;
	struct nd_ep *ep;
	struct nd_ep_attr a = {
		.inbound_entries = QUEUE_DEPTH < in->max_inbound_requests ?
				   QUEUE_DEPTH : in->max_inbound_requests,
		.outbound_entries = QUEUE_DEPTH < in->max_outbound_requests ?
				    QUEUE_DEPTH : in->max_outbound_requests,
		.inbound_sge = WSP_MAX_BUFS < in->max_inbound_sge ? WSP_MAX_BUFS : in->max_inbound_sge,
		.outbound_sge = WSP_MAX_BUFS < in->max_outbound_sge ?
				WSP_MAX_BUFS : in->max_outbound_sge,
		.inbound_read_limit = 16 < in->max_inbound_read_limit ?
				      16 : in->max_inbound_read_limit,
	};

	if (nd_cq_create(s->pv->ad, a.inbound_entries + a.outbound_entries, &cq) != ND_SUCCESS)
		return WSAENOBUFS;
	a.inbound_cq = a.outbound_cq = cq;
	if (nd_ep_create(s->pv->ad, &a, &ep) != ND_SUCCESS) {
		nd_cq_destroy(cq);
		return WSAENOBUFS;
	}
	pthread_mutex_lock(&s->pv->lock);
	s->cq = cq;
	s->ep = ep;
	pthread_mutex_unlock(&s->pv->lock);
	return 0;
}

/*
 * Lock held: the completion thread may be polling the CQ (it holds the
 * lock while it does), and a CQ destroyed under it was a use after free
 * (a failed connect dropped its endpoint without the lock: the sanitizer
 * build's mixed_check caught the thread in nd_cq_poll).
 */
static void drop_endpoint(struct wsp_socket *s)
{
	if (s->ep) {
		/* windows the application left bound end with the connection */
		(void)nd_ep_disconnect(s->ep);
		wsp_rdma_release_all(s);
		(void)nd_ep_destroy(s->ep);
		s->ep = NULL;
	}
	if (s->cq) {
		if (s->in_epoll)
			(void)epoll_ctl(s->pv->epfd, EPOLL_CTL_DEL, nd_cq_fd(s->cq), NULL);
		s->in_epoll = false;
		(void)nd_cq_destroy(s->cq);
		s->cq = NULL;
		wsp_reqs_orphan_all(s);
	}
}

/* The socket is connected: the completion thread watches it from now on. */
static int go_connected(struct wsp_socket *s)
{
	int ret;

	pthread_mutex_lock(&s->pv->lock);
	s->state = S_CONNECTED;
	ret = wsp_sock_watch(s);
	pthread_mutex_unlock(&s->pv->lock);
	return ret < 0 ? WSAENOBUFS : 0;
}

/*
 * Ask the condition function about req: 0 and the callee data to answer
 * with (in *callee), or a WSA code (req then rejected, or kept when
 * deferred).
 */
static int ask_condition(struct wsp_socket *s, struct nd_conn_request *req,
			 LPCONDITIONPROC cond, uintptr_t data, WSABUF *callee)
{
	char caller[256];
	size_t n = sizeof(caller);
	WSABUF caller_data = { 0, caller };
	/* through the rendezvous directory: an AF_UNIX caller, from another namespace */
	struct sockaddr_un via = { .sun_family = AF_UNIX };
	WSABUF caller_id = { req->rendezvous ? (uint32_t)sizeof(via) : 0,
			     req->rendezvous ? (char *)&via : NULL };
	WSABUF callee_id = { (uint32_t)s->local_len, (char *)&s->local };
	unsigned g = 0;
	int v;

	if (nd_conn_request_data(req, caller, &n) != ND_SUCCESS)
		n = 0;
	caller_data.len = (uint32_t)n;
	callee->len = (uint32_t)s->pv->info.private_data_length;
	v = cond(&caller_id, n ? &caller_data : NULL, NULL, NULL,
		 s->local_len ? &callee_id : NULL, callee, &g, data);
	if (v == CF_ACCEPT && callee->len <= s->pv->info.private_data_length)
		return 0;
	if (v == CF_DEFER) {
		pthread_mutex_lock(&s->pv->lock);
		if (!s->deferred && !s->closing) {
			s->deferred = req;
			req = NULL;
		}
		pthread_mutex_unlock(&s->pv->lock);
		if (!req)
			return WSATRY_AGAIN;
	}
	nd_conn_request_reject(req);
	return v == CF_REJECT || v == CF_DEFER ? WSAECONNREFUSED : WSAEINVAL;
}

SOCKET WSPAccept(SOCKET h, struct sockaddr *addr, socklen_t *addrlen, LPCONDITIONPROC cond,
		 uintptr_t data, int *err)
{
	struct wsp_socket *s = live(h, err), *ns;
	struct nd_conn_request *req = NULL;
	char answer[256];
	WSABUF callee = { 0, answer };
	SOCKET nh;
	nd_status st = ND_SUCCESS;
	int e;

	if (!s)
		return INVALID_SOCKET;
	if (addr && !addrlen) {
		fail_with(s, WSAEFAULT, err);
		return INVALID_SOCKET;
	}
	if (s->state != S_LISTENING) {
		fail_with(s, WSAEINVAL, err);
		return INVALID_SOCKET;
	}
	/* a request the condition function deferred comes first */
	pthread_mutex_lock(&s->pv->lock);
	req = s->deferred;
	s->deferred = NULL;
	pthread_mutex_unlock(&s->pv->lock);
	/* wake now and then, so a cleanup or close is noticed; SO_WSP_ACCEPT_MS ends the wait */
	int64_t end = s->accept_ms ? wsd_now_ms() + s->accept_ms : INT64_MAX;

	while (!req) {
		int64_t left = end - wsd_now_ms();

		if (left <= 0)
			break;
		st = nd_listen_get_request(s->l, left < 200 ? (int)left : 200, &req);
		if (st != ND_TIMEOUT || s->pv->down || s->closing)
			break;
	}
	if (st != ND_SUCCESS || !req) {
		bool timed_out = (st == ND_TIMEOUT || st == ND_SUCCESS) && !s->closing;

		fail_with(s, s->pv->down ? WSAENETDOWN : timed_out ? WSAETIMEDOUT : WSAEINTR, err);
		return INVALID_SOCKET;
	}
	if (cond) {
		e = ask_condition(s, req, cond, data, &callee);
		if (e) {
			fail_with(s, e, err);
			return INVALID_SOCKET;
		}
	}
	nh = wsp_sock_new(s->pv, s->af, err, &ns);
	if (nh == INVALID_SOCKET) {
		nd_conn_request_reject(req);
		wsp_sock_put(s);
		return INVALID_SOCKET;
	}
	e = make_endpoint(ns);
	if (e) {
		nd_conn_request_reject(req);
	} else {
		st = nd_ep_accept(ns->ep, req, callee.len ? callee.buf : NULL, callee.len,
				  CONNECT_TIMEOUT_MS);
		e = st == ND_SUCCESS ? go_connected(ns) :
		    st == ND_ACCESS_DENIED ? WSAEACCES : WSAECONNABORTED;
	}
	if (e) {
		pthread_mutex_lock(&ns->pv->lock);
		drop_endpoint(ns);
		pthread_mutex_unlock(&ns->pv->lock);
		wsp_sock_release_handle(ns);
		fail_with(s, e, err);
		return INVALID_SOCKET;
	}
	if (addr) {
		/* the endpoint layer keeps no peer address: report the family only */
		memset(addr, 0, *addrlen);
		if (*addrlen >= sizeof(sa_family_t))
			addr->sa_family = (sa_family_t)s->af;
	}
	wsp_sock_put(s);
	return nh;
}

int WSPConnect(SOCKET h, const struct sockaddr *name, socklen_t len, const WSABUF *caller,
	       WSABUF *callee, void *sqos, void *gqos, int *err)
{
	struct wsp_socket *s = live(h, err);
	nd_status st;
	int e;

	if (!s)
		return SOCKET_ERROR;
	if (!name)
		return fail_with(s, WSAEFAULT, err);
	if (s->state == S_CONNECTED)
		return fail_with(s, WSAEISCONN, err);
	if (s->state != S_NEW || sqos || gqos || name->sa_family != s->af ||
	    (caller && caller->len > s->pv->info.private_data_length))
		return fail_with(s, WSAEINVAL, err);
	e = make_endpoint(s);
	if (e)
		return fail_with(s, e, err);
	wsd_ep_owner_check(s->ep, s->tcp_listener > 0, (uint16_t)s->tcp_port);
	wsd_ep_owner_from(s->ep, s->tcp_from_len ? (struct sockaddr *)&s->tcp_from : NULL,
			  s->tcp_from_len);
	wsd_ep_other_users(s->ep, s->peer_users);
	st = nd_ep_connect(s->ep, name, len, caller ? caller->buf : NULL, caller ? caller->len : 0,
			   CONNECT_TIMEOUT_MS);
	if (st != ND_SUCCESS) {
		pthread_mutex_lock(&s->pv->lock);
		drop_endpoint(s);
		pthread_mutex_unlock(&s->pv->lock);
		return fail_with(s, st == ND_TIMEOUT ? WSAETIMEDOUT :
				    st == ND_ACCESS_DENIED ? WSAEACCES :
				    st == ND_INVALID_PARAMETER ? WSAEINVAL :
				    st == ND_NO_MORE_ENTRIES ? WSAENOBUFS :
				    WSAECONNREFUSED, err);
	}
	if (callee) {
		size_t n = callee->len;

		if (nd_ep_peer_data(s->ep, callee->buf, &n) != ND_SUCCESS)
			n = 0;
		callee->len = (uint32_t)n;
	}
	e = go_connected(s);
	if (e)
		return fail_with(s, e, err);
	wsp_sock_put(s);
	return 0;
}

int WSPShutdown(SOCKET h, int how, int *err)
{
	struct wsp_socket *s = live(h, err);

	if (!s)
		return SOCKET_ERROR;
	if (how != SD_RECEIVE && how != SD_SEND && how != SD_BOTH)
		return fail_with(s, WSAEINVAL, err);
	if (s->state != S_CONNECTED)
		return fail_with(s, WSAENOTCONN, err);
	pthread_mutex_lock(&s->pv->lock);
	if (how != SD_SEND)
		s->shut_recv = true;
	if (how != SD_RECEIVE)
		s->shut_send = true;
	if (s->shut_send && s->shut_recv && !s->fail)
		s->fail = WSAESHUTDOWN;
	pthread_mutex_unlock(&s->pv->lock);
	if (how == SD_BOTH)
		(void)nd_ep_disconnect(s->ep);
	wsp_sock_put(s);
	return 0;
}

int WSPCloseSocket(SOCKET h, int *err)
{
	struct wsp_socket *s = wsp_sock_get(h, err);
	struct nd_conn_request *req;
	struct wsp_provider *pv;

	if (!s)
		return SOCKET_ERROR;
	pv = s->pv;
	pthread_mutex_lock(&pv->lock);
	if (s->closing) {
		pthread_mutex_unlock(&pv->lock);
		return fail_with(s, WSAENOTSOCK, err);
	}
	wsp_abort_all(s);
	req = s->deferred;
	s->deferred = NULL;
	pthread_mutex_unlock(&pv->lock);
	if (req)
		nd_conn_request_reject(req);
	if (s->l) {
		nd_listen_close(s->l);
		s->l = NULL;
	}
	pthread_mutex_lock(&pv->lock);
	drop_endpoint(s);
	s->state = S_CLOSED;
	if (s->port) {
		wsp_port_detach(s->port);
		s->port = NULL;
	}
	pthread_mutex_unlock(&pv->lock);
	wsp_sock_release_handle(s);
	wsp_sock_put(s);
	wsp_provider_maybe_free(pv);
	return 0;
}

int WSPGetSockOpt(SOCKET h, int level, int name, void *val, socklen_t *len, int *err)
{
	struct wsp_socket *s = live(h, err);
	int v;

	if (!s)
		return SOCKET_ERROR;
	if (!val || !len || *len < sizeof(int))
		return fail_with(s, WSAEFAULT, err);
	if (level != SOL_WSP)
		return fail_with(s, WSAENOPROTOOPT, err);
	switch (name) {
	case SO_MAX_MSG_SIZE:
		v = (int)(s->pv->info.max_transfer_length < INT32_MAX ?
			  s->pv->info.max_transfer_length : INT32_MAX);
		break;
	case SO_MAX_RDMA_SIZE:
		v = (int)(s->pv->info.max_transfer_length < INT32_MAX ?
			  s->pv->info.max_transfer_length : INT32_MAX);
		break;
	case SO_RDMA_THRESHOLD_SIZE:
		v = (int)s->rdma_threshold;
		break;
	case SO_WSP_TCP_LISTENER:
		v = s->tcp_listener;
		break;
	case SO_WSP_TCP_PORT:
		v = s->tcp_port;
		break;
	case SO_WSP_ACCEPT_MS:
		v = s->accept_ms;
		break;
	case SO_WSP_NAME_TAKEN:
		if (s->state != S_LISTENING || !s->l)
			return fail_with(s, WSAEINVAL, err);
		v = wsd_listen_taken(s->l);
		break;
	case SO_WSP_PEER_PID:
		pthread_mutex_lock(&s->pv->lock);
		v = s->state == S_CONNECTED && s->ep ? (int)s->ep->peer_pid : 0;
		pthread_mutex_unlock(&s->pv->lock);
		if (v <= 0)
			return fail_with(s, WSAENOPROTOOPT, err);
		break;
	case SO_WSP_PEER_USERS:
		v = s->peer_users;
		break;
	case SO_WSP_RENDEZVOUS:
		pthread_mutex_lock(&s->pv->lock);
		v = s->state == S_CONNECTED && s->ep ? s->ep->rendezvous : 0;
		pthread_mutex_unlock(&s->pv->lock);
		break;
	case SO_WSP_PEER_UID: {
		int64_t uid;

		pthread_mutex_lock(&s->pv->lock);
		uid = s->state == S_CONNECTED && s->ep ? s->ep->peer_uid : -1;
		pthread_mutex_unlock(&s->pv->lock);
		if (uid < 0)
			return fail_with(s, WSAENOPROTOOPT, err);
		v = (int)uid;
		break;
	}
	default:
		return fail_with(s, WSAENOPROTOOPT, err);
	}
	memcpy(val, &v, sizeof(v));
	*len = sizeof(v);
	wsp_sock_put(s);
	return 0;
}

/* private.h: not an option, as the counts are no API an integrator may hold us to */
int wsd_listen_refused(uintptr_t h, uint64_t counts[WSD_LREF_N])
{
	int err, ret = -1;
	struct wsp_socket *s = wsp_sock_get((SOCKET)h, &err);

	if (!s)
		return -1;
	pthread_mutex_lock(&s->pv->lock);
	/* closing, set under the lock, comes before the listener is freed */
	if (s->state == S_LISTENING && s->l && !s->closing) {
		for (int i = 0; i < WSD_LREF_N; i++)
			counts[i] = atomic_load_explicit(&s->l->refused[i], memory_order_relaxed);
		ret = 0;
	}
	pthread_mutex_unlock(&s->pv->lock);
	wsp_sock_put(s);
	return ret;
}

/*
 * SO_WSP_TCP_LISTENER: a descriptor (or -1) for a listener, applied at once
 * when it listens already; for a socket that will connect, > 0 asks for
 * the check.  A connection already made is past the point it matters.
 */
static int set_tcp_listener(struct wsp_socket *s, int v)
{
	if (v < -1 || s->state == S_CONNECTED || s->state == S_CLOSED)
		return WSAEINVAL;
	if (s->state == S_LISTENING && wsd_listen_owner(s->l, v) < 0)
		return WSAEINVAL;
	s->tcp_listener = v;
	return 0;
}

int WSPSetSockOpt(SOCKET h, int level, int name, const void *val, socklen_t len, int *err)
{
	struct wsp_socket *s = live(h, err);
	int v, e;

	if (!s)
		return SOCKET_ERROR;
	if (!val || len < sizeof(int))
		return fail_with(s, WSAEFAULT, err);
	if (level != SOL_WSP)
		return fail_with(s, WSAENOPROTOOPT, err);
	if (name == SO_WSP_TCP_FROM) {
		/* an address of the socket's family, read at the connect */
		sa_family_t f;

		memcpy(&f, val, sizeof(f));
		if (f != s->af || len != (f == AF_INET6 ? sizeof(struct sockaddr_in6) :
						       sizeof(struct sockaddr_in)) ||
		    s->state == S_CONNECTED || s->state == S_CLOSED)
			return fail_with(s, WSAEINVAL, err);
		memcpy(&s->tcp_from, val, len);
		s->tcp_from_len = len;
		return 0;
	}
	memcpy(&v, val, sizeof(v));
	switch (name) {
	case SO_RDMA_THRESHOLD_SIZE:
		if (v < 0)
			return fail_with(s, WSAEINVAL, err);
		s->rdma_threshold = (uint32_t)v;
		break;
	case SO_WSP_TCP_LISTENER:
		e = set_tcp_listener(s, v);
		if (e)
			return fail_with(s, e, err);
		break;
	case SO_WSP_TCP_PORT:
		/* read at the connect: a connection made is past it */
		if (v < 0 || v > 65535 || s->state == S_CONNECTED || s->state == S_CLOSED)
			return fail_with(s, WSAEINVAL, err);
		s->tcp_port = v;
		break;
	case SO_WSP_ACCEPT_MS:
		if (v < 0 || s->state == S_CLOSED)
			return fail_with(s, WSAEINVAL, err);
		s->accept_ms = v;
		break;
	case SO_WSP_PEER_USERS:
		/* a listener's applies to requests from now on; a connect's at the connect */
		if (v < 0 || v > 1 || s->state == S_CONNECTED || s->state == S_CLOSED)
			return fail_with(s, WSAEINVAL, err);
		s->peer_users = v;
		if (s->state == S_LISTENING)
			wsd_listen_other_users(s->l, v);
		break;
	default:
		return fail_with(s, WSAENOPROTOOPT, err);
	}
	wsp_sock_put(s);
	return 0;
}

/* SIO_WSP_SEND_FD, SIO_WSP_RECV_FD: the endpoint's transport moves it (or cannot). */
static int pass_fd(struct wsp_socket *s, uint32_t code, void *in, uint32_t inlen, void *out,
		   uint32_t outlen, uint32_t *returned, int *err)
{
	int fd, r;

	if (code == SIO_WSP_SEND_FD ? !in || inlen < sizeof(int) :
				      !out || outlen < sizeof(int) || !returned)
		return fail_with(s, WSAEFAULT, err);
	if (s->state != S_CONNECTED || !s->ep)
		return fail_with(s, WSAENOTCONN, err);
	if (code == SIO_WSP_SEND_FD) {
		memcpy(&fd, in, sizeof(fd));
		r = fd < 0 ? -EBADF : wsd_ep_fd_send(s->ep, fd);
	} else {
		r = wsd_ep_fd_take(s->ep);
	}
	if (r < 0)
		return fail_with(s, r == -EAGAIN ? WSAEWOULDBLOCK : r == -EOPNOTSUPP ?
				    WSAEOPNOTSUPP : r == -EBADF ? WSAEINVAL : WSAECONNRESET, err);
	if (code == SIO_WSP_RECV_FD) {
		memcpy(out, &r, sizeof(r));
		*returned = sizeof(r);
	}
	wsp_sock_put(s);
	return 0;
}

/* SIO_WSP_PUBLISH, SIO_WSP_UNPUBLISH: a listener's entry for a peer, in the transports'. */
static int publish(struct wsp_socket *s, bool on, const void *in, uint32_t inlen, int *err)
{
	struct sockaddr_storage peer;
	int r;

	if (!in || inlen < sizeof(sa_family_t) || inlen > sizeof(peer))
		return fail_with(s, WSAEFAULT, err);
	memcpy(&peer, in, inlen);
	if (s->state != S_LISTENING || !s->l)
		return fail_with(s, WSAEINVAL, err);
	r = wsd_listen_publish(s->l, (const struct sockaddr *)&peer, inlen, on);
	if (r < 0)
		return fail_with(s, r == -EOPNOTSUPP ? WSAEOPNOTSUPP :
				    r == -EEXIST ? WSAEADDRINUSE : WSAEINVAL, err);
	wsp_sock_put(s);
	return 0;
}

int WSPIoctl(SOCKET h, uint32_t code, void *in, uint32_t inlen, void *out, uint32_t outlen,
	     uint32_t *returned, WSAOVERLAPPED *ov, LPWSAOVERLAPPED_COMPLETION_ROUTINE routine,
	     WSATHREADID *tid, int *err)
{
	struct wsp_socket *s = live(h, err);
	const char *name;
	size_t n;

	(void)tid;
	if (!s)
		return SOCKET_ERROR;
	if (ov || routine)
		return fail_with(s, WSAEINVAL, err);
	if (code == SIO_WSP_SEND_FD || code == SIO_WSP_RECV_FD)
		return pass_fd(s, code, in, inlen, out, outlen, returned, err);
	if (code == SIO_WSP_PUBLISH || code == SIO_WSP_UNPUBLISH)
		return publish(s, code == SIO_WSP_PUBLISH, in, inlen, err);
	if (code != SIO_WSP_TRANSPORT)
		return fail_with(s, WSAEINVAL, err);
	name = s->ep ? nd_ep_transport(s->ep) : NULL;
	if (!name)
		name = s->pv->info.transport;
	n = strlen(name) + 1;
	if (!out || outlen < n || !returned)
		return fail_with(s, WSAEFAULT, err);
	memcpy(out, name, n);
	*returned = (uint32_t)n;
	wsp_sock_put(s);
	return 0;
}

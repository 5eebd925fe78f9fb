/* SPDX-License-Identifier: MIT */
/* Adapters, memory regions, memory windows and listeners. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "provider/internal.h"

/* Every transport, in the order an "auto" adapter tries them. */
static const struct nd_transport *const transports[] = {
	&wsd_transport_shm,
	&wsd_transport_verbs,
};

#define NTRANSPORTS (sizeof(transports) / sizeof(transports[0]))

int wsd_tp_none(void *adpriv, void **priv)
{
	(void)adpriv;
	*priv = NULL;
	return 0;
}

void wsd_tp_none_free(void *priv)
{
	(void)priv;
}

int wsd_tp_none_mr(void *adpriv, struct nd_mr *mr, void **priv)
{
	(void)adpriv;
	(void)mr;
	*priv = NULL;
	return 0;
}

/* A transport with no registry process to vouch for (verbs). */
int wsd_tp_no_owner(void *priv, int tcp_fd)
{
	(void)priv;
	(void)tcp_fd;
	return -EOPNOTSUPP;
}

int wsd_tp_not_taken(void *priv)
{
	(void)priv;
	return -1;
}

int wsd_tp_no_publish(void *priv, const struct sockaddr *peer, socklen_t len, bool on)
{
	(void)priv; (void)peer; (void)len; (void)on;
	return -EOPNOTSUPP;
}

int wsd_tp_no_fd_send(struct nd_ep *ep, int fd)
{
	(void)ep;
	(void)fd;
	return -EOPNOTSUPP;
}

int wsd_tp_no_fd_take(struct nd_ep *ep)
{
	(void)ep;
	return -EOPNOTSUPP;
}

nd_status wsd_tp_unchecked(struct nd_ep *ep, uint64_t addr, uint64_t len, uint64_t token,
			   uint32_t access)
{
	(void)ep; (void)addr; (void)len; (void)token; (void)access;
	return ND_SUCCESS;
}

/* The tightest of two sets of limits: what every transport can honour. */
void wsd_caps_meet(struct nd_adapter_info *a, const struct nd_adapter_info *b)
{
#define MEET(f) do { if (b->f < a->f) a->f = b->f; } while (0)
	MEET(max_inbound_sge); MEET(max_outbound_sge);
	MEET(max_inbound_requests); MEET(max_outbound_requests);
	MEET(max_cq_entries); MEET(max_inbound_read_limit);
	MEET(max_transfer_length); MEET(max_registration_size);
	MEET(max_window_size); MEET(max_windows); MEET(private_data_length);
#undef MEET
	a->flags &= b->flags;
	if (b->rdma_threshold > a->rdma_threshold)
		a->rdma_threshold = b->rdma_threshold;
}

nd_status nd_adapter_open(const char *transport, struct nd_adapter **adapter)
{
	const char *name = transport;
	struct nd_adapter *ad;
	nd_status st = ND_NOT_SUPPORTED;

	if (!adapter)
		return ND_INVALID_PARAMETER;
	if (!name || !*name)
		name = wsd_param_str("WSD_TRANSPORT");
	ad = calloc(1, sizeof(*ad));
	if (!ad)
		return ND_NO_MEMORY;
	for (size_t i = 0; i < NTRANSPORTS; i++) {
		struct nd_adapter_info caps;
		int ret;

		if (strcmp(name, "auto") && strcmp(name, transports[i]->name))
			continue;
		ret = transports[i]->adapter_open(&ad->tpriv[ad->ntp], &caps);
		if (ret < 0) {
			st = wsd_nd_from_errno(ret);
			if (ret == -ENODEV)
				st = ND_NOT_SUPPORTED;
			continue;
		}
		if (!ad->ntp)
			ad->info = caps;
		else
			wsd_caps_meet(&ad->info, &caps);
		ad->tp[ad->ntp++] = transports[i];
	}
	if (!ad->ntp) {
		free(ad);
		return st;
	}
	snprintf(ad->info.transport, sizeof(ad->info.transport), "%s",
		 ad->ntp > 1 ? "auto" : ad->tp[0]->name);
	pthread_mutex_init(&ad->lock, NULL);
	*adapter = ad;
	return ND_SUCCESS;
}

void nd_adapter_background(struct nd_adapter *ad)
{
	for (unsigned i = 0; i < ad->ntp; i++)
		ad->tp[i]->background(ad->tpriv[i]);
}

nd_status nd_adapter_close(struct nd_adapter *ad)
{
	if (!ad)
		return ND_INVALID_PARAMETER;
	pthread_mutex_lock(&ad->lock);
	if (ad->nobjects) {
		pthread_mutex_unlock(&ad->lock);
		return ND_DEVICE_BUSY;
	}
	pthread_mutex_unlock(&ad->lock);
	for (unsigned i = 0; i < ad->ntp; i++)
		ad->tp[i]->adapter_close(ad->tpriv[i]);
	pthread_mutex_destroy(&ad->lock);
	free(ad);
	return ND_SUCCESS;
}

nd_status nd_adapter_query(struct nd_adapter *ad, struct nd_adapter_info *info)
{
	if (!ad || !info)
		return ND_INVALID_PARAMETER;
	*info = ad->info;
	return ND_SUCCESS;
}

/* ---- memory regions ---------------------------------------------------- */

#define MR_FLAGS (ND_MR_FLAG_ALLOW_LOCAL_WRITE | ND_MR_FLAG_ALLOW_REMOTE_READ | \
		  ND_MR_FLAG_ALLOW_REMOTE_WRITE)

nd_status nd_mr_register(struct nd_adapter *ad, void *addr, size_t length, uint32_t flags,
			 struct nd_mr **out)
{
	struct nd_mr *mr;

	if (!ad || !addr || !out || !length || length > ad->info.max_registration_size ||
	    (flags & ~MR_FLAGS) || (uintptr_t)addr + length < (uintptr_t)addr)
		return ND_INVALID_PARAMETER;
	mr = calloc(1, sizeof(*mr));
	if (!mr)
		return ND_NO_MEMORY;
	mr->ad = ad;
	mr->addr = (uintptr_t)addr;
	mr->length = length;
	mr->flags = flags;
	mr->valid = true;
	for (unsigned i = 0; i < ad->ntp; i++) {
		int ret = ad->tp[i]->mr_register(ad->tpriv[i], mr, &mr->tpriv[i]);

		if (ret < 0) {
			while (i--)
				ad->tp[i]->mr_deregister(mr->tpriv[i]);
			free(mr);
			return wsd_nd_from_errno(ret);
		}
	}
	pthread_mutex_lock(&ad->lock);
	ad->nobjects++;
	pthread_mutex_unlock(&ad->lock);
	*out = mr;
	return ND_SUCCESS;
}

nd_status nd_mr_deregister(struct nd_mr *mr)
{
	struct nd_adapter *ad;

	if (!mr)
		return ND_INVALID_PARAMETER;
	ad = mr->ad;
	pthread_mutex_lock(&ad->lock);
	if (mr->windows) {
		pthread_mutex_unlock(&ad->lock);
		return ND_DEVICE_BUSY;
	}
	ad->nobjects--;
	pthread_mutex_unlock(&ad->lock);
	for (unsigned i = 0; i < ad->ntp; i++)
		ad->tp[i]->mr_deregister(mr->tpriv[i]);
	free(mr);
	return ND_SUCCESS;
}

void wsd_mr_local_invalidate(struct nd_mr *mr)
{
	mr->valid = false;
}

nd_status wsd_sge_check(const struct nd_sge *sge, uint32_t need)
{
	const struct nd_mr *mr = sge->mr;
	uintptr_t a = (uintptr_t)sge->addr;

	if (!sge->length)
		return ND_SUCCESS;
	if (!mr || !mr->valid || a < mr->addr || a >= mr->addr + mr->length ||
	    (mr->flags & need) != need)
		return ND_ACCESS_VIOLATION;
	if (sge->length > mr->addr + mr->length - a)
		return ND_LOCAL_LENGTH;
	return ND_SUCCESS;
}

void wsd_sge_to_iov(const struct nd_sge *sgl, uint32_t nsge, struct iovec *iov)
{
	for (uint32_t i = 0; i < nsge; i++) {
		iov[i].iov_base = sgl[i].addr;
		iov[i].iov_len = sgl[i].length;
	}
}

/* ---- memory windows ---------------------------------------------------- */

nd_status nd_mw_create(struct nd_adapter *ad, struct nd_mw **out)
{
	struct nd_mw *mw;

	if (!ad || !out)
		return ND_INVALID_PARAMETER;
	if (!(ad->info.flags & ND_ADAPTER_FLAG_MEMORY_WINDOWS))
		return ND_NOT_SUPPORTED;
	mw = calloc(1, sizeof(*mw));
	if (!mw)
		return ND_NO_MEMORY;
	mw->ad = ad;
	for (unsigned i = 0; i < ad->ntp; i++) {
		int ret = ad->tp[i]->mw_create(ad->tpriv[i], &mw->tpriv[i]);

		if (ret < 0) {
			while (i--)
				ad->tp[i]->mw_destroy(mw->tpriv[i]);
			free(mw);
			return wsd_nd_from_errno(ret);
		}
	}
	pthread_mutex_lock(&ad->lock);
	ad->nobjects++;
	pthread_mutex_unlock(&ad->lock);
	*out = mw;
	return ND_SUCCESS;
}

nd_status nd_mw_destroy(struct nd_mw *mw)
{
	struct nd_adapter *ad;

	if (!mw)
		return ND_INVALID_PARAMETER;
	ad = mw->ad;
	pthread_mutex_lock(&ad->lock);
	if (mw->ep) {
		pthread_mutex_unlock(&ad->lock);
		return ND_DEVICE_BUSY;
	}
	ad->nobjects--;
	pthread_mutex_unlock(&ad->lock);
	for (unsigned i = 0; i < ad->ntp; i++)
		ad->tp[i]->mw_destroy(mw->tpriv[i]);
	free(mw);
	return ND_SUCCESS;
}

/* ---- listeners --------------------------------------------------------- */

nd_status nd_listen(struct nd_adapter *ad, const struct sockaddr *addr, socklen_t addrlen,
		    int backlog, struct nd_listener **out)
{
	struct nd_listener *l;
	int ret = -EINVAL, ok = 0;

	if (!ad || !addr || !out)
		return ND_INVALID_PARAMETER;
	l = calloc(1, sizeof(*l));
	if (!l)
		return ND_NO_MEMORY;
	l->ad = ad;
	/*
	 * An "auto" adapter listens wherever it can, since a peer may come
	 * either way; a port taken on any of them is taken.
	 */
	for (unsigned i = 0; i < ad->ntp; i++) {
		int r = ad->tp[i]->listen(l, &l->tpriv[i], addr, addrlen, backlog);

		if (r == 0)
			ok++;
		else if (ret != -EADDRINUSE)
			ret = r;
	}
	if (!ok || ret == -EADDRINUSE) {
		for (unsigned i = 0; i < ad->ntp; i++)
			if (l->tpriv[i])
				ad->tp[i]->listen_close(l->tpriv[i]);
		free(l);
		return wsd_nd_from_errno(ret);
	}
	pthread_mutex_lock(&ad->lock);
	ad->nobjects++;
	pthread_mutex_unlock(&ad->lock);
	*out = l;
	return ND_SUCCESS;
}

nd_status nd_listen_close(struct nd_listener *l)
{
	if (!l)
		return ND_INVALID_PARAMETER;
	for (unsigned i = 0; i < l->ad->ntp; i++)
		if (l->tpriv[i])
			l->ad->tp[i]->listen_close(l->tpriv[i]);
	pthread_mutex_lock(&l->ad->lock);
	l->ad->nobjects--;
	pthread_mutex_unlock(&l->ad->lock);
	free(l);
	return ND_SUCCESS;
}


int wsd_listen_owner(struct nd_listener *l, int tcp_fd)
{
	for (unsigned i = 0; i < l->ad->ntp; i++) {
		int r;

		if (!l->tpriv[i])
			continue;
		r = l->ad->tp[i]->listen_owner(l->tpriv[i], tcp_fd);
		if (r < 0 && r != -EOPNOTSUPP)
			return r;
	}
	return 0;
}

/* 0 when some transport published (or withdrew) the entry, else the first error. */
int wsd_listen_publish(struct nd_listener *l, const struct sockaddr *peer, socklen_t len, bool on)
{
	int ret = -EOPNOTSUPP;

	for (unsigned i = 0; i < l->ad->ntp; i++) {
		int r;

		if (!l->tpriv[i])
			continue;
		r = l->ad->tp[i]->listen_publish(l->tpriv[i], peer, len, on);
		if (r == 0 || ret == -EOPNOTSUPP)
			ret = r;
	}
	return ret;
}

/* The first transport whose rendezvous name someone else held: its answer. */
int wsd_listen_taken(struct nd_listener *l)
{
	for (unsigned i = 0; i < l->ad->ntp; i++) {
		int r = l->tpriv[i] ? l->ad->tp[i]->listen_taken(l->tpriv[i]) : -1;

		if (r != -1)
			return r;
	}
	return -1;
}

void wsd_ep_owner_check(struct nd_ep *ep, bool on, uint16_t tcp_port)
{
	ep->owner_check = on;
	ep->owner_port = tcp_port;
}

void wsd_ep_owner_from(struct nd_ep *ep, const struct sockaddr *from, socklen_t len)
{
	ep->owner_from_len = 0;
	if (from && len > 0 && (size_t)len <= sizeof(ep->owner_from)) {
		memcpy(&ep->owner_from, from, (size_t)len);
		ep->owner_from_len = len;
	}
}

void wsd_listen_other_users(struct nd_listener *l, bool on)
{
	atomic_store(&l->other_users, on);
}

void wsd_ep_other_users(struct nd_ep *ep, bool on)
{
	ep->other_users = on;
}

int wsd_ep_fd_send(struct nd_ep *ep, int fd)
{
	int r;

	pthread_mutex_lock(&ep->ad->lock);
	r = ep->state == EP_CONNECTED ? ep->tp->fd_send(ep, fd) : -ENOTCONN;
	pthread_mutex_unlock(&ep->ad->lock);
	return r;
}

int wsd_ep_fd_take(struct nd_ep *ep)
{
	int r;

	pthread_mutex_lock(&ep->ad->lock);
	r = ep->state == EP_CONNECTED ? ep->tp->fd_take(ep) : -ENOTCONN;
	pthread_mutex_unlock(&ep->ad->lock);
	return r;
}

/* Wait on every transport's listener at once; take a request from the first. */
static int listen_get(struct nd_listener *l, int timeout_ms, struct nd_conn_request *req)
{
	struct nd_adapter *ad = l->ad;
	int64_t deadline = timeout_ms < 0 ? -1 : wsd_now_ms() + timeout_ms;
	unsigned only = WSD_MAX_TP, n = 0;

	for (unsigned i = 0; i < ad->ntp; i++)
		if (l->tpriv[i]) {
			only = i;
			n++;
		}
	if (n == 1) {
		req->tpi = only;
		return ad->tp[only]->listen_get(l, l->tpriv[only], timeout_ms, req);
	}
	for (;;) {
		struct pollfd p[WSD_MAX_TP];
		unsigned idx[WSD_MAX_TP];
		int left = wsd_ms_left(deadline), r;

		n = 0;
		for (unsigned i = 0; i < ad->ntp; i++) {
			if (!l->tpriv[i])
				continue;
			p[n].fd = ad->tp[i]->listen_fd(l->tpriv[i]);
			p[n].events = POLLIN;
			idx[n++] = i;
		}
		r = wsd_wait_fds(p, n, left);   /* restarted after a signal itself */
		if (r < 0)
			return -errno;
		if (r == 0)
			return -ETIMEDOUT;
		for (unsigned k = 0; k < n && r > 0; k++) {
			if (!(p[k].revents & POLLIN))
				continue;
			req->tpi = idx[k];
			r = ad->tp[idx[k]]->listen_get(l, l->tpriv[idx[k]], 0, req);
			if (r != -ETIMEDOUT)
				return r;
		}
	}
}

nd_status nd_listen_get_request(struct nd_listener *l, int timeout_ms,
				struct nd_conn_request **out)
{
	struct nd_conn_request *req;
	int ret;

	if (!l || !out)
		return ND_INVALID_PARAMETER;
	req = calloc(1, sizeof(*req));
	if (!req)
		return ND_NO_MEMORY;
	req->ad = l->ad;
	ret = listen_get(l, timeout_ms, req);
	if (ret < 0) {
		free(req);
		return wsd_nd_from_errno(ret);
	}
	*out = req;
	return ND_SUCCESS;
}

nd_status nd_conn_request_data(struct nd_conn_request *req, void *buf, size_t *len)
{
	size_t have;

	if (!req || !len || (!buf && *len))
		return ND_INVALID_PARAMETER;
	have = *len;
	*len = req->len;
	if (have < req->len)
		return ND_BUFFER_OVERFLOW;
	if (req->len)
		memcpy(buf, req->data, req->len);
	return ND_SUCCESS;
}

nd_status nd_conn_request_reject(struct nd_conn_request *req)
{
	if (!req)
		return ND_INVALID_PARAMETER;
	req->ad->tp[req->tpi]->request_reject(req);
	free(req);
	return ND_SUCCESS;
}

/* SPDX-License-Identifier: MIT */
/* Endpoints: limits, request queues, ordered completion, termination. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "provider/internal.h"

nd_status nd_ep_create(struct nd_adapter *ad, const struct nd_ep_attr *attr,
		       struct nd_ep **out)
{
	const struct nd_adapter_info *in;
	struct nd_ep *ep;

	if (!ad || !attr || !out || !attr->inbound_cq || !attr->outbound_cq ||
	    attr->inbound_cq->ad != ad || attr->outbound_cq->ad != ad)
		return ND_INVALID_PARAMETER;
	in = &ad->info;
	if (!attr->inbound_entries || attr->inbound_entries > in->max_inbound_requests ||
	    !attr->outbound_entries || attr->outbound_entries > in->max_outbound_requests ||
	    !attr->inbound_sge || attr->inbound_sge > in->max_inbound_sge ||
	    !attr->outbound_sge || attr->outbound_sge > in->max_outbound_sge ||
	    attr->inbound_read_limit > in->max_inbound_read_limit)
		return ND_INVALID_PARAMETER;
	ep = calloc(1, sizeof(*ep));
	if (!ep)
		return ND_NO_MEMORY;
	ep->ad = ad;
	ep->attr = *attr;
	ep->peer_uid = -1;
	ep->sq = calloc(attr->outbound_entries, sizeof(*ep->sq));
	ep->sq_sge = calloc((size_t)attr->outbound_entries * attr->outbound_sge,
			    sizeof(*ep->sq_sge));
	ep->rq = calloc(attr->inbound_entries, sizeof(*ep->rq));
	ep->rq_sge = calloc((size_t)attr->inbound_entries * attr->inbound_sge,
			    sizeof(*ep->rq_sge));
	if (!ep->sq || !ep->sq_sge || !ep->rq || !ep->rq_sge) {
		free(ep->sq);
		free(ep->sq_sge);
		free(ep->rq);
		free(ep->rq_sge);
		free(ep);
		return ND_NO_MEMORY;
	}
	for (uint32_t i = 0; i < attr->outbound_entries; i++)
		ep->sq[i].sgl = ep->sq_sge + (size_t)i * attr->outbound_sge;
	for (uint32_t i = 0; i < attr->inbound_entries; i++)
		ep->rq[i].sgl = ep->rq_sge + (size_t)i * attr->inbound_sge;
	pthread_mutex_lock(&ad->lock);
	ep->next = ad->eps;
	ad->eps = ep;
	ad->nobjects++;
	pthread_mutex_unlock(&ad->lock);
	*out = ep;
	return ND_SUCCESS;
}

/* Lock held. */
void wsd_ep_terminate(struct nd_ep *ep)
{
	if (ep->state != EP_CONNECTED)
		return;
	ep->state = EP_TERMINATED;
	for (uint64_t i = ep->sq_done; i < ep->sq_tail; i++) {
		struct nd_wr *wr = &ep->sq[i % ep->attr.outbound_entries];

		if (!wr->executed) {
			wr->executed = true;
			wr->status = ND_CANCELED;
		}
	}
	ep->sq_exec = ep->sq_tail;
	ep->tp->disconnect(ep);
	wsd_cq_kick(ep->attr.inbound_cq);
	wsd_cq_kick(ep->attr.outbound_cq);
}

/* Lock held.  Hand finished requests to the CQs, in order, as room allows. */
void wsd_ep_drain(struct nd_ep *ep)
{
	struct nd_cq *ocq = ep->attr.outbound_cq, *icq = ep->attr.inbound_cq;

	while (ep->sq_done < ep->sq_exec) {
		struct nd_wr *wr = &ep->sq[ep->sq_done % ep->attr.outbound_entries];
		struct nd_result r;

		if (!wr->executed)
			break;
		if (wr->status != ND_SUCCESS || !(wr->flags & ND_OP_FLAG_SILENT_SUCCESS)) {
			if (wsd_cq_full(ocq))
				break;
			r = (struct nd_result){ .status = wr->status, .op = wr->op,
						.bytes = wr->status == ND_SUCCESS ? wr->done : 0,
						.request_context = wr->context };
			wsd_cq_push(ocq, &r);
		}
		ep->sq_done++;
	}
	if (ep->state != EP_TERMINATED)
		return;
	while (ep->rq_head < ep->rq_tail && !wsd_cq_full(icq)) {
		struct nd_rwr *rw = &ep->rq[ep->rq_head % ep->attr.inbound_entries];
		struct nd_result r = { .status = ND_CANCELED, .op = ND_OP_RECEIVE,
				       .request_context = rw->context };

		wsd_cq_push(icq, &r);
		ep->rq_head++;
	}
}

nd_status nd_ep_disconnect(struct nd_ep *ep)
{
	if (!ep)
		return ND_INVALID_PARAMETER;
	pthread_mutex_lock(&ep->ad->lock);
	if (ep->state != EP_CONNECTED) {
		pthread_mutex_unlock(&ep->ad->lock);
		return ND_CONNECTION_INVALID;
	}
	wsd_ep_terminate(ep);
	wsd_ep_drain(ep);
	pthread_mutex_unlock(&ep->ad->lock);
	return ND_SUCCESS;
}

nd_status nd_ep_destroy(struct nd_ep *ep)
{
	struct nd_adapter *ad;

	if (!ep)
		return ND_INVALID_PARAMETER;
	ad = ep->ad;
	pthread_mutex_lock(&ad->lock);
	if (ep->windows_bound) {
		pthread_mutex_unlock(&ad->lock);
		return ND_DEVICE_BUSY;
	}
	wsd_ep_terminate(ep);
	for (struct nd_ep **p = &ad->eps; *p; p = &(*p)->next) {
		if (*p == ep) {
			*p = ep->next;
			break;
		}
	}
	if (ep->tp)
		ep->tp->ep_free(ep);
	ad->nobjects--;
	pthread_mutex_unlock(&ad->lock);
	free(ep->sq);
	free(ep->sq_sge);
	free(ep->rq);
	free(ep->rq_sge);
	free(ep);
	return ND_SUCCESS;
}

/*
 * Try each transport of the adapter in turn, shm first.  A transport that
 * cannot reach the address at all (another host for shm, no route through
 * the device for verbs) says ND_NOT_SUPPORTED and the next one tries; any
 * other answer is the peer's, and final.
 */
nd_status nd_ep_connect(struct nd_ep *ep, const struct sockaddr *addr, socklen_t addrlen,
			const void *priv, size_t plen, int timeout_ms)
{
	nd_status st = ND_NOT_SUPPORTED;

	if (!ep || !addr || (plen && !priv) || plen > ep->ad->info.private_data_length)
		return ND_INVALID_PARAMETER;
	if (ep->state != EP_IDLE || ep->tpriv)
		return ND_INVALID_PARAMETER;
	for (unsigned i = 0; i < ep->ad->ntp && st == ND_NOT_SUPPORTED; i++) {
		ep->tp = ep->ad->tp[i];
		ep->tpi = i;
		st = ep->tp->connect(ep, addr, addrlen, priv, plen, timeout_ms);
	}
	if (st != ND_SUCCESS)
		ep->tp = NULL;
	/* reachable by none of them: as if nobody listened */
	return st == ND_NOT_SUPPORTED ? ND_CONNECTION_REFUSED : st;
}

nd_status nd_ep_accept(struct nd_ep *ep, struct nd_conn_request *req, const void *priv,
		       size_t plen, int timeout_ms)
{
	nd_status st;

	if (!ep || !req)
		return ND_INVALID_PARAMETER;
	if ((plen && !priv) || plen > ep->ad->info.private_data_length ||
	    ep->state != EP_IDLE || ep->tpriv || req->ad != ep->ad) {
		req->ad->tp[req->tpi]->request_reject(req);
		free(req);
		return ND_INVALID_PARAMETER;
	}
	ep->tp = ep->ad->tp[req->tpi];
	ep->tpi = req->tpi;
	st = ep->tp->accept(ep, req, priv, plen, timeout_ms);
	if (st != ND_SUCCESS)
		ep->tp = NULL;
	free(req);
	return st;
}

const char *nd_ep_transport(struct nd_ep *ep)
{
	return ep && ep->tp && ep->state != EP_IDLE ? ep->tp->name : NULL;
}

nd_status nd_ep_peer_data(struct nd_ep *ep, void *buf, size_t *len)
{
	size_t have;

	if (!ep || !len || (!buf && *len))
		return ND_INVALID_PARAMETER;
	if (ep->state == EP_IDLE)
		return ND_CONNECTION_INVALID;
	have = *len;
	*len = ep->peer_len;
	if (have < ep->peer_len)
		return ND_BUFFER_OVERFLOW;
	if (ep->peer_len)
		memcpy(buf, ep->peer_data, ep->peer_len);
	return ND_SUCCESS;
}

nd_status wsd_sgl_check(const struct nd_sge *sgl, uint32_t n, uint32_t need)
{
	for (uint32_t i = 0; i < n; i++) {
		nd_status st = wsd_sge_check(&sgl[i], need);

		if (st != ND_SUCCESS)
			return st;
	}
	return ND_SUCCESS;
}

/* ---- posting ----------------------------------------------------------- */

static nd_status sgl_length(const struct nd_sge *sgl, size_t nsge, uint64_t max,
			    uint64_t *len)
{
	uint64_t sum = 0;

	if (nsge && !sgl)
		return ND_INVALID_PARAMETER;
	for (size_t i = 0; i < nsge; i++)
		sum += sgl[i].length;
	if (sum > max)
		return ND_BUFFER_OVERFLOW;
	*len = sum;
	return ND_SUCCESS;
}

/* Lock held.  Check limits and queue a copy of the request; it runs below. */
static nd_status sq_post(struct nd_ep *ep, const struct nd_wr *tmpl, const struct nd_sge *sgl,
			 size_t nsge, struct nd_wr **out)
{
	struct nd_wr *wr;
	struct nd_sge *pool;
	uint64_t len;
	nd_status st;

	if (ep->state != EP_CONNECTED)
		return ND_CONNECTION_INVALID;
	if (nsge > ep->attr.outbound_sge)
		return ND_DATA_OVERRUN;
	if (ep->sq_tail - ep->sq_done >= ep->attr.outbound_entries)
		return ND_NO_MORE_ENTRIES;
	st = sgl_length(sgl, nsge, ep->ad->info.max_transfer_length, &len);
	if (st != ND_SUCCESS)
		return st;
	wr = &ep->sq[ep->sq_tail % ep->attr.outbound_entries];
	pool = wr->sgl;
	*wr = *tmpl;
	wr->sgl = pool;
	wr->nsge = (uint32_t)nsge;
	wr->length = len;
	if (nsge)
		memcpy(wr->sgl, sgl, nsge * sizeof(*sgl));
	wr->deferred = tmpl->flags & ND_OP_FLAG_DEFER;
	ep->sq_tail++;
	if (out)
		*out = wr;
	return ND_SUCCESS;
}

/* Lock held.  Release deferred requests unless this one defers too, then run. */
static void sq_kick(struct nd_ep *ep, uint32_t flags)
{
	if (flags & ND_OP_FLAG_DEFER)
		return;
	for (uint64_t i = ep->sq_exec; i < ep->sq_tail; i++)
		ep->sq[i % ep->attr.outbound_entries].deferred = false;
	ep->tp->progress(ep);
	wsd_ep_drain(ep);
}

#define SEND_FLAGS (ND_OP_FLAG_SILENT_SUCCESS | ND_OP_FLAG_READ_FENCE | \
		    ND_OP_FLAG_SEND_AND_SOLICIT_EVENT | ND_OP_FLAG_DEFER)
#define RDMA_FLAGS (ND_OP_FLAG_SILENT_SUCCESS | ND_OP_FLAG_READ_FENCE | ND_OP_FLAG_DEFER)

static nd_status post_locked(struct nd_ep *ep, const struct nd_wr *tmpl,
			     const struct nd_sge *sgl, size_t nsge)
{
	nd_status st;

	pthread_mutex_lock(&ep->ad->lock);
	st = sq_post(ep, tmpl, sgl, nsge, NULL);
	if (st == ND_SUCCESS)
		sq_kick(ep, tmpl->flags);
	pthread_mutex_unlock(&ep->ad->lock);
	return st;
}

nd_status nd_ep_send(struct nd_ep *ep, void *context, const struct nd_sge *sgl, size_t nsge,
		     uint32_t flags)
{
	struct nd_wr t = { .op = ND_OP_SEND, .flags = flags, .context = context };

	if (!ep || (flags & ~SEND_FLAGS))
		return ND_INVALID_PARAMETER;
	return post_locked(ep, &t, sgl, nsge);
}

nd_status nd_ep_send_invalidate(struct nd_ep *ep, void *context, const struct nd_sge *sgl,
				size_t nsge, const struct nd_mw_descriptor *remote,
				uint32_t flags)
{
	struct nd_wr t = { .op = ND_OP_SEND_INVALIDATE, .flags = flags, .context = context };

	if (!ep || !remote || (flags & ~SEND_FLAGS))
		return ND_INVALID_PARAMETER;
	t.remote_token = remote->token;
	t.remote_addr = remote->base;
	return post_locked(ep, &t, sgl, nsge);
}

nd_status nd_ep_receive(struct nd_ep *ep, void *context, const struct nd_sge *sgl,
			size_t nsge)
{
	struct nd_rwr *rw;
	struct nd_sge *pool;
	uint64_t len;
	nd_status st;

	if (!ep)
		return ND_INVALID_PARAMETER;
	pthread_mutex_lock(&ep->ad->lock);
	if (ep->state == EP_TERMINATED) {
		st = ND_CONNECTION_INVALID;
	} else if (nsge > ep->attr.inbound_sge) {
		st = ND_DATA_OVERRUN;
	} else if (ep->rq_tail - ep->rq_head >= ep->attr.inbound_entries) {
		st = ND_NO_MORE_ENTRIES;
	} else {
		st = sgl_length(sgl, nsge, ep->ad->info.max_transfer_length, &len);
	}
	if (st == ND_SUCCESS) {
		rw = &ep->rq[ep->rq_tail % ep->attr.inbound_entries];
		pool = rw->sgl;
		rw->context = context;
		rw->nsge = (uint32_t)nsge;
		rw->length = len;
		if (nsge)
			memcpy(pool, sgl, nsge * sizeof(*sgl));
		ep->rq_tail++;
		if (ep->state == EP_CONNECTED) {
			ep->tp->progress(ep);
			wsd_ep_drain(ep);
		}
	}
	pthread_mutex_unlock(&ep->ad->lock);
	return st;
}

/*
 * Lock held.  A range the descriptor itself rules out, or that the owner's
 * live window rules out, is refused before anything is posted.
 */
static nd_status rdma_post(struct nd_ep *ep, struct nd_wr *t, const struct nd_sge *sgl,
			   size_t nsge, const struct nd_mw_descriptor *desc, uint64_t offset)
{
	uint64_t len = 0;
	nd_status st;

	if (ep->state != EP_CONNECTED)
		return ND_CONNECTION_INVALID;
	if (desc) {
		st = sgl_length(sgl, nsge, UINT64_MAX, &len);
		if (st != ND_SUCCESS)
			return st;
		if (offset > desc->length || len > desc->length - offset)
			return ND_REMOTE_ERROR;
		t->remote_addr = desc->base + offset;
		t->remote_token = desc->token;
	} else {
		st = sgl_length(sgl, nsge, UINT64_MAX, &len);
		if (st != ND_SUCCESS)
			return st;
	}
	if (nsge <= ep->attr.outbound_sge && len <= ep->ad->info.max_transfer_length) {
		st = ep->tp->remote_check(ep, t->remote_addr, len, t->remote_token,
					      t->op == ND_OP_READ ? ND_OP_FLAG_ALLOW_READ :
								    ND_OP_FLAG_ALLOW_WRITE);
		if (st != ND_SUCCESS)
			return st;
	}
	st = sq_post(ep, t, sgl, nsge, NULL);
	if (st == ND_SUCCESS)
		sq_kick(ep, t->flags);
	return st;
}

static nd_status rdma(struct nd_ep *ep, enum nd_op op, void *context, const struct nd_sge *sgl,
		      size_t nsge, const struct nd_mw_descriptor *desc, uint64_t offset,
		      uint64_t addr, uint64_t token, uint32_t flags)
{
	uint32_t allowed = RDMA_FLAGS;
	struct nd_wr t = { .op = op, .context = context, .remote_addr = addr,
			   .remote_token = token };
	nd_status st;

	if (op == ND_OP_READ)
		allowed |= ND_OP_FLAG_RDMA_READ_LOCAL_INVALIDATE;
	if (!ep || (flags & ~allowed))
		return ND_INVALID_PARAMETER;
	if (ep->no_rdma)
		return ND_NOT_SUPPORTED;
	if (!(ep->ad->info.flags & ND_ADAPTER_FLAG_RDMA_READ_LOCAL_INVALIDATE_SUPPORTED))
		flags &= ~ND_OP_FLAG_RDMA_READ_LOCAL_INVALIDATE;
	t.flags = flags;
	pthread_mutex_lock(&ep->ad->lock);
	st = rdma_post(ep, &t, sgl, nsge, desc, offset);
	pthread_mutex_unlock(&ep->ad->lock);
	return st;
}

nd_status nd_ep_read(struct nd_ep *ep, void *context, const struct nd_sge *sgl, size_t nsge,
		     const struct nd_mw_descriptor *remote, uint64_t offset, uint32_t flags)
{
	if (!remote)
		return ND_INVALID_PARAMETER;
	return rdma(ep, ND_OP_READ, context, sgl, nsge, remote, offset, 0, 0, flags);
}

nd_status nd_ep_read_token(struct nd_ep *ep, void *context, const struct nd_sge *sgl,
			   size_t nsge, uint64_t remote_addr, uint64_t remote_token,
			   uint32_t flags)
{
	return rdma(ep, ND_OP_READ, context, sgl, nsge, NULL, 0, remote_addr, remote_token,
		    flags);
}

nd_status nd_ep_write(struct nd_ep *ep, void *context, const struct nd_sge *sgl, size_t nsge,
		      const struct nd_mw_descriptor *remote, uint64_t offset, uint32_t flags)
{
	if (!remote)
		return ND_INVALID_PARAMETER;
	return rdma(ep, ND_OP_WRITE, context, sgl, nsge, remote, offset, 0, 0, flags);
}

#define BIND_FLAGS (ND_OP_FLAG_ALLOW_READ | ND_OP_FLAG_ALLOW_WRITE | \
		    ND_OP_FLAG_SILENT_SUCCESS | ND_OP_FLAG_DEFER)

nd_status nd_ep_bind(struct nd_ep *ep, void *context, struct nd_mr *mr, struct nd_mw *mw,
		     const void *addr, size_t length, uint32_t flags,
		     struct nd_mw_descriptor *desc)
{
	struct nd_wr t = { .op = ND_OP_BIND, .flags = flags, .context = context, .mw = mw,
			   .mr = mr, .bind_length = length };
	uintptr_t a = (uintptr_t)addr;
	nd_status st;

	if (!ep || !mr || !mw || !addr || !desc || (flags & ~BIND_FLAGS) ||
	    !(flags & (ND_OP_FLAG_ALLOW_READ | ND_OP_FLAG_ALLOW_WRITE)) ||
	    mr->ad != ep->ad || mw->ad != ep->ad)
		return ND_INVALID_PARAMETER;
	if (ep->no_rdma)
		return ND_NOT_SUPPORTED;
	pthread_mutex_lock(&ep->ad->lock);
	if (ep->state != EP_CONNECTED) {
		st = ND_CONNECTION_INVALID;
	} else if (mw->ep) {
		st = ND_DEVICE_BUSY;
	} else if (length > ep->ad->info.max_window_size) {
		st = ND_INVALID_PARAMETER;
	} else if (!mr->valid || a < mr->addr || length > mr->length ||
		   a - mr->addr > mr->length - length ||
		   ((flags & ND_OP_FLAG_ALLOW_READ) && !(mr->flags & ND_MR_FLAG_ALLOW_REMOTE_READ)) ||
		   ((flags & ND_OP_FLAG_ALLOW_WRITE) && !(mr->flags & ND_MR_FLAG_ALLOW_REMOTE_WRITE))) {
		st = ND_ACCESS_VIOLATION;
	} else if (ep->windows_bound >= ep->ad->info.max_windows) {
		st = ND_INSUFFICIENT_RESOURCES;
	} else {
		uint64_t token = ep->tp->mw_token(ep, mw->tpriv[ep->tpi]);

		t.bind_flags = flags & (ND_OP_FLAG_ALLOW_READ | ND_OP_FLAG_ALLOW_WRITE);
		mw->desc = (struct nd_mw_descriptor){ .base = a, .length = length,
						      .token = token };
		st = sq_post(ep, &t, NULL, 0, NULL);
		if (st == ND_SUCCESS) {
			mw->ep = ep;
			mw->mr = mr;
			mw->bind_context = context;
			mr->windows++;
			ep->windows_bound++;
			*desc = mw->desc;
			sq_kick(ep, flags);
		}
	}
	pthread_mutex_unlock(&ep->ad->lock);
	return st;
}

nd_status nd_ep_invalidate(struct nd_ep *ep, void *context, struct nd_mw *mw, uint32_t flags)
{
	struct nd_wr t = { .op = ND_OP_INVALIDATE, .flags = flags, .context = context, .mw = mw };
	nd_status st;

	if (!ep || !mw || (flags & ~(ND_OP_FLAG_SILENT_SUCCESS | ND_OP_FLAG_DEFER)))
		return ND_INVALID_PARAMETER;
	pthread_mutex_lock(&ep->ad->lock);
	if (mw->ep != ep)
		st = mw->ep ? ND_INVALID_PARAMETER : ND_INVALIDATION_ERROR;
	else
		st = sq_post(ep, &t, NULL, 0, NULL);
	if (st == ND_SUCCESS)
		sq_kick(ep, flags);
	pthread_mutex_unlock(&ep->ad->lock);
	return st;
}

/* Lock held.  Unbind a window locally (the transport has revoked it). */
void wsd_mw_unbind(struct nd_mw *mw)
{
	if (!mw->ep)
		return;
	mw->ep->windows_bound--;
	mw->mr->windows--;
	mw->ep = NULL;
	mw->mr = NULL;
}

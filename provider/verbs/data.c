/* SPDX-License-Identifier: MIT */
/*
 * verbs data path, under the adapter lock.  Requests go to the send queue
 * in order, chained; DEFER holds them back until a request without it.
 * SILENT_SUCCESS leaves a request unsignaled, and every so often one is
 * signaled anyway so the send queue drains.  A completion for request i
 * settles every unsignaled request before it, in order.
 */
#include <errno.h>
#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>

#include "provider/verbs/verbs.h"

#define IMM_SOLICITED 0x1u     /* carried as immediate data: the peer sees the flag */

/*
 * rdma-core 44's rxe hands the kernel's completion flags through as they
 * are, and the kernel's "with invalidate" bit is the library's
 * IBV_WC_IP_CSUM_OK; that flag has no meaning on an RC queue pair, so
 * either bit means the send invalidated one of our windows.
 */
#define WC_WITH_INV (IBV_WC_WITH_INV | IBV_WC_IP_CSUM_OK)

static nd_status wc_status(enum ibv_wc_status s, enum nd_op op)
{
	switch (s) {
	case IBV_WC_SUCCESS: return ND_SUCCESS;
	case IBV_WC_WR_FLUSH_ERR: return ND_CANCELED;
	case IBV_WC_LOC_LEN_ERR: return op == ND_OP_RECEIVE ? ND_BUFFER_OVERFLOW : ND_LOCAL_LENGTH;
	case IBV_WC_LOC_QP_OP_ERR:
		/* on a receive this is how rxe says the message did not fit */
		return op == ND_OP_RECEIVE ? ND_BUFFER_OVERFLOW : ND_FAILURE;
	case IBV_WC_LOC_PROT_ERR:
	case IBV_WC_REM_ACCESS_ERR:
	case IBV_WC_MW_BIND_ERR: return ND_ACCESS_VIOLATION;
	case IBV_WC_REM_INV_REQ_ERR:
		/* a send the peer could not take; a read or write it does not serve */
		return op == ND_OP_SEND || op == ND_OP_SEND_INVALIDATE ? ND_REMOTE_ERROR :
									 ND_INVALID_REQUEST;
	case IBV_WC_REM_OP_ERR:
	case IBV_WC_REM_ABORT_ERR: return ND_REMOTE_ERROR;
	case IBV_WC_RETRY_EXC_ERR:
	case IBV_WC_RNR_RETRY_EXC_ERR: return ND_TIMEOUT;
	default: return ND_FAILURE;
	}
}

static struct ibv_mr *lmr(const struct nd_ep *ep, const struct nd_mr *mr)
{
	const struct vb_conn *vc = ep->tpriv;

	return mr ? ((const struct vb_mr *)mr->tpriv[ep->tpi])->mr[vc->dev] : NULL;
}

static void to_sge(const struct nd_ep *ep, const struct nd_sge *in, uint32_t n,
		   struct ibv_sge *out)
{
	for (uint32_t i = 0; i < n; i++) {
		struct ibv_mr *m = lmr(ep, in[i].mr);

		out[i].addr = (uintptr_t)in[i].addr;
		out[i].length = in[i].length;
		out[i].lkey = m ? m->lkey : 0;
	}
}


static int track_mw(struct vb_conn *vc, struct nd_mw *mw)
{
	if (vc->nmws == vc->cap_mws) {
		unsigned cap = vc->cap_mws ? vc->cap_mws * 2 : 8;
		struct nd_mw **m = realloc(vc->mws, cap * sizeof(*m));

		if (!m)
			return -ENOMEM;
		vc->mws = m;
		vc->cap_mws = cap;
	}
	vc->mws[vc->nmws++] = mw;
	return 0;
}

static void untrack_mw(struct vb_conn *vc, struct nd_mw *mw)
{
	for (unsigned i = 0; i < vc->nmws; i++) {
		if (vc->mws[i] == mw) {
			vc->mws[i] = vc->mws[--vc->nmws];
			return;
		}
	}
}

static void unbind(struct vb_conn *vc, struct nd_mw *mw)
{
	untrack_mw(vc, mw);
	wsd_mw_unbind(mw);
}

static void local_fail(struct nd_ep *ep, struct nd_wr *wr, nd_status st)
{
	wsd_debug("verbs: request (op %d) failed before the device took it: status %#x, "
		  "errno %d", wr->op, (unsigned)st, errno);
	wr->status = st;
	wr->executed = true;
	wsd_ep_terminate(ep);
}

/* Does a bind on vc's device wait for the requests before it (RXE_VENDOR_ID)? */
static bool bind_alone(const struct vb_conn *vc)
{
	return vc->va->dev[vc->dev].bind_alone;
}

/* Fill one send work request; 0, or a local status that fails it. */
static nd_status build(struct nd_ep *ep, struct vb_conn *vc, struct nd_wr *wr, uint64_t idx,
		       struct ibv_send_wr *sw, struct ibv_sge *sge)
{
	uint32_t need = wr->op == ND_OP_READ ? ND_MR_FLAG_ALLOW_LOCAL_WRITE : 0;
	nd_status st;

	memset(sw, 0, sizeof(*sw));
	sw->wr_id = idx;
	if (wr->op != ND_OP_BIND && wr->op != ND_OP_INVALIDATE) {
		st = wsd_sgl_check(wr->sgl, wr->nsge, need);
		if (st != ND_SUCCESS)
			return st;
		to_sge(ep, wr->sgl, wr->nsge, sge);
		sw->sg_list = wr->nsge ? sge : NULL;
		sw->num_sge = (int)wr->nsge;
	}
	switch (wr->op) {
	case ND_OP_SEND:
		if (wr->flags & ND_OP_FLAG_SEND_AND_SOLICIT_EVENT) {
			sw->opcode = IBV_WR_SEND_WITH_IMM;
			sw->imm_data = htonl(IMM_SOLICITED);
			sw->send_flags |= IBV_SEND_SOLICITED;
		} else {
			sw->opcode = IBV_WR_SEND;
		}
		break;
	case ND_OP_SEND_INVALIDATE:
		sw->opcode = IBV_WR_SEND_WITH_INV;
		sw->invalidate_rkey = (uint32_t)wr->remote_token;
		if (wr->flags & ND_OP_FLAG_SEND_AND_SOLICIT_EVENT)
			sw->send_flags |= IBV_SEND_SOLICITED;
		break;
	case ND_OP_READ:
	case ND_OP_WRITE:
		/* with no read credit from the peer, the device would hold it forever */
		if (wr->op == ND_OP_READ && !vc->peer_read_limit)
			return ND_INVALID_REQUEST;
		sw->opcode = wr->op == ND_OP_READ ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
		sw->wr.rdma.remote_addr = wr->remote_addr;
		sw->wr.rdma.rkey = (uint32_t)wr->remote_token;
		break;
	case ND_OP_BIND: {
		struct vb_mw *w = wr->mw->tpriv[ep->tpi];

		sw->opcode = IBV_WR_BIND_MW;
		sw->bind_mw.mw = w->on[vc->dev].mw;
		sw->bind_mw.rkey = (uint32_t)wr->mw->desc.token;
		wsd_debug("verbs: bind rkey 0x%x over %llu bytes", sw->bind_mw.rkey,
			  (unsigned long long)wr->mw->desc.length);
		sw->bind_mw.bind_info.mr = lmr(ep, wr->mr);
		sw->bind_mw.bind_info.addr = wr->mw->desc.base;
		sw->bind_mw.bind_info.length = wr->mw->desc.length;
		sw->bind_mw.bind_info.mw_access_flags =
			((wr->bind_flags & ND_OP_FLAG_ALLOW_READ) ? IBV_ACCESS_REMOTE_READ : 0) |
			((wr->bind_flags & ND_OP_FLAG_ALLOW_WRITE) ? IBV_ACCESS_REMOTE_WRITE : 0);
		/* known here, so a send-and-invalidate can name it back to us */
		if (track_mw(vc, wr->mw) < 0)
			return ND_NO_MEMORY;
		break;
	}
	case ND_OP_INVALIDATE:
		sw->opcode = IBV_WR_LOCAL_INV;
		sw->invalidate_rkey = (uint32_t)wr->mw->desc.token;
		break;
	default:
		return ND_INVALID_PARAMETER;
	}
	if (wr->flags & ND_OP_FLAG_READ_FENCE)
		sw->send_flags |= IBV_SEND_FENCE;
	/*
	 * Signal what the caller wants to see, and often enough to drain the
	 * queue; everything where a bind waits for what went before (which
	 * it learns from completions).
	 */
	if (!(wr->flags & ND_OP_FLAG_SILENT_SUCCESS) || bind_alone(vc) ||
	    ++vc->unsignaled >= ep->attr.outbound_entries / 2) {
		sw->send_flags |= IBV_SEND_SIGNALED;
		vc->unsignaled = 0;
	}
	return ND_SUCCESS;
}

static void post_sends(struct nd_ep *ep, struct vb_conn *vc)
{
	while (ep->state == EP_CONNECTED && ep->sq_exec < ep->sq_tail) {
		struct ibv_send_wr sw[16], *bad;
		struct ibv_sge sge[16][32];
		int n = 0;

		while (n < 16 && ep->sq_exec + (uint64_t)n < ep->sq_tail) {
			uint64_t idx = ep->sq_exec + (uint64_t)n;
			struct nd_wr *wr = &ep->sq[idx % ep->attr.outbound_entries];
			nd_status st;

			if (wr->deferred)
				break;
			/* a bind alone: posted once all before it have completed (RXE_VENDOR_ID) */
			if (wr->op == ND_OP_BIND && bind_alone(vc) && vc->sq_comp < idx)
				break;
			st = build(ep, vc, wr, idx, &sw[n], sge[n]);
			if (st != ND_SUCCESS) {
				/* what went before still goes; this one fails the connection */
				if (n) {
					sw[n - 1].next = NULL;
					if (!ibv_post_send(vc->qp, sw, &bad))
						ep->sq_exec += (uint64_t)n;
				}
				return local_fail(ep, wr, st);
			}
			if (n)
				sw[n - 1].next = &sw[n];
			n++;
		}
		if (!n)
			return;
		sw[n - 1].next = NULL;
		bad = NULL;
		if (ibv_post_send(vc->qp, sw, &bad)) {
			/*
			 * A provider may fail without naming the request (rxe, when
			 * its doorbell is refused): then none of them is known to go.
			 */
			uint64_t at = bad >= sw && bad < sw + n ? bad->wr_id : ep->sq_exec;
			struct nd_wr *wr = &ep->sq[at % ep->attr.outbound_entries];

			ep->sq_exec = at;
			return local_fail(ep, wr, ND_FAILURE);
		}
		ep->sq_exec += (uint64_t)n;
		if (n < 16)
			return;
	}
}

static void post_recvs(struct nd_ep *ep, struct vb_conn *vc)
{
	if (vc->rq_posted < ep->rq_head)
		vc->rq_posted = ep->rq_head;
	while (ep->state == EP_CONNECTED && vc->rq_posted < ep->rq_tail) {
		struct nd_rwr *rw = &ep->rq[vc->rq_posted % ep->attr.inbound_entries];
		struct ibv_sge sge[32];
		struct ibv_recv_wr r = { .wr_id = vc->rq_posted, .sg_list = sge,
					 .num_sge = (int)rw->nsge }, *bad;
		/*
		 * A bad buffer fails when a message lands, as on shm; the device
		 * reports every kind as a protection error, so remember which.
		 */
		vc->rq_status[vc->rq_posted % ep->attr.inbound_entries] =
			wsd_sgl_check(rw->sgl, rw->nsge, ND_MR_FLAG_ALLOW_LOCAL_WRITE);
		to_sge(ep, rw->sgl, rw->nsge, sge);
		if (ibv_post_recv(vc->qp, &r, &bad)) {
			wsd_ep_terminate(ep);
			return;
		}
		vc->rq_posted++;
	}
}

/*
 * Requests at the device that complete nothing for this long never will:
 * the endpoint ends (its requests flushed, the switch's connections on it
 * reset, reason provider), where its callers would otherwise wait for
 * ever.  An RC QP retries a lost packet 7 times after its ack timeout (2 s
 * as rdma_cm sets it over Soft-RoCE) before it gives up by itself; this
 * is past that, emulated CPUs included.  Soft-RoCE (rxe) in Debian 12's
 * kernel did this when a retry ran a bind a second time (RXE_VENDOR_ID),
 * and does it still when the responses to an RDMA read are lost:
 * requests posted and uncompleted with its QP idle, every connection of
 * the channel waiting on them.
 */
#define DEAD_NS 30000000000

static void vb_deadline(struct nd_ep *ep, struct vb_conn *vc)
{
	int64_t now;

	if (ep->sq_exec == vc->sq_comp) {
		vc->still_ns = 0;
		return;
	}
	now = wsd_now_ns();
	if (!vc->still_ns || vc->still_at != vc->sq_comp) {
		vc->still_ns = now;
		vc->still_at = vc->sq_comp;
		return;
	}
	if (now - vc->still_ns < DEAD_NS)
		return;
	wsd_debug("verbs: %llu requests at the device, none completed for %lld s: the "
		  "connection ends", (unsigned long long)(ep->sq_exec - vc->sq_comp),
		  (long long)(DEAD_NS / 1000000000));
	wsd_ep_terminate(ep);
}

/* A completion at end: the unsignaled requests before it succeeded (RC is in order). */
static void settle_before(struct nd_ep *ep, struct vb_conn *vc, uint64_t end)
{
	for (uint64_t i = vc->sq_comp; i < end; i++) {
		struct nd_wr *w = &ep->sq[i % ep->attr.outbound_entries];

		if (!w->executed) {
			w->executed = true;
			w->status = ND_SUCCESS;
			w->done = w->length;
		}
	}
	if (vc->sq_comp < end)
		vc->sq_comp = end;
}

static void reap_sends(struct nd_ep *ep, struct vb_conn *vc)
{
	struct ibv_wc wc[16];
	int n;

	while ((n = ibv_poll_cq(vc->scq, 16, wc)) > 0) {
		vc->activity++;
		for (int k = 0; k < n; k++) {
			uint64_t idx = wc[k].wr_id;
			struct nd_wr *wr;

			if (idx < ep->sq_done || idx >= ep->sq_tail)
				continue;    /* settled already (flushed by a terminate) */
			/* unsignaled requests before it have succeeded */
			settle_before(ep, vc, idx);
			vc->sq_comp = idx + 1;
			wr = &ep->sq[idx % ep->attr.outbound_entries];
			if (wc[k].status != IBV_WC_SUCCESS)
				wsd_debug("verbs: request %llu (op %d) completed: %s",
					  (unsigned long long)idx, wr->op,
					  ibv_wc_status_str(wc[k].status));
			if (wr->executed)
				continue;
			wr->executed = true;
			wr->status = wc_status(wc[k].status, wr->op);
			wr->done = wr->status == ND_SUCCESS ? wr->length : 0;
			if (wr->status == ND_SUCCESS && wr->op == ND_OP_INVALIDATE &&
			    wr->mw->ep == ep)
				unbind(vc, wr->mw);
			if (wr->status == ND_SUCCESS &&
			    (wr->flags & ND_OP_FLAG_RDMA_READ_LOCAL_INVALIDATE) && wr->nsge)
				wsd_mr_local_invalidate(wr->sgl[0].mr);
			if (wr->status != ND_SUCCESS && wr->status != ND_CANCELED)
				wsd_ep_terminate(ep);
		}
	}
}

static void push(struct nd_ep *ep, enum nd_op op, nd_status st, uint64_t bytes, void *ctx,
		 uint32_t flags)
{
	struct nd_result r = { .status = st, .op = op, .bytes = bytes,
			       .request_context = ctx, .flags = flags };

	wsd_cq_push(ep->attr.inbound_cq, &r);
}

static void reap_recvs(struct nd_ep *ep, struct vb_conn *vc)
{
	struct nd_cq *icq = ep->attr.inbound_cq;
	struct ibv_wc wc;

	/* one at a time, while the CQ has room for an invalidate and a receive */
	while (icq->depth - icq->count >= 2 && ibv_poll_cq(vc->rcq, 1, &wc) == 1) {
		struct nd_rwr *rw;
		nd_status st = wc_status(wc.status, ND_OP_RECEIVE);
		uint32_t flags = 0;

		vc->activity++;
		wsd_debug("verbs: receive %s, %u bytes, flags 0x%x, invalidated rkey 0x%x",
			  ibv_wc_status_str(wc.status), wc.byte_len, (unsigned)wc.wc_flags,
			  (wc.wc_flags & WC_WITH_INV) ? wc.invalidated_rkey : 0);
		if (ep->rq_head >= ep->rq_tail)
			continue;
		rw = &ep->rq[ep->rq_head % ep->attr.inbound_entries];
		if (st != ND_SUCCESS && st != ND_CANCELED &&
		    vc->rq_status[ep->rq_head % ep->attr.inbound_entries] != ND_SUCCESS)
			st = vc->rq_status[ep->rq_head % ep->attr.inbound_entries];
		if (st == ND_SUCCESS && (wc.wc_flags & IBV_WC_WITH_IMM) &&
		    (ntohl(wc.imm_data) & IMM_SOLICITED))
			flags = ND_RESULT_FLAG_SOLICITED;
		if (st == ND_SUCCESS && (wc.wc_flags & WC_WITH_INV)) {
			struct nd_mw *mw = NULL;

			for (unsigned i = 0; i < vc->nmws && !mw; i++)
				if ((uint32_t)vc->mws[i]->desc.token == wc.invalidated_rkey)
					mw = vc->mws[i];
			push(ep, ND_OP_REMOTE_INVALIDATE, mw ? ND_SUCCESS : ND_INVALIDATION_ERROR, 0,
			     mw ? mw->bind_context : NULL, 0);
			if (mw)
				unbind(vc, mw);
		}
		push(ep, ND_OP_RECEIVE, st, st == ND_SUCCESS ? wc.byte_len : 0, rw->context, flags);
		ep->rq_head++;
		if (st != ND_SUCCESS && st != ND_CANCELED)
			wsd_ep_terminate(ep);
	}
}

/* Has the peer disconnected, or gone?  rdma_cm says so on our channel. */
int vb_cm_poll(struct nd_ep *ep)
{
	struct vb_conn *vc = ep->tpriv;
	struct rdma_cm_event *ev;
	int ended = 0;

	while (rdma_get_cm_event(vc->ch, &ev) == 0) {
		vc->activity++;
		wsd_debug("verbs: rdma_cm event %s", rdma_event_str(ev->event));
		if (ev->event == RDMA_CM_EVENT_DISCONNECTED ||
		    ev->event == RDMA_CM_EVENT_DEVICE_REMOVAL ||
		    ev->event == RDMA_CM_EVENT_TIMEWAIT_EXIT)
			ended = 1;
		rdma_ack_cm_event(ev);
	}
	if (ended && ep->state == EP_CONNECTED) {
		/* take what completed before the end, then flush the rest */
		reap_sends(ep, vc);
		reap_recvs(ep, vc);
		wsd_ep_terminate(ep);
	}
	return ended;
}

void vb_progress(struct nd_ep *ep)
{
	struct vb_conn *vc = ep->tpriv;

	if (ep->state != EP_CONNECTED)
		return;
	post_recvs(ep, vc);
	post_sends(ep, vc);
	reap_sends(ep, vc);
	/* a bind held for the completions just reaped goes now */
	if (bind_alone(vc) && ep->sq_exec < ep->sq_tail)
		post_sends(ep, vc);
	reap_recvs(ep, vc);
	vb_deadline(ep, vc);
	/* a syscall, so only now and then while polling; always before sleeping */
	if (!(++vc->polls & 63))
		(void)vb_cm_poll(ep);
}

int vb_arm(struct nd_ep *ep, struct nd_cq *cq)
{
	struct vb_conn *vc = ep->tpriv;
	struct ibv_cq *ev_cq;
	void *ctx;
	unsigned before;

	if (ep->state != EP_CONNECTED)
		return 0;
	/* take the events that woke us; on a solicited-only CQ each one fires it */
	while (ibv_get_cq_event(vc->cc, &ev_cq, &ctx) == 0) {
		if (ev_cq == vc->scq) {
			vc->scq_events++;
		} else {
			vc->rcq_events++;
			if (ep->attr.inbound_cq->armed == ND_CQ_NOTIFY_SOLICITED)
				wsd_cq_solicited(ep->attr.inbound_cq);
		}
	}
	if (vb_cm_poll(ep))
		return 1;
	if (ep->attr.outbound_cq == cq && ibv_req_notify_cq(vc->scq, 0))
		return 1;
	if (ep->attr.inbound_cq == cq &&
	    ibv_req_notify_cq(vc->rcq, cq->armed == ND_CQ_NOTIFY_SOLICITED))
		return 1;
	/* what completed before the request for events would not wake us */
	before = vc->activity;
	vb_progress(ep);
	wsd_ep_drain(ep);
	return vc->activity != before || ep->state != EP_CONNECTED;
}

void vb_disconnect(struct nd_ep *ep)
{
	struct vb_conn *vc = ep->tpriv;

	if (!vc)
		return;
	while (vc->nmws)
		unbind(vc, vc->mws[vc->nmws - 1]);
	/* what rdma_disconnect does to a QP it made: flush what is posted */
	if (vc->va->own)
		(void)ibv_modify_qp(vc->qp, &(struct ibv_qp_attr){ .qp_state = IBV_QPS_ERR },
				    IBV_QP_STATE);
	rdma_disconnect(vc->id);
	wsd_cq_detach(ep->attr.inbound_cq, vc->ch->fd);
	wsd_cq_detach(ep->attr.outbound_cq, vc->ch->fd);
	wsd_cq_detach(ep->attr.inbound_cq, vc->cc->fd);
	wsd_cq_detach(ep->attr.outbound_cq, vc->cc->fd);
}

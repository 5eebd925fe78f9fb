/* SPDX-License-Identifier: MIT */
/*
 * verbs: the device, registrations, windows, and connection setup by
 * rdma_cm.  Private data carries a small header (magic, version, the
 * sender's inbound read limit) ahead of the caller's bytes.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "provider/verbs/verbs.h"

/* ---- device ------------------------------------------------------------ */

/* Our device that rdma_cm's context ctx names (by name: the contexts differ). */
int vb_dev_of(const struct vb_adapter *va, const struct ibv_context *ctx)
{
	const char *name = ctx ? ibv_get_device_name(ctx->device) : NULL;

	for (int i = 0; name && i < va->ndev; i++)
		if (!strcmp(ibv_get_device_name(va->dev[i].ctx->device), name))
			return i;
	return -1;
}

static void caps_of(const struct vb_dev *d, struct nd_adapter_info *caps)
{
	struct ibv_port_attr port;
	const struct ibv_device_attr *a = &d->attr;

	if (ibv_query_port(d->ctx, 1, &port))
		port.max_msg_sz = 1u << 30;
	memset(caps, 0, sizeof(*caps));
	strcpy(caps->transport, "verbs");
	caps->flags = d->windows ? ND_ADAPTER_FLAG_MEMORY_WINDOWS : 0;
	caps->max_inbound_sge = caps->max_outbound_sge =
		(uint32_t)(a->max_sge < 32 ? a->max_sge : 32);
	caps->max_inbound_requests = caps->max_outbound_requests =
		(uint32_t)(a->max_qp_wr < 16384 ? a->max_qp_wr : 16384);
	caps->max_cq_entries = (uint32_t)(a->max_cqe < 65536 ? a->max_cqe : 65536);
	caps->max_inbound_read_limit = (uint32_t)a->max_qp_rd_atom;
	caps->max_transfer_length = port.max_msg_sz < (1u << 30) ? port.max_msg_sz : 1u << 30;
	caps->max_registration_size = a->max_mr_size;
	caps->max_window_size = a->max_mr_size;
	caps->max_windows = (uint32_t)(a->max_mw < 65536 ? a->max_mw : 65536);
	caps->private_data_length = VB_PRIV_MAX;
	caps->rdma_threshold = 65536;
}

static void adapter_close_op(void *priv)
{
	struct vb_adapter *va = priv;

	for (int i = 0; i < va->ndev; i++) {
		ibv_dealloc_pd(va->dev[i].pd);
		if (va->own)
			ibv_close_device(va->dev[i].ctx);
	}
	if (va->list)
		rdma_free_devices(va->list);
	free(va->dev);
	free(va);
}

/* librdmacm was used here before a fork: its contexts are the parent's (vb_dev). */
static bool cm_used, cm_inherited;
static pthread_once_t cm_once = PTHREAD_ONCE_INIT;

static void cm_atfork_child(void)
{
	cm_inherited = cm_inherited || cm_used;
}

static void cm_hook(void)
{
	pthread_atfork(NULL, NULL, cm_atfork_child);
}

/*
 * Every device (or the one WSD_VERBS_DEVICE names), each with its own
 * protection domain; the limits reported are those all of them honour.
 */
static int adapter_open_op(void **priv, struct nd_adapter_info *caps)
{
	const char *want = wsd_param_str("WSD_VERBS_DEVICE");
	struct vb_adapter *va;
	struct ibv_device **list = NULL;
	int n = 0;

	pthread_once(&cm_once, cm_hook);
	va = calloc(1, sizeof(*va));
	if (!va)
		return -ENOMEM;
	va->own = cm_inherited;
	cm_used = true;
	if (va->own)
		list = ibv_get_device_list(&n);
	else
		va->list = rdma_get_devices(&n);
	va->dev = calloc(n > 0 ? (size_t)n : 1, sizeof(*va->dev));
	for (int i = 0; (list || va->list) && va->dev && i < n; i++) {
		struct vb_dev *d = &va->dev[va->ndev];
		struct ibv_device *dev = va->own ? list[i] : va->list[i]->device;

		if (*want && strcmp(want, ibv_get_device_name(dev)))
			continue;
		d->ctx = va->own ? ibv_open_device(dev) : va->list[i];
		if (!d->ctx)
			continue;
		if (ibv_query_device(d->ctx, &d->attr) || !(d->pd = ibv_alloc_pd(d->ctx))) {
			if (va->own)
				ibv_close_device(d->ctx);
			continue;
		}
		d->windows = d->attr.max_mw > 0 &&
			     (d->attr.device_cap_flags & (IBV_DEVICE_MEM_WINDOW_TYPE_2A |
							  IBV_DEVICE_MEM_WINDOW_TYPE_2B));
		d->bind_alone = d->attr.vendor_id == RXE_VENDOR_ID;
		if (!va->ndev) {
			caps_of(d, caps);
		} else {
			struct nd_adapter_info more;

			caps_of(d, &more);
			wsd_caps_meet(caps, &more);
		}
		va->ndev++;
	}
	if (list)
		ibv_free_device_list(list);
	if (!va->ndev) {
		adapter_close_op(va);
		return -ENODEV;
	}
	*priv = va;
	return 0;
}

static int mr_register_op(void *adpriv, struct nd_mr *mr, void **priv)
{
	struct vb_adapter *va = adpriv;
	struct vb_mr *m = calloc(1, sizeof(*m) + (size_t)va->ndev * sizeof(m->mr[0]));
	int access = 0;

	if (!m)
		return -ENOMEM;
	/* the device wants local write wherever remote write may happen */
	if (mr->flags & (ND_MR_FLAG_ALLOW_LOCAL_WRITE | ND_MR_FLAG_ALLOW_REMOTE_WRITE))
		access |= IBV_ACCESS_LOCAL_WRITE;
	if (mr->flags & ND_MR_FLAG_ALLOW_REMOTE_READ)
		access |= IBV_ACCESS_REMOTE_READ;
	if (mr->flags & ND_MR_FLAG_ALLOW_REMOTE_WRITE)
		access |= IBV_ACCESS_REMOTE_WRITE;
	for (int i = 0; i < va->ndev; i++) {
		/*
		 * With windows, the peer reaches a region only through a window
		 * bound over it, which carries the remote rights: the region's own
		 * rkey grants nothing, so a region the cache keeps between
		 * offers leaves nothing open to a peer guessing keys.
		 */
		int a = va->dev[i].windows ?
			(access & ~(IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE)) |
			IBV_ACCESS_MW_BIND : access;

		m->mr[i] = ibv_reg_mr(va->dev[i].pd, (void *)mr->addr, mr->length, a);
		if (!m->mr[i]) {
			int err = errno ? -errno : -ENOMEM;

			while (i--)
				ibv_dereg_mr(m->mr[i]);
			free(m);
			return err;
		}
	}
	m->mr[va->ndev] = NULL;
	*priv = m;
	return 0;
}

static void mr_deregister_op(void *priv)
{
	struct vb_mr *m = priv;

	for (int i = 0; m->mr[i]; i++)
		ibv_dereg_mr(m->mr[i]);
	free(m);
}

static int mw_create_op(void *adpriv, void **priv)
{
	struct vb_adapter *va = adpriv;
	struct vb_mw *w = calloc(1, sizeof(*w) + (size_t)va->ndev * sizeof(w->on[0]));

	if (!w)
		return -ENOMEM;
	for (int i = 0; i < va->ndev; i++) {
		w->on[i].mw = va->dev[i].windows ? ibv_alloc_mw(va->dev[i].pd, IBV_MW_TYPE_2) : NULL;
		if (!w->on[i].mw) {
			int err = va->dev[i].windows ? (errno ? -errno : -ENOMEM) : -EOPNOTSUPP;

			while (i--)
				ibv_dealloc_mw(w->on[i].mw);
			free(w);
			return err;
		}
		w->on[i].rkey = w->on[i].mw->rkey;
	}
	w->on[va->ndev].mw = NULL;
	*priv = w;
	return 0;
}

static void mw_destroy_op(void *priv)
{
	struct vb_mw *w = priv;

	for (int i = 0; w->on[i].mw; i++)
		ibv_dealloc_mw(w->on[i].mw);
	free(w);
}

/*
 * A type 2 bind names its new rkey: the same index, the next key byte.  It
 * names the window too, by the rkey the device holds for it now (that of
 * its latest bind), which the library reads from ibv_mw and never updates
 * itself: a window bound again (the SPI keeps unbound ones) needs it set.
 */
static uint64_t mw_token_op(struct nd_ep *ep, void *mwpriv)
{
	struct vb_mw *w = mwpriv;
	struct vb_conn *vc = ep->tpriv;

	w->on[vc->dev].mw->rkey = w->on[vc->dev].rkey;
	w->on[vc->dev].rkey = ibv_inc_rkey(w->on[vc->dev].rkey);
	return w->on[vc->dev].rkey;
}

/* ---- rdma_cm events ---------------------------------------------------- */


static int nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	return fl < 0 ? -errno : fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 ? -errno : 0;
}

/* The next event on ch within the deadline (-1: none): 0, -ETIMEDOUT or -errno. */
static int next_event(struct rdma_event_channel *ch, int64_t deadline,
		      struct rdma_cm_event **ev)
{
	for (;;) {
		struct pollfd p = { .fd = ch->fd, .events = POLLIN };
		int left = wsd_ms_left(deadline);

		if (rdma_get_cm_event(ch, ev) == 0)
			return 0;
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			return -errno;
		if (left == 0)
			return -ETIMEDOUT;
		if (wsd_wait_fds(&p, 1, left) < 0)   /* restarted after a signal itself */
			return -errno;
	}
}

static struct rdma_event_channel *channel_new(void)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();

	if (ch && nonblock(ch->fd) < 0) {
		rdma_destroy_event_channel(ch);
		return NULL;
	}
	return ch;
}

/* ---- listening ----------------------------------------------------------- */

struct vb_listener {
	struct vb_adapter *va;
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
};

struct vb_request {
	struct rdma_cm_id *id;
	uint32_t peer_read_limit;
	uint8_t initiator_depth, responder_resources;
};

static int addr_ok(const struct sockaddr *addr, socklen_t len)
{
	return (addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) ||
	       (addr->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6));
}

static int listen_op(struct nd_listener *l, void **priv, const struct sockaddr *addr,
		     socklen_t len, int backlog)
{
	struct vb_listener *vl;
	int ret = -ENOMEM;

	if (!addr_ok(addr, len))
		return -EINVAL;
	vl = calloc(1, sizeof(*vl));
	if (!vl)
		return ret;
	for (unsigned i = 0; i < l->ad->ntp; i++)
		if (l->ad->tp[i] == &wsd_transport_verbs)
			vl->va = l->ad->tpriv[i];
	vl->ch = channel_new();
	if (!vl->ch || rdma_create_id(vl->ch, &vl->id, NULL, RDMA_PS_TCP)) {
		ret = errno ? -errno : -ENOMEM;
		goto fail;
	}
	if (rdma_bind_addr(vl->id, (struct sockaddr *)addr)) {
		ret = -errno;
		goto fail;
	}
	/* a listener bound to an address of another device is of no use */
	if (vl->id->verbs && vb_dev_of(vl->va, vl->id->verbs) < 0) {
		ret = -EADDRNOTAVAIL;
		goto fail;
	}
	if (rdma_listen(vl->id, backlog > 0 ? backlog : 16)) {
		ret = -errno;
		goto fail;
	}
	wsd_fd_named(vl->ch->fd, true);   /* a fork child does not hold our port */
	*priv = vl;
	return 0;
fail:
	if (vl->id)
		rdma_destroy_id(vl->id);
	if (vl->ch)
		rdma_destroy_event_channel(vl->ch);
	free(vl);
	return ret;
}

static void listen_close_op(void *priv)
{
	struct vb_listener *vl = priv;

	wsd_fd_named(vl->ch->fd, false);
	rdma_destroy_id(vl->id);
	rdma_destroy_event_channel(vl->ch);
	free(vl);
}

static int listen_fd_op(void *priv)
{
	return ((struct vb_listener *)priv)->ch->fd;
}

static int hello_ok(const void *data, uint8_t len, struct vb_hello *h)
{
	if (!data || len < sizeof(*h))
		return 0;
	memcpy(h, data, sizeof(*h));
	return h->magic == VB_MAGIC && h->version == VB_VERSION &&
	       h->plen <= len - sizeof(*h) && h->plen <= VB_PRIV_MAX;
}

static int listen_get_op(struct nd_listener *l, void *priv, int timeout_ms,
			 struct nd_conn_request *req)
{
	struct vb_listener *vl = priv;
	int64_t deadline = timeout_ms < 0 ? -1 : wsd_now_ms() + timeout_ms;

	(void)l;
	for (;;) {
		struct rdma_cm_event *ev;
		struct vb_hello h;
		struct vb_request *vr;
		int ret = next_event(vl->ch, deadline, &ev);

		if (ret < 0)
			return ret;
		if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
			rdma_ack_cm_event(ev);
			continue;
		}
		vr = calloc(1, sizeof(*vr));
		if (!vr || vb_dev_of(vl->va, ev->id->verbs) < 0 ||
		    !hello_ok(ev->param.conn.private_data, ev->param.conn.private_data_len, &h)) {
			/* not ours to serve: another device, or not a wsd peer */
			rdma_reject(ev->id, NULL, 0);
			rdma_destroy_id(ev->id);
			rdma_ack_cm_event(ev);
			free(vr);
			continue;
		}
		vr->id = ev->id;
		vr->peer_read_limit = h.read_limit;
		vr->initiator_depth = ev->param.conn.initiator_depth;
		vr->responder_resources = ev->param.conn.responder_resources;
		req->len = h.plen;
		memcpy(req->data, (const uint8_t *)ev->param.conn.private_data + sizeof(h), h.plen);
		req->tpriv = vr;
		rdma_ack_cm_event(ev);
		return 0;
	}
}

static void request_reject_op(struct nd_conn_request *req)
{
	struct vb_request *vr = req->tpriv;

	rdma_reject(vr->id, NULL, 0);
	rdma_destroy_id(vr->id);
	free(vr);
}

/* ---- connection ---------------------------------------------------------- */

static struct vb_adapter *ep_adapter(struct nd_ep *ep)
{
	return ep->ad->tpriv[ep->tpi];
}

static void conn_free(struct vb_conn *vc)
{
	if (vc->qp && vc->va->own)
		ibv_destroy_qp(vc->qp);
	else if (vc->qp)
		rdma_destroy_qp(vc->id);
	if (vc->scq_events)
		ibv_ack_cq_events(vc->scq, vc->scq_events);
	if (vc->rcq_events)
		ibv_ack_cq_events(vc->rcq, vc->rcq_events);
	if (vc->scq)
		ibv_destroy_cq(vc->scq);
	if (vc->rcq)
		ibv_destroy_cq(vc->rcq);
	if (vc->cc)
		ibv_destroy_comp_channel(vc->cc);
	if (vc->id)
		rdma_destroy_id(vc->id);
	if (vc->ch)
		rdma_destroy_event_channel(vc->ch);
	free(vc->mws);
	free(vc->rq_status);
	free(vc);
}

/*
 * Our QP to state, with the attributes rdma_cm keeps for the connection
 * (path, PSNs, the peer's QP number: rdma_init_qp_attr); depth, when not
 * -1, is the read depth this side announced, which the QP must honour:
 * max_dest_rd_atomic at RTR (reads the peer may have in flight at us),
 * max_rd_atomic at RTS (ours at it).  0 or -errno.
 */
static int qp_move(struct vb_conn *vc, enum ibv_qp_state state, int depth)
{
	struct ibv_qp_attr a = { .qp_state = state };
	struct ibv_port_attr port;
	int mask, ret;

	/*
	 * INIT again first: made before the connection had its CM state, the
	 * QP has no remote access rights yet; the CM gives them now, from the
	 * read depths agreed (librdmacm does the same).
	 */
	if (state == IBV_QPS_RTR && (ret = qp_move(vc, IBV_QPS_INIT, -1)) < 0)
		return ret;
	if (rdma_init_qp_attr(vc->id, &a, &mask)) {
		wsd_debug("verbs: rdma_init_qp_attr for state %d: %s", (int)state, strerror(errno));
		return errno ? -errno : -EINVAL;
	}
	/*
	 * On an InfiniBand port the kernel's answer may carry mask bits 21-23
	 * (RoCE's) that the device then refuses; librdmacm drops them too.
	 */
	if (state == IBV_QPS_RTR &&
	    !ibv_query_port(vc->va->dev[vc->dev].ctx, vc->id->port_num, &port) &&
	    port.link_layer == IBV_LINK_LAYER_INFINIBAND)
		mask &= ~0xe00000;
	if (depth >= 0 && state == IBV_QPS_RTR)
		a.max_dest_rd_atomic = (uint8_t)depth;
	if (depth >= 0 && state == IBV_QPS_RTS)
		a.max_rd_atomic = (uint8_t)depth;
	ret = ibv_modify_qp(vc->qp, &a, mask);
	if (ret)
		wsd_debug("verbs: QP to state %d failed: %s", (int)state, strerror(ret > 0 ? ret : -ret));
	return ret > 0 ? -ret : ret;
}

/* CQs and the QP on id's device, in state INIT. */
static int conn_qp(struct nd_ep *ep, struct vb_conn *vc)
{
	struct vb_dev *d;
	struct ibv_qp_init_attr qa = {
		.qp_type = IBV_QPT_RC,
		.cap = {
			.max_send_wr = ep->attr.outbound_entries,
			.max_recv_wr = ep->attr.inbound_entries,
			.max_send_sge = ep->attr.outbound_sge,
			.max_recv_sge = ep->attr.inbound_sge,
		},
	};

	vc->dev = vb_dev_of(vc->va, vc->id->verbs);
	if (vc->dev < 0)
		return -ENODEV;
	d = &vc->va->dev[vc->dev];
	vc->rq_status = calloc(ep->attr.inbound_entries, sizeof(*vc->rq_status));
	if (!vc->rq_status)
		return -ENOMEM;
	vc->cc = ibv_create_comp_channel(d->ctx);
	if (!vc->cc || nonblock(vc->cc->fd) < 0)
		return -ENOMEM;
	vc->scq = ibv_create_cq(d->ctx, (int)ep->attr.outbound_entries + 1, ep, vc->cc, 0);
	vc->rcq = ibv_create_cq(d->ctx, (int)ep->attr.inbound_entries + 1, ep, vc->cc, 0);
	if (!vc->scq || !vc->rcq)
		return errno ? -errno : -ENOMEM;
	qa.send_cq = vc->scq;
	qa.recv_cq = vc->rcq;
	if (!vc->va->own) {
		if (rdma_create_qp(vc->id, d->pd, &qa))
			return -errno;
		vc->qp = vc->id->qp;
		return 0;
	}
	vc->qp = ibv_create_qp(d->pd, &qa);
	if (!vc->qp)
		return errno ? -errno : -ENOMEM;
	return qp_move(vc, IBV_QPS_INIT, -1);
}

static nd_status conn_live(struct nd_ep *ep, struct vb_conn *vc)
{
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;

	/* what the QP retries by, for a stall's log */
	if (!ibv_query_qp(vc->qp, &qa, IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			  IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC, &qi))
		wsd_debug("verbs: QP %u live: ack timeout %u, retries %u, rnr retries %u, "
			  "reads %u out, %u in", vc->qp->qp_num, qa.timeout, qa.retry_cnt,
			  qa.rnr_retry, qa.max_rd_atomic, qa.max_dest_rd_atomic);
	pthread_mutex_lock(&ep->ad->lock);
	if (wsd_cq_attach(ep->attr.inbound_cq, vc->ch->fd) < 0 ||
	    wsd_cq_attach(ep->attr.inbound_cq, vc->cc->fd) < 0 ||
	    wsd_cq_attach(ep->attr.outbound_cq, vc->ch->fd) < 0 ||
	    wsd_cq_attach(ep->attr.outbound_cq, vc->cc->fd) < 0) {
		wsd_cq_detach(ep->attr.inbound_cq, vc->ch->fd);
		wsd_cq_detach(ep->attr.inbound_cq, vc->cc->fd);
		wsd_cq_detach(ep->attr.outbound_cq, vc->ch->fd);
		wsd_cq_detach(ep->attr.outbound_cq, vc->cc->fd);
		pthread_mutex_unlock(&ep->ad->lock);
		return ND_INSUFFICIENT_RESOURCES;
	}
	ep->tpriv = vc;
	ep->state = EP_CONNECTED;
	vb_progress(ep);     /* post the receives waiting since before the connection */
	wsd_ep_drain(ep);
	pthread_mutex_unlock(&ep->ad->lock);
	return ND_SUCCESS;
}

static void hello_fill(uint8_t *buf, const struct nd_ep *ep, const void *priv, size_t plen)
{
	struct vb_hello h = { .magic = VB_MAGIC, .version = VB_VERSION, .plen = (uint8_t)plen,
			      .read_limit = ep->attr.inbound_read_limit };

	memcpy(buf, &h, sizeof(h));
	if (plen)
		memcpy(buf + sizeof(h), priv, plen);
}

/* Wait for one event of the kind wanted; anything else ends the attempt. */
static nd_status expect(struct vb_conn *vc, enum rdma_cm_event_type want, int64_t deadline,
			struct nd_ep *ep)
{
	struct rdma_cm_event *ev;
	nd_status st;
	int ret = next_event(vc->ch, deadline, &ev);

	if (ret < 0)
		return ret == -ETIMEDOUT ? ND_TIMEOUT : ND_CONNECTION_ABORTED;
	wsd_debug("verbs: setup event %s (status %d), waiting for %s", rdma_event_str(ev->event),
		  ev->status, rdma_event_str(want));
	if (ev->event == want) {
		st = ND_SUCCESS;
		if ((want == RDMA_CM_EVENT_ESTABLISHED || want == RDMA_CM_EVENT_CONNECT_RESPONSE) &&
		    ep) {
			struct vb_hello h;

			wsd_debug("verbs: answered, %u bytes of private data, depth %u/%u",
				  ev->param.conn.private_data_len, ev->param.conn.initiator_depth,
				  ev->param.conn.responder_resources);
			if (hello_ok(ev->param.conn.private_data, ev->param.conn.private_data_len,
				     &h)) {
				vc->peer_read_limit = h.read_limit;
				ep->peer_len = h.plen;
				memcpy(ep->peer_data,
				       (const uint8_t *)ev->param.conn.private_data + sizeof(h),
				       h.plen);
			}
		}
	} else if (ev->event == RDMA_CM_EVENT_REJECTED) {
		st = ND_CONNECTION_REFUSED;
	} else if (ev->event == RDMA_CM_EVENT_UNREACHABLE ||
		   ev->event == RDMA_CM_EVENT_ADDR_ERROR ||
		   ev->event == RDMA_CM_EVENT_ROUTE_ERROR) {
		st = ND_CONNECTION_REFUSED;
	} else {
		st = ND_CONNECTION_ABORTED;
	}
	rdma_ack_cm_event(ev);
	return st;
}

static nd_status connect_op(struct nd_ep *ep, const struct sockaddr *addr, socklen_t len,
			    const void *priv, size_t plen, int timeout_ms)
{
	struct vb_conn *vc = calloc(1, sizeof(*vc));
	int64_t deadline = timeout_ms < 0 ? -1 : wsd_now_ms() + timeout_ms;
	int step = timeout_ms < 0 || timeout_ms > 2000 ? 2000 : timeout_ms;
	uint8_t pd[VB_CONNECT_PRIV];
	struct rdma_conn_param cp = { .private_data = pd,
				      .private_data_len = (uint8_t)(sizeof(struct vb_hello) + plen),
				      .retry_count = 7, .rnr_retry_count = 7 };
	nd_status st = ND_NO_MEMORY;

	if (!addr_ok(addr, len))
		return ND_INVALID_PARAMETER;
	if (!vc)
		return st;
	vc->va = ep_adapter(ep);
	if (plen > VB_PRIV_MAX) {
		st = ND_INVALID_PARAMETER;
		goto fail;
	}
	vc->ch = channel_new();
	if (!vc->ch || rdma_create_id(vc->ch, &vc->id, NULL, RDMA_PS_TCP)) {
		st = ND_INSUFFICIENT_RESOURCES;
		goto fail;
	}
	/* No address, no route, or another device: this transport cannot reach it. */
	st = ND_NOT_SUPPORTED;
	if (rdma_resolve_addr(vc->id, NULL, (struct sockaddr *)addr, step) ||
	    expect(vc, RDMA_CM_EVENT_ADDR_RESOLVED, deadline, NULL) != ND_SUCCESS ||
	    vb_dev_of(vc->va, vc->id->verbs) < 0 ||
	    rdma_resolve_route(vc->id, step) ||
	    expect(vc, RDMA_CM_EVENT_ROUTE_RESOLVED, deadline, NULL) != ND_SUCCESS)
		goto fail;
	if (conn_qp(ep, vc) < 0) {
		st = ND_INSUFFICIENT_RESOURCES;
		goto fail;
	}
	hello_fill(pd, ep, priv, plen);
	cp.responder_resources = (uint8_t)(ep->attr.inbound_read_limit < 255 ?
					   ep->attr.inbound_read_limit : 255);
	{
		int depth = vc->va->dev[vc->dev].attr.max_qp_init_rd_atom;

		cp.initiator_depth = (uint8_t)(depth < 255 ? depth : 255);
	}
	cp.qp_num = vc->qp->qp_num;
	if (rdma_connect(vc->id, &cp)) {
		st = ND_CONNECTION_REFUSED;
		goto fail;
	}
	/* a QP of our own: the answer comes as such, and we complete the connection */
	st = expect(vc, vc->va->own ? RDMA_CM_EVENT_CONNECT_RESPONSE : RDMA_CM_EVENT_ESTABLISHED,
		    deadline, ep);
	if (st != ND_SUCCESS)
		goto fail;
	/* the depths the answer settled, as rdma_cm has them (as librdmacm does) */
	if (vc->va->own &&
	    (qp_move(vc, IBV_QPS_RTR, -1) < 0 || qp_move(vc, IBV_QPS_RTS, -1) < 0 ||
	     rdma_establish(vc->id))) {
		rdma_reject(vc->id, NULL, 0);
		st = ND_CONNECTION_ABORTED;
		goto fail;
	}
	st = conn_live(ep, vc);
	if (st == ND_SUCCESS)
		return st;
fail:
	conn_free(vc);
	return st;
}

static nd_status accept_op(struct nd_ep *ep, struct nd_conn_request *req, const void *priv,
			   size_t plen, int timeout_ms)
{
	struct vb_request *vr = req->tpriv;
	struct vb_conn *vc = calloc(1, sizeof(*vc));
	int64_t deadline = timeout_ms < 0 ? -1 : wsd_now_ms() + timeout_ms;
	uint8_t pd[VB_CONNECT_PRIV];
	struct rdma_conn_param cp = { .private_data = pd,
				      .private_data_len = (uint8_t)(sizeof(struct vb_hello) + plen),
				      .retry_count = 7, .rnr_retry_count = 7 };
	nd_status st = ND_NO_MEMORY;

	if (!vc)
		goto fail;
	vc->va = ep_adapter(ep);
	vc->peer_read_limit = vr->peer_read_limit;
	vc->id = vr->id;
	vr->id = NULL;
	vc->ch = channel_new();
	if (!vc->ch || rdma_migrate_id(vc->id, vc->ch) || conn_qp(ep, vc) < 0) {
		st = ND_INSUFFICIENT_RESOURCES;
		goto fail;
	}
	hello_fill(pd, ep, priv, plen);
	/*
	 * Reads the peer may have in flight at us, and we at it.  rdma_cm
	 * hands the request's figures over already turned to our side: its
	 * responder_resources is the peer's initiator depth, and the reverse.
	 */
	cp.responder_resources = (uint8_t)(ep->attr.inbound_read_limit < vr->responder_resources ?
					   ep->attr.inbound_read_limit : vr->responder_resources);
	cp.initiator_depth = vr->initiator_depth;
	cp.qp_num = vc->qp->qp_num;
	if (vc->va->own && qp_move(vc, IBV_QPS_RTR, cp.responder_resources) < 0) {
		st = ND_INSUFFICIENT_RESOURCES;
		goto fail;
	}
	if (rdma_accept(vc->id, &cp)) {
		st = ND_CONNECTION_ABORTED;
		goto fail;
	}
	st = expect(vc, RDMA_CM_EVENT_ESTABLISHED, deadline, NULL);
	if (st == ND_SUCCESS && vc->va->own && qp_move(vc, IBV_QPS_RTS, cp.initiator_depth) < 0) {
		rdma_disconnect(vc->id);
		st = ND_CONNECTION_ABORTED;
	}
	if (st != ND_SUCCESS)
		goto fail;
	ep->peer_len = req->len;
	memcpy(ep->peer_data, req->data, req->len);
	st = conn_live(ep, vc);
	if (st == ND_SUCCESS) {
		free(vr);
		return st;
	}
fail:
	if (vr->id) {
		rdma_reject(vr->id, NULL, 0);
		rdma_destroy_id(vr->id);
	}
	free(vr);
	if (vc)
		conn_free(vc);
	return st;
}

static void ep_free_op(struct nd_ep *ep)
{
	if (ep->tpriv)
		conn_free(ep->tpriv);
	ep->tpriv = NULL;
}

const struct nd_transport wsd_transport_verbs = {
	.name = "verbs",
	.adapter_open = adapter_open_op,
	.adapter_close = adapter_close_op,
	.background = wsd_tp_none_free,    /* nothing slow to begin */
	.mr_register = mr_register_op,
	.mr_deregister = mr_deregister_op,
	.mw_create = mw_create_op,
	.mw_destroy = mw_destroy_op,
	.mw_token = mw_token_op,
	.listen = listen_op,
	.listen_close = listen_close_op,
	.listen_owner = wsd_tp_no_owner,   /* no registry process: nothing to name */
	.listen_taken = wsd_tp_not_taken,  /* rdma_cm ports: no shared names to squat */
	.listen_publish = wsd_tp_no_publish,   /* rdma_cm reaches across namespaces itself */
	.listen_fd = listen_fd_op,
	.listen_get = listen_get_op,
	.request_reject = request_reject_op,
	.connect = connect_op,
	.accept = accept_op,
	.disconnect = vb_disconnect,
	.ep_free = ep_free_op,
	.progress = vb_progress,
	.arm = vb_arm,
	.remote_check = wsd_tp_unchecked,
	.fd_send = wsd_tp_no_fd_send,       /* another host: no descriptor crosses */
	.fd_take = wsd_tp_no_fd_take,
};

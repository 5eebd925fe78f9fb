/* SPDX-License-Identifier: MIT */
/*
 * The verbs transport: RC queue pairs set up by rdma_cm, memory windows
 * type 2 bound and invalidated through the send queue.  Each endpoint has
 * its own send and receive CQs on one completion channel; progress turns
 * their work completions into the endpoint layer's results, in order.
 */
#ifndef WSD_PROVIDER_VERBS_H
#define WSD_PROVIDER_VERBS_H

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "provider/internal.h"

#define VB_MAGIC 0x57534456u      /* "WSDV" */
#define VB_VERSION 1
#define VB_CONNECT_PRIV 56        /* rdma_cm's limit for an RC connect */

/* Private data header on connect and accept; the caller's bytes follow. */
struct vb_hello {
	uint32_t magic;
	uint16_t version;
	uint8_t plen;
	uint8_t pad;
	uint32_t reserved;            /* zero; read depths go by rdma_cm's own fields */
} __attribute__((packed));

#define VB_PRIV_MAX (VB_CONNECT_PRIV - sizeof(struct vb_hello))

struct vb_adapter {
	struct ibv_context **devs;    /* rdma_get_devices(): contexts rdma_cm uses */
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_device_attr attr;
	int windows;                  /* type 2 memory windows work */
};

struct vb_mw {
	struct ibv_mw *mw;
	uint32_t rkey;                /* of the latest bind */
};

struct vb_conn {
	struct vb_adapter *va;
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
	struct ibv_comp_channel *cc;
	struct ibv_cq *scq, *rcq;
	unsigned scq_events, rcq_events; /* to acknowledge before destroying the CQs */
	uint64_t rq_posted;           /* receives handed to the QP: [rq_head, rq_posted) */
	nd_status *rq_status;         /* per receive: what a bad local buffer means */
	uint64_t sq_comp;             /* the oldest request a completion settles */
	uint32_t unsignaled;          /* unsignaled requests since the last signaled */
	uint32_t polls;
	unsigned activity;            /* completions or events seen by progress */
	struct nd_mw **mws;           /* windows bound here, for remote invalidation */
	unsigned nmws, cap_mws;
};

WSD_HIDDEN void vb_progress(struct nd_ep *ep);
WSD_HIDDEN int vb_arm(struct nd_ep *ep, struct nd_cq *cq);
WSD_HIDDEN void vb_disconnect(struct nd_ep *ep);
WSD_HIDDEN int vb_cm_poll(struct nd_ep *ep);

#endif

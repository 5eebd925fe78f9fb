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
	uint32_t read_limit;          /* the sender's inbound_read_limit */
} __attribute__((packed));

#define VB_PRIV_MAX (VB_CONNECT_PRIV - sizeof(struct vb_hello))

/*
 * The vendor id of Linux's software RoCE device (rxe).  A retry there
 * (a lost packet's timeout, a NAK) starts its send queue again at the
 * oldest request not yet completed and runs every local operation after
 * it once more: a window bound since is bound again with the key it
 * already gave away, which fails and leaves the queue stuck for good
 * with everything after it (Debian 12's kernel 6.1).  So there a bind
 * goes to the device only when every request before it has completed.
 */
#define RXE_VENDOR_ID 0xffffffu

/*
 * One RDMA device: a connection uses the one its route leaves by.  Its
 * context is librdmacm's (rdma_get_devices), the one rdma_cm uses, except
 * in a process that inherited librdmacm's state by fork: librdmacm opens
 * its contexts once and keeps them across fork, and the kernel refuses a
 * fork child the commands a context opened by its parent sends by
 * write() (rxe rings its send doorbell so).  There the adapter opens its
 * own (own), rdma_cm only names the device (id->verbs), and each QP is
 * ours, moved through its states with rdma_init_qp_attr.
 */
struct vb_dev {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_device_attr attr;
	int windows;                  /* type 2 memory windows work */
	bool bind_alone;              /* a bind waits for the requests before it (post_sends) */
};

struct vb_adapter {
	struct ibv_context **list;    /* rdma_get_devices(), unless own */
	bool own;                     /* contexts of our own (a fork child): see vb_dev */
	struct vb_dev *dev;
	int ndev;
};

/* A region or window has its verbs object on every device. */
struct vb_mr {
	struct ibv_mr *mr[1];         /* [ndev] */
};

struct vb_mw {
	struct {
		struct ibv_mw *mw;
		uint32_t rkey;        /* of the latest bind */
	} on[1];                      /* [ndev] */
};

struct vb_conn {
	struct vb_adapter *va;
	int dev;                      /* index in va->dev */
	uint32_t peer_read_limit;     /* 0: a read would wait forever for credit */
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
	struct ibv_qp *qp;            /* id->qp, or (own) ours on dev's context */
	struct ibv_comp_channel *cc;
	struct ibv_cq *scq, *rcq;
	unsigned scq_events, rcq_events; /* to acknowledge before destroying the CQs */
	uint64_t rq_posted;           /* receives handed to the QP: [rq_head, rq_posted) */
	nd_status *rq_status;         /* per receive: what a bad local buffer means */
	uint64_t sq_comp;             /* the oldest request a completion settles */
	uint32_t unsignaled;          /* unsignaled requests since the last signaled */
	uint32_t polls;
	unsigned activity;            /* completions or events seen by progress */
	/* requests at the device with no completion since (vb_deadline) */
	int64_t still_ns;
	uint64_t still_at;            /* sq_comp then */
	struct nd_mw **mws;           /* windows bound here, for remote invalidation */
	unsigned nmws, cap_mws;
};

WSD_HIDDEN int vb_dev_of(const struct vb_adapter *va, const struct ibv_context *ctx);
WSD_HIDDEN void vb_progress(struct nd_ep *ep);
WSD_HIDDEN int vb_arm(struct nd_ep *ep, struct nd_cq *cq);
WSD_HIDDEN void vb_disconnect(struct nd_ep *ep);
WSD_HIDDEN int vb_cm_poll(struct nd_ep *ep);

#endif

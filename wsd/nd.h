/* SPDX-License-Identifier: MIT */
/*
 * wsd endpoint layer: NetworkDirect-style adapters, completion queues,
 * memory regions and windows, and connected endpoints.
 *
 * Calls return an nd_status (nd_cq_poll a count, nd_cq_fd a descriptor,
 * nd_strstatus a name).  Requests (send, receive, read, write,
 * bind, invalidate) are posted and complete later into a completion queue
 * as a struct nd_result carrying the caller's context pointer.
 * The contract of each call is in its man page (nd_adapter_open(3), ...).
 */
#ifndef WSD_ND_H
#define WSD_ND_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status codes ------------------------------------------------------ */

typedef enum nd_status {
	ND_SUCCESS = 0,
	ND_PENDING,             /* reserved for overlapped calls of the SPI */
	ND_TIMEOUT,             /* wait expired, or the peer stopped answering */
	ND_CANCELED,            /* flushed: endpoint disconnected or terminated */
	ND_BUFFER_OVERFLOW,     /* too much data for the buffer or the adapter */
	ND_DATA_OVERRUN,        /* more SGEs than the endpoint allows */
	ND_NO_MORE_ENTRIES,     /* request queue full */
	ND_CONNECTION_INVALID,  /* endpoint not connected */
	ND_CONNECTION_REFUSED,  /* no listener, or the listener rejected */
	ND_CONNECTION_ABORTED,  /* the peer went away during setup, or broke the protocol */
	ND_ACCESS_DENIED,       /* processes may not access each other's memory */
	ND_ACCESS_VIOLATION,    /* memory access outside rights or registration */
	ND_LOCAL_LENGTH,        /* local SGE runs past the end of its region */
	ND_INVALID_REQUEST,     /* the peer cannot serve this kind of request */
	ND_INVALID_PARAMETER,   /* bad argument */
	ND_FAILURE,             /* the transfer failed in the kernel */
	ND_REMOTE_ERROR,        /* the peer rejected the request */
	ND_INVALIDATION_ERROR,  /* send-and-invalidate named a window not bound */
	ND_NO_MEMORY,
	ND_NOT_SUPPORTED,
	ND_DEVICE_BUSY,         /* object still in use (bound window, attached CQ) */
	ND_ADDRESS_IN_USE,
	ND_INSUFFICIENT_RESOURCES
} nd_status;

const char *nd_strstatus(nd_status status);

/* ---- flags ------------------------------------------------------------- */

#define ND_OP_FLAG_SILENT_SUCCESS          0x00000001u
#define ND_OP_FLAG_READ_FENCE              0x00000002u
#define ND_OP_FLAG_SEND_AND_SOLICIT_EVENT  0x00000004u
#define ND_OP_FLAG_ALLOW_READ              0x00000008u /* bind */
#define ND_OP_FLAG_ALLOW_WRITE             0x00000010u /* bind */
#define ND_OP_FLAG_DEFER                   0x00000100u
#define ND_OP_FLAG_RDMA_READ_LOCAL_INVALIDATE 0x00000200u

/* memory region access */
#define ND_MR_FLAG_ALLOW_LOCAL_WRITE   0x1u
#define ND_MR_FLAG_ALLOW_REMOTE_READ   0x2u
#define ND_MR_FLAG_ALLOW_REMOTE_WRITE  0x4u

/* adapter capability flags */
#define ND_ADAPTER_FLAG_RDMA_READ_LOCAL_INVALIDATE_SUPPORTED 0x1u
#define ND_ADAPTER_FLAG_MEMORY_WINDOWS 0x2u

enum nd_cq_notify_type {
	ND_CQ_NOTIFY_ANY = 1,
	ND_CQ_NOTIFY_SOLICITED = 2
};

enum nd_op {
	ND_OP_SEND = 1,
	ND_OP_SEND_INVALIDATE,
	ND_OP_RECEIVE,
	ND_OP_READ,
	ND_OP_WRITE,
	ND_OP_BIND,
	ND_OP_INVALIDATE,        /* nd_ep_invalidate of one's own window */
	ND_OP_REMOTE_INVALIDATE  /* the peer's send-and-invalidate hit our window */
};

/* ---- objects ----------------------------------------------------------- */

struct nd_adapter;
struct nd_cq;
struct nd_mr;
struct nd_mw;
struct nd_ep;
struct nd_listener;
struct nd_conn_request;

struct nd_adapter_info {
	char transport[16];        /* "shm", "verbs", or "auto" for both */
	uint32_t flags;            /* ND_ADAPTER_FLAG_* */
	uint32_t max_inbound_sge;
	uint32_t max_outbound_sge;
	uint32_t max_inbound_requests;
	uint32_t max_outbound_requests;
	uint32_t max_cq_entries;
	uint32_t max_inbound_read_limit;
	uint64_t max_transfer_length;  /* largest single request */
	uint64_t max_registration_size;
	uint64_t max_window_size;
	uint32_t max_windows;          /* windows bound per endpoint at once */
	uint32_t private_data_length;  /* connect/accept private data limit */
	uint64_t rdma_threshold;       /* size above which zero copy pays */
};

struct nd_sge {
	void *addr;
	uint32_t length;
	struct nd_mr *mr;
};

struct nd_mw_descriptor {
	uint64_t base;    /* peer's address of the window's first byte */
	uint64_t length;
	uint64_t token;   /* new at every bind: 64 random bits (shm), the rkey (verbs) */
};

struct nd_result {
	nd_status status;
	enum nd_op op;
	uint64_t bytes;          /* bytes transferred */
	void *request_context;   /* the context given when posting */
	uint32_t flags;          /* ND_RESULT_FLAG_* */
};

#define ND_RESULT_FLAG_SOLICITED 0x1u

struct nd_ep_attr {
	struct nd_cq *inbound_cq;   /* receive results */
	struct nd_cq *outbound_cq;  /* send, read, write, bind, invalidate */
	uint32_t inbound_entries;
	uint32_t outbound_entries;
	uint32_t inbound_sge;
	uint32_t outbound_sge;
	uint32_t inbound_read_limit;  /* reads the peer may have in flight; 0: none */
};

/* ---- adapter ----------------------------------------------------------- */

nd_status nd_adapter_open(const char *transport, struct nd_adapter **adapter);
nd_status nd_adapter_close(struct nd_adapter *adapter);
nd_status nd_adapter_query(struct nd_adapter *adapter, struct nd_adapter_info *info);

/* ---- completion queues ------------------------------------------------- */

nd_status nd_cq_create(struct nd_adapter *adapter, uint32_t depth, struct nd_cq **cq);
nd_status nd_cq_destroy(struct nd_cq *cq);
int nd_cq_poll(struct nd_cq *cq, struct nd_result *results, int count);
nd_status nd_cq_notify(struct nd_cq *cq, enum nd_cq_notify_type type);
nd_status nd_cq_wait(struct nd_cq *cq, int timeout_ms);
int nd_cq_fd(struct nd_cq *cq);

/* ---- memory ------------------------------------------------------------ */

nd_status nd_mr_register(struct nd_adapter *adapter, void *addr, size_t length,
			 uint32_t flags, struct nd_mr **mr);
nd_status nd_mr_deregister(struct nd_mr *mr);
nd_status nd_mw_create(struct nd_adapter *adapter, struct nd_mw **mw);
nd_status nd_mw_destroy(struct nd_mw *mw);

/* ---- connection setup -------------------------------------------------- */

nd_status nd_ep_create(struct nd_adapter *adapter, const struct nd_ep_attr *attr,
		       struct nd_ep **ep);
nd_status nd_ep_destroy(struct nd_ep *ep);
nd_status nd_ep_connect(struct nd_ep *ep, const struct sockaddr *addr, socklen_t addrlen,
			const void *private_data, size_t private_len, int timeout_ms);
nd_status nd_ep_accept(struct nd_ep *ep, struct nd_conn_request *req,
		       const void *private_data, size_t private_len, int timeout_ms);
nd_status nd_ep_disconnect(struct nd_ep *ep);
nd_status nd_ep_peer_data(struct nd_ep *ep, void *buf, size_t *len);
const char *nd_ep_transport(struct nd_ep *ep);

nd_status nd_listen(struct nd_adapter *adapter, const struct sockaddr *addr,
		    socklen_t addrlen, int backlog, struct nd_listener **listener);
nd_status nd_listen_close(struct nd_listener *listener);
nd_status nd_listen_get_request(struct nd_listener *listener, int timeout_ms,
				struct nd_conn_request **req);
nd_status nd_conn_request_data(struct nd_conn_request *req, void *buf, size_t *len);
nd_status nd_conn_request_reject(struct nd_conn_request *req);

/* ---- requests ---------------------------------------------------------- */

nd_status nd_ep_send(struct nd_ep *ep, void *context, const struct nd_sge *sgl,
		     size_t nsge, uint32_t flags);
nd_status nd_ep_send_invalidate(struct nd_ep *ep, void *context, const struct nd_sge *sgl,
				size_t nsge, const struct nd_mw_descriptor *remote,
				uint32_t flags);
nd_status nd_ep_receive(struct nd_ep *ep, void *context, const struct nd_sge *sgl,
			size_t nsge);
nd_status nd_ep_read(struct nd_ep *ep, void *context, const struct nd_sge *sgl,
		     size_t nsge, const struct nd_mw_descriptor *remote,
		     uint64_t offset, uint32_t flags);
nd_status nd_ep_read_token(struct nd_ep *ep, void *context, const struct nd_sge *sgl,
			   size_t nsge, uint64_t remote_addr, uint64_t remote_token,
			   uint32_t flags);
nd_status nd_ep_write(struct nd_ep *ep, void *context, const struct nd_sge *sgl,
		      size_t nsge, const struct nd_mw_descriptor *remote,
		      uint64_t offset, uint32_t flags);
nd_status nd_ep_bind(struct nd_ep *ep, void *context, struct nd_mr *mr, struct nd_mw *mw,
		     const void *addr, size_t length, uint32_t flags,
		     struct nd_mw_descriptor *descriptor);
nd_status nd_ep_invalidate(struct nd_ep *ep, void *context, struct nd_mw *mw,
			   uint32_t flags);

#ifdef __cplusplus
}
#endif

#endif /* WSD_ND_H */

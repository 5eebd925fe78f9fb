/* SPDX-License-Identifier: MIT */
/*
 * The SPI's internals.  A provider instance owns an endpoint-layer adapter,
 * a registration cache and a completion thread; a socket owns a CQ and an
 * endpoint (or a listener).  Every posted request carries a struct
 * wsp_req as its endpoint-layer context; completing it is the one place
 * where overlapped state, waiters and notification meet.
 *
 * Locks: a provider's lock guards its sockets, requests and cache, and is
 * taken before the adapter's; the handle table has its own; a port has its
 * own.  Upcalls run with no provider lock held.
 */
#ifndef WSD_PROVIDER_SPI_H
#define WSD_PROVIDER_SPI_H

#include <pthread.h>
#include <stdbool.h>

#include "provider/internal.h"
#include "wsd/wsp.h"

#define WSP_MAX_BUFS WSP_MAX_BUFFERS

struct rc_entry;

enum req_kind { REQ_SEND, REQ_RECV, REQ_READ, REQ_WRITE, REQ_BIND, REQ_INVAL };

struct wsp_req {
	struct wsp_req *next, *prev;     /* the socket's outstanding requests */
	struct wsp_socket *s;
	WSAOVERLAPPED *ov;               /* NULL: someone waits for it in a call */
	enum req_kind kind;
	bool done;                       /* its outcome is known */
	bool in_call;                    /* the posting call has not returned yet */
	bool waiting;                    /* a call sleeps until it is done */
	bool nd_pending;                 /* the endpoint layer still holds it */
	int error;                       /* WSA code, 0 on success */
	uint32_t bytes;
	struct rc_entry *regs[WSP_MAX_BUFS];   /* cache entries to release */
	unsigned nregs;
};

/* The descriptor a peer gets from WSPRegisterRdmaMemory, as it travels. */
struct wire_desc {
	uint64_t base, length, token;    /* the memory window's descriptor */
	uint32_t access;                 /* MEM_* */
	uint32_t magic;
};

#define DESC_MAGIC 0x57535044u           /* "WSPD" */

_Static_assert(sizeof(struct wire_desc) == WSP_RDMA_DESCRIPTOR_SIZE, "descriptor size");

enum sock_state { S_NEW, S_LISTENING, S_CONNECTED, S_CLOSED };

struct rdma_reg {
	struct rdma_reg *next;
	struct rc_entry *rc;             /* the cached region the window lies in */
	struct nd_mw *mw;
	uint8_t desc[WSP_RDMA_DESCRIPTOR_SIZE];
};

struct wsp_socket {
	struct wsp_provider *pv;
	struct wsp_socket *next;         /* the provider's sockets */
	SOCKET handle;
	unsigned refs;                   /* handle-table lookups in progress, +1 while open */
	int af;
	enum sock_state state;
	bool bound, shut_send, shut_recv, closing, in_epoll;
	struct sockaddr_storage local;
	socklen_t local_len;
	struct nd_listener *l;
	struct nd_cq *cq;
	struct nd_ep *ep;
	int fail;                        /* why the connection ended (WSA code), 0 while up */
	uint32_t rdma_threshold;
	int tcp_listener;                /* SO_WSP_TCP_LISTENER; -1 when not set */
	int tcp_port;                    /* SO_WSP_TCP_PORT; 0: the port dialled */
	struct sockaddr_storage tcp_from;   /* SO_WSP_TCP_FROM */
	socklen_t tcp_from_len;          /* 0: not set */
	int accept_ms;                   /* SO_WSP_ACCEPT_MS; 0: WSPAccept waits until a request */
	bool peer_users;                 /* SO_WSP_PEER_USERS */
	struct wsd_port *port;
	uintptr_t key;
	struct wsp_req *reqs;
	bool armed;                      /* the completion thread armed its CQ */
	bool watched;                    /* ...and its epoll set reports the CQ's fd */
	struct rdma_reg *rdma;
	struct nd_conn_request *deferred;  /* CF_DEFER: the next WSPAccept takes it */
	unsigned ov_sleepers;            /* WSPGetOverlappedResult calls asleep on it */
};

/*
 * Rights of a cached region beyond MEM_*: the peer's, through a window bound
 * over it.  Kept apart from the local ones, so a region is offered only with
 * the rights its WSPRegisterRdmaMemory asked for.
 */
#define WSP_RC_REMOTE_READ  0x100u
#define WSP_RC_REMOTE_WRITE 0x200u

/* the most one region grows to by taking in its neighbours (mem.c, widen) */
#define WSP_RC_MERGE_MAX ((size_t)64 << 20)
/* the most memory the cache keeps in regions nobody uses */
#define WSP_RC_UNUSED_BYTES ((size_t)64 << 20)

/* unbound windows kept for the next WSPRegisterRdmaMemory */
#define WSP_MW_POOL 16

struct rc_entry {
	struct rc_entry *next;
	uintptr_t addr;
	size_t len;
	uint32_t flags;                  /* MEM_*, WSP_RC_REMOTE_* */
	struct nd_mr *mr;
	uint64_t handle;
	unsigned refs;
	uint64_t used;                   /* LRU tick */
	bool stale;                      /* its memory is going away: never reuse */
};

#define WSP_PENDING_INVAL 256

struct wsp_provider {
	pthread_mutex_t lock;
	/*
	 * Ranges freed while another thread held lock: the memory hooks may not
	 * wait for it (that thread may hold what the freeing thread holds), so
	 * they leave the range here and the next cache lookup applies it.
	 */
	pthread_spinlock_t inval_lock;
	unsigned ninval;
	bool inval_overflow;
	struct { uintptr_t a; size_t len; } inval[WSP_PENDING_INVAL];
	pthread_cond_t cond;             /* broadcast whenever a request completes */
	struct nd_adapter *ad;
	struct nd_adapter_info info;
	WSPUPCALLTABLE up;
	struct wsp_socket *socks;
	bool down;                       /* WSPCleanup ran */
	/* the completion thread */
	pthread_t thread;
	bool thread_started;
	int epfd;                        /* every socket's CQ fd, and efd */
	int efd;                         /* wakes the thread: new socket, cleanup */
	struct wsd_engine engine;
	/* registration cache */
	struct rc_entry *cache;
	unsigned cached;
	struct nd_mw *mw_pool[WSP_MW_POOL];
	unsigned nmw_pool;
	uint64_t tick, next_handle;
	struct wsp_provider *next;       /* all instances, for the cache callback */
};

/* provider.c */
WSD_HIDDEN struct wsp_socket *wsp_sock_get(SOCKET h, int *err);
WSD_HIDDEN void wsp_sock_ref(struct wsp_socket *s);
WSD_HIDDEN void wsp_sock_put(struct wsp_socket *s);
WSD_HIDDEN SOCKET wsp_sock_new(struct wsp_provider *pv, int af, int *err,
			       struct wsp_socket **out);
WSD_HIDDEN void wsp_sock_release_handle(struct wsp_socket *s);
WSD_HIDDEN int wsp_sock_watch(struct wsp_socket *s);
WSD_HIDDEN void wsp_kick(struct wsp_socket *s, const WSAOVERLAPPED *ov);
WSD_HIDDEN int wsp_harvest(struct wsp_socket *s);
WSD_HIDDEN struct wsp_req *wsp_req_new(struct wsp_socket *s, enum req_kind kind,
				       WSAOVERLAPPED *ov);
WSD_HIDDEN void wsp_req_release(struct wsp_req *r);
WSD_HIDDEN void wsp_reqs_orphan_all(struct wsp_socket *s);
WSD_HIDDEN int wsp_req_finish_call(struct wsp_req *r, uint32_t *bytes, int *err);
WSD_HIDDEN void wsp_wait_step(struct wsp_provider *pv, int64_t spin_end);
WSD_HIDDEN int wsp_req_wait(struct wsp_req *r, uint32_t *bytes);
WSD_HIDDEN int wsp_posted_error(struct wsp_socket *s, nd_status st);
WSD_HIDDEN int wsp_notify(SOCKET s, WSAOVERLAPPED *ov, uint32_t error, uint32_t bytes);
WSD_HIDDEN void wsp_abort_all(struct wsp_socket *s);
WSD_HIDDEN void wsp_provider_maybe_free(struct wsp_provider *pv);
WSD_HIDDEN void wsp_for_each_provider(void (*fn)(struct wsp_provider *, void *), void *arg);

/* mem.c */
WSD_HIDDEN struct rc_entry *wsp_rc_get(struct wsp_provider *pv, const void *buf, size_t len,
				       uint32_t flags, int *err);
WSD_HIDDEN void wsp_rc_put(struct wsp_provider *pv, struct rc_entry *e);
WSD_HIDDEN struct rc_entry *wsp_rc_find(struct wsp_provider *pv, uint64_t handle);
WSD_HIDDEN void wsp_rc_drop_all(struct wsp_provider *pv);
WSD_HIDDEN void wsp_rc_invalidate(const void *addr, size_t size);
WSD_HIDDEN void wsp_rdma_release_all(struct wsp_socket *s);

/* port.c */
WSD_HIDDEN int wsp_port_attach(struct wsd_port *port);
WSD_HIDDEN void wsp_port_detach(struct wsd_port *port);

#endif

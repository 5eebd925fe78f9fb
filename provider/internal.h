/* SPDX-License-Identifier: MIT */
/* Endpoint layer internals shared by the core and the transports. */
#ifndef WSD_PROVIDER_INTERNAL_H
#define WSD_PROVIDER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>
#include <time.h>

#include "wsd/nd.h"
#include "provider/engine.h"
#include "provider/private.h"

#define WSD_HIDDEN __attribute__((visibility("hidden")))

struct nd_transport;

#define WSD_MAX_TP 2   /* transports one adapter can drive: shm, verbs */

/*
 * One mutex per adapter guards every object made from it.  The data path
 * holds it only for bookkeeping, never across a sleep, and a single lock
 * means no lock order to get wrong between endpoints and CQs.
 */
struct nd_adapter {
	pthread_mutex_t lock;
	/* transports in the order connect tries them; "auto" has every one */
	const struct nd_transport *tp[WSD_MAX_TP];
	void *tpriv[WSD_MAX_TP];       /* each transport's device state */
	unsigned ntp;
	struct nd_adapter_info info;   /* the tightest limits of those transports */
	unsigned nobjects;             /* CQs, MRs, MWs, EPs, listeners alive */
	struct nd_ep *eps;             /* all endpoints */
	/* counters */
	uint64_t refused_access;       /* connection requests refused: no ptrace */
};

struct nd_cq {
	struct nd_adapter *ad;
	struct nd_result *ring;
	uint32_t depth, head, count;
	int efd;                       /* doorbell: peers and local progress */
	int epfd;                      /* efd + endpoints' liveness fds */
	struct wsd_engine engine;
	enum nd_cq_notify_type armed;  /* 0 when not armed */
	bool fired;
	_Atomic uint32_t sleeping;     /* a thread is in nd_cq_wait's sleep */
};

struct nd_mr {
	struct nd_adapter *ad;
	uintptr_t addr;
	size_t length;
	uint32_t flags;
	bool valid;                    /* false after a read with local invalidate */
	unsigned windows;              /* windows bound into it */
	void *tpriv[WSD_MAX_TP];       /* e.g. the verbs registration */
};

struct nd_mw {
	struct nd_adapter *ad;
	struct nd_ep *ep;              /* endpoint it is bound on, or NULL */
	struct nd_mr *mr;
	uint32_t slot;
	void *bind_context;
	struct nd_mw_descriptor desc;
	void *tpriv[WSD_MAX_TP];       /* e.g. the verbs window */
};

enum ep_state {
	EP_IDLE,
	EP_CONNECTED,
	EP_TERMINATED,                 /* error or disconnect; requests flushed */
};

/* An outbound work request: the caller's SGL is copied in at post time. */
struct nd_wr {
	enum nd_op op;
	uint32_t flags;
	void *context;
	uint32_t nsge;
	uint64_t length;               /* sum of the SGEs */
	uint64_t remote_addr;          /* read/write target address */
	uint64_t remote_token;
	struct nd_mw *mw;              /* bind, invalidate */
	struct nd_mr *mr;              /* bind */
	uint64_t bind_length;
	uint32_t bind_flags;
	/* progress */
	nd_status status;
	uint64_t done;                 /* bytes moved so far */
	uint64_t ring_start;           /* send: where its message starts in the ring */
	uint64_t ring_end;             /* send: ring position when fully consumed */
	bool started;                  /* send: header written */
	bool executed;
	bool deferred;
	struct nd_sge *sgl;            /* points into the endpoint's SGE pool */
};

struct nd_rwr {
	void *context;
	uint32_t nsge;
	uint64_t length;
	struct nd_sge *sgl;
};

struct nd_ep {
	struct nd_adapter *ad;
	const struct nd_transport *tp; /* chosen at connect/accept */
	unsigned tpi;                  /* its index in ad->tp[] */
	struct nd_ep *next;            /* adapter's list */
	struct nd_ep_attr attr;
	enum ep_state state;
	/* outbound queue: [sq_done, sq_exec) executed, [sq_exec, sq_tail) waiting */
	struct nd_wr *sq;
	struct nd_sge *sq_sge;
	uint64_t sq_done, sq_exec, sq_tail;
	/* inbound queue */
	struct nd_rwr *rq;
	struct nd_sge *rq_sge;
	uint64_t rq_head, rq_tail;
	unsigned windows_bound;
	unsigned char peer_data[256];
	size_t peer_len;
	/*
	 * connect: the listener's process must hold a TCP listener on the port
	 * dialled (SO_WSP_TCP_LISTENER).  shm checks it; verbs has no registry
	 * process to check and ignores it.
	 */
	bool owner_check;
	uint16_t owner_port;           /* ...on this TCP port, not the one dialled (0: that one) */
	/* our end of the TCP connection (SO_WSP_TCP_FROM; length 0: not known) */
	struct sockaddr_storage owner_from;
	socklen_t owner_from_len;
	/* shm: the peer's process, as the kernel named it at connect (0: not known) */
	uint32_t peer_pid;
	/*
	 * connect: a listener of another user may take us (shm, "copy": no
	 * access to each other's memory beyond the shared rings).
	 */
	bool other_users;
	int64_t peer_uid;              /* shm: the peer's uid at connect (-1: not known) */
	bool no_rdma;                  /* connected so (copy): read, write, bind refused */
	/*
	 * shm: made through the rendezvous directory (WSD_RENDEZVOUS_DIR), by
	 * copy, the peer's process not named (peer_pid 0)
	 */
	bool rendezvous;
	void *tpriv;                   /* the transport's connection state */
};

struct nd_listener {
	struct nd_adapter *ad;
	void *tpriv[WSD_MAX_TP];       /* NULL where that transport does not listen */
	_Atomic uint64_t refused[WSD_LREF_N];   /* the transports' refusals, by why */
	_Atomic bool other_users;      /* connectors of another user are taken (shm) */
};

struct nd_conn_request {
	struct nd_adapter *ad;
	unsigned tpi;                  /* the transport it came in on */
	bool rendezvous;               /* shm: it came through the rendezvous directory */
	unsigned char data[256];
	size_t len;
	void *tpriv;
};

/*
 * A transport: a capability table and an ops table.  Every op is filled;
 * one with nothing to do for a transport points at a shared wsd_tp_* stub.  Ops return >= 0 or -errno, except where they say.
 * The adapter lock is held around every op except listen_get, connect and
 * accept (which block).
 */
struct nd_transport {
	const char *name;
	/* device: fill caps from the device; -ENODEV when there is none */
	int (*adapter_open)(void **priv, struct nd_adapter_info *caps);
	void (*adapter_close)(void *priv);
	/*
	 * Set-up that may take milliseconds, begun once the adapter is open,
	 * on the thread nd_adapter_background is called on (the SPI's own);
	 * a transport that needs it before then does it itself.
	 */
	void (*background)(void *priv);
	/* memory: per-transport state of a region or window (may stay NULL) */
	int (*mr_register)(void *adpriv, struct nd_mr *mr, void **priv);
	void (*mr_deregister)(void *priv);
	int (*mw_create)(void *adpriv, void **priv);
	void (*mw_destroy)(void *priv);
	/* the token a bind of this window on ep will carry */
	uint64_t (*mw_token)(struct nd_ep *ep, void *mwpriv);
	int (*listen)(struct nd_listener *l, void **priv, const struct sockaddr *addr,
		      socklen_t len, int backlog);
	void (*listen_close)(void *priv);
	/*
	 * Name the program's TCP listener this one stands for (a descriptor
	 * number, or -1), for connectors that check it (nd_ep.owner_check).
	 */
	int (*listen_owner)(void *priv, int tcp_fd);
	/*
	 * Was the listener's usual rendezvous name held by another user, so
	 * that it took an alternate one?  -1 no; else the holder's uid.
	 */
	int (*listen_taken)(void *priv);
	/*
	 * Publish (on) or withdraw, for a connection the program accepted
	 * from peer, the entry that leads a connector of another network
	 * namespace to this listener (shm: the rendezvous directory);
	 * -EOPNOTSUPP where the transport has no such rendezvous.
	 */
	int (*listen_publish)(void *priv, const struct sockaddr *peer, socklen_t len, bool on);
	int (*listen_fd)(void *priv);
	/* returns 0, -ETIMEDOUT, or -errno; fills req */
	int (*listen_get)(struct nd_listener *l, void *priv, int timeout_ms,
			  struct nd_conn_request *req);
	void (*request_reject)(struct nd_conn_request *req);
	/*
	 * Return an nd_status (setup has more outcomes than errno says well);
	 * connect says ND_NOT_SUPPORTED when it cannot reach addr at all.
	 */
	nd_status (*connect)(struct nd_ep *ep, const struct sockaddr *addr, socklen_t len,
			     const void *priv, size_t plen, int timeout_ms);
	nd_status (*accept)(struct nd_ep *ep, struct nd_conn_request *req,
			    const void *priv, size_t plen, int timeout_ms);
	/* tell the peer the connection is over; called once, on terminate */
	void (*disconnect)(struct nd_ep *ep);
	void (*ep_free)(struct nd_ep *ep);
	/* move data: run outbound requests, consume inbound messages */
	void (*progress)(struct nd_ep *ep);
	/*
	 * Prepare to sleep on the CQ: ask the peer for a doorbell and report
	 * whether work is already there (1) or sleeping is safe (0).
	 */
	int (*arm)(struct nd_ep *ep, struct nd_cq *cq);
	/* does the peer's table hold a live window covering [addr, addr+len)? */
	nd_status (*remote_check)(struct nd_ep *ep, uint64_t addr, uint64_t len,
				  uint64_t token, uint32_t access);
	/*
	 * Hand a descriptor to the connected peer (0), or take the oldest one
	 * it handed us (the descriptor, -EAGAIN while none came), where the
	 * peer cannot take ours from our process itself (shm between users);
	 * -EOPNOTSUPP elsewhere.
	 */
	int (*fd_send)(struct nd_ep *ep, int fd);
	int (*fd_take)(struct nd_ep *ep);
};

/* Shared stubs: an op with nothing to do, and an op a transport lacks. */
WSD_HIDDEN int wsd_tp_none(void *adpriv, void **priv);
WSD_HIDDEN void wsd_tp_none_free(void *priv);
WSD_HIDDEN int wsd_tp_none_mr(void *adpriv, struct nd_mr *mr, void **priv);
WSD_HIDDEN int wsd_tp_no_owner(void *priv, int tcp_fd);
WSD_HIDDEN int wsd_tp_not_taken(void *priv);
WSD_HIDDEN int wsd_tp_no_publish(void *priv, const struct sockaddr *peer, socklen_t len, bool on);
WSD_HIDDEN int wsd_tp_no_fd_send(struct nd_ep *ep, int fd);
WSD_HIDDEN int wsd_tp_no_fd_take(struct nd_ep *ep);
WSD_HIDDEN nd_status wsd_tp_unchecked(struct nd_ep *ep, uint64_t addr, uint64_t len,
				      uint64_t token, uint32_t access);


/* core.c: each transport's background set-up (above), on the caller's thread. */
WSD_HIDDEN void nd_adapter_background(struct nd_adapter *ad);

WSD_HIDDEN extern const struct nd_transport wsd_transport_shm;
WSD_HIDDEN extern const struct nd_transport wsd_transport_verbs;
/* core.c: the tightest of two sets of limits, into a */
WSD_HIDDEN void wsd_caps_meet(struct nd_adapter_info *a, const struct nd_adapter_info *b);

/*
 * core.c, for the SPI (SO_WSP_TCP_LISTENER): name the TCP listener to every
 * transport that can (those that cannot are skipped); check it at connect.
 */
WSD_HIDDEN int wsd_listen_owner(struct nd_listener *l, int tcp_fd);
WSD_HIDDEN int wsd_listen_taken(struct nd_listener *l);
/* ...(SIO_WSP_PUBLISH, SIO_WSP_UNPUBLISH): every transport's listen_publish */
WSD_HIDDEN int wsd_listen_publish(struct nd_listener *l, const struct sockaddr *peer,
				  socklen_t len, bool on);
WSD_HIDDEN void wsd_ep_owner_check(struct nd_ep *ep, bool on, uint16_t tcp_port);
/* ...and our end of the TCP connection (NULL: not known) */
WSD_HIDDEN void wsd_ep_owner_from(struct nd_ep *ep, const struct sockaddr *from, socklen_t len);
/* ...(SO_WSP_PEER_USERS): pair with processes of other users, without their memory */
WSD_HIDDEN void wsd_listen_other_users(struct nd_listener *l, bool on);
WSD_HIDDEN void wsd_ep_other_users(struct nd_ep *ep, bool on);
/* ...(SIO_WSP_SEND_FD, SIO_WSP_RECV_FD): the transport's fd_send and fd_take */
WSD_HIDDEN int wsd_ep_fd_send(struct nd_ep *ep, int fd);
WSD_HIDDEN int wsd_ep_fd_take(struct nd_ep *ep);

/* status.c: -errno to nd_status, in one table */
WSD_HIDDEN nd_status wsd_nd_from_errno(int err);

/* ep.c: helpers the transports use (adapter lock held) */
WSD_HIDDEN void wsd_cq_push(struct nd_cq *cq, const struct nd_result *r);
WSD_HIDDEN bool wsd_cq_full(const struct nd_cq *cq);
WSD_HIDDEN void wsd_ep_terminate(struct nd_ep *ep);
WSD_HIDDEN void wsd_ep_drain(struct nd_ep *ep);
WSD_HIDDEN void wsd_mw_unbind(struct nd_mw *mw);
WSD_HIDDEN nd_status wsd_sge_check(const struct nd_sge *sge, uint32_t need);
WSD_HIDDEN void wsd_sge_to_iov(const struct nd_sge *sgl, uint32_t nsge, struct iovec *iov);
WSD_HIDDEN void wsd_mr_local_invalidate(struct nd_mr *mr);
WSD_HIDDEN void wsd_cq_solicited(struct nd_cq *cq);
WSD_HIDDEN int wsd_cq_attach(struct nd_cq *cq, int fd);
WSD_HIDDEN void wsd_cq_detach(struct nd_cq *cq, int fd);
WSD_HIDDEN void wsd_cq_kick(struct nd_cq *cq);

/* Monotonic clock, for deadlines and spin periods. */
static inline int64_t wsd_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline int64_t wsd_now_ms(void)
{
	return wsd_now_ns() / 1000000;
}

/* clock's time ns (>= 0) from now, as pthread's timed waits take it. */
static inline struct timespec wsd_timespec_in(clockid_t clock, int64_t ns)
{
	struct timespec ts;

	clock_gettime(clock, &ts);
	ts.tv_sec += (time_t)(ns / 1000000000);
	ts.tv_nsec += (long)(ns % 1000000000);
	if (ts.tv_nsec >= 1000000000) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000;
	}
	return ts;
}

/* The ms from now to a deadline (wsd_now_ms), 0 once past; -1 for none (-1). */
static inline int wsd_ms_left(int64_t deadline)
{
	int64_t left = deadline - wsd_now_ms();

	return deadline < 0 ? -1 : left > 0 ? (int)left : 0;
}

/* ep.c: every SGE of a list inside its region with the rights needed */
WSD_HIDDEN nd_status wsd_sgl_check(const struct nd_sge *sgl, uint32_t n, uint32_t need);

/* params.c: WSD_* runtime parameters */
struct wsd_param {
	const char *name;
	const char *type;
	const char *def;
	const char *help;
};
WSD_HIDDEN const struct wsd_param *wsd_params(size_t *count);
/* (wsd_param_long, wsd_param_str, wsd_spin_ns, wsd_debug: provider/private.h) */

/* the library's threads at work (wsd_threads_*): provider/private.h */

#endif

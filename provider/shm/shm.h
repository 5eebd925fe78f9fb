/* SPDX-License-Identifier: MIT */
/*
 * The same-host transport.  Two processes share one memfd holding two
 * halves, one per direction.  A half belongs to the process that produces
 * into its ring and owns its window table; the other process consumes the
 * ring and reads the table.  Read and Write move data with
 * process_vm_readv/writev after checking the owner's table.
 */
#ifndef WSD_PROVIDER_SHM_H
#define WSD_PROVIDER_SHM_H

#include <stdalign.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/un.h>

#include "provider/internal.h"

#define SHM_MAGIC 0x5753444eu  /* "WSDN" */
#define SHM_VERSION 3          /* 2: mutual proof before HELLO, sealed memfd;
				  3: PROVE_ACK names the TCP listener */
#define SHM_PRIV_MAX 200
#define SHM_NONCE 16
#define SHM_FDS_MAX 8          /* descriptors a peer of another user handed us, held */

/*
 * What a connector may ask the listener to map: the limits of
 * WSD_SHM_RING_SIZE and WSD_SHM_WINDOWS in the parameter table.
 */
#define SHM_RING_MIN 4096u
#define SHM_RING_MAX (64u << 20)
#define SHM_WINDOWS_MAX 65536u

/* A window as its owner publishes it.  seq is odd while being changed. */
struct shm_window {
	_Atomic uint64_t seq;
	uint64_t token;
	uint64_t base;
	uint64_t length;
	uint32_t access;          /* ND_OP_FLAG_ALLOW_*; 0 when unbound */
	uint32_t pad;
};

struct shm_half {
	alignas(64) _Atomic uint64_t head;   /* bytes produced */
	alignas(64) _Atomic uint64_t tail;   /* bytes consumed */
	alignas(64) _Atomic uint32_t cons_armed;  /* consumer sleeps: ring a bell on data */
	_Atomic uint32_t prod_armed;         /* producer sleeps: ring a bell on consume */
	_Atomic uint32_t closed;             /* owner ended the connection */
	_Atomic uint32_t fail_status;        /* consumer: message at fail_pos failed */
	_Atomic uint64_t fail_pos;
	/*
	 * Layout, written once by the creator.  Each side copies it into
	 * struct shm_conn at map time and uses only that copy; these stay
	 * here so a change by the peer can be noticed (shm_layout_intact).
	 */
	uint32_t ring_size;
	uint32_t nwindows;
	uint64_t ring_offset;                /* from the start of the half */
	uint64_t stamp_key;                  /* mixed into message stamps */
	struct shm_window windows[];
};

/*
 * Messages in a ring: a 32-byte header, the payload, padding to 32 bytes.
 * The consumer learns a message is there from its header's stamp (the ring
 * position mixed with the connection's key), published last, so the fast
 * path reads one place instead of the producer's head.  A message larger
 * than the free space is streamed: its header goes first, marked STREAM,
 * and the payload follows as room appears, tracked by head.
 */
struct shm_msg {
	_Atomic uint64_t stamp;
	uint32_t len;
	uint8_t op;                          /* ND_OP_SEND or ND_OP_SEND_INVALIDATE */
	uint8_t flags;                       /* SHM_MSG_* */
	uint16_t pad;
	uint64_t token;                      /* window to invalidate */
	uint64_t pad2;
};

#define SHM_MSG_SOLICIT 0x1u
#define SHM_MSG_STREAM  0x2u

#define SHM_FEAT_MEMBARRIER 0x1u   /* registered for global expedited membarrier */
/*
 * PROVE and PROVE_ACK between processes of different users, each taking
 * the other ("copy"): neither reads the other's memory, so there is no
 * nonce to read; the listener hands over a handle on its TCP listener
 * instead (O_PATH: it names the socket and allows nothing else), and
 * no descriptor of ours that the peer could block us with changes hands
 * (doorbells are bytes on the unix socket, sent without waiting).
 */
#define SHM_FEAT_COPY       0x2u

/*
 * Set-up, connector C and listener L, on L's abstract unix socket:
 *   C checks SO_PEERCRED (our uid), L checks SO_PEERCRED (our uid)
 *   (another uid, where both take other users: "copy", SHM_FEAT_COPY in
 *   PROVE and PROVE_ACK, no nonces; PROVE_ACK carries the TCP listener
 *   itself; HELLO and ACCEPT no eventfds)
 *   C -> L  PROVE      probe_addr: where C's nonce lies in C's memory
 *   L -> C  PROVE_ACK  nonce: C's nonce as L read it; probe_addr: L's nonce;
 *                      tcp_fd: L's TCP listener on the port, or -1
 *   C checks tcp_fd, when asked to (owner.c), then reads L's nonce
 *   C -> L  ECHO       nonce: L's nonce as C read it
 *   L -> C  PROVED
 *   C -> L  HELLO      + memfd (sealed) and C's two CQ eventfds
 *   L -> C  ACCEPT     + L's two CQ eventfds      (or REJECT)
 *   C -> L  RTU                                  (or ABORT)
 * Either side may answer REJECT (reason ND_ACCESS_DENIED when a check
 * failed) instead of the next step.  No descriptor moves and nothing is
 * mapped before PROVED.
 */
enum shm_ctl_type {
	SHM_HELLO = 1,
	SHM_ACCEPT,
	SHM_REJECT,
	SHM_RTU,
	SHM_ABORT,
	SHM_PROVE,
	SHM_PROVE_ACK,
	SHM_ECHO,
	SHM_PROVED,
};

/* Control messages on the connection's unix socket. */
struct shm_ctl {
	uint32_t magic;
	uint16_t version;
	uint16_t type;
	uint32_t ring_size;
	uint32_t nwindows;
	uint64_t probe_addr;
	uint32_t read_limit;
	uint32_t reason;                     /* nd_status for REJECT */
	uint32_t features;                   /* SHM_FEAT_* */
	uint32_t plen;
	int32_t tcp_fd;                      /* PROVE_ACK: the listener's TCP listener */
	uint8_t nonce[SHM_NONCE];
	uint8_t priv[SHM_PRIV_MAX];
};

/*
 * Everything here is private.  The peer can write the whole mapping at any
 * time, so a value read from it is checked against these fields before use
 * (data.c), and positions we own are kept here, not read back.
 */
struct shm_conn {
	int sock;                            /* liveness; EOF when the peer dies */
	int pidfd;
	pid_t peer_pid;
	uid_t peer_uid;
	bool copy;                           /* another user: no RDMA, bells on sock */
	bool rdv;                            /* through the rendezvous directory (rdv.c) */
	int fds[SHM_FDS_MAX];                /* copy: descriptors the peer handed us, in order */
	unsigned nfds;
	void *map;
	size_t map_len;
	struct shm_half *tx;                 /* mine: I produce, I own its windows */
	struct shm_half *rx;                 /* the peer's */
	uint8_t *tx_ring, *rx_ring;
	/* the layout, copied at map time */
	uint32_t ring_size;
	uint32_t nwindows;
	uint64_t ring_offset;
	uint64_t tx_key, rx_key;
	/* positions: tx_head is ours; tx_tail the last valid one the peer gave */
	uint64_t tx_head, tx_tail;
	uint64_t rx_tail;                    /* ours */
	int peer_in_efd, peer_out_efd;       /* the peer's CQ doorbells (-1: copy) */
	uint32_t peer_read_limit;
	int fast_bell;                       /* both sides use membarrier */
	/* receive side */
	int in_msg;
	struct shm_msg cur;                  /* header of the message being taken */
	uint64_t cur_start, cur_done;
	/* my windows, by slot */
	struct nd_mw **mws;
	uint32_t last_slot;                  /* hint for the peer's table */
};

/* conn.c */
WSD_HIDDEN size_t shm_half_size(uint32_t ring_size, uint32_t nwindows);
WSD_HIDDEN void shm_conn_free(struct shm_conn *c);
WSD_HIDDEN int shm_conn_map(struct shm_conn *c, int memfd, uint32_t ring_size,
			    uint32_t nwindows, int side, int init);
WSD_HIDDEN uint32_t shm_windows_param(void);
WSD_HIDDEN uint32_t shm_ring_size_param(void);

/* ctl.c: control messages on the unix socket */
WSD_HIDDEN int shm_send_ctl(int sock, const struct shm_ctl *m, const int *fds, int nfds);
WSD_HIDDEN int shm_recv_ctl(int sock, struct shm_ctl *m, int *fds, int nfds, int timeout_ms);
WSD_HIDDEN int shm_wait_readable(int fd, int timeout_ms);
WSD_HIDDEN void shm_close_fds(int *fds, int n);
WSD_HIDDEN void shm_reject(int sock, uint16_t type, nd_status why);
WSD_HIDDEN int shm_layout_ok(uint32_t ring_size, uint32_t nwindows);

/* proof.c: each side shows it may read the other's memory */
struct shm_nonce {
	uint8_t *page;                       /* a page of its own, at a random address */
	uint8_t *at;                         /* the nonce in it */
};
WSD_HIDDEN int shm_peer_uid_ok(int sock, pid_t *pid, uid_t *uid, bool other_ok, bool no_pid_ok);
WSD_HIDDEN int shm_nonce_new(struct shm_nonce *n);
WSD_HIDDEN void shm_nonce_free(struct shm_nonce *n);
WSD_HIDDEN int shm_nonce_read(pid_t pid, uint64_t addr, uint8_t out[SHM_NONCE]);
WSD_HIDDEN int shm_nonce_match(const struct shm_nonce *n, const uint8_t echo[SHM_NONCE]);
struct shm_owner;
WSD_HIDDEN int shm_prove_connector(int sock, pid_t pid, const struct shm_owner *owner,
				   int timeout_ms);
WSD_HIDDEN int shm_prove_copy(int sock, const struct shm_owner *owner, int timeout_ms);
WSD_HIDDEN int shm_check_eventfd(int fd);

/* owner.c: does the registry's process hold the TCP listener it stands for? */
struct shm_owner {
	uint8_t addr[16];                    /* the address dialled, IPv4 mapped */
	unsigned port;
	/*
	 * Our own end of the TCP connection (SO_WSP_TCP_FROM), IPv4 mapped;
	 * from_port 0: not known.  A connection handed over in place of a
	 * listener must have it as its other end (shm_owner_check_fd).
	 */
	uint8_t from[16];
	unsigned from_port;
};
WSD_HIDDEN int shm_owner_want(const struct sockaddr *addr, socklen_t len, struct shm_owner *o);
WSD_HIDDEN int shm_owner_check(pid_t pid, int fd, const struct shm_owner *o);
/*
 * ...where the listener handed over fd (copy), a handle on its TCP
 * listener, or on the other end of our connection (o->from)
 */
WSD_HIDDEN int shm_owner_check_fd(int fd, const struct shm_owner *o);
/*
 * unix_diag: the uid of the socket that holds the name un (-2 when the
 * kernel does not say); up to max alternate registry names
 * "wsd-nd.NAME_PORT.INO.RANDOM" held by our uid whose INO is a TCP
 * listener for o: their number, or -errno; whether our uid holds one
 * for port and the TCP listener ino already.
 */
WSD_HIDDEN int shm_name_holder(const struct sockaddr_un *un, socklen_t unlen);
WSD_HIDDEN int shm_alt_names(unsigned name_port, const struct shm_owner *o,
			     struct sockaddr_un *out, socklen_t *outlen, int max);
WSD_HIDDEN bool shm_alt_held(unsigned port, unsigned long ino);

/* listen.c: the registry socket and the requests proving themselves on it */
struct shm_request {
	int sock;
	int memfd, in_efd, out_efd;
	pid_t pid;
	uid_t uid;
	bool copy;
	bool rdv;                            /* came through the rendezvous directory */
	struct shm_ctl hello;
};
WSD_HIDDEN int shm_listen(struct nd_listener *l, void **priv, const struct sockaddr *addr,
			  socklen_t len, int backlog);
WSD_HIDDEN void shm_listen_close(void *priv);
WSD_HIDDEN int shm_listen_owner(void *priv, int tcp_fd);
WSD_HIDDEN int shm_listen_taken(void *priv);
WSD_HIDDEN int shm_listen_publish(void *priv, const struct sockaddr *peer, socklen_t len, bool on);
WSD_HIDDEN int shm_listen_fd(void *priv);
WSD_HIDDEN int shm_listen_get(struct nd_listener *l, void *priv, int timeout_ms,
			      struct nd_conn_request *req);
WSD_HIDDEN void shm_request_reject(struct nd_conn_request *req);
WSD_HIDDEN void shm_request_free(struct shm_request *r);
WSD_HIDDEN int shm_addr_port(const struct sockaddr *addr, socklen_t len);
WSD_HIDDEN int shm_sock_name(const struct sockaddr *addr, socklen_t len,
			     struct sockaddr_un *un, socklen_t *unlen);

/* rdv.c: the rendezvous directory, across network namespaces */
WSD_HIDDEN int shm_rdv_dir(char *dir, size_t n);
WSD_HIDDEN int shm_rdv_entry(const struct sockaddr *a, socklen_t len, char *name, size_t n);
WSD_HIDDEN int shm_rdv_listen(unsigned port, int backlog, char *path, size_t n);
WSD_HIDDEN void shm_rdv_unlisten(const char *path);
WSD_HIDDEN int shm_rdv_publish(const char *lpath, const struct sockaddr *peer, socklen_t len,
			       bool on);
WSD_HIDDEN int shm_rdv_find(const struct sockaddr *from, socklen_t len, int64_t deadline,
			    uid_t *owner);

/* conn.c: the sleeper's half of the doorbell protocol */
WSD_HIDDEN uint32_t shm_features(void);
WSD_HIDDEN void shm_sleeper_barrier(const struct shm_conn *c);

/* data.c */
WSD_HIDDEN void shm_progress(struct nd_ep *ep);
WSD_HIDDEN int shm_arm(struct nd_ep *ep, struct nd_cq *cq);
WSD_HIDDEN void shm_disconnect(struct nd_ep *ep);
WSD_HIDDEN int shm_mw_publish(struct nd_ep *ep, struct nd_mw *mw);
WSD_HIDDEN void shm_mw_revoke(struct nd_ep *ep, struct nd_mw *mw);
WSD_HIDDEN int shm_layout_intact(const struct shm_conn *c);
WSD_HIDDEN nd_status shm_remote_check(struct nd_ep *ep, uint64_t addr, uint64_t len,
				      uint64_t token, uint32_t access);
WSD_HIDDEN int shm_fd_send(struct nd_ep *ep, int fd);
WSD_HIDDEN int shm_fd_take(struct nd_ep *ep);

#endif

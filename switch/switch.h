/* SPDX-License-Identifier: MIT */
/*
 * The switch: the socket layer of libwsd-preload.so, which `wsd run`
 * preloads.  Internal to it; it calls the provider in libwsd.so.
 *
 * Every AF_INET/AF_INET6 stream socket the program creates or accepts gets a
 * struct wsd_sock, found from its fd (and from every dup of it).  It starts
 * and may stay as the plain kernel TCP connection.  When both ends run wsd,
 * the connecting side asks the listening side's switch (through the SPI, on
 * the transport the provider picks) to take the connection over; each
 * direction then switches at a byte count its sender announces, and data
 * moves through a ring in the receiver's memory that the sender fills with
 * WSPRdmaWrite (small) or by zero copy through WSPRdmaRead (large).  The
 * kernel socket stays open as the visible fd, the liveness signal and the
 * doorbell.  wsd-protocol(7) is the reference for what goes on the wire.
 *
 * Files: real.c (the C library's own calls), fdtab.c (fd -> sock), sock.c
 * (socket lifecycle calls), stdio.c (sockets under stdio streams), proc.c
 * (fork, exec, spawn), io.c (data calls), copy.c (sendfile, splice),
 * raw.c (syscall()), the readiness calls: poll.c (poll, select), epoll.c
 * (epoll's shadow, epoll_ctl), epoll_wait.c (epoll's waits); the ring
 * protocol (sess_int.h): cw.c (control words, RDMA puts, failures),
 * slot.c (the session object), bell.c (doorbells), proof.c (the switch to
 * the ring, the proof), back.c (back to the stream, fork and exec), tx.c
 * (send), rx.c (receive), zc.c (zero copy), wait.c (sleeping, spinning),
 * ready.c (readiness), close.c (shutdown, close); upgrade.c (registry and
 * handshake), guard.c (keeping sockets on TCP), policy.c (the policy file,
 * wsd.conf(5)), stat.c (counters published for `wsd stat`).
 */
#ifndef WSD_SWITCH_H
#define WSD_SWITCH_H

#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "wsd/wsp.h"
#include "switch/stat.h"

#define EXPORT __attribute__((visibility("default")))

/* ---- the C library's own calls (real.c) ------------------------------------ */

struct real_calls {
	int (*socket)(int, int, int);
	int (*connect)(int, const struct sockaddr *, socklen_t);
	int (*bind)(int, const struct sockaddr *, socklen_t);
	int (*listen)(int, int);
	int (*accept)(int, struct sockaddr *, socklen_t *);
	int (*accept4)(int, struct sockaddr *, socklen_t *, int);
	int (*close)(int);
	int (*shutdown)(int, int);
	ssize_t (*read)(int, void *, size_t);
	ssize_t (*write)(int, const void *, size_t);
	ssize_t (*readv)(int, const struct iovec *, int);
	ssize_t (*writev)(int, const struct iovec *, int);
	ssize_t (*recv)(int, void *, size_t, int);
	ssize_t (*send)(int, const void *, size_t, int);
	ssize_t (*recvfrom)(int, void *, size_t, int, struct sockaddr *, socklen_t *);
	ssize_t (*sendto)(int, const void *, size_t, int, const struct sockaddr *, socklen_t);
	ssize_t (*recvmsg)(int, struct msghdr *, int);
	ssize_t (*sendmsg)(int, const struct msghdr *, int);
	ssize_t (*sendfile)(int, int, off_t *, size_t);
	ssize_t (*splice)(int, off_t *, int, off_t *, size_t, unsigned int);
	int (*poll)(struct pollfd *, nfds_t, int);
	int (*ppoll)(struct pollfd *, nfds_t, const struct timespec *, const sigset_t *);
	int (*select)(int, fd_set *, fd_set *, fd_set *, struct timeval *);
	int (*pselect)(int, fd_set *, fd_set *, fd_set *, const struct timespec *,
		       const sigset_t *);
	int (*epoll_create)(int);
	int (*epoll_create1)(int);
	int (*epoll_ctl)(int, int, int, struct epoll_event *);
	int (*epoll_wait)(int, struct epoll_event *, int, int);
	int (*epoll_pwait)(int, struct epoll_event *, int, int, const sigset_t *);
	int (*dup)(int);
	int (*dup2)(int, int);
	int (*dup3)(int, int, int);
	int (*fcntl)(int, int, ...);
	int (*ioctl)(int, unsigned long, ...);
	pid_t (*fork)(void);
	int (*setsockopt)(int, int, int, const void *, socklen_t);
	int (*getsockopt)(int, int, int, void *, socklen_t *);
	/* the data calls beyond the socket API's (io.c) */
	int (*sendmmsg)(int, struct mmsghdr *, unsigned int, int);
	int (*recvmmsg)(int, struct mmsghdr *, unsigned int, int, struct timespec *);
	ssize_t (*preadv64)(int, const struct iovec *, int, off64_t);
	ssize_t (*pwritev64)(int, const struct iovec *, int, off64_t);
	ssize_t (*preadv64v2)(int, const struct iovec *, int, off64_t, int);
	ssize_t (*pwritev64v2)(int, const struct iovec *, int, off64_t, int);
	int (*vdprintf)(int, const char *, va_list);
	int (*__vdprintf_chk)(int, int, const char *, va_list);
};

extern struct real_calls real;
/* The next definition of name after ours (dlsym RTLD_NEXT); aborts when there is none. */
void *wsd_real_next(const char *name);
/* Fill `real` (once; safe from any interposed call, before constructors). */
void wsd_real_init(void);

/* ---- per-socket state -------------------------------------------------------- */

enum wsd_path { PATH_TCP, PATH_SHM, PATH_VERBS };

/* Why a socket is not (yet) accelerated: wsd stat shows these; wsd-protocol(7). */
enum wsd_reason {
	R_NONE = 0,        /* accelerated */
	R_PENDING,         /* not upgraded yet: upgrades lazily, after some traffic */
	R_LISTENER,        /* a listening socket: its connections are upgraded */
	R_DISABLED,        /* WSD_SWITCH=0 */
	R_PEER_PLAIN,      /* the peer answered nothing: no wsd there */
	R_REFUSED,         /* the peer's switch refused (it sent its reason) */
	R_NO_MATCH,        /* the peer's switch found no connection with this 4-tuple */
	R_ACCESS,          /* the transport declined: other user, no ptrace right */
	R_PROVIDER,        /* the provider failed (no transport, no memory) */
	R_FORKED,          /* upgraded before fork; the child's copy is detached */
	R_UNSUPPORTED,     /* a socket option or use the switch does not carry */
	R_PROTOCOL,        /* the peer spoke a different protocol version */
	R_BACK,            /* moved back to the kernel stream for fork or exec */
	R_AUTH,            /* the ring's peer did not prove it holds the TCP connection */
	R_BUSY,            /* the peer's registry had too many requests in hand */
	R_IO_URING,        /* the process made an io_uring of its own: no more upgrades */
	R_BYPASS,          /* a byte moved by a call the switch did not see: reset */
	R_RESOURCES,       /* descriptors or memory near the program's limits */
	R_SHARED,          /* the peer's listener is shared with processes it forked */
	R_MOVED,           /* ...and one of those has the connection: ask its registry */
	R_CLOSED,          /* the program closed it before its upgrade was asked */
	R_POLICY,          /* a rule of the policy file (wsd.conf(5)), ours or the peer's */
	R_PEER_LIMIT,      /* the asking process or its user already had its share in hand */
	R_TIMEOUT,         /* a rendezvous or proof with another process missed its deadline */
	R_PAGE,            /* the fork children's shared page was full, held or corrupt */
	R_NREASONS
};

/*
 * Its name, as wsd stat shows it (the switch's debug lines and the wsd
 * command share it).  Indexed by the enum: the assertion fails the build
 * when the last reason has no name; one missing in the middle reads "?".
 */
static inline const char *wsd_reason_name(unsigned r)
{
	static const char *const names[] = {
		[R_NONE] = "none",
		[R_PENDING] = "pending",
		[R_LISTENER] = "listener",
		[R_DISABLED] = "disabled",
		[R_PEER_PLAIN] = "peer-plain",
		[R_REFUSED] = "refused",
		[R_NO_MATCH] = "no-match",
		[R_ACCESS] = "access",
		[R_PROVIDER] = "provider",
		[R_FORKED] = "forked",
		[R_UNSUPPORTED] = "unsupported",
		[R_PROTOCOL] = "protocol",
		[R_BACK] = "back",
		[R_AUTH] = "auth",
		[R_BUSY] = "busy",
		[R_IO_URING] = "io-uring",
		[R_BYPASS] = "bypass",
		[R_RESOURCES] = "resources",
		[R_SHARED] = "shared",
		[R_MOVED] = "moved",
		[R_CLOSED] = "closed",
		[R_POLICY] = "policy",
		[R_PEER_LIMIT] = "peer-limit",
		[R_TIMEOUT] = "timeout",
		[R_PAGE] = "page",
	};
	_Static_assert(sizeof(names) / sizeof(names[0]) == R_NREASONS, "a wsd_reason without a name");

	return r < R_NREASONS && names[r] ? names[r] : "?";
}

/* Rx/tx direction mode: see proof.c and back.c. */
/*
 * A direction's state.  The receiver's goes TCP, DRAIN (stream bytes up to
 * the peer's SWITCH point), PROOF (the peer's proof on the stream), RING.
 */
enum { DIR_TCP = 0, DIR_DRAIN, DIR_RING, DIR_PROOF, DIR_PROV };

struct wsd_session;

struct wsd_reg_page;   /* registry.c */

struct wsd_sock {
	_Atomic int refs;            /* fds naming it, plus temporary holders */
	_Atomic int nfds;            /* fds naming it */
	int fd;                      /* one of those fds, for real calls */
	int family;
	bool listening;
	/*
	 * Its network namespace's SO_NETNS_COOKIE, 0 while not asked: a
	 * listener's once, at its first accept; an accepted socket's is its
	 * listener's (the kernel makes it in that namespace).
	 */
	_Atomic uint64_t netns;
	/*
	 * A listener a fork child inherited: its registry is the parent's, so
	 * this process asks for one of its own at an accept, from reg_try_ms
	 */
	bool reg_lost;
	int64_t reg_try_ms;
	/*
	 * Its registration's page, which a fork child shares (accept.c): the
	 * count of processes that accepted on it besides the registering one
	 * (reg_counted once this process is among them), and which process's
	 * registry each connection they accepted is to be asked of.
	 */
	struct wsd_reg_page *reg_page;
	bool reg_counted;
	/*
	 * A connection a fork child accepted on such a listener and noted in
	 * its page (reg_page is then the listener's): the slot's value, and
	 * the process that noted it (it forgets the slot at the last close).
	 */
	uint64_t reg_noted;
	pid_t reg_noted_pid;
	/*
	 * A connection accepted on a listener with a page (reg_page is that
	 * page) and inherited at fork: this child may take it over at its
	 * first data call (wsd_upgrade_handoff; once taken, reg_noted says
	 * where).  data_called: this process has sent or received on it (a
	 * peek does not count: accept.c).
	 */
	bool handoff, data_called;
	/*
	 * An accepted connection whose entry in the rendezvous directory is
	 * published (registry_publish), until it upgrades or closes.
	 */
	bool rdv_published;
	pid_t accepted_by;           /* the process whose accept made it (0: not accepted) */
	/*
	 * A fork child's registry of its own for the connections it accepts
	 * on this listener while its parent keeps the port's: the provider
	 * port it took (0: none).
	 */
	uint16_t side_port;
	/* a connection whose peer's registry said another process has it: that one's port */
	uint16_t moved_port;
	bool nonblock;               /* O_NONBLOCK on the open file description */
	bool connected_side;         /* created by connect (the side that upgrades) */
	bool chan_looked, chan_known;   /* a channel to the peer: looked for, found */
	bool routed;                 /* moved_port is probe_routed's guess, not an answer's */
	bool route_looked;           /* probe_routed asked (once) */
	uint64_t created_ns;
	/* the peer answered busy: asked again from this time (CLOCK_MONOTONIC_COARSE ns), busy_tries times so far */
	uint64_t retry_ns;
	uint8_t busy_tries;
	bool shared_asked;           /* of those, one answered shared (probe_shared_lost at its close) */

	pthread_mutex_t mu;          /* state below, session attach */
	pthread_mutex_t tx_lock;     /* one sender at a time (as the socket lock) */
	pthread_mutex_t rx_lock;     /* one receiver at a time */

	/* byte counts on the kernel stream (data only, not doorbells) */
	uint64_t tcp_tx, tcp_rx;
	int tx_mode, rx_mode;
	uint64_t rx_switch_at;       /* DRAIN: TCP data ends at this count */
	/* PROOF (rx_lock): bytes of the peer's proof taken from the stream,
	 * since when (ms) part of it waits for the rest */
	uint8_t proof_got;
	int64_t proof_since;
	/* the peer proved it holds this TCP connection: until then the
	 * listening side sends nothing by ring (set under rx_lock) */
	_Atomic bool proven;
	bool tx_shut, rx_shut;       /* shutdown() by the application */
	bool peer_fin;               /* the peer's FIN record was consumed */
	bool sent_after_close;       /* the one send a closed peer's kernel would take */
	bool kernel_fin;
	bool nodelay_forced;         /* TCP_NODELAY set by us for the doorbells */
	int app_nodelay;             /* what the application set (getsockopt answers it) */
	bool nodelay_known;          /* app_nodelay is the socket's, not yet read (made here, or set) */             /* both FINs went by ring: the stream was shut too */

	/* blocking-wait bookkeeping (mu) */
	int plain_waiters;           /* inside a real blocking recv before the switch */
	int sleepers;                /* inside a doorbell wait */
	int rx_sleepers;             /* the receives among them (proof_ours) */
	bool rx_ready_sent;
	/*
	 * The program closed its last fd: a session that attaches now never
	 * says rx_ready, as the close that would collect the peer's proof
	 * and bells from the stream has run (wsd-protocol(7), Closing).
	 */
	bool closing;

	bool accel;                  /* data may move outside the kernel stream */
	bool policy_ok;              /* mu: the policy file let it upgrade (upgrade.c) */
	bool no_upgrade;             /* never upgrade: why_not says why */
	uint8_t why_not;             /* enum wsd_reason for no_upgrade */
	bool detached;               /* a fork child's copy of an upgraded socket */
	/*
	 * The last fd naming it closed: its number may be another file's
	 * now, so a thread still inside a call on it (a sleeping recv) must
	 * not use s->fd again (it returns EBADF).
	 */
	_Atomic bool closed;
	bool tcp_eof, tcp_err;       /* the kernel stream ended (after the switch) */
	/* BACK (wsd-protocol(7)): a direction that went back to the stream for good */
	bool tx_back;                /* tx_lock */
	bool rx_back;                /* rx_lock */
	uint64_t rx_skip;            /* rx_lock: the peer's doorbells still on the stream */
	uint64_t rx_skip_end;        /* rx_lock: the number of the last of them */
	struct wsd_prefix *pre;      /* bytes to deliver before the stream's (fork, exec) */
	int tcp_errno;
	_Atomic int upgrade_state;   /* UP_* */
	bool first_waited;           /* the first receive looked for a posted OPEN (once) */
	struct wsd_session *sess;    /* set once established; freed with the sock */
	/*
	 * First bytes sent before the peer answered (tx_lock; connect.c,
	 * tx.c): the session on the peer's grant, what went into its ring
	 * (a copy, for the stream if declined), and the kernel's count of
	 * bytes written when the SWITCH went there.
	 */
	struct wsd_session *prov;
	bool prov_hold;              /* ...or held here, the OPEN sent by message (open.c) */
	bool hold_looked;            /* open_hold_begin looked for this OPEN (once) */
	/*
	 * An OPEN it posted in the peer's mailbox went unread and was taken
	 * back: the peer looks there only at its accept and first receive, so
	 * the next asks by message (open.c, box_look).
	 */
	bool box_missed;
	uint8_t *prov_buf;
	uint32_t prov_len;
	int64_t prov_k0;

	/* the 4-tuple, filled when known (peer: from connect() already) */
	int pre_fd;                  /* the prefix's memfd (-1) */
	bool tuple_known;
	bool peer_known;             /* peer: exactly getpeername's (connect's or accept's) */
	struct sockaddr_storage local, peer;

	struct wsd_stat_slot *stat;  /* this socket's published counters */
	/* epoll sets this socket was added to (epoll.c; guarded by mu) */
	struct wsd_epitem *ep_items;
	/* of those, the sets that rely on its doorbell alone (parked there:
	 * epoll_wait.c no longer looks at its ring until a kernel event) */
	_Atomic int ep_parked;
	/* bumped each time a recv/send returns EAGAIN: edge-triggered epoll
	 * reports an accelerated socket again only after the application ran
	 * dry (or a doorbell arrived) */
	_Atomic uint32_t rx_eagain, tx_eagain;
};

enum { UP_NONE = 0, UP_QUEUED, UP_RUNNING, UP_DONE, UP_FAILED };

/* Moved off the kernel stream in at least one direction, in this process. */
static inline bool wsd_sock_upgraded(const struct wsd_sock *s)
{
	return s->sess && !s->detached && !(s->rx_back && s->tx_back);
}

/* ---- data calls (io.c, copy.c) ------------------------------------------------ */

/* The socket behind fd when it carries data through the session (a reference), or NULL. */
struct wsd_sock *wsd_data_sock(int fd);
/*
 * One receive through the session whatever the flags (MSG_OOB and
 * MSG_ERRQUEUE to the kernel, MSG_TRUNC discarding, a flag the ring does
 * not carry after the way back to TCP): bytes or -errno.
 */
ssize_t wsd_io_recv(struct wsd_sock *s, struct msghdr *m, int flags);

/* ---- fd table (fdtab.c) ------------------------------------------------------ */

/* The sock an fd names, with a reference (wsd_sock_put), or NULL. */
struct wsd_sock *wsd_fd_get(int fd);
/* Point fd at s (takes a reference).  Replaces what fd named. */
void wsd_fd_set(int fd, struct wsd_sock *s);
/* Forget fd; returns the sock it named (its reference now the caller's). */
struct wsd_sock *wsd_fd_take(int fd);
/* Call fn for every fd naming a sock (holding fd-table lock: fn must not block). */
void wsd_fd_each(void (*fn)(int fd, struct wsd_sock *s, void *arg), void *arg);
/* True when any fd names a sock: the interposed calls' fast exit. */
bool wsd_fd_any(void);
/* fork, in the child: the table's lock may have been held by a lost thread. */
void wsd_fd_atfork_child(void);

/*
 * Sockets noted under the fd table's lock (wsd_fd_each's callback), each
 * held, for work that takes other locks afterwards; a sock with several
 * fds may be noted more than once.  A failed allocation drops the note.
 */
struct wsd_sock_list {
	struct wsd_sock **socks;
	size_t n, cap;
};
void wsd_sock_list_add(struct wsd_sock_list *l, struct wsd_sock *s);
void wsd_sock_list_free(struct wsd_sock_list *l);

struct wsd_sock *wsd_sock_new(int fd, int family);
/*
 * Accepted by this process, whose program has not sent or received on it
 * yet (a peek does not count): a handler it forks may be the one to serve
 * it (proc.c), and until then it does not move (slot.c, ready_deferred).
 */
bool wsd_sock_unserved(const struct wsd_sock *s);
/* A new wsd stat slot for a socket on fd, reason pending (never NULL: stat.h). */
struct wsd_stat_slot *wsd_sock_slot(int fd);
void wsd_sock_hold(struct wsd_sock *s);
void wsd_sock_put(struct wsd_sock *s);
/* Another fd of the same socket, after s->fd closed (or -1). */
void wsd_sock_refd(struct wsd_sock *s, int closed_fd);

/* ---- the session (the ring protocol's files: sess_int.h) --------------------- */

/* True when the socket carries data outside the kernel stream (either way). */
bool wsd_sock_accel(struct wsd_sock *s);
/* An accelerated socket whose sending side is (still, or again) the stream. */
bool wsd_sock_tx_stream(struct wsd_sock *s);

/*
 * The data calls.  buf/iov as the application gave them; flags MSG_*.
 * Return bytes or -errno (the edge sets errno).  Plain sockets go straight
 * to the kernel; these handle every mode.
 */
ssize_t wsd_sock_send(struct wsd_sock *s, const struct iovec *iov, int iovcnt, int flags);
ssize_t wsd_sock_recv(struct wsd_sock *s, const struct iovec *iov, int iovcnt, int flags);

/*
 * Readiness of an accelerated socket as the application would see it from
 * the kernel: POLLIN, POLLOUT, POLLHUP, POLLRDHUP, POLLERR, within `events`
 * (POLLHUP/POLLERR always).  kernel_revents: what a real poll of the fd
 * for POLLIN said (doorbells, the TCP phase's data, EOF, errors).  With
 * arm, a socket that is not ready asks its peer to make the fd readable
 * when it becomes so (a doorbell) and drops doorbells already read.
 */
short wsd_sock_revents(struct wsd_sock *s, short events, short kernel_revents, bool arm);

/*
 * Edge-triggered epoll's view: where the ring's complete data ends (moves
 * on each arrival; 0 while the kernel stream carries the data and makes its
 * own edges), and a request for doorbells on the next arrival or room even
 * when the socket is ready now.
 */
uint64_t wsd_sock_rx_mark(struct wsd_sock *s);

/*
 * Set (lowered) by wsd_sock_revents() when a socket's state must be looked
 * at again within this many ms though nothing wakes the wait (a wait for
 * room both ends share); -1 for none.  The readiness calls reset it before
 * they look, and bound their sleep by it.
 */
extern __thread int wsd_recheck_ms;
void wsd_sock_arm(struct wsd_sock *s, short events);
/* A kernel event came for s: its arm may be spent (a bell), so the next arm is written anew. */
void wsd_sock_bell_seen(struct wsd_sock *s);
/*
 * Armed for data, the arm not rung, nothing in the ring: only a doorbell
 * (a kernel event) or a call on s itself can make s readable.  *ready:
 * its look found s readable (it may read the peer's proof and find data
 * behind it, a wake-up no doorbell repeats: the caller reports it).
 */
bool wsd_sock_parkable(struct wsd_sock *s, bool *ready);

/*
 * A readiness wait (poll, select, epoll) on accelerated sockets spins a
 * while before it sleeps, as a blocking receive does: wsd_spin_until()
 * gives the end of that spin (WSD_SPIN_US, at most max_ns away; 0 for no
 * spin), and wsd_spin_burst() pauses briefly and says whether time is left.
 */
int64_t wsd_spin_until(int64_t max_ns);
bool wsd_spin_burst(int64_t end);

/* FIONREAD of an accelerated socket, or -1 when the kernel's answer holds. */
long wsd_sock_nread(struct wsd_sock *s);

/* shutdown()/close() of an accelerated socket; the last close frees it. */
int wsd_sock_shutdown(struct wsd_sock *s, int how);
void wsd_sock_closed(struct wsd_sock *s);   /* the last fd went: tell the peer */

/*
 * fork or exec is coming: move both directions of an upgraded socket back
 * to the kernel stream (the peer's unread data is kept in s->pre, which a
 * fork shares and an exec passes on).  0 when the socket is plain TCP now;
 * -ETIMEDOUT (the peer's switch did not answer within ms) or -errno, and
 * the session goes on as it was.
 */
int wsd_sock_downgrade(struct wsd_sock *s, int ms);
/*
 * After wsd_sock_downgrade, for a program that reads the kernel socket
 * itself (io_uring): the peer's doorbells still on the stream are read (ms
 * at most); 0 when the stream's next byte is data.  Otherwise (bytes that
 * came by ring unread, bells that never came, a socket not back) the
 * connection is reset with reason why, and -ECONNRESET.
 */
int wsd_sock_bare(struct wsd_sock *s, enum wsd_reason why, int ms);
/* A plain socket's peer doorbells still to skip go into s->pre (before fork). */
int wsd_sock_share_skip(struct wsd_sock *s);

/* exec is coming: close the provider connection now (its windows die), keep the memory. */
void wsd_session_abandon(struct wsd_session *ss);

/* The session's share of freeing a sock. */
void wsd_session_free(struct wsd_session *ss);

/* ---- the prefix: bytes a socket delivers before its stream's (prefix.c) ----------- */

/*
 * Shared memory (a memfd): a fork child shares it with its parent, so each
 * byte is read once, as from the kernel's queue; an exec passes the memfd
 * on (WSD_INHERIT).  skip: the peer's doorbells on the stream before its
 * data.
 */
struct wsd_prefix {
	pthread_mutex_t mu;          /* process-shared, robust */
	uint64_t len, off, skip;
	_Atomic uint32_t done;       /* nothing left: read the stream */
	uint32_t bells_end;          /* the number of the last bell to skip (low bits) */
	uint8_t data[];
};

struct wsd_prefix *wsd_prefix_new(const void *data, size_t len, uint64_t skip, int *fd);
struct wsd_prefix *wsd_prefix_open(int fd);
void wsd_prefix_close(struct wsd_prefix *p);
void wsd_prefix_lock(struct wsd_prefix *p);
void wsd_prefix_unlock(struct wsd_prefix *p);
/* Data left to deliver (a hint: no lock). */
bool wsd_prefix_has_data(const struct wsd_prefix *p);
/* After exec: adopt the sockets the old image passed in WSD_INHERIT. */
void wsd_prefix_inherit(void);
/* Before exec: the environment variable naming the prefixes to pass, or NULL. */
char *wsd_prefix_env(void);

/* ---- readiness calls (poll.c, epoll.c, epoll_wait.c) -------------------------- */

/*
 * One more each time a socket's receiving side is about to carry the
 * switch's own bytes on its stream (its rx_ready published: the peer's
 * switch point, proof and doorbells follow).  A poll or select that went
 * to the kernel with the socket still plain compares it after waking: a
 * change means what woke it may not be data (poll.c).  The socket is
 * marked accelerated before the count moves (slot.c, publish_rx_ready):
 * a wait that read the moved count finds it so.
 */
extern _Atomic uint64_t wsd_accel_gen;
/* s was accelerated, or became plain, or its sending side moved: re-register it in epoll sets. */
void wsd_poll_sock_accelerated(struct wsd_sock *s);
/* ...with s->mu held (publish_rx_ready: before the peer may switch). */
void wsd_poll_sock_accelerated_locked(struct wsd_sock *s);
/*
 * s->mu held.  Its doorbells were read by a call that does not arm again
 * (a sender's or a blocking receiver's wait): the sets it is parked in,
 * and those a thread sleeps on or that are watched through their fd,
 * look at it once more.
 */
void wsd_poll_sock_unpark(struct wsd_sock *s);
/*
 * s ran dry: whether it must stay armed for the next arrival, because a
 * set holding it has a thread asleep in the kernel, is watched through
 * its own fd (inside another set, or in poll), or is parked on it.
 */
bool wsd_poll_sock_watched(struct wsd_sock *s);
/* fd is given to poll or select, or added to a set not ours: if it is an
 * epoll set, its readiness is watched through its fd from now on. */
void wsd_poll_fd_watched(int fd);
/* Whether any epoll set of ours exists (a hint: no lock). */
bool wsd_poll_sets_any(void);
/* s's last fd closed: forget its epoll registrations. */
void wsd_poll_sock_gone(struct wsd_sock *s);
/* fd was closed (any fd): forget it if it was an epoll set. */
void wsd_poll_fd_closed(int fd);
/* The same for each fd from lo to hi (close_range, closefrom). */
void wsd_poll_fds_closed(unsigned lo, unsigned hi);
/* newfd now names what oldfd names (dup*, F_DUPFD*): an epoll set too. */
void wsd_poll_fd_dup(int oldfd, int newfd);
/* fork, in the child: the shadow's locks may have been held by a lost thread. */
void wsd_poll_atfork_child(void);

/* ---- upgrade (upgrade.c) ----------------------------------------------------- */

/* listen() succeeded on s: register its port so peers can find us. */
void wsd_upgrade_listen(struct wsd_sock *s);
/* The listener closes. */
void wsd_upgrade_unlisten(struct wsd_sock *s);
/* An accept on l, a listener inherited at fork: a registry of this process's own, maybe. */
void wsd_upgrade_relisten(struct wsd_sock *l);
/* s accepted on l, which has a registry of this fork child's own (side_port): noted. */
void wsd_upgrade_side_accepted(struct wsd_sock *l, struct wsd_sock *s);
/* ...and forgotten when its last fd closes. */
void wsd_upgrade_side_closed(struct wsd_sock *s);
/* Set in a fork child that inherited a listener: accepts look for reg_lost only then. */
extern bool wsd_listeners_inherited;
/*
 * Set in a process that forked a child holding a connection it had
 * accepted and not served (a handler): it may do so for each connection.
 */
extern bool wsd_handlers_forked;
/* The first data call of a fork child on a connection it inherited (s->handoff). */
void wsd_upgrade_handoff(struct wsd_sock *s);
/* accept() made s: attach a handshake that arrived first. */
void wsd_upgrade_accepted(struct wsd_sock *s);
/* ...and its last fd closed, never upgraded: a late OPEN for it is declined at once. */
void wsd_upgrade_accepted_closed(struct wsd_sock *s);
/* A data call on s: start the upgrade when it is worth it (lazy, cheap). */
void wsd_upgrade_maybe(struct wsd_sock *s);
/* ...and as connect() returns: with a channel to the peer, asked for by mailbox or not yet. */
void wsd_upgrade_connected(struct wsd_sock *s);
/* The last fd of a connected socket goes: a channel to its peer made ahead, maybe (probe.c). */
void wsd_upgrade_closing(struct wsd_sock *s);
/* An accepted connection: its peer's OPEN, if posted in our mailbox, answered now. */
void wsd_upgrade_box(struct wsd_sock *s);
/* ...and the first receive's look, which waits for it a little when peers post OPENs. */
int wsd_upgrade_box_first(struct wsd_sock *s, bool nonblock);
/*
 * Every OPEN posted in a peer's mailbox a while ago: its answer taken, or
 * the OPEN taken back (the channel thread's sweep).
 */
void wsd_upgrade_box_sweep(void);
/* The peer stayed on the stream after our OPENED (proof.c). */
void wsd_sock_unswitched(struct wsd_sock *s);
/*
 * s's first bytes, sent into a grant before the peer's answer (s->prov):
 * settled now, committed or sent by the stream, waiting for the answer up
 * to a bound (to_tcp: sent by the stream whatever the answer, for a
 * connection that is to stay there); and every socket's (waits, fork,
 * exec).  No lock of s held.
 */
void wsd_upgrade_settle(struct wsd_sock *s, bool to_tcp);
/*
 * s's OPEN went by message a moment ago and is unanswered: its next sends
 * are held (s->prov, s->prov_hold) until the answer, for a while, where a
 * grant's would go into the peer's ring (open.c).  No lock of s held.
 */
void open_hold_begin(struct wsd_sock *s);
void wsd_upgrade_settle_all(bool to_tcp);
extern _Atomic int wsd_prov_open;   /* sockets with first bytes unsettled */
/* Before a wait, fork or exec: first bytes that wait for their peer's answer settled. */
static inline void wsd_settle_pending(bool to_tcp)
{
	if (atomic_load_explicit(&wsd_prov_open, memory_order_relaxed))
		wsd_upgrade_settle_all(to_tcp);
}
/* A connected socket exists: start the provider in the background now. */
void wsd_upgrade_prestart(void);
/* fork: in the child, forget threads and provider state. */
void wsd_upgrade_atfork_child(void);

/*
 * A detached thread of the switch's own running fn(arg); 0 or -EAGAIN.
 * It counts as busy (wsd_threads_busy) from the moment it runs, except
 * while it waits (wsd_threads_rest, wsd_threads_away), and not after fn.
 */
int wsd_thread_start(void *(*fn)(void *), void *arg);

/* The path an fd's connection takes: "tcp", "shm", "verbs", or NULL for no
 * socket of ours.  Exported for tests and tools (libwsd(7)). */
EXPORT const char *wsd_switch_path(int fd);

/* ---- the lifecycle calls (sock.c), stdio (stdio.c) ------------------------------ */

/* fd no longer names its socket (closed, or replaced): as close() forgets it. */
void wsd_sock_forget(int fd);
/*
 * fd became 0, 1 or 2, which stdio reads and writes behind the switch: its
 * socket goes back to TCP (stdin gets what was kept for it).  0, or -errno
 * when the peer's switch did not answer.
 */
int wsd_keep_stdio(int fd);
/* Before exec: stdin's unread pushed-back bytes become fd 0's prefix again. */
void wsd_stdin_to_prefix(void);
/* The exec failed: what wsd_stdin_to_prefix moved goes back into stdin. */
void wsd_stdin_exec_failed(void);

/* ---- guards: paths the switch cannot see, the program's limits (guard.c) ---- */

/* How long a peer's switch has to answer a BACK request (fork, exec, guards). */
#define WSD_BACK_MS 1000

/*
 * The reason no socket of this process upgrades any more (R_IO_URING), or
 * R_NONE.  New sockets start with it as their why_not.
 */
enum wsd_reason wsd_guard_stopped(void);

/*
 * s stays on the kernel stream for good (why: its reason in wsd stat).  An
 * upgrade under way is not waited for (it goes back when it ends); an
 * upgraded socket goes back to the stream byte-exact first
 * (wsd_sock_downgrade).  0 once s is plain TCP;
 * -errno when the peer's switch did not answer (s is then as it was).
 * Call it holding none of s's locks.
 */
int wsd_sock_keep_tcp(struct wsd_sock *s, enum wsd_reason why);

/*
 * The process made an io_uring the provider does not own: every socket
 * goes back to (or stays on) TCP, and nothing upgrades any more.
 */
void wsd_guard_io_uring(void);
/* The backstop: an io_uring not ours among the process's fds (at most every 100 ms). */
void wsd_guard_scan(void);

/*
 * The switch may take fds more descriptors and map bytes more memory and
 * still leave the program its reserve below RLIMIT_NOFILE and RLIMIT_AS
 * (an eighth of each, at least 32 descriptors).  False: stay on TCP,
 * reason R_RESOURCES.
 */
bool wsd_guard_room(int fds, uint64_t bytes);

/* ---- runtime ------------------------------------------------------------------ */

struct wsd_switch_params {
	bool enabled;                /* WSD_SWITCH */
	uint32_t ring_size;          /* WSD_SWITCH_RING */
	uint64_t upgrade_bytes;      /* WSD_UPGRADE_BYTES */
	uint64_t upgrade_ns;         /* WSD_UPGRADE_US */
	int64_t hold_ns;             /* WSD_HOLD_US */
	uint32_t zcopy_threshold;    /* WSD_ZCOPY_THRESHOLD (0 in the variable: never) */
	bool zcopy_by_path;          /* -1 in the variable: no zero copy over a mapped ring */
};

const struct wsd_switch_params *wsd_switch_params(void);

/* Set errno from a -errno result and return -1; pass other values. */
static inline ssize_t wsd_ret(ssize_t r)
{
	extern int *__errno_location(void);

	if (r < 0) {
		*__errno_location() = (int)-r;
		return -1;
	}
	return r;
}

/*
 * Whether fd's kernel socket has something for a read (data, the end, an
 * error), left where it is.  Not recv(MSG_PEEK): that takes a pending
 * error (a reset), which the kernel reports once, and the program would
 * read a clean end instead.
 */
static inline bool wsd_kernel_readable(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	return real.poll(&p, 1, 0) > 0;
}

/* mbox.c: fd's network namespace cookie (SO_NETNS_COOKIE), 0 when the kernel does not say. */
uint64_t wsd_netns_cookie(int fd);

#endif /* WSD_SWITCH_H */

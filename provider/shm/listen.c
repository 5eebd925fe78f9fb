/* SPDX-License-Identifier: MIT */
/*
 * shm listener: the abstract unix socket "\0wsd-nd.PORT", scoped to the
 * network namespace, and the connections on it still proving themselves.
 *
 * Anyone may bind that name first.  A listener that finds it held by
 * another user binds "\0wsd-nd.PORT.INO.RANDOM" instead, once it knows the
 * TCP listener it stands for (shm_listen_owner; until then nobody reaches
 * it): INO that socket's inode, RANDOM 64 bits nobody can guess, so no one
 * can hold this name before us.  Connectors find it by the kernel's lists
 * (owner.c).  Who held the usual name is kept (shm_listen_taken).
 *
 * A connection is accepted at once and its uid checked (SO_PEERCRED)
 * before we send it anything.  Our PROVE_ACK names the TCP listener we
 * stand for, when the SPI told us (SO_WSP_TCP_LISTENER), for connectors
 * that check it (owner.c).  It then walks the proof of proof.c, one
 * non-blocking step per message, with a deadline of SHM_PROOF_MS from its
 * accept; at most PENDING_MAX walk at a time, PENDING_PER_PID of them
 * from one process (as SO_PEERCRED names it).  Every process that walks
 * runs as our user, so a bound per process is the one that matters.  A
 * newcomer that finds every slot taken takes the oldest slot of the
 * process holding the most, when that is more than its own process holds:
 * silent connectors, however many processes they come from, cannot keep
 * another process's proof, which takes microseconds, from starting.  The
 * socket is drained as connectors come, so none waits in the kernel's
 * backlog behind them.  Nothing is mapped for anyone here: a request
 * reaches the application only after the proof, with its memfd unmapped
 * until nd_ep_accept.  Whatever is turned away is counted by why in
 * l->refused, which the switch reads (wsd_listen_refused).
 *
 * With a rendezvous directory (rdv.c), the listener also listens on a
 * pathname socket there, for connectors of other network namespaces.
 * Those pair by copy whatever their user, and nothing is done by their
 * pid, which SO_PEERCRED gives as 0 across pid namespaces (their share of
 * the slots is that of pid 0 then, a larger one).
 *
 * The listener's pollable fd is an epoll set holding the socket and every
 * pending connection, so a waiter wakes for either; shm_listen_get itself
 * polls them, straight to the kernel.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "provider/shm/shm.h"

#define SHM_PROOF_MS 1000     /* from accept to a complete HELLO */
#define PENDING_MAX 16
#define PENDING_PER_PID 2     /* one process's share of the slots */
/* connectors taken per wake, so the steps of those in the slots come between */
#define TAKE_BATCH (PENDING_MAX / 2)

enum pstate { P_PROVE, P_ECHO, P_HELLO };

struct pending {
	int sock;
	pid_t pid;
	uid_t uid;
	bool copy;                   /* another user's: proves nothing, gets the listener */
	bool rdv;                    /* through the rendezvous directory */
	enum pstate state;
	int64_t deadline;
	struct shm_nonce nonce;
};

struct shm_listener {
	int fd;
	_Atomic int tcp_fd;          /* the TCP listener we stand for, named in PROVE_ACK */
	_Atomic unsigned long tcp_ino;   /* its inode when named (0: none) */
	/* naming: the usual name, or (taken) the alternate one once tcp_fd is known */
	unsigned port;
	int backlog;
	bool taken;                  /* someone else held "wsd-nd.PORT" */
	int holder;                  /* its uid, or -2 when the kernel did not say */
	atomic_flag alt_named;       /* the alternate name is bound (or being bound) */
	int epfd;
	bool fd_watched;             /* the socket is in epfd */
	int rdv_fd;                  /* the socket in the rendezvous directory, or -1 */
	pid_t rdv_owner;             /* the process that bound it, and unlinks it */
	char rdv_path[108];
	int npending;
	struct pending *p[PENDING_MAX];
};

int shm_addr_port(const struct sockaddr *addr, socklen_t len)
{
	if (addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in))
		return ntohs(((const struct sockaddr_in *)addr)->sin_port);
	if (addr->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6))
		return ntohs(((const struct sockaddr_in6 *)addr)->sin6_port);
	return -EINVAL;
}

int shm_sock_name(const struct sockaddr *addr, socklen_t len, struct sockaddr_un *un,
		  socklen_t *unlen)
{
	int port = shm_addr_port(addr, len), n;

	if (port < 0)
		return port;
	memset(un, 0, sizeof(*un));
	un->sun_family = AF_UNIX;
	n = snprintf(un->sun_path + 1, sizeof(un->sun_path) - 1, "wsd-nd.%d", port);
	*unlen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
	return 0;
}

/*
 * The rendezvous directory's socket, when one is configured: watched as the
 * usual one is.  Its failure leaves this namespace's way as it was.
 */
static void rdv_open(struct shm_listener *sl)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = sl };
	int fd = shm_rdv_listen(sl->port, sl->backlog, sl->rdv_path, sizeof(sl->rdv_path));

	if (fd < 0) {
		if (fd != -ENOENT)
			wsd_debug("shm: no rendezvous socket for port %u: %s", sl->port,
				  strerror(-fd));
		return;
	}
	wsd_fd_named(fd, true);
	if (epoll_ctl(sl->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
		wsd_fd_named(fd, false);
		shm_rdv_unlisten(sl->rdv_path);
		close(fd);
		return;
	}
	sl->rdv_fd = fd;
	sl->rdv_owner = getpid();
	wsd_debug("shm: registry for port %u also at %s", sl->port, sl->rdv_path);
}

/* Listen on the bound socket and watch it: connectors may come from now on. */
static int name_listen(struct shm_listener *sl)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = sl };

	if (listen(sl->fd, sl->backlog > 0 ? sl->backlog : 16) < 0)
		return -errno;
	wsd_fd_named(sl->fd, true);   /* a fork child does not hold our name */
	sl->fd_watched = true;        /* before the first event can reach a taker */
	if (epoll_ctl(sl->epfd, EPOLL_CTL_ADD, sl->fd, &ev) < 0) {
		sl->fd_watched = false;
		return -errno;
	}
	return 0;
}

int shm_listen(struct nd_listener *l, void **priv, const struct sockaddr *addr,
	       socklen_t len, int backlog)
{
	struct shm_listener *sl;
	struct sockaddr_un un;
	socklen_t unlen;
	int ret = shm_sock_name(addr, len, &un, &unlen);

	(void)l;
	if (ret < 0)
		return ret;
	sl = calloc(1, sizeof(*sl));
	if (!sl)
		return -ENOMEM;
	atomic_init(&sl->tcp_fd, -1);
	atomic_init(&sl->tcp_ino, 0);
	atomic_flag_clear(&sl->alt_named);
	sl->port = (unsigned)shm_addr_port(addr, len);
	sl->backlog = backlog;
	sl->rdv_fd = -1;
	sl->epfd = epoll_create1(EPOLL_CLOEXEC);
	sl->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	ret = sl->epfd < 0 || sl->fd < 0 ? -errno : 0;
	if (!ret && bind(sl->fd, (struct sockaddr *)&un, unlen) < 0) {
		ret = -errno;
		/*
		 * Held by another user: a squatter, for all we know.  Held by
		 * ours (a listener of this process or of a sibling on the same
		 * port, SO_REUSEPORT), or by one the kernel does not name: in
		 * use, as it always was.
		 */
		if (ret == -EADDRINUSE &&
		    (sl->holder = shm_name_holder(&un, unlen)) >= 0 &&
		    (uid_t)sl->holder != geteuid()) {
			/* not listening, not watched: shm_listen_owner names it */
			sl->taken = true;
			wsd_debug("shm: registry name wsd-nd.%u held by uid %d: an alternate name "
				  "once the TCP listener is known", sl->port, sl->holder);
			rdv_open(sl);
			*priv = sl;
			return 0;
		}
	}
	if (!ret)
		ret = name_listen(sl);
	if (ret < 0) {
		if (sl->fd >= 0) {
			wsd_fd_named(sl->fd, false);
			close(sl->fd);
		}
		if (sl->epfd >= 0)
			close(sl->epfd);
		free(sl);
		return ret;
	}
	rdv_open(sl);
	*priv = sl;
	return 0;
}

/*
 * The usual name was taken: bind "wsd-nd.PORT.INO.RANDOM" for the TCP
 * listener tcp_fd, unless a listener of our uid has such a name for it
 * (-EADDRINUSE).  Another random part if, against all odds, that one is
 * taken too.
 */
static int name_alt(struct shm_listener *sl, int tcp_fd)
{
	struct sockaddr_un un = { .sun_family = AF_UNIX };
	struct stat st;
	int ret = -EADDRINUSE;

	if (fstat(tcp_fd, &st) < 0 || !S_ISSOCK(st.st_mode))
		return -EINVAL;
	/*
	 * A listener of ours has one for this TCP listener already (a fork
	 * child's parent): in use, as the usual name would have been.
	 */
	if (shm_alt_held(sl->port, (unsigned long)st.st_ino))
		return -EADDRINUSE;
	for (int i = 0; i < 4 && ret == -EADDRINUSE; i++) {
		uint64_t r;
		socklen_t unlen;

		while (getrandom(&r, sizeof(r), 0) != sizeof(r))
			;
		unlen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 +
				    (size_t)snprintf(un.sun_path + 1, sizeof(un.sun_path) - 1,
						     "wsd-nd.%u.%lu.%016llx", sl->port,
						     (unsigned long)st.st_ino,
						     (unsigned long long)r));
		ret = bind(sl->fd, (struct sockaddr *)&un, unlen) < 0 ? -errno : 0;
	}
	if (!ret)
		ret = name_listen(sl);
	if (!ret)
		wsd_debug("shm: registry for port %u on %s", sl->port, un.sun_path + 1);
	return ret;
}

/* Remove pending i (its socket already closed or handed on); a slot is free again. */
static void pending_remove(struct shm_listener *sl, int i)
{
	shm_nonce_free(&sl->p[i]->nonce);
	free(sl->p[i]);
	sl->p[i] = sl->p[--sl->npending];
	sl->p[sl->npending] = NULL;
}

static void pending_drop(struct shm_listener *sl, int i)
{
	/*
	 * out of the epoll set first: a fork child's copy of the socket
	 * would keep it there after close, ready for ever (a spinning loop)
	 */
	epoll_ctl(sl->epfd, EPOLL_CTL_DEL, sl->p[i]->sock, NULL);
	close(sl->p[i]->sock);
	pending_remove(sl, i);
}

void shm_listen_close(void *priv)
{
	struct shm_listener *sl = priv;

	while (sl->npending)
		pending_drop(sl, 0);
	if (sl->rdv_fd >= 0) {
		wsd_fd_named(sl->rdv_fd, false);
		close(sl->rdv_fd);
		if (sl->rdv_owner == getpid())   /* a fork child's copy is not the name */
			shm_rdv_unlisten(sl->rdv_path);
	}
	wsd_fd_named(sl->fd, false);
	close(sl->fd);
	close(sl->epfd);
	free(sl);
}

/*
 * May come after listen, while a thread takes requests: hence the atomics.
 * The first descriptor given names a listener whose usual name was taken;
 * until then nobody can reach it.
 */
int shm_listen_owner(void *priv, int tcp_fd)
{
	struct shm_listener *sl = priv;
	struct stat st;

	atomic_store(&sl->tcp_ino, tcp_fd >= 0 && fstat(tcp_fd, &st) == 0 &&
				   S_ISSOCK(st.st_mode) ? (unsigned long)st.st_ino : 0);
	atomic_store(&sl->tcp_fd, tcp_fd);
	if (!sl->taken || tcp_fd < 0 || atomic_flag_test_and_set(&sl->alt_named))
		return 0;
	return name_alt(sl, tcp_fd);
}

int shm_listen_taken(void *priv)
{
	struct shm_listener *sl = priv;

	return sl->taken ? sl->holder : -1;
}

int shm_listen_publish(void *priv, const struct sockaddr *peer, socklen_t len, bool on)
{
	struct shm_listener *sl = priv;

	if (sl->rdv_fd < 0 || sl->rdv_owner != getpid())
		return -EOPNOTSUPP;
	return shm_rdv_publish(sl->rdv_path, peer, len, on);
}

int shm_listen_fd(void *priv)
{
	return ((struct shm_listener *)priv)->epfd;
}

static void count_refusal(struct nd_listener *l, enum wsd_lrefused why)
{
	atomic_fetch_add_explicit(&l->refused[why], 1, memory_order_relaxed);
	if (why == WSD_LREF_USER || why == WSD_LREF_PROOF) {
		pthread_mutex_lock(&l->ad->lock);
		l->ad->refused_access++;
		pthread_mutex_unlock(&l->ad->lock);
	}
}

/*
 * A process's share of the slots: those the kernel could not name (pid 0,
 * another pid namespace's, through the rendezvous directory) share a
 * larger one.
 */
static int share_of(pid_t pid)
{
	return pid > 0 ? PENDING_PER_PID : PENDING_MAX / 2;
}

/* The slots process pid holds. */
static int held_by(const struct shm_listener *sl, pid_t pid)
{
	int n = 0;

	for (int i = 0; i < sl->npending; i++)
		n += sl->p[i]->pid == pid;
	return n;
}

/*
 * Every slot taken, and a newcomer whose process holds `held`: the slot
 * to give it, the oldest of the process that holds the most, when that is
 * more than `held`; else -1.  The oldest, as an honest proof is over in
 * microseconds: what has waited longest is the likeliest to be silent.
 * Never one past its proof (P_HELLO): its process may read us, and its
 * HELLO is on the way.
 */
static int pending_victim(const struct shm_listener *sl, int held)
{
	int best = -1, most = held;

	for (int i = 0; i < sl->npending; i++) {
		int n = held_by(sl, sl->p[i]->pid);
		bool older = best >= 0 && sl->p[i]->deadline < sl->p[best]->deadline;

		if (sl->p[i]->state == P_HELLO)
			continue;
		if (n > most || (n == most && older)) {
			most = n;
			best = i;
		}
	}
	return best;
}

/*
 * Take the connectors waiting, TAKE_BATCH at most: each one's uid checked
 * first, then its process's share, then a slot made for it if need be.
 */
static void take_new(struct nd_listener *l, struct shm_listener *sl, int lfd, bool rdv)
{
	for (int k = 0; k < TAKE_BATCH; k++) {
		struct epoll_event ev = { .events = EPOLLIN };
		struct pending *p;
		pid_t pid;
		uid_t uid;
		int held, ret, sock = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);

		if (sock < 0)
			return;   /* EAGAIN, or a connector gone already */
		ret = shm_peer_uid_ok(sock, &pid, &uid, atomic_load(&l->other_users), rdv);
		if (ret < 0) {
			if (ret == -EACCES) {
				count_refusal(l, WSD_LREF_USER);
				shm_reject(sock, SHM_REJECT, ND_ACCESS_DENIED);
			}
			close(sock);
			continue;
		}
		held = held_by(sl, pid);
		if (held < share_of(pid) && sl->npending == PENDING_MAX) {
			int v = pending_victim(sl, held);

			if (v >= 0) {
				count_refusal(l, WSD_LREF_EVICTED);
				shm_reject(sl->p[v]->sock, SHM_REJECT, ND_NO_MORE_ENTRIES);
				pending_drop(sl, v);
			}
		}
		if (held >= share_of(pid) || sl->npending == PENDING_MAX) {
			count_refusal(l, WSD_LREF_PEER);
			/* no room now, which the connector tells from nobody there */
			shm_reject(sock, SHM_REJECT, ND_NO_MORE_ENTRIES);
			close(sock);
			continue;
		}
		p = calloc(1, sizeof(*p));
		ev.data.ptr = p;
		if (!p || epoll_ctl(sl->epfd, EPOLL_CTL_ADD, sock, &ev) < 0) {
			free(p);
			close(sock);
			continue;
		}
		p->sock = sock;
		p->pid = pid;
		p->uid = uid;
		p->copy = uid != geteuid() || rdv;
		p->rdv = rdv;
		p->state = P_PROVE;
		p->deadline = wsd_now_ms() + SHM_PROOF_MS;
		sl->p[sl->npending++] = p;
	}
}

/* The region, and the connector's eventfds unless it is another user's (copy). */
static bool hello_ok(const struct pending *p, const struct shm_ctl *m, const int *fds)
{
	if (fds[0] < 0 || !shm_layout_ok(m->ring_size, m->nwindows))
		return false;
	if (p->copy)
		return fds[1] < 0 && fds[2] < 0;
	return fds[1] >= 0 && fds[2] >= 0 &&
	       shm_check_eventfd(fds[1]) == 0 && shm_check_eventfd(fds[2]) == 0;
}

/*
 * A handle on the TCP listener we stand for, for the time of a send, or
 * -1.  It goes to a process of another user, which must be able to do
 * nothing with it but name the socket: an O_PATH open of our descriptor
 * (through /proc) refers to the same socket, and every socket call on it
 * fails (EBADF), where a copy of the descriptor would let that process
 * shut the listener down, make it non-blocking or take its connections.
 * The program may close its number and reuse it for any file at any time:
 * only a handle found to be that very socket (its inode) goes.
 */
static int tcp_listener_handle(struct shm_listener *sl)
{
	unsigned long ino = atomic_load(&sl->tcp_ino);
	int fd = atomic_load(&sl->tcp_fd), h;
	char path[40];
	struct stat st;

	if (fd < 0 || !ino)
		return -1;
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	h = open(path, O_PATH | O_CLOEXEC);
	if (h >= 0 && h < 3) {
		/* above the standard streams: a program with stdin closed would get 0 */
		int d = fcntl(h, F_DUPFD_CLOEXEC, 3);

		close(h);
		h = d;
	}
	if (h < 0)
		return -1;
	if (fstat(h, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_ino == ino)
		return h;
	close(h);
	return -1;
}

/*
 * A connector of another user (copy): no nonce either way; PROVE_ACK
 * hands over a handle on the TCP listener we stand for, if named, which
 * the connector checks is the one it dialled (owner.c).
 */
static int prove_copy(struct nd_listener *l, struct shm_listener *sl, struct pending *p,
		      const struct shm_ctl *m)
{
	struct shm_ctl ack = { .magic = SHM_MAGIC, .version = SHM_VERSION,
			       .type = SHM_PROVE_ACK, .features = SHM_FEAT_COPY, .tcp_fd = -1 };
	int tcp, ret;

	if (!(m->features & SHM_FEAT_COPY)) {
		count_refusal(l, WSD_LREF_PROTOCOL);
		return -EPROTO;
	}
	p->state = P_ECHO;
	/* a connector of another network namespace could not check it (sock_diag) */
	tcp = p->rdv ? -1 : tcp_listener_handle(sl);
	ret = shm_send_ctl(p->sock, &ack, &tcp, tcp >= 0 ? 1 : 0);
	if (tcp >= 0)
		close(tcp);
	return ret;
}

/*
 * One step of a pending connection's proof, on a message that may be
 * there.  0: keep waiting; 1: a complete request in *r; -errno: drop it.
 */
static int pending_step(struct nd_listener *l, struct shm_listener *sl, struct pending *p,
			struct shm_request *r)
{
	struct shm_ctl m;
	int fds[3] = { -1, -1, -1 };
	int ret = shm_recv_ctl(p->sock, &m, fds, p->state == P_HELLO ? 3 : 0, 0);

	if (ret == -ETIMEDOUT)
		return 0;
	if (ret == -EPROTO)
		count_refusal(l, WSD_LREF_PROTOCOL);
	if (ret < 0)
		return ret;   /* malformed, or the connector gone */
	switch (p->state) {
	case P_PROVE: {
		uint8_t theirs[SHM_NONCE];

		if (m.type != SHM_PROVE) {
			count_refusal(l, WSD_LREF_PROTOCOL);
			return -EPROTO;
		}
		if (p->copy)
			return prove_copy(l, sl, p, &m);
		if (shm_nonce_read(p->pid, m.probe_addr, theirs) < 0 ||
		    shm_nonce_new(&p->nonce) < 0) {
			count_refusal(l, WSD_LREF_PROOF);
			shm_reject(p->sock, SHM_REJECT, ND_ACCESS_DENIED);
			return -EACCES;
		}
		m = (struct shm_ctl){ .magic = SHM_MAGIC, .version = SHM_VERSION,
				      .type = SHM_PROVE_ACK,
				      .probe_addr = (uintptr_t)p->nonce.at,
				      .tcp_fd = atomic_load(&sl->tcp_fd) };
		memcpy(m.nonce, theirs, SHM_NONCE);
		p->state = P_ECHO;
		return shm_send_ctl(p->sock, &m, NULL, 0);
	}
	case P_ECHO:
		if (m.type != SHM_ECHO || (!p->copy && !shm_nonce_match(&p->nonce, m.nonce))) {
			count_refusal(l, m.type == SHM_ECHO ? WSD_LREF_PROOF : WSD_LREF_PROTOCOL);
			shm_reject(p->sock, SHM_REJECT, ND_ACCESS_DENIED);
			return -EACCES;
		}
		shm_nonce_free(&p->nonce);
		m = (struct shm_ctl){ .magic = SHM_MAGIC, .version = SHM_VERSION,
				      .type = SHM_PROVED };
		p->state = P_HELLO;
		return shm_send_ctl(p->sock, &m, NULL, 0);
	case P_HELLO:
		if (m.type != SHM_HELLO || !hello_ok(p, &m, fds)) {
			count_refusal(l, WSD_LREF_PROTOCOL);
			shm_close_fds(fds, 3);
			shm_reject(p->sock, SHM_REJECT, ND_CONNECTION_REFUSED);
			return -EPROTO;
		}
		/* blocking from here: accept and reject run their own timeouts */
		(void)fcntl(p->sock, F_SETFL, 0);
		r->sock = p->sock;
		r->pid = p->rdv ? 0 : p->pid;   /* nothing by pid across namespaces */
		r->uid = p->uid;
		r->copy = p->copy;
		r->rdv = p->rdv;
		r->memfd = fds[0];
		r->in_efd = fds[1];
		r->out_efd = fds[2];
		r->hello = m;
		return 1;
	}
	return -EPROTO;
}

int shm_listen_get(struct nd_listener *l, void *priv, int timeout_ms,
		   struct nd_conn_request *req)
{
	struct shm_listener *sl = priv;
	int64_t deadline = timeout_ms < 0 ? -1 : wsd_now_ms() + timeout_ms;

	for (;;) {
		struct pollfd pf[PENDING_MAX + 2];
		struct pending *who[PENDING_MAX];
		int64_t now = wsd_now_ms(), first = deadline;
		int n, np, wait;

		for (int i = 0; i < sl->npending;) {
			if (sl->p[i]->deadline <= now) {
				count_refusal(l, WSD_LREF_TIMEOUT);
				pending_drop(sl, i);   /* silent or slow: its slot goes to others */
				continue;
			}
			if (first < 0 || sl->p[i]->deadline < first)
				first = sl->p[i]->deadline;
			i++;
		}
		wait = wsd_ms_left(first);
		/*
		 * A poll of our own descriptors, not the epoll set (which is for
		 * those who poll the listener: it goes through the switch's
		 * epoll, whose wait may allocate, where a fork must not find a
		 * thread of ours).  The listening socket first.
		 */
		np = sl->npending;
		pf[0] = (struct pollfd){ .fd = sl->fd_watched ? sl->fd : -1, .events = POLLIN };
		for (int i = 0; i < np; i++) {
			who[i] = sl->p[i];
			pf[1 + i] = (struct pollfd){ .fd = who[i]->sock, .events = POLLIN };
		}
		pf[1 + np] = (struct pollfd){ .fd = sl->rdv_fd, .events = POLLIN };
		n = wsd_wait_fds(pf, (unsigned)np + 2, wait);
		if (n < 0)
			return -errno;
		/* taken after the steps: a newcomer must not take the slot of one ready to go on */
		bool take = n > 0 && pf[0].revents;
		bool take_rdv = n > 0 && sl->rdv_fd >= 0 && pf[1 + np].revents;

		for (int k = 0; n > 0 && k < np; k++) {
			struct shm_request *r;
			int i, ret;

			if (!pf[1 + k].revents)
				continue;
			for (i = 0; i < sl->npending && sl->p[i] != who[k]; i++)
				;
			if (i == sl->npending)
				continue;   /* dropped earlier in this batch */
			r = calloc(1, sizeof(*r));
			if (!r)
				return -ENOMEM;
			ret = pending_step(l, sl, sl->p[i], r);
			if (ret == 1) {
				/* the request owns the socket now */
				epoll_ctl(sl->epfd, EPOLL_CTL_DEL, r->sock, NULL);
				pending_remove(sl, i);
				req->rendezvous = r->rdv;
				req->len = r->hello.plen;
				memcpy(req->data, r->hello.priv, r->hello.plen);
				req->tpriv = r;
				return 0;
			}
			free(r);
			if (ret < 0)
				pending_drop(sl, i);
		}
		if (take)
			take_new(l, sl, sl->fd, false);
		if (take_rdv)
			take_new(l, sl, sl->rdv_fd, true);
		if (deadline >= 0 && wsd_now_ms() >= deadline)
			return -ETIMEDOUT;
	}
}

void shm_request_free(struct shm_request *r)
{
	int fds[] = { r->sock, r->memfd, r->in_efd, r->out_efd };

	shm_close_fds(fds, 4);
	free(r);
}

void shm_request_reject(struct nd_conn_request *req)
{
	struct shm_request *r = req->tpriv;

	shm_reject(r->sock, SHM_REJECT, ND_CONNECTION_REFUSED);
	shm_request_free(r);
}

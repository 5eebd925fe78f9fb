/* SPDX-License-Identifier: MIT */
/*
 * The socket lifecycle under the preload: socket, connect, listen, accept,
 * shutdown, close, close_range, closefrom, dup*, fcntl, ioctl, socket
 * options (stdio.c: streams; proc.c: fork, exec, spawn).  Each does the real call first
 * and keeps the fd table in step; the application sees the kernel's result.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <netinet/tcp.h>
#include <alloca.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "provider/internal.h"
#include "switch/switch.h"
#include "switch/upgrade_int.h"

static bool is_tcp(int domain, int type, int protocol)
{
	return (domain == AF_INET || domain == AF_INET6) &&
	       (type & 0xf) == SOCK_STREAM && (protocol == 0 || protocol == IPPROTO_TCP);
}


static void track(int fd, int family, bool nonblock)
{
	struct wsd_sock *s = wsd_sock_new(fd, family);

	if (!s)
		return;   /* no memory: the socket simply stays plain */
	s->nonblock = nonblock;
	s->nodelay_known = true;   /* a new socket's TCP_NODELAY is off */
	wsd_fd_set(fd, s);
	wsd_sock_put(s);
	wsd_keep_stdio(fd);   /* nothing to move yet: it cannot fail */
}

EXPORT int socket(int domain, int type, int protocol)
{
	int fd;

	wsd_real_init();
	fd = real.socket(domain, type, protocol);
	if (fd >= 0 && is_tcp(domain, type, protocol)) {
		track(fd, domain, type & SOCK_NONBLOCK);
		/* the provider takes tens of ms to start: begin in the background now */
		wsd_upgrade_prestart();
	}
	return fd;
}

/*
 * The peer's address as connect gave it (len bytes, copied to p) stands for
 * getpeername's when it is IPv4 or IPv6, whole, and specified: the kernel
 * connects 0.0.0.0 and :: to the loopback, whose address getpeername gives.
 */
static bool exact_peer(const struct sockaddr_storage *p, socklen_t len)
{
	static const uint8_t zero[16];
	struct wsd_stat_addr k;

	if (len < (p->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) :
					      sizeof(struct sockaddr_in)))
		return false;
	to_addr(p, &k);
	return k.family && memcmp(k.addr, zero, k.family == AF_INET ? 4 : 16);
}

EXPORT int connect(int fd, const struct sockaddr *addr, socklen_t len)
{
	struct wsd_sock *s;
	int r, e;

	wsd_real_init();
	r = real.connect(fd, addr, len);
	e = errno;
	s = wsd_fd_get(fd);
	if (s) {
		if (r == 0 || e == EINPROGRESS) {
			s->connected_side = true;
			/* the peer's address, as getpeername would give it (the channel's key) */
			s->peer_known = false;
			if (addr && len <= sizeof(s->peer)) {
				memcpy(&s->peer, addr, len);
				s->peer_known = exact_peer(&s->peer, len);
			}
			wsd_upgrade_prestart();
			/* connected to a peer we have a channel with: its OPEN goes now */
			if (r == 0)
				wsd_upgrade_connected(s);
		}
		wsd_sock_put(s);
	}
	errno = e;
	return r;
}

EXPORT int listen(int fd, int backlog)
{
	struct wsd_sock *s;
	int r, e;

	wsd_real_init();
	r = real.listen(fd, backlog);
	e = errno;
	if (r == 0 && (s = wsd_fd_get(fd))) {
		if (!s->listening)
			wsd_upgrade_listen(s);
		wsd_sock_put(s);
	}
	errno = e;
	return r;
}

/* fd accepted on lfd; peer: the address accept wrote into a buffer of ours (plen bytes), or NULL. */
static int accepted(int lfd, int fd, int flags, const struct sockaddr *peer, socklen_t plen)
{
	struct wsd_sock *l, *s;
	int e = errno;

	if (fd < 0 || !(l = wsd_fd_get(lfd)))
		return fd;
	s = wsd_sock_new(fd, l->family);
	if (s) {
		uint64_t ns = atomic_load(&l->netns);

		if (!ns) {
			ns = wsd_netns_cookie(lfd);   /* once per listener */
			atomic_store(&l->netns, ns);
		}
		atomic_store(&s->netns, ns);
	}
	if (s && peer && plen <= sizeof(s->peer) &&
	    (peer->sa_family == AF_INET || peer->sa_family == AF_INET6)) {
		memcpy(&s->peer, peer, plen);
		s->peer_known = true;   /* what getpeername would say */
	}
	if (s && l->nodelay_known) {
		/* an accepted socket has its listener's TCP_NODELAY */
		s->nodelay_known = true;
		s->app_nodelay = l->app_nodelay;
	}
	if (s) {
		s->reg_page = l->reg_page;   /* a handler we fork may note it there (registry.c) */
		s->accepted_by = wsd_pid();
	}
	if (s && l->side_port)
		wsd_upgrade_side_accepted(l, s);   /* before a request for it can come */
	wsd_sock_put(l);
	if (s) {
		s->nonblock = flags & SOCK_NONBLOCK;
		wsd_fd_set(fd, s);
		/*
		 * Onto 0, 1 or 2 (inetd's way) it stays on TCP, decided before
		 * a request that came first is looked at: that one is declined,
		 * not attached and then asked back (nothing is upgraded yet, so
		 * this cannot wait for the peer or fail).
		 */
		(void)wsd_keep_stdio(fd);
		wsd_upgrade_accepted(s);
		wsd_sock_put(s);
	}
	errno = e;
	return fd;
}

/*
 * A listener a fork child inherited gets a registry of this process's own
 * before the accept, so that one made before its peer's switch asks is
 * there to answer (a daemon's child blocks in accept long before).
 */
static void before_accept(int fd)
{
	struct wsd_sock *l;

	if (!wsd_listeners_inherited)
		return;   /* no fork child's listener here: nothing looked up */
	l = wsd_fd_get(fd);
	if (l) {
		if (l->reg_lost)
			wsd_upgrade_relisten(l);
		wsd_sock_put(l);
	}
}

/*
 * A program that passes no buffer for the peer's address gets the accept
 * into ours, which it never sees, and the switch learns the address with
 * it.  One that passes a buffer has it used as it is: reading its length
 * before the call could fault where the kernel says EFAULT.
 */
static int accept_any(int fd, struct sockaddr *addr, socklen_t *len, int flags, bool four)
{
	struct sockaddr_storage own;
	socklen_t olen = sizeof(own);
	int r;

	wsd_real_init();
	before_accept(fd);
	if (addr) {
		r = four ? real.accept4(fd, addr, len, flags) : real.accept(fd, addr, len);
		return accepted(fd, r, flags, NULL, 0);
	}
	r = four ? real.accept4(fd, (struct sockaddr *)&own, &olen, flags) :
		   real.accept(fd, (struct sockaddr *)&own, &olen);
	return accepted(fd, r, flags, (struct sockaddr *)&own, olen);
}

EXPORT int accept(int fd, struct sockaddr *addr, socklen_t *len)
{
	return accept_any(fd, addr, len, 0, false);
}

EXPORT int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
	return accept_any(fd, addr, len, flags, true);
}

EXPORT int shutdown(int fd, int how)
{
	struct wsd_sock *s;
	int r;

	wsd_real_init();
	s = wsd_fd_get(fd);
	if (!s)
		return real.shutdown(fd, how);
	if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR) {
		wsd_sock_put(s);
		errno = EINVAL;
		return -1;
	}
	if (s->prov)
		wsd_upgrade_settle(s, false);   /* its first bytes reach the peer before its end */
	if (s->listening || !s->sess) {
		r = real.shutdown(fd, how);
		if (r == 0) {
			if (how != SHUT_RD)
				s->tx_shut = true;
			if (how != SHUT_WR)
				s->rx_shut = true;
		}
	} else {
		r = (int)wsd_ret(wsd_sock_shutdown(s, how));
	}
	wsd_sock_put(s);
	return r;
}

/*
 * The last fd of s is about to close: from now its number may name another
 * file at any moment.  A thread still inside a call on s (asleep in recv,
 * waiting for room) must not touch that number again, not even to read a
 * doorbell: it sees closed and returns EBADF.  One asleep in the kernel on
 * an upgraded socket is woken with SHUT_RD (which sends the peer nothing):
 * without that it would sleep until the peer's next doorbell, and then
 * read it from the number's next owner.
 */
static void last_close(struct wsd_sock *s)
{
	int sleepers;

	atomic_store(&s->closed, true);
	pthread_mutex_lock(&s->mu);
	sleepers = s->sleepers;
	pthread_mutex_unlock(&s->mu);
	if (sleepers && wsd_sock_upgraded(s))
		real.shutdown(s->fd, SHUT_RD);
}

/* fd no longer names its socket (closed, or replaced by dup2). */
void wsd_sock_forget(int fd)
{
	struct wsd_sock *s = wsd_fd_take(fd);

	if (!s)
		return;
	if (atomic_load(&s->nfds) == 0) {
		/* from here a session attached by another thread stays silent */
		pthread_mutex_lock(&s->mu);
		s->closing = true;
		pthread_mutex_unlock(&s->mu);
		if (s->prov)
			wsd_upgrade_settle(s, false);   /* its first bytes reach the peer before its end */
		if (s->listening)
			wsd_upgrade_unlisten(s);
		if (s->reg_noted)
			wsd_upgrade_side_closed(s);
		wsd_upgrade_closing(s);
		wsd_upgrade_accepted_closed(s);
		wsd_stat_closed(s->stat);
		wsd_sock_closed(s);
		wsd_poll_sock_gone(s);
		last_close(s);
	} else {
		wsd_sock_refd(s, fd);
	}
	wsd_sock_put(s);
}

EXPORT int close(int fd)
{
	wsd_real_init();
	if (wsd_fd_any()) {
		wsd_poll_fd_closed(fd);
		wsd_sock_forget(fd);
	} else {
		wsd_poll_fd_closed(fd);
	}
	return real.close(fd);
}

struct fd_range {
	unsigned lo, hi;
	int *fds;
	size_t n, cap;
};

/* Under the fd table's lock: only note them (forget takes other locks). */
static void note_in_range(int fd, struct wsd_sock *s, void *arg)
{
	struct fd_range *r = arg;

	(void)s;
	if ((unsigned)fd < r->lo || (unsigned)fd > r->hi)
		return;
	if (r->n == r->cap) {
		size_t cap = r->cap ? 2 * r->cap : 64;
		int *p = realloc(r->fds, cap * sizeof(*p));

		if (!p)
			return;
		r->fds = p;
		r->cap = cap;
	}
	r->fds[r->n++] = fd;
}

/* fds lo..hi are about to close together: each as close() forgets it. */
static void forget_range(unsigned lo, unsigned hi)
{
	struct fd_range r = { .lo = lo, .hi = hi };

	wsd_poll_fds_closed(lo, hi);
	if (!wsd_fd_any())
		return;
	wsd_fd_each(note_in_range, &r);
	for (size_t i = 0; i < r.n; i++)
		wsd_sock_forget(r.fds[i]);
	free(r.fds);
}

/*
 * close_range and closefrom close many numbers in one call the C library
 * makes itself (closefrom calls close_range inside, unseen): the sockets
 * among them are forgotten first, as by close, or their numbers would
 * still name a socket when a file gets one.  CLOSE_RANGE_CLOEXEC closes
 * nothing; CLOSE_RANGE_UNSHARE closes in a table of our own, which is ours
 * to keep in step all the same.
 */
EXPORT int close_range(unsigned int first, unsigned int last, int flags)
{
	static int (*next)(unsigned int, unsigned int, int);

	wsd_real_init();
	if (!next)
		next = (int (*)(unsigned int, unsigned int, int))dlsym(RTLD_NEXT, "close_range");
	if (first <= last && !(flags & ~(CLOSE_RANGE_UNSHARE | CLOSE_RANGE_CLOEXEC)) &&
	    !(flags & CLOSE_RANGE_CLOEXEC))
		forget_range(first, last);
	if (next)
		return next(first, last, flags);
	return (int)syscall(SYS_close_range, first, last, flags);
}

EXPORT void closefrom(int lowfd)
{
	static void (*next)(int);
	unsigned lo = lowfd < 0 ? 0 : (unsigned)lowfd;

	wsd_real_init();
	if (!next)
		next = (void (*)(int))dlsym(RTLD_NEXT, "closefrom");
	forget_range(lo, ~0u);
	if (next)
		next(lowfd);
	else
		syscall(SYS_close_range, lo, ~0u, 0);
}

static int duped(int oldfd, int newfd)
{
	struct wsd_sock *s;
	int e = errno, r;

	if (newfd >= 0)
		wsd_poll_fd_dup(oldfd, newfd);
	if (newfd < 0 || !(s = wsd_fd_get(oldfd)))
		return newfd;
	wsd_fd_set(newfd, s);
	wsd_sock_put(s);
	if ((r = wsd_keep_stdio(newfd))) {
		/* stdio over an accelerated socket would lose bytes: fail loudly */
		wsd_sock_forget(newfd);
		real.close(newfd);
		errno = -r;
		return -1;
	}
	errno = e;
	return newfd;
}

EXPORT int dup(int fd)
{
	wsd_real_init();
	return duped(fd, real.dup(fd));
}

/*
 * dup2 or dup3 is about to close newfd: if it is its socket's last fd, the
 * socket's close (its FIN by ring, its last doorbells read and rung) must
 * still reach its own kernel socket, not the one newfd names afterwards
 * (a bell written there is a byte the other connection's peer never
 * announced, a bell read there one stolen from it).  A copy of the
 * descriptor to close it by (returned, to close after), or -1: none needed,
 * or none to be had (then the close path's calls fail with EBADF).
 */
static int keep_closing(int newfd, bool *kept)
{
	struct wsd_sock *s = wsd_fd_get(newfd);
	int k = -1;

	*kept = false;
	if (!s)
		return -1;
	if (atomic_load(&s->nfds) == 1 && s->fd == newfd) {
		k = real.fcntl(newfd, F_DUPFD_CLOEXEC, 0);
		s->fd = k;
		*kept = true;
	}
	wsd_sock_put(s);
	return k;
}

/* The dup failed: newfd still names its socket. */
static void keep_undo(int newfd, int k)
{
	struct wsd_sock *s = wsd_fd_get(newfd);

	if (s && s->fd == k)
		s->fd = newfd;
	if (s)
		wsd_sock_put(s);
}

EXPORT int dup2(int oldfd, int newfd)
{
	bool kept = false;
	int r, k, e;

	wsd_real_init();
	if (oldfd == newfd)
		return real.dup2(oldfd, newfd);
	k = wsd_fd_any() ? keep_closing(newfd, &kept) : -1;
	r = real.dup2(oldfd, newfd);
	e = errno;
	if (r >= 0) {
		wsd_poll_fd_closed(newfd);
		wsd_sock_forget(newfd);
	} else if (kept) {
		keep_undo(newfd, k);
	}
	if (k >= 0)
		real.close(k);
	errno = e;
	return duped(oldfd, r);
}

EXPORT int dup3(int oldfd, int newfd, int flags)
{
	bool kept = false;
	int r, k, e;

	wsd_real_init();
	k = wsd_fd_any() && oldfd != newfd ? keep_closing(newfd, &kept) : -1;
	r = real.dup3(oldfd, newfd, flags);
	e = errno;
	if (r >= 0) {
		wsd_poll_fd_closed(newfd);
		wsd_sock_forget(newfd);
	} else if (kept) {
		keep_undo(newfd, k);
	}
	if (k >= 0)
		real.close(k);
	errno = e;
	return duped(oldfd, r);
}

EXPORT int fcntl(int fd, int cmd, ...)
{
	struct wsd_sock *s;
	va_list ap;
	void *arg;
	int r;

	va_start(ap, cmd);
	arg = va_arg(ap, void *);
	va_end(ap);
	wsd_real_init();
	r = real.fcntl(fd, cmd, arg);
	if (r >= 0 && (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC))
		return duped(fd, r);
	if (r < 0 || !wsd_fd_any())
		return r;
	if (cmd == F_SETFL && (s = wsd_fd_get(fd))) {
		s->nonblock = (long)arg & O_NONBLOCK;
		wsd_sock_put(s);
	}
	return r;
}

/* fcntl64 is the same call on 64-bit; glibc 2.28+ programs may use either name. */
EXPORT int fcntl64(int fd, int cmd, ...) __attribute__((alias("fcntl")));

EXPORT int ioctl(int fd, unsigned long req, ...)
{
	struct wsd_sock *s;
	va_list ap;
	void *arg;
	int r;

	va_start(ap, req);
	arg = va_arg(ap, void *);
	va_end(ap);
	wsd_real_init();
	if (req == FIONREAD && arg && (s = wsd_fd_get(fd))) {
		long n = wsd_sock_nread(s);

		wsd_sock_put(s);
		if (n >= 0) {
			*(int *)arg = n > INT32_MAX ? INT32_MAX : (int)n;
			return 0;
		}
	}
	r = real.ioctl(fd, req, arg);
	if (r == 0 && req == FIONBIO && arg && (s = wsd_fd_get(fd))) {
		s->nonblock = *(int *)arg != 0;
		wsd_sock_put(s);
	}
	return r;
}

/* TCP_NODELAY is ours once a socket is accelerated (doorbells); the app's value stays its own. */
EXPORT int setsockopt(int fd, int level, int name, const void *val, socklen_t len)
{
	struct wsd_sock *s;
	int r;

	wsd_real_init();
	if (level != IPPROTO_TCP || name != TCP_NODELAY || !(s = wsd_fd_get(fd)))
		return real.setsockopt(fd, level, name, val, len);
	if (s->nodelay_forced && val && len >= sizeof(int)) {
		s->app_nodelay = *(const int *)val != 0;
		r = 0;
	} else {
		r = real.setsockopt(fd, level, name, val, len);
		/* what the kernel now holds, as it reads it back (non-zero: on) */
		if (r == 0 && val && len >= sizeof(int) && !s->nodelay_forced) {
			s->app_nodelay = *(const int *)val != 0;
			s->nodelay_known = true;
		}
	}
	wsd_sock_put(s);
	return r;
}

EXPORT int getsockopt(int fd, int level, int name, void *val, socklen_t *len)
{
	struct wsd_sock *s;
	int r;

	wsd_real_init();
	if (level != IPPROTO_TCP || name != TCP_NODELAY || !(s = wsd_fd_get(fd)))
		return real.getsockopt(fd, level, name, val, len);
	r = real.getsockopt(fd, level, name, val, len);
	if (r == 0 && s->nodelay_forced && val && len && *len >= sizeof(int))
		*(int *)val = s->app_nodelay;
	wsd_sock_put(s);
	return r;
}

bool wsd_sock_unserved(const struct wsd_sock *s)
{
	return s->accepted_by == wsd_pid() && !s->data_called;
}

/* SPDX-License-Identifier: MIT */
/*
 * The socket lifecycle under the preload: socket, connect, listen, accept,
 * shutdown, close, dup*, fcntl, ioctl, fork.  Each does the real call first
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

static bool is_tcp(int domain, int type, int protocol)
{
	return (domain == AF_INET || domain == AF_INET6) &&
	       (type & 0xf) == SOCK_STREAM && (protocol == 0 || protocol == IPPROTO_TCP);
}

static int keep_stdio(int fd);
static void forget(int fd);

static void track(int fd, int family, bool nonblock)
{
	struct wsd_sock *s = wsd_sock_new(fd, family);

	if (!s)
		return;   /* no memory: the socket simply stays plain */
	s->nonblock = nonblock;
	wsd_fd_set(fd, s);
	wsd_sock_put(s);
	keep_stdio(fd);   /* nothing to move yet: it cannot fail */
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
			wsd_upgrade_prestart();
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

static int accepted(int lfd, int fd, int flags)
{
	struct wsd_sock *l, *s;
	int e = errno;

	if (fd < 0 || !(l = wsd_fd_get(lfd)))
		return fd;
	s = wsd_sock_new(fd, l->family);
	wsd_sock_put(l);
	if (s) {
		s->nonblock = flags & SOCK_NONBLOCK;
		wsd_fd_set(fd, s);
		wsd_upgrade_accepted(s);
		wsd_sock_put(s);
		if (keep_stdio(fd)) {
			/* attached in accept and its peer did not answer: fail loudly */
			forget(fd);
			real.close(fd);
			errno = ECONNABORTED;
			return -1;
		}
	}
	errno = e;
	return fd;
}

EXPORT int accept(int fd, struct sockaddr *addr, socklen_t *len)
{
	wsd_real_init();
	return accepted(fd, real.accept(fd, addr, len), 0);
}

EXPORT int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
	wsd_real_init();
	return accepted(fd, real.accept4(fd, addr, len, flags), flags);
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
static void forget(int fd)
{
	struct wsd_sock *s = wsd_fd_take(fd);

	if (!s)
		return;
	if (atomic_load(&s->nfds) == 0) {
		if (s->listening)
			wsd_upgrade_unlisten(s);
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
		forget(fd);
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
		forget(r.fds[i]);
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

/* Bytes the switch still holds for s (a plain socket now), or bells to skip before the stream's. */
static bool kept_left(struct wsd_sock *s)
{
	return (s->pre && !atomic_load(&s->pre->done)) || (s->rx_skip && s->rx_back);
}

/*
 * s went back to the stream for a stdio stream that reads it: what had
 * arrived by the ring and was not yet read (the prefix) would be skipped
 * by the stream's internal reads.  The switch's receive takes it out
 * (*kept, *len; free it), and skips the peer's last doorbells on the
 * stream.  0, or -ETIMEDOUT if those bells do not come (the stream is
 * stalled: the bytes are dropped and the socket is shut both ways, so its
 * reads end rather than skip them or take bells for data), or -ENOMEM.
 */
static int take_kept(struct wsd_sock *s, uint8_t **kept_out, size_t *len_out)
{
	int64_t end = wsd_now_ms() + 10 * WSD_BACK_MS;
	size_t len = 0, cap = 0;
	uint8_t *kept = NULL;
	int r = 0;

	while (kept_left(s)) {
		struct iovec v;
		ssize_t n;

		if (cap - len < 65536) {
			uint8_t *p = realloc(kept, cap + 65536);

			if (!p) {
				r = -ENOMEM;
				break;
			}
			kept = p;
			cap += 65536;
		}
		v = (struct iovec){ kept + len, cap - len };
		n = wsd_sock_recv(s, &v, 1, MSG_DONTWAIT);
		if (n > 0) {
			len += (size_t)n;
			continue;
		}
		if (n != -EAGAIN)
			break;        /* the end or an error: f's own reads will say so */
		if (wsd_now_ms() >= end) {
			r = -ETIMEDOUT;
			break;
		}
		real.poll(&(struct pollfd){ .fd = s->fd, .events = POLLIN }, 1, 10);
	}
	if (r) {
		real.shutdown(s->fd, SHUT_RDWR);
		free(kept);
		kept = NULL;
		len = 0;
	}
	*kept_out = kept;
	*len_out = len;
	return r;
}

/*
 * Bytes keep_stdio pushed into stdin for the socket on 0.  An exec would
 * drop them with the stream: before_exec moves those still unread into a
 * prefix the new image gets (restored), and a failed exec puts them back.
 */
static _Atomic bool stdin_pushed;
static bool stdin_restored;

/* glibc: f reads from its pushback ("backup") area; what is left there is ours. */
#define GLIBC_IN_BACKUP 0x100

static size_t pushed_unread(FILE *f)
{
	if (!(f->_flags & GLIBC_IN_BACKUP) || f->_IO_read_end < f->_IO_read_ptr)
		return 0;
	return (size_t)(f->_IO_read_end - f->_IO_read_ptr);
}

/* The bytes take_kept took go in front of f's, in order (glibc's ungetc takes any number). */
static void push_kept(FILE *f, uint8_t *kept, size_t len)
{
	while (len)
		ungetc(kept[--len], f);
	free(kept);
}

/*
 * 0, 1 and 2 are the program's stdin, stdout and stderr: printf, puts and
 * fgets move their bytes with the C library's internal read and write,
 * which no preload sees.  A socket that is or becomes one of them (inetd,
 * systemd's Accept=yes, a dup2 onto stdout) stays on (or goes back to) the
 * kernel stream.  0, or -errno when its peer's switch did not answer.
 */
static int keep_stdio(int fd)
{
	struct wsd_sock *s;
	int r;

	if (fd < 0 || fd > 2 || !(s = wsd_fd_get(fd)))
		return 0;
	r = wsd_sock_keep_tcp(s, R_UNSUPPORTED);
	if (!r && fd == 0) {
		/* stdin's stream reads it: what the switch kept goes there */
		uint8_t *kept;
		size_t len;

		r = take_kept(s, &kept, &len);
		if (!r && len)
			atomic_store(&stdin_pushed, true);
		if (!r)
			push_kept(stdin, kept, len);
	}
	wsd_sock_put(s);
	return r;
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
	if ((r = keep_stdio(newfd))) {
		/* stdio over an accelerated socket would lose bytes: fail loudly */
		forget(newfd);
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
		forget(newfd);
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
		forget(newfd);
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

/*
 * A stream over a socket reads and writes through the C library's internal
 * calls, which no preload can see: such a socket goes back to the kernel
 * stream first (an upgrade may have been attached inside accept already)
 * and stays there; what the switch kept unread goes into the stream.  If
 * its peer's switch does not answer, fdopen fails (ETIMEDOUT, or the
 * error): a stream that loses bytes would be worse.
 */
EXPORT FILE *fdopen(int fd, const char *mode)
{
	static FILE *(*next)(int, const char *);
	struct wsd_sock *s;
	uint8_t *kept = NULL;
	size_t len = 0;
	FILE *f;
	int r = 0;

	if (!next)
		next = (FILE *(*)(int, const char *))dlsym(RTLD_NEXT, "fdopen");
	if (!next) {
		errno = ENOSYS;
		return NULL;
	}
	if (!(s = wsd_fd_get(fd)))
		return next(fd, mode);
	r = wsd_sock_keep_tcp(s, R_UNSUPPORTED);
	if (r) {
		wsd_sock_put(s);
		fprintf(stderr, "libwsd: fdopen(%d): the connection cannot go back to TCP "
			"(its peer's switch did not answer): %s\n", fd, strerror(-r));
		errno = -r;
		return NULL;
	}
	f = next(fd, mode);
	/* a stream that reads takes what the switch kept for the socket */
	if (f && mode && (strchr(mode, 'r') || strchr(mode, '+'))) {
		if (take_kept(s, &kept, &len))
			fprintf(stderr, "libwsd: fdopen(%d): the stream stalled on its way back "
				"to TCP: the connection is shut\n", fd);
		push_kept(f, kept, len);
	}
	wsd_sock_put(s);
	return f;
}

/*
 * fclose closes the stream's fd with the C library's internal close: that
 * fd is forgotten as close() forgets it (after the stream's last bytes
 * went out), or its number would still name the socket.
 */
EXPORT int fclose(FILE *f)
{
	static int (*next)(FILE *);
	struct wsd_sock *s;
	int fd;

	if (!next)
		next = (int (*)(FILE *))dlsym(RTLD_NEXT, "fclose");
	if (!next) {
		errno = ENOSYS;
		return EOF;
	}
	fd = f ? fileno(f) : -1;
	if (fd >= 0) {
		wsd_poll_fd_closed(fd);
		if ((s = wsd_fd_get(fd))) {
			wsd_sock_put(s);
			fflush(f);   /* its buffer goes out while fd is still ours */
			forget(fd);
		}
	}
	return next(f);
}

/*
 * freopen closes the stream's old fd with the internal close, then gives
 * the new file that number when it can: the old socket is forgotten first.
 */
static FILE *reopened(FILE *(*next)(const char *, const char *, FILE *), const char *path,
		      const char *mode, FILE *f)
{
	struct wsd_sock *s;
	int fd;

	if (!next) {
		errno = ENOSYS;
		return NULL;
	}
	fd = f ? fileno(f) : -1;
	/* without a path the same fd is reopened (its mode changes): nothing closes */
	if (fd >= 0 && path) {
		wsd_poll_fd_closed(fd);
		if ((s = wsd_fd_get(fd))) {
			wsd_sock_put(s);
			fflush(f);
			forget(fd);
		}
	}
	return next(path, mode, f);
}

EXPORT FILE *freopen(const char *path, const char *mode, FILE *f)
{
	static FILE *(*next)(const char *, const char *, FILE *);

	if (!next)
		next = (FILE *(*)(const char *, const char *, FILE *))dlsym(RTLD_NEXT, "freopen");
	return reopened(next, path, mode, f);
}

EXPORT FILE *freopen64(const char *path, const char *mode, FILE *f)
{
	static FILE *(*next)(const char *, const char *, FILE *);

	if (!next)
		next = (FILE *(*)(const char *, const char *, FILE *))dlsym(RTLD_NEXT, "freopen64");
	return reopened(next, path, mode, f);
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

/* ---- fork and exec ------------------------------------------------------------------ */

/*
 * A connection moved off the kernel stream lives in one process's memory:
 * neither a fork child nor a new image could read what the peer puts in
 * its ring.  So before fork and exec each upgraded socket the other image
 * will hold goes back to the stream, byte-exact (wsd_sock_downgrade, BACK
 * in wsd-protocol(7)); what had arrived unread is kept in a prefix that a
 * fork shares and an exec passes on.  Close-on-exec sockets are left
 * alone at fork: fork+exec helpers are the common case, and only a child
 * that uses one before exec finds it detached.  A peer whose switch does
 * not answer within BACK_MS leaves its connection as it was (the child's
 * copy detached; for exec, shut).
 */
#define BACK_MS WSD_BACK_MS

static void note_child(struct wsd_sock *s, struct wsd_sock_list *l)
{
	int st;

	if (s->listening)
		return;
	/* held by two processes from now: the peer's data must stay where both read */
	if (!s->no_upgrade) {
		s->no_upgrade = true;
		s->why_not = R_FORKED;
	}
	st = atomic_load(&s->upgrade_state);
	if (wsd_sock_upgraded(s) || st == UP_QUEUED || st == UP_RUNNING || s->rx_skip)
		wsd_sock_list_add(l, s);
}

static void note_fork(int fd, struct wsd_sock *s, void *arg)
{
	if (!(real.fcntl(fd, F_GETFD) & FD_CLOEXEC))
		note_child(s, arg);
}

/* The noted sockets go back to the stream (before a child may use them). */
static void to_stream(struct wsd_sock_list *l)
{
	int64_t end = wsd_now_ms() + BACK_MS;

	for (size_t i = 0; i < l->n; i++) {
		struct wsd_sock *s = l->socks[i];
		int st;

		/* an upgrade under way finishes (or fails, seeing no_upgrade) first */
		while (((st = atomic_load(&s->upgrade_state)) == UP_QUEUED || st == UP_RUNNING) &&
		       wsd_now_ms() < end)
			real.poll(NULL, 0, 1);
		if (wsd_sock_upgraded(s))
			wsd_sock_downgrade(s, BACK_MS);
		else if (s->rx_skip)
			wsd_sock_share_skip(s);
	}
}

static void before_fork(void)
{
	struct wsd_sock_list l = { 0 };

	/* our threads between two pieces of work: none inside the allocator */
	wsd_threads_idle(200);
	if (!wsd_fd_any())
		return;
	wsd_fd_each(note_fork, &l);
	to_stream(&l);
	wsd_sock_list_free(&l);
}

static void in_child(void)
{
	wsd_fd_atfork_child();
	wsd_poll_atfork_child();
	wsd_stat_atfork_child();
	wsd_upgrade_atfork_child();
}

__attribute__((constructor)) static void switch_init(void)
{
	wsd_real_init();
	pthread_atfork(before_fork, NULL, in_child);
	wsd_prefix_inherit();
}

static void note_exec(int fd, struct wsd_sock *s, void *arg)
{
	(void)fd;
	if (s->sess && !s->detached)
		wsd_sock_list_add(arg, s);
}

/*
 * Before exec.  Every session's provider connection closes with the old
 * image (the peer must not write into an address space being replaced).
 * Each upgraded socket goes back to the stream first, close-on-exec ones
 * too: the exec may fail and leave them in use, and if it succeeds the
 * kernel closes a plain stream whose doorbells were all read, which the
 * peer sees as the end of the stream (bells left unread would make the
 * close a reset).  If the peer does not answer, the socket is shut both
 * ways (it reads as closed).  Returns the WSD_INHERIT entry naming the
 * prefixes to pass on, or NULL.
 */
static void stdin_to_prefix(void)
{
	struct wsd_sock *s;
	struct wsd_prefix *p;
	uint8_t *buf;
	size_t n;
	int pfd;

	if (!atomic_load(&stdin_pushed) || !(s = wsd_fd_get(0)))
		return;
	n = pushed_unread(stdin);
	if (n && (!s->pre || atomic_load(&s->pre->done)) && !s->rx_skip && (buf = malloc(n))) {
		/* all of it is in the stream's buffer: fread does not touch the fd */
		size_t got = fread(buf, 1, n, stdin);

		p = got == n ? wsd_prefix_new(buf, n, 0, &pfd) : NULL;
		if (p) {
			if (s->pre) {
				wsd_prefix_close(s->pre);
				real.close(s->pre_fd);
			}
			s->pre = p;
			s->pre_fd = pfd;
			stdin_restored = true;
		} else {
			push_kept(stdin, buf, got);   /* no memory: they stay where they were */
			buf = NULL;
		}
		free(buf);
	}
	wsd_sock_put(s);
}

/* The exec failed: what stdin_to_prefix moved goes back into stdin. */
static void exec_failed(void)
{
	struct wsd_sock *s;
	uint8_t *kept;
	size_t len;

	if (!stdin_restored || !(s = wsd_fd_get(0)))
		return;
	stdin_restored = false;
	if (!take_kept(s, &kept, &len))
		push_kept(stdin, kept, len);
	wsd_sock_put(s);
}

static char *before_exec(void)
{
	struct wsd_sock_list l = { 0 };

	wsd_real_init();
	if (!wsd_fd_any())
		return NULL;
	stdin_to_prefix();
	wsd_fd_each(note_exec, &l);
	for (size_t i = 0; i < l.n; i++) {
		struct wsd_sock *s = l.socks[i];

		/* one plain again already (an earlier fork, say) stays as it is */
		if (wsd_sock_upgraded(s) && wsd_sock_downgrade(s, BACK_MS)) {
			real.shutdown(s->fd, SHUT_RDWR);   /* reads as closed, not as bells */
			s->detached = true;
		}
		wsd_session_abandon(s->sess);
	}
	wsd_sock_list_free(&l);
	return wsd_prefix_env();
}

/* envp with var (NAME=value) in place of any earlier NAME, or envp itself. */
static char *const *with_var(char *const envp[], char *var)
{
	size_t n = 0, k = 0, name = strchr(var, '=') - var + 1;
	char **e;

	while (envp && envp[n])
		n++;
	e = malloc((n + 2) * sizeof(*e));
	if (!e)
		return envp;
	for (size_t i = 0; i < n; i++)
		if (strncmp(envp[i], var, name))
			e[k++] = envp[i];
	e[k++] = var;
	e[k] = NULL;
	return e;
}

extern char **environ;

typedef int (*execve_fn)(const char *, char *const[], char *const[]);

static execve_fn next_execve(void)
{
	static execve_fn next;

	if (!next)
		next = (execve_fn)dlsym(RTLD_NEXT, "execve");
	return next;
}

static execve_fn next_execvpe(void)
{
	static execve_fn next;

	if (!next)
		next = (execve_fn)dlsym(RTLD_NEXT, "execvpe");
	return next;
}

/*
 * The exec itself, with var (from before_exec, or NULL) in the
 * environment; if it fails, what was allocated for it goes.  The calls
 * without an environment go straight to the C library's execve/execvpe,
 * not through ours: before_exec is done once.
 */
static int exec_with(execve_fn fn, const char *path, char *const argv[], char *const envp[],
		     char *var)
{
	char *const *e = var ? with_var(envp, var) : envp;
	int r = fn(path, argv, e), err = errno;

	if (e != envp)
		free((void *)e);
	free(var);
	exec_failed();
	errno = err;
	return r;
}

EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
	return exec_with(next_execve(), path, argv, envp, before_exec());
}

EXPORT int execv(const char *path, char *const argv[])
{
	static int (*next)(const char *, char *const[]);
	char *var;

	if (!next)
		next = (int (*)(const char *, char *const[]))dlsym(RTLD_NEXT, "execv");
	var = before_exec();
	if (var)
		return exec_with(next_execve(), path, argv, environ, var);
	return next(path, argv);
}

EXPORT int execvp(const char *file, char *const argv[])
{
	static int (*next)(const char *, char *const[]);
	char *var;

	if (!next)
		next = (int (*)(const char *, char *const[]))dlsym(RTLD_NEXT, "execvp");
	var = before_exec();
	if (var)
		return exec_with(next_execvpe(), file, argv, environ, var);
	return next(file, argv);
}

EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
	return exec_with(next_execvpe(), file, argv, envp, before_exec());
}

EXPORT int fexecve(int fd, char *const argv[], char *const envp[])
{
	static int (*next)(int, char *const[], char *const[]);
	char *var;
	char *const *e;
	int r, err;

	if (!next)
		next = (int (*)(int, char *const[], char *const[]))dlsym(RTLD_NEXT, "fexecve");
	var = before_exec();
	e = var ? with_var(envp, var) : envp;
	r = next(fd, argv, e);
	err = errno;
	if (e != envp)
		free((void *)e);
	free(var);
	exec_failed();
	errno = err;
	return r;
}

/* The execl family: gather the arguments, then as execve/execvp. */
#define GATHER(first, ap, argv, with_env, envp)						\
	do {										\
		size_t n_ = 1;								\
		va_list c_;								\
		va_copy(c_, ap);							\
		while (va_arg(c_, char *))						\
			n_++;								\
		va_end(c_);								\
		argv = alloca((n_ + 1) * sizeof(char *));				\
		argv[0] = (char *)(first);						\
		for (size_t i_ = 1; i_ <= n_; i_++)					\
			argv[i_] = va_arg(ap, char *);					\
		if (with_env)								\
			envp = va_arg(ap, char **);					\
	} while (0)

EXPORT int execl(const char *path, const char *arg, ...)
{
	char **argv, **envp = NULL;
	va_list ap;

	va_start(ap, arg);
	GATHER(arg, ap, argv, false, envp);
	va_end(ap);
	(void)envp;
	return execv(path, argv);
}

EXPORT int execlp(const char *file, const char *arg, ...)
{
	char **argv, **envp = NULL;
	va_list ap;

	va_start(ap, arg);
	GATHER(arg, ap, argv, false, envp);
	va_end(ap);
	(void)envp;
	return execvp(file, argv);
}

EXPORT int execle(const char *path, const char *arg, ...)
{
	char **argv, **envp = NULL;
	va_list ap;

	va_start(ap, arg);
	GATHER(arg, ap, argv, true, envp);
	va_end(ap);
	return execve(path, argv, envp);
}

/* ---- children started without fork: vfork, posix_spawn, system, popen ---------------- */

/*
 * vfork runs as fork, as POSIX allows and libvma does.  A vfork child
 * shares its parent's memory until it execs: our execve in it (Python's
 * subprocess execs through it) would move the parent's connections back to
 * the stream and drop its sessions, in the parent.  As fork, the child
 * has its own copy, the parent's sockets it inherits go back to the
 * stream before it starts (before_fork), and its copies of the others are
 * detached, which an exec leaves alone.  It costs the copy of the page
 * tables that vfork saves.
 */
EXPORT pid_t vfork(void)
{
	return fork();
}

/*
 * glibc's posix_spawn file actions, as posix/spawn_int.h lays them out
 * (stable since 2.x; checked once against a probe below).  Only dup2
 * matters here: it gives the child a socket that may be close-on-exec.
 */
struct spawn_action {
	int tag;                      /* 1: dup2 */
	union {
		struct { int fd, newfd; } dup2;
		struct { int fd; char *path; int oflag; mode_t mode; } open;
	} u;
};

enum { SPAWN_DUP2 = 1, SPAWN_TAGS = 7 };

/* True when the layout above is glibc's (else every socket counts as given). */
static bool spawn_layout_known(void)
{
	static int known = -1;
	posix_spawn_file_actions_t fa;

	if (known < 0) {
		const struct spawn_action *a;

		known = 0;
		if (posix_spawn_file_actions_init(&fa))
			return false;
		if (!posix_spawn_file_actions_addclose(&fa, 7) &&
		    !posix_spawn_file_actions_adddup2(&fa, 5, 9) && fa.__used == 2) {
			a = (const struct spawn_action *)fa.__actions;
			known = a[0].tag == 0 && a[1].tag == SPAWN_DUP2 && a[1].u.dup2.fd == 5 &&
				a[1].u.dup2.newfd == 9;
		}
		posix_spawn_file_actions_destroy(&fa);
	}
	return known;
}

/* Whether fa (may be NULL) gives the child fd by a dup2; with newfd, the first. */
static bool spawn_dup2s(const posix_spawn_file_actions_t *fa, int fd, int *newfd)
{
	const struct spawn_action *a;

	if (!fa || !fa->__used)
		return false;
	if (!spawn_layout_known())
		return !newfd;   /* unknown: assume it does, but name no number */
	a = (const struct spawn_action *)fa->__actions;
	for (int i = 0; i < fa->__used; i++) {
		if (a[i].tag < 0 || a[i].tag >= SPAWN_TAGS)
			return !newfd;
		if (a[i].tag == SPAWN_DUP2 && a[i].u.dup2.fd == fd) {
			if (newfd)
				*newfd = a[i].u.dup2.newfd;
			return true;
		}
	}
	return false;
}

struct spawn_ctx {
	struct wsd_sock_list l;
	const posix_spawn_file_actions_t *fa;
};

static void note_spawn(int fd, struct wsd_sock *s, void *arg)
{
	struct spawn_ctx *c = arg;

	if (!(real.fcntl(fd, F_GETFD) & FD_CLOEXEC) || spawn_dup2s(c->fa, fd, NULL))
		note_child(s, &c->l);
}

/*
 * The prefixes of sockets a dup2 action gives the child under another
 * number, added to var (WSD_INHERIT=..., or NULL): its number in the child
 * is the dup2's.
 */
struct dup2_env {
	const posix_spawn_file_actions_t *fa;
	FILE *f;
	bool any;
};

static void env_dup2(int fd, struct wsd_sock *s, void *arg)
{
	struct dup2_env *d = arg;
	int newfd;

	if (!s->pre || s->pre_fd < 0 || atomic_load(&s->pre->done) ||
	    !spawn_dup2s(d->fa, fd, &newfd))
		return;
	if (fprintf(d->f, "%s%d:%d", d->any ? "," : "", newfd, s->pre_fd) < 0)
		return;
	d->any = true;
	real.fcntl(s->pre_fd, F_SETFD, 0);   /* the child needs the memfd open */
}

static char *spawn_env(const posix_spawn_file_actions_t *fa)
{
	struct dup2_env d = { .fa = fa };
	char *var = wsd_prefix_env(), *v = NULL;
	size_t len = 0;

	if (!fa || !fa->__used)
		return var;
	d.f = open_memstream(&v, &len);
	if (!d.f)
		return var;
	fputs(var ? var : "WSD_INHERIT=", d.f);
	d.any = var != NULL;
	wsd_fd_each(env_dup2, &d);
	if (fclose(d.f) || !d.any) {
		free(v);
		return var;
	}
	free(var);
	return v;
}

/*
 * Before a child the C library starts by itself (posix_spawn, system,
 * popen: a clone sharing our memory, then its internal execve, which no
 * preload sees): what before_fork and before_exec do for fork and exec.
 * The sockets the child will hold (not close-on-exec, or given by a dup2
 * action) go back to the stream, and the prefixes of their unread bytes
 * are passed in the returned WSD_INHERIT entry (or NULL).
 */
static char *before_spawn(const posix_spawn_file_actions_t *fa)
{
	struct spawn_ctx c = { .fa = fa };

	wsd_real_init();
	if (!wsd_fd_any())
		return NULL;
	wsd_fd_each(note_spawn, &c);
	to_stream(&c.l);
	wsd_sock_list_free(&c.l);
	return spawn_env(fa);
}

typedef int (*spawn_fn)(pid_t *, const char *, const posix_spawn_file_actions_t *,
			const posix_spawnattr_t *, char *const[], char *const[]);

static int spawn_with(spawn_fn fn, pid_t *pid, const char *path,
		      const posix_spawn_file_actions_t *fa, const posix_spawnattr_t *attr,
		      char *const argv[], char *const envp[])
{
	char *var = before_spawn(fa);
	char *const *e = var ? with_var(envp, var) : envp;
	int r;

	if (!fn)
		return ENOSYS;
	r = fn(pid, path, fa, attr, argv, e);
	if (e != envp)
		free((void *)e);
	free(var);
	return r;
}

EXPORT int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
		       const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
	static spawn_fn next;

	if (!next)
		next = (spawn_fn)dlsym(RTLD_NEXT, "posix_spawn");
	return spawn_with(next, pid, path, fa, attr, argv, envp);
}

EXPORT int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa,
			const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
	static spawn_fn next;

	if (!next)
		next = (spawn_fn)dlsym(RTLD_NEXT, "posix_spawnp");
	return spawn_with(next, pid, file, fa, attr, argv, envp);
}

/*
 * system and popen spawn inside the C library with the environment as it
 * is: a prefix to pass goes there for the length of the call.  The
 * environment is the process's, so this is the one place the switch
 * changes it; only when a socket the child inherits has unread bytes kept
 * for it (after going back to the stream), and the lock keeps two such
 * calls from undoing each other.
 */
static pthread_mutex_t env_lock = PTHREAD_MUTEX_INITIALIZER;

static bool env_set(char *var)
{
	if (!var)
		return false;
	pthread_mutex_lock(&env_lock);
	if (putenv(var)) {
		pthread_mutex_unlock(&env_lock);
		free(var);
		return false;
	}
	return true;
}

static void env_unset(char *var, bool set)
{
	if (!set)
		return;
	unsetenv("WSD_INHERIT");
	pthread_mutex_unlock(&env_lock);
	free(var);
}

EXPORT int system(const char *cmd)
{
	static int (*next)(const char *);
	char *var;
	bool set;
	int r, e;

	if (!next)
		next = (int (*)(const char *))dlsym(RTLD_NEXT, "system");
	if (!next) {
		errno = ENOSYS;
		return -1;
	}
	if (!cmd)
		return next(cmd);
	var = before_spawn(NULL);
	set = env_set(var);
	r = next(cmd);
	e = errno;
	env_unset(var, set);
	errno = e;
	return r;
}

EXPORT FILE *popen(const char *cmd, const char *mode)
{
	static FILE *(*next)(const char *, const char *);
	char *var;
	bool set;
	FILE *f;
	int e;

	if (!next)
		next = (FILE *(*)(const char *, const char *))dlsym(RTLD_NEXT, "popen");
	if (!next) {
		errno = ENOSYS;
		return NULL;
	}
	var = before_spawn(NULL);
	set = env_set(var);
	f = next(cmd, mode);
	e = errno;
	env_unset(var, set);
	errno = e;
	return f;
}

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

static void track(int fd, int family, bool nonblock)
{
	struct wsd_sock *s = wsd_sock_new(fd, family);

	if (!s)
		return;   /* no memory: the socket simply stays plain */
	s->nonblock = nonblock;
	wsd_fd_set(fd, s);
	wsd_sock_put(s);
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

static int duped(int oldfd, int newfd)
{
	struct wsd_sock *s;
	int e = errno;

	if (newfd >= 0)
		wsd_poll_fd_dup(oldfd, newfd);
	if (newfd < 0 || !(s = wsd_fd_get(oldfd)))
		return newfd;
	wsd_fd_set(newfd, s);
	wsd_sock_put(s);
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
 * calls, which no preload can see: such a socket must stay on the kernel
 * stream (an upgraded one cannot go back; wsd-protocol(7), BUGS).
 */
EXPORT FILE *fdopen(int fd, const char *mode)
{
	static FILE *(*next)(int, const char *);
	struct wsd_sock *s;

	if (!next)
		next = (FILE *(*)(int, const char *))dlsym(RTLD_NEXT, "fdopen");
	if ((s = wsd_fd_get(fd))) {
		s->no_upgrade = true;
		s->why_not = R_UNSUPPORTED;
		wsd_sock_put(s);
	}
	return next ? next(fd, mode) : NULL;
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

struct sock_list {
	struct wsd_sock **socks;
	size_t n, cap;
};

/* Under the fd table's lock: only note them (the work takes other locks). */
static void list_add(struct sock_list *l, struct wsd_sock *s)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 64;
		struct wsd_sock **p = realloc(l->socks, cap * sizeof(*p));

		if (!p)
			return;
		l->socks = p;
		l->cap = cap;
	}
	wsd_sock_hold(s);
	l->socks[l->n++] = s;
}

static void list_free(struct sock_list *l)
{
	for (size_t i = 0; i < l->n; i++)
		wsd_sock_put(l->socks[i]);
	free(l->socks);
}

#define upgraded wsd_sock_upgraded

static void note_fork(int fd, struct wsd_sock *s, void *arg)
{
	int st;

	if (s->listening || (real.fcntl(fd, F_GETFD) & FD_CLOEXEC))
		return;
	/* held by two processes from now: the peer's data must stay where both read */
	if (!s->no_upgrade) {
		s->no_upgrade = true;
		s->why_not = R_FORKED;
	}
	st = atomic_load(&s->upgrade_state);
	if (upgraded(s) || st == UP_QUEUED || st == UP_RUNNING || s->rx_skip)
		list_add(arg, s);
}

static void before_fork(void)
{
	struct sock_list l = { 0 };
	int64_t end;

	/* our threads between two pieces of work: none inside the allocator */
	wsd_threads_idle(200);
	if (!wsd_fd_any())
		return;
	wsd_fd_each(note_fork, &l);
	end = wsd_now_ms() + BACK_MS;
	for (size_t i = 0; i < l.n; i++) {
		struct wsd_sock *s = l.socks[i];
		int st;

		/* an upgrade under way finishes (or fails, seeing no_upgrade) first */
		while (((st = atomic_load(&s->upgrade_state)) == UP_QUEUED || st == UP_RUNNING) &&
		       wsd_now_ms() < end)
			real.poll(NULL, 0, 1);
		if (upgraded(s))
			wsd_sock_downgrade(s, BACK_MS);
		else if (s->rx_skip)
			wsd_sock_share_skip(s);
	}
	list_free(&l);
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
		list_add(arg, s);
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
static char *before_exec(void)
{
	struct sock_list l = { 0 };

	wsd_real_init();
	if (!wsd_fd_any())
		return NULL;
	wsd_fd_each(note_exec, &l);
	for (size_t i = 0; i < l.n; i++) {
		struct wsd_sock *s = l.socks[i];

		/* one plain again already (an earlier fork, say) stays as it is */
		if (upgraded(s) && wsd_sock_downgrade(s, BACK_MS)) {
			real.shutdown(s->fd, SHUT_RDWR);   /* reads as closed, not as bells */
			s->detached = true;
		}
		wsd_session_abandon(s->sess);
	}
	list_free(&l);
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

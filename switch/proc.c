/* SPDX-License-Identifier: MIT */
/*
 * Other images and other processes: fork, the exec family, and the
 * children started without fork (vfork, posix_spawn, system, popen).  An
 * upgraded connection lives in one process's memory, so each moves the
 * sockets the other image will hold back to the kernel stream first.
 */
#define _GNU_SOURCE
#include <alloca.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "provider/internal.h"
#include "switch/switch.h"

/* ---- fork and exec ------------------------------------------------------------------ */

/*
 * A connection moved off the kernel stream lives in one process's memory:
 * neither a fork child nor a new image could read what the peer puts in
 * its ring.  So before fork and exec each upgraded socket the other image
 * will hold goes back to the stream, byte-exact (wsd_sock_downgrade, BACK
 * in wsd-protocol(7)); what had arrived unread is kept in a prefix that a
 * fork shares and an exec passes on.  Close-on-exec sockets are left
 * alone at fork (note_fork): fork+exec helpers are the common case, and
 * only a child that uses one before exec finds it detached.  A peer whose switch does
 * not answer within BACK_MS leaves its connection as it was (the child's
 * copy detached; for exec, shut).
 */
#define BACK_MS WSD_BACK_MS

/*
 * How long fork waits for a thread of ours at work to reach its next wait
 * (wsd_threads_hold).  glibc's fork takes its allocator's locks itself, so
 * there the hold only keeps threads that wake from starting work, and
 * fork waits for none: a thread at work on a loaded machine may not run
 * for hundreds of ms, and a server's fork must not pay for that
 * (tests/attack/stall_check.sh).  The sanitizers' allocator (GCC 12's
 * ASan, LLVM's before 17) has no fork handling: a child whose parent
 * forked while one of our threads was inside it would wait on its lock
 * for ever, so that build waits, up to 200 ms.
 */
#ifdef WSD_SANITIZERS
#define HOLD_MS 200
#else
#define HOLD_MS 0
#endif

/*
 * A connection this process accepted on a listener with a page and has not
 * sent or received on: the child the fork makes is most likely its
 * handler (a server that forks per connection).
 */
static bool unserved(const struct wsd_sock *s)
{
	return s->reg_page && wsd_sock_unserved(s);
}

static void note_child(struct wsd_sock *s, struct wsd_sock_list *l)
{
	bool up;

	if (s->listening)
		return;
	/* a connection we accepted and never served, in the child too: a handler's fork */
	if (unserved(s))
		wsd_handlers_forked = true;
	/*
	 * Held by two processes from now: the peer's data must stay where both
	 * read.  Under mu, as an attach takes it: an upgrade that attaches
	 * after this sees no_upgrade and goes back to the stream by itself
	 * (wsd_session_attach_new), so the fork need not wait for it; one that
	 * attached before is upgraded here, and goes back now.
	 */
	pthread_mutex_lock(&s->mu);
	if (!s->no_upgrade) {
		s->no_upgrade = true;
		s->why_not = R_FORKED;
	}
	up = wsd_sock_upgraded(s);
	pthread_mutex_unlock(&s->mu);
	if (up || s->rx_skip)
		wsd_sock_list_add(l, s);
}

/*
 * Close-on-exec sockets are left alone, but for one accepted and not yet
 * served: a server whose sockets are all close-on-exec (Python's) forks
 * its handler with it, and an exec helper forked in that moment loses
 * little by the stream (doc/fork-servers.md).
 */
static void note_fork(int fd, struct wsd_sock *s, void *arg)
{
	if (!(real.fcntl(fd, F_GETFD) & FD_CLOEXEC) || unserved(s))
		note_child(s, arg);
}

/* The noted sockets go back to the stream (before a child may use them). */
static void to_stream(struct wsd_sock_list *l)
{

	for (size_t i = 0; i < l->n; i++) {
		struct wsd_sock *s = l->socks[i];

		if (wsd_sock_upgraded(s))
			wsd_sock_downgrade(s, BACK_MS);
		else if (s->rx_skip)
			wsd_sock_share_skip(s);
	}
}

static void before_fork(void)
{
	struct wsd_sock_list l = { 0 };

	wsd_settle_pending(true);   /* first bytes in a grant go by the stream: the child copies none */
	if (wsd_fd_any()) {
		wsd_fd_each(note_fork, &l);
		to_stream(&l);   /* may want our threads: they are held after it */
		wsd_sock_list_free(&l);
	}
	/* last: our threads held between two pieces of work, none inside the allocator */
	wsd_threads_hold(HOLD_MS);
}

static void in_parent(void)
{
	wsd_threads_release();
}

static void in_child(void)
{
	wsd_threads_release();
	wsd_fd_atfork_child();
	wsd_poll_atfork_child();
	wsd_stat_atfork_child();
	wsd_upgrade_atfork_child();
}

__attribute__((constructor)) static void switch_init(void)
{
	wsd_real_init();
	pthread_atfork(before_fork, in_parent, in_child);
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
static char *before_exec(void)
{
	struct wsd_sock_list l = { 0 };

	wsd_real_init();
	wsd_settle_pending(true);
	if (!wsd_fd_any())
		return NULL;
	wsd_stdin_to_prefix();
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
	wsd_stdin_exec_failed();
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
	wsd_stdin_exec_failed();
	errno = err;
	return r;
}

/*
 * The execl family: the arguments gathered (on this frame: the exec either
 * replaces the process or returns here), then as execv, execvp or execve.
 */
enum exec_kind { EXEC_V, EXEC_VP, EXEC_VE };

static int exec_list(enum exec_kind kind, const char *path, const char *arg, va_list ap)
{
	char **argv;
	size_t n = 1;
	va_list c;

	va_copy(c, ap);
	while (va_arg(c, char *))
		n++;
	va_end(c);
	argv = alloca((n + 1) * sizeof(char *));
	argv[0] = (char *)arg;
	for (size_t i = 1; i <= n; i++)
		argv[i] = va_arg(ap, char *);
	if (kind == EXEC_VE)
		return execve(path, argv, va_arg(ap, char **));
	return kind == EXEC_VP ? execvp(path, argv) : execv(path, argv);
}

EXPORT int execl(const char *path, const char *arg, ...)
{
	va_list ap;
	int r;

	va_start(ap, arg);
	r = exec_list(EXEC_V, path, arg, ap);
	va_end(ap);
	return r;
}

EXPORT int execlp(const char *file, const char *arg, ...)
{
	va_list ap;
	int r;

	va_start(ap, arg);
	r = exec_list(EXEC_VP, file, arg, ap);
	va_end(ap);
	return r;
}

EXPORT int execle(const char *path, const char *arg, ...)
{
	va_list ap;
	int r;

	va_start(ap, arg);
	r = exec_list(EXEC_VE, path, arg, ap);
	va_end(ap);
	return r;
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

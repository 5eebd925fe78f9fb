/* SPDX-License-Identifier: MIT */
/*
 * Guards: what keeps a connection on the kernel stream when the switch
 * could not see every byte of it (a stdio stream over the socket, an
 * io_uring of the program's own, a flag the ring does not carry) or when
 * accelerating it would spend the program's own limits.  Each ends in the
 * same place: the socket goes back to the stream at an exact byte (BACK in
 * wsd-protocol(7)) and upgrades no more, with its reason in wsd stat.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "provider/internal.h"
#include "switch/switch.h"

static _Atomic uint8_t stop_reason;

enum wsd_reason wsd_guard_stopped(void)
{
	return (enum wsd_reason)atomic_load(&stop_reason);
}

static void show_reason(struct wsd_sock *s, enum wsd_reason why)
{
	pthread_mutex_lock(&s->mu);
	s->no_upgrade = true;
	s->why_not = (uint8_t)why;
	pthread_mutex_unlock(&s->mu);
	wsd_stat_begin(s->stat);
	s->stat->reason = (uint8_t)why;
	wsd_stat_end(s->stat);
}

int wsd_sock_keep_tcp(struct wsd_sock *s, enum wsd_reason why)
{
	bool up;
	int r = 0;

	if (s->prov)
		wsd_upgrade_settle(s, true);   /* first bytes in a grant: by the stream */
	/*
	 * Under mu, as an attach takes it: an upgrade still under way sees
	 * no_upgrade when it ends and goes back by itself, its peer never
	 * told it may switch (wsd_session_attach_new), so nobody waits for it.
	 */
	pthread_mutex_lock(&s->mu);
	if (!s->no_upgrade) {
		s->no_upgrade = true;
		s->why_not = (uint8_t)why;
	}
	up = wsd_sock_upgraded(s);
	pthread_mutex_unlock(&s->mu);
	if (s->listening)
		return 0;
	if (up)
		r = wsd_sock_downgrade(s, WSD_BACK_MS);
	if (!r)
		show_reason(s, why);
	wsd_debug("switch: fd %d stays on TCP (%s)%s", s->fd, wsd_reason_name(why),
		  r ? ": its peer did not answer" : "");
	return r;
}

static void note(int fd, struct wsd_sock *s, void *arg)
{
	(void)fd;
	wsd_sock_list_add(arg, s);
}

void wsd_guard_io_uring(void)
{
	struct wsd_sock_list l = { 0 };
	uint8_t none = R_NONE;

	wsd_real_init();
	if (!atomic_compare_exchange_strong(&stop_reason, &none, R_IO_URING))
		return;
	wsd_debug("switch: the program made an io_uring: its sockets go back to TCP");
	if (!wsd_fd_any())
		return;
	wsd_fd_each(note, &l);
	for (size_t i = 0; i < l.n; i++) {
		struct wsd_sock *s = l.socks[i];

		/* the ring may read the kernel socket: nothing of ours may sit before its bytes */
		wsd_sock_keep_tcp(s, R_IO_URING);
		wsd_sock_bare(s, R_IO_URING, WSD_BACK_MS);
	}
	wsd_sock_list_free(&l);
}

/* ---- io_uring ------------------------------------------------------------------ */

/*
 * A ring of the program's own can send and receive on a socket without a
 * call the switch sees.  liburing makes its rings with inline system calls,
 * so its entry points are interposed here (and io_uring_setup through
 * syscall() in raw.c); the provider's own rings pass through
 * wsd_uring_init, which says so.
 */
EXPORT int io_uring_queue_init_params(unsigned entries, struct io_uring *ring,
				      struct io_uring_params *p)
{
	static int (*next)(unsigned, struct io_uring *, struct io_uring_params *);
	bool own = wsd_uring_own_call;
	int r;

	if (!next)
		next = wsd_real_next("io_uring_queue_init_params");
	r = next(entries, ring, p);
	if (r == 0 && !own)
		wsd_guard_io_uring();
	return r;
}

EXPORT int io_uring_queue_init(unsigned entries, struct io_uring *ring, unsigned flags)
{
	static int (*next)(unsigned, struct io_uring *, unsigned);
	bool own = wsd_uring_own_call;
	int r;

	if (!next)
		next = wsd_real_next("io_uring_queue_init");
	r = next(entries, ring, flags);
	if (r == 0 && !own)
		wsd_guard_io_uring();
	return r;
}

EXPORT int io_uring_setup(unsigned entries, struct io_uring_params *p)
{
	static int (*next)(unsigned, struct io_uring_params *);
	bool own = wsd_uring_own_call;
	int r;

	if (!next)
		next = wsd_real_next("io_uring_setup");
	r = next(entries, p);
	if (r >= 0 && !own)
		wsd_guard_io_uring();
	return r;
}

/*
 * The backstop: a ring made by an inline system call (a statically linked
 * helper library, a runtime without the C library) shows in /proc/self/fd.
 * Looked for before an upgrade, at most every SCAN_MS, and never more than
 * a twentieth of the time: a scan reads every descriptor's link, and a
 * process holding 10,000 connections spent most of its time here.
 */
#define SCAN_MS 100
#define SCAN_SHARE 20

static bool foreign_ring(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	bool found = false;

	if (!d)
		return false;
	while (!found && (e = readdir(d))) {
		char path[64], link[32];
		ssize_t n;
		int fd;

		if (e->d_name[0] < '0' || e->d_name[0] > '9')
			continue;
		fd = atoi(e->d_name);
		if (fd == dirfd(d))
			continue;
		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
		n = readlink(path, link, sizeof(link) - 1);
		if (n <= 0)
			continue;
		link[n] = 0;
		/* a likely one looked at again, with our rings held still */
		found = !strcmp(link, "anon_inode:[io_uring]") && wsd_uring_foreign(fd);
	}
	closedir(d);
	return found;
}

void wsd_guard_scan(void)
{
	static _Atomic int64_t last, gap = SCAN_MS;
	int64_t now = wsd_now_ms(), then = atomic_load(&last), took;
	bool found;

	if (wsd_guard_stopped() || now - then < atomic_load(&gap) ||
	    !atomic_compare_exchange_strong(&last, &then, now))
		return;
	found = foreign_ring();
	took = wsd_now_ms() - now;
	atomic_store(&gap, took * SCAN_SHARE > SCAN_MS ? took * SCAN_SHARE : SCAN_MS);
	if (found)
		wsd_guard_io_uring();
}

/* ---- the program's limits --------------------------------------------------------- */

/*
 * The kernel gives a new descriptor the lowest free number below
 * RLIMIT_NOFILE: every descriptor the switch holds is one the program may
 * find missing at its next accept, open or socket.  So the switch takes
 * descriptors (and maps memory under RLIMIT_AS) only while a reserve of
 * an eighth of the limit, at least RESERVE_FDS, would stay free after.
 */
#define RESERVE_FDS 32

/* Open descriptors; a cheap upper bound first (the table's size), exact when that is close. */
static long open_fds(long limit, long need)
{
	char line[128];
	long size = -1, n = 0;
	FILE *f = fopen("/proc/self/status", "re");
	DIR *d;
	struct dirent *e;

	if (f) {
		while (fgets(line, sizeof(line), f))
			if (!strncmp(line, "FDSize:", 7)) {
				size = atol(line + 7);
				break;
			}
		fclose(f);
	}
	if (size >= 0 && size + need <= limit)
		return size;
	if (!(d = opendir("/proc/self/fd")))
		return limit;   /* unknown: as if full */
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n - 1;           /* the directory's own */
}

static uint64_t mapped_bytes(void)
{
	unsigned long long pages = 0;
	FILE *f = fopen("/proc/self/statm", "re");

	if (f) {
		if (fscanf(f, "%llu", &pages) != 1)
			pages = 0;
		fclose(f);
	}
	return (uint64_t)pages * (uint64_t)sysconf(_SC_PAGESIZE);
}

/*
 * RLIMIT_AS as of at most a second ago: asked for each upgrade, it was one
 * system call on every short connection's way.  A limit lowered since
 * costs nothing worse than a mapping that fails, which the callers take
 * as no room (the connection stays on TCP).
 */
#define AS_LIMIT_MS 1000

static bool as_limit(struct rlimit *rl)
{
	static _Atomic uint64_t cur;
	static _Atomic int64_t until;   /* ms; 0: not asked yet */
	int64_t now = wsd_now_ms();

	if (atomic_load(&until) > now) {
		rl->rlim_cur = (rlim_t)atomic_load(&cur);
		return true;
	}
	if (getrlimit(RLIMIT_AS, rl))
		return false;
	atomic_store(&cur, (uint64_t)rl->rlim_cur);
	atomic_store(&until, now + AS_LIMIT_MS);
	return true;
}

bool wsd_guard_room(int fds, uint64_t bytes)
{
	struct rlimit rl;

	if (fds > 0 && !getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur != RLIM_INFINITY) {
		long limit = (long)rl.rlim_cur;
		long reserve = limit / 8 > RESERVE_FDS ? limit / 8 : RESERVE_FDS;

		if (open_fds(limit, fds + reserve) + fds + reserve > limit)
			return false;
	}
	if (bytes && as_limit(&rl) && rl.rlim_cur != RLIM_INFINITY) {
		uint64_t limit = rl.rlim_cur;

		if (mapped_bytes() + bytes + limit / 8 > limit)
			return false;
	}
	return true;
}

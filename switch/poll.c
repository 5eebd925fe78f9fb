/* SPDX-License-Identifier: MIT */
/*
 * The readiness calls poll, ppoll, select and pselect, and what they share
 * with epoll's (epoll.c, epoll_wait.c; declared in poll_int.h): a wait's
 * deadline, and an accelerated socket's readiness in the kernel's bits.
 *
 * A plain socket's kernel fd tells the whole truth, so a call that names
 * no accelerated socket goes to the C library unchanged.  An accelerated
 * socket's data arrives outside the kernel stream: its fd carries only
 * doorbells, EOF and errors.  For those the kernel is asked for POLLIN
 * alone (the fd is always writable), wsd_sock_revents() says what the
 * application sees, and before sleeping each is armed so that it rings
 * its doorbell when it becomes ready.  A wake by a doorbell that turns
 * out not to matter goes back to sleep for the time left, after arming
 * again (which drops the doorbells read), so a stale byte never spins.
 *
 * Locks: none of its own (a socket's, inside wsd_sock_revents).  It does
 * not keep epoll's shadow of the registrations (epoll.c).
 */
#define _GNU_SOURCE
/* poll and ppoll are defined here: keep the fortified inline wrappers out */
#undef _FORTIFY_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "switch/poll_int.h"

#define POLL_STACK 32            /* entries handled without malloc */

extern void __chk_fail(void) __attribute__((__noreturn__));

/* ---- time ------------------------------------------------------------------ */

void deadline_init(struct deadline *d, const struct timespec *rel)
{
	/* beyond 2^40 s the wait outlives the machine: treat as forever */
	d->inf = !rel || rel->tv_sec > (time_t)1 << 40;
	if (d->inf)
		return;
	clock_gettime(CLOCK_MONOTONIC, &d->at);
	d->at.tv_sec += rel->tv_sec;
	d->at.tv_nsec += rel->tv_nsec;
	if (d->at.tv_nsec >= NSEC) {
		d->at.tv_sec++;
		d->at.tv_nsec -= NSEC;
	}
}

void deadline_ms(struct deadline *d, int ms)
{
	struct timespec ts = { ms / 1000, ms % 1000 * 1000000L };

	deadline_init(d, ms < 0 ? NULL : &ts);
}

/* The time left in *left (0 once past); false when none is. */
bool deadline_left(const struct deadline *d, struct timespec *left)
{
	struct timespec now;

	if (d->inf)
		return true;
	clock_gettime(CLOCK_MONOTONIC, &now);
	left->tv_sec = d->at.tv_sec - now.tv_sec;
	left->tv_nsec = d->at.tv_nsec - now.tv_nsec;
	if (left->tv_nsec < 0) {
		left->tv_sec--;
		left->tv_nsec += NSEC;
	}
	if (left->tv_sec < 0)
		left->tv_sec = left->tv_nsec = 0;
	return left->tv_sec || left->tv_nsec;
}

/* For the calls that take milliseconds: rounded up, so no wait ends early. */
int deadline_to_ms(const struct deadline *d, const struct timespec *left)
{
	if (d->inf)
		return -1;
	if (left->tv_sec >= INT_MAX / 1000 - 1)
		return INT_MAX;
	return (int)(left->tv_sec * 1000 + (left->tv_nsec + 999999) / 1000000);
}

/* Bound a sleep by wsd_recheck_ms (set while arming): true when it did. */
bool cap_wait(const struct deadline *dl, struct timespec *left)
{
	struct timespec cap;

	if (wsd_recheck_ms < 0)
		return false;
	cap.tv_sec = wsd_recheck_ms / 1000;
	cap.tv_nsec = (long)(wsd_recheck_ms % 1000) * 1000000;
	if (!dl->inf && (left->tv_sec < cap.tv_sec ||
			 (left->tv_sec == cap.tv_sec && left->tv_nsec <= cap.tv_nsec)))
		return false;
	*left = cap;
	return true;
}

bool timespec_bad(const struct timespec *ts)
{
	return ts && (ts->tv_sec < 0 || ts->tv_nsec < 0 || ts->tv_nsec >= NSEC);
}

/* ---- an accelerated socket's readiness ----------------------------------------- */

/*
 * What the application sees on an accelerated socket, in the kernel's bits:
 * tcp_poll sets POLLRDNORM with POLLIN and POLLWRNORM with POLLOUT, and
 * urgent data (POLLPRI) still comes only through the kernel stream.
 */
short accel_revents(struct wsd_sock *s, short events, short krev, bool arm)
{
	short want = events, r;

	if (krev & POLLNVAL)
		return POLLNVAL;
	if (events & POLLRDNORM)
		want |= POLLIN;
	if (events & POLLWRNORM)
		want |= POLLOUT;
	r = wsd_sock_revents(s, want, krev, arm);
	if (r & POLLIN)
		r |= POLLRDNORM;
	if (r & POLLOUT)
		r |= POLLWRNORM;
	r |= krev & POLLPRI;
	return r & (events | POLLHUP | POLLERR);
}

/* How long a wait may spin before it sleeps: the time it has, in ns. */
int64_t spin_room(const struct deadline *dl)
{
	struct timespec left;

	if (dl->inf)
		return INT64_MAX;
	if (!deadline_left(dl, &left))
		return 0;
	return (int64_t)left.tv_sec * NSEC + left.tv_nsec;
}

/* ---- poll, ppoll, select, pselect ------------------------------------------------ */

/* select's verdict on one entry, as the kernel's do_select: 1 read, 2 write, 4 except. */
static unsigned sel_bits(short events, short revents)
{
	return (events & POLLIN && revents & (POLLIN | POLLHUP | POLLERR) ? 1 : 0) |
	       (events & POLLOUT && revents & (POLLOUT | POLLERR) ? 2 : 0) |
	       (events & POLLPRI && revents & POLLPRI ? 4 : 0);
}

/* What poll would return (entries with revents), or select (bits set, or -EBADF). */
static int poll_count(const struct pollfd *fds, nfds_t nfds, bool sel)
{
	int n = 0;

	for (nfds_t i = 0; i < nfds; i++) {
		if (!sel)
			n += fds[i].revents != 0;
		else if (fds[i].revents & POLLNVAL)
			return -EBADF;
		else
			n += __builtin_popcount(sel_bits(fds[i].events, fds[i].revents));
	}
	return n;
}

/* The application's revents from the kernel's, and the count to return. */
static int poll_fill(struct pollfd *fds, const struct pollfd *kfds, struct wsd_sock **socks,
		     nfds_t nfds, bool arm, bool sel)
{
	for (nfds_t i = 0; i < nfds; i++)
		fds[i].revents = socks[i] ?
			accel_revents(socks[i], fds[i].events, kfds[i].revents, arm) :
			kfds[i].revents;
	return poll_count(fds, nfds, sel);
}

/*
 * The wait when fds[first] is an accelerated socket (s0, held).  Entries
 * before first are known plain.  sel: count as select does.  rem: the time
 * left at return, as select reports it.  Returns the count or -errno.
 */
static int poll_slow(struct pollfd *fds, nfds_t nfds, nfds_t first, struct wsd_sock *s0,
		     const struct timespec *timeout, const sigset_t *sigmask, bool sel,
		     struct timespec *rem)
{
	static const struct timespec zero;
	struct pollfd kstack[POLL_STACK], *kfds = kstack;
	struct wsd_sock *sstack[POLL_STACK], **socks = sstack;
	struct timespec left = { 0, 0 };
	struct deadline dl;
	int n, r;

	if (timespec_bad(timeout)) {
		wsd_sock_put(s0);
		return -EINVAL;
	}
	if (nfds > POLL_STACK) {
		kfds = nfds < SIZE_MAX / (sizeof(*kfds) + sizeof(*socks)) ?
			malloc(nfds * (sizeof(*kfds) + sizeof(*socks))) : NULL;
		if (!kfds) {
			wsd_sock_put(s0);
			return -ENOMEM;
		}
		socks = (struct wsd_sock **)(kfds + nfds);
	}
	for (nfds_t i = 0; i < nfds; i++) {
		struct wsd_sock *s = i == first ? s0 : NULL;

		if (i > first && fds[i].fd >= 0 && (s = wsd_fd_get(fds[i].fd)) &&
		    !wsd_sock_accel(s)) {
			wsd_sock_put(s);
			s = NULL;
		}
		socks[i] = s;
		kfds[i].fd = fds[i].fd;
		/* the doorbell and EOF; POLLOUT is the session's to say, or the
		 * kernel's while the socket still sends by the stream */
		kfds[i].events = s ? POLLIN | (fds[i].events & (POLLPRI | POLLRDHUP)) |
				     (wsd_sock_tx_stream(s) ? fds[i].events & (POLLOUT | POLLWRNORM | POLLWRBAND) : 0) :
				     fds[i].events;
		kfds[i].revents = 0;
	}
	deadline_init(&dl, timeout);

	r = real.ppoll(kfds, nfds, &zero, NULL);
	if (r < 0) {
		n = -errno;
		goto out;
	}
	n = poll_fill(fds, kfds, socks, nfds, false, sel);
	if (n || (timeout && !timeout->tv_sec && !timeout->tv_nsec))
		goto out;
	/* spin on the rings first; now and then ask the kernel about the rest */
	for (int64_t end = wsd_spin_until(spin_room(&dl)), k = 1; end && wsd_spin_burst(end); k++) {
		if (!(k % 16) && real.ppoll(kfds, nfds, &zero, NULL) < 0) {
			n = -errno;
			goto out;
		}
		n = poll_fill(fds, kfds, socks, nfds, false, sel);
		if (n)
			goto out;
	}
	for (;;) {
		/* arm whatever is not ready; arming may find it ready after all */
		bool capped;

		wsd_recheck_ms = -1;
		n = poll_fill(fds, kfds, socks, nfds, true, sel);
		if (n || !deadline_left(&dl, &left))
			goto out;
		capped = cap_wait(&dl, &left);
		/* the caller's sigmask: signals behave as in the kernel's own wait */
		r = real.ppoll(kfds, nfds, dl.inf && !capped ? NULL : &left, sigmask);
		if (r < 0) {
			n = -errno;
			goto out;
		}
		n = poll_fill(fds, kfds, socks, nfds, false, sel);
		if (n || (r == 0 && !capped))
			goto out;
	}
out:
	if (rem && !dl.inf)
		deadline_left(&dl, rem);
	for (nfds_t i = first; i < nfds; i++)
		if (socks[i])
			wsd_sock_put(socks[i]);
	if (kfds != kstack)
		free(kfds);
	return n;
}

/*
 * The first entry naming an accelerated socket (its reference in *sp), or
 * nfds.  An epoll set among them is watched through its fd from now on.
 */
static nfds_t poll_first_accel(const struct pollfd *fds, nfds_t nfds, struct wsd_sock **sp)
{
	if (wsd_poll_sets_any())
		for (nfds_t i = 0; i < nfds; i++)
			wsd_poll_fd_watched(fds[i].fd);
	if (!wsd_fd_any())
		return nfds;
	for (nfds_t i = 0; i < nfds; i++) {
		struct wsd_sock *s;

		if (fds[i].fd < 0 || !(s = wsd_fd_get(fds[i].fd)))
			continue;
		if (wsd_sock_accel(s)) {
			*sp = s;
			return i;
		}
		wsd_sock_put(s);
	}
	return nfds;
}

/*
 * A wait the kernel did alone, all its sockets plain when it began, that
 * returned r: whether it must be looked at again.  A socket may have been
 * accelerated meanwhile (an upgrade finishing on another thread), and the
 * peer's switch point, proof and doorbells on its stream woke the kernel:
 * not data.  Taken as data, a read would wait for bytes that are not coming
 * (iperf3's server then blocks on its control connection for the whole
 * test).  Cheap: one load, unless some socket was accelerated meanwhile.
 */
static bool woke_by_switch(int r, uint64_t gen)
{
	return r > 0 && atomic_load(&wsd_accel_gen) != gen;
}

/* ...and so it must when fd, which the kernel reported, names an accelerated socket now. */
static bool now_accel(int fd)
{
	struct wsd_sock *s = fd >= 0 ? wsd_fd_get(fd) : NULL;
	bool r = s && wsd_sock_accel(s);

	if (s)
		wsd_sock_put(s);
	return r;
}

static bool poll_woke_accel(const struct pollfd *fds, nfds_t nfds)
{
	for (nfds_t i = 0; i < nfds; i++)
		if (fds[i].revents && now_accel(fds[i].fd))
			return true;
	return false;
}

/* poll (is_poll: ms, the kernel's poll) and ppoll (timeout, sigmask). */
static int poll_any(struct pollfd *fds, nfds_t nfds, bool is_poll, int ms,
		    const struct timespec *timeout, const sigset_t *sigmask)
{
	struct timespec ts = { ms / 1000, ms % 1000 * 1000000L }, left;
	uint64_t gen = atomic_load(&wsd_accel_gen);
	struct deadline dl = { .inf = true };
	struct wsd_sock *s;
	bool check;
	nfds_t first;
	int r;

	if (is_poll)
		timeout = ms < 0 ? NULL : &ts;
	wsd_real_init();
	wsd_settle_pending(false);
	first = poll_first_accel(fds, nfds, &s);
	if (first != nfds)
		return (int)wsd_ret(poll_slow(fds, nfds, first, s, timeout, sigmask, false, NULL));
	/* no socket known to the switch: none in the set can become accelerated */
	check = wsd_fd_any() && !timespec_bad(timeout);
	if (check)
		deadline_init(&dl, timeout);
	r = is_poll ? real.poll(fds, nfds, ms) : real.ppoll(fds, nfds, timeout, sigmask);
	if (!check || !woke_by_switch(r, gen) || !poll_woke_accel(fds, nfds) ||
	    (first = poll_first_accel(fds, nfds, &s)) == nfds)
		return r;
	/* asked again the accelerated way, for the time left */
	deadline_left(&dl, &left);
	return (int)wsd_ret(poll_slow(fds, nfds, first, s, dl.inf ? NULL : &left, sigmask, false,
				      NULL));
}

static int do_ppoll(struct pollfd *fds, nfds_t nfds, const struct timespec *timeout,
		    const sigset_t *sigmask)
{
	return poll_any(fds, nfds, false, 0, timeout, sigmask);
}

EXPORT int poll(struct pollfd *fds, nfds_t nfds, int timeout)
{
	return poll_any(fds, nfds, true, timeout, NULL, NULL);
}

EXPORT int ppoll(struct pollfd *fds, nfds_t nfds, const struct timespec *timeout,
		 const sigset_t *sigmask)
{
	return do_ppoll(fds, nfds, timeout, sigmask);
}

/* The fortified callers' entries (-D_FORTIFY_SOURCE): the same check as glibc's. */
EXPORT int __poll_chk(struct pollfd *fds, nfds_t nfds, int timeout, size_t fdslen)
{
	if (fdslen / sizeof(*fds) < nfds)
		__chk_fail();
	return poll(fds, nfds, timeout);
}

EXPORT int __ppoll_chk(struct pollfd *fds, nfds_t nfds, const struct timespec *timeout,
		       const sigset_t *sigmask, size_t fdslen)
{
	if (fdslen / sizeof(*fds) < nfds)
		__chk_fail();
	return do_ppoll(fds, nfds, timeout, sigmask);
}

/* fd_set as the kernel reads it: an array of longs, whatever FD_SETSIZE says. */
#define FDW_BITS ((int)(8 * sizeof(unsigned long)))

static unsigned long *fd_words(fd_set *set)
{
	return (unsigned long *)(void *)set;
}

static bool fd_in(fd_set *set, int fd)
{
	return set && fd_words(set)[fd / FDW_BITS] >> (fd % FDW_BITS) & 1;
}

/* The first fd at or after fd, below nfds, that one of the sets names; else nfds. */
static int fd_next(int fd, int nfds, fd_set *const sets[3])
{
	while (fd < nfds) {
		unsigned long w = 0;
		int base = fd - fd % FDW_BITS;

		for (int i = 0; i < 3; i++)
			if (sets[i])
				w |= fd_words(sets[i])[fd / FDW_BITS];
		w &= ~0UL << (fd % FDW_BITS);
		if (w)
			return base + __builtin_ctzl(w) < nfds ? base + __builtin_ctzl(w) : nfds;
		fd = base + FDW_BITS;
	}
	return nfds;
}

static int select_first_accel(int nfds, fd_set *const sets[3], struct wsd_sock **sp)
{
	if (wsd_poll_sets_any())
		for (int fd = fd_next(0, nfds, sets); fd < nfds; fd = fd_next(fd + 1, nfds, sets))
			wsd_poll_fd_watched(fd);
	if (!wsd_fd_any())
		return nfds;
	for (int fd = fd_next(0, nfds, sets); fd < nfds; fd = fd_next(fd + 1, nfds, sets)) {
		struct wsd_sock *s = wsd_fd_get(fd);

		if (!s)
			continue;
		if (wsd_sock_accel(s)) {
			*sp = s;
			return fd;
		}
		wsd_sock_put(s);
	}
	return nfds;
}

/* select as poll: fd first (s0, held) is the first accelerated socket. */
static int select_slow(int nfds, fd_set *const sets[3], int first, struct wsd_sock *s0,
		       const struct timespec *timeout, const sigset_t *sigmask,
		       struct timespec *rem)
{
	static const short ev_of[3] = { POLLIN, POLLOUT, POLLPRI };
	struct pollfd stack[POLL_STACK], *pfds = stack;
	nfds_t n = 0, k = 0, at = 0;
	int fd, ret;

	for (fd = fd_next(0, nfds, sets); fd < nfds; fd = fd_next(fd + 1, nfds, sets))
		n++;
	if (n > POLL_STACK && !(pfds = malloc(n * sizeof(*pfds)))) {
		wsd_sock_put(s0);
		return -ENOMEM;
	}
	for (fd = fd_next(0, nfds, sets); fd < nfds; fd = fd_next(fd + 1, nfds, sets)) {
		pfds[k] = (struct pollfd){ .fd = fd };
		for (int i = 0; i < 3; i++)
			if (fd_in(sets[i], fd))
				pfds[k].events |= ev_of[i];
		if (fd == first)
			at = k;
		k++;
	}
	ret = poll_slow(pfds, n, at, s0, timeout, sigmask, true, rem);
	if (ret >= 0) {
		/* as the kernel: whole words up to nfds rewritten, only ready bits set */
		for (int i = 0; i < 3; i++)
			if (sets[i])
				memset(sets[i], 0, (size_t)(nfds + FDW_BITS - 1) / FDW_BITS *
				       sizeof(unsigned long));
		for (k = 0; k < n; k++) {
			unsigned bits = sel_bits(pfds[k].events, pfds[k].revents);

			for (int i = 0; i < 3; i++)
				if (bits & 1u << i)
					fd_words(sets[i])[pfds[k].fd / FDW_BITS] |=
						1UL << (pfds[k].fd % FDW_BITS);
		}
	}
	if (pfds != stack)
		free(pfds);
	return ret;
}

/*
 * The kernel's select over sets that name no accelerated socket (see
 * woke_by_switch).  When one it reported became accelerated meanwhile,
 * the sets are put back as the caller passed them and -EAGAIN asks the
 * caller to look again the accelerated way; else the kernel's answer.
 * tv: select's (the kernel writes the time left into it), else timeout.
 */
static int select_plain(int nfds, fd_set *const sets[3], struct timeval *tv,
			const struct timespec *timeout, const sigset_t *sigmask, uint64_t gen)
{
	enum { STACK_WORDS = FD_SETSIZE / FDW_BITS };
	size_t words = nfds > 0 ? ((size_t)nfds + FDW_BITS - 1) / FDW_BITS : 0;
	unsigned long stack[3][STACK_WORDS], *copy = &stack[0][0];
	bool woke = false;
	int r;

	/* no socket known to the switch: none can have become accelerated */
	if (!wsd_fd_any() || (words > STACK_WORDS && !(copy = calloc(3 * words, sizeof(long)))))
		copy = NULL;
	for (int i = 0; copy && i < 3; i++)
		if (sets[i])
			memcpy(copy + i * words, fd_words(sets[i]), words * sizeof(long));
	r = tv ? real.select(nfds, sets[0], sets[1], sets[2], tv) :
		 real.pselect(nfds, sets[0], sets[1], sets[2], timeout, sigmask);
	if (copy && woke_by_switch(r, gen))
		for (int fd = fd_next(0, nfds, sets); fd < nfds && !woke;
		     fd = fd_next(fd + 1, nfds, sets))
			woke = now_accel(fd);
	for (int i = 0; woke && i < 3; i++)
		if (sets[i])
			memcpy(fd_words(sets[i]), copy + i * words, words * sizeof(long));
	if (copy != &stack[0][0])
		free(copy);
	return woke ? -EAGAIN : r;
}

/* select (tv) and pselect (timeout, sigmask). */
static int select_any(int nfds, fd_set *rd, fd_set *wr, fd_set *ex, struct timeval *tv,
		      const struct timespec *timeout, const sigset_t *sigmask, bool is_select)
{
	fd_set *const sets[3] = { rd, wr, ex };
	struct timespec ts, rem, left;
	struct deadline dl = { .inf = true };
	struct wsd_sock *s;
	int fd, n;

	wsd_real_init();
	wsd_settle_pending(false);
	for (bool first_look = true;; first_look = false) {
		uint64_t gen = atomic_load(&wsd_accel_gen);

		fd = select_first_accel(nfds, sets, &s);
		if (fd < nfds)
			break;
		/* the time left, should it be asked again (select_plain looks only then) */
		if (first_look && !is_select && wsd_fd_any() && !timespec_bad(timeout))
			deadline_init(&dl, timeout);
		n = select_plain(nfds, sets, is_select ? tv : NULL, timeout, sigmask, gen);
		if (n != -EAGAIN)
			return n;
		/* asked again for the time left: select's tv says it, pselect's deadline */
		if (!is_select) {
			deadline_left(&dl, &left);
			timeout = dl.inf ? NULL : &left;
		}
	}
	if (!is_select)
		return (int)wsd_ret(select_slow(nfds, sets, fd, s, timeout, sigmask, NULL));
	if (tv) {
		if (tv->tv_sec < 0 || tv->tv_usec < 0) {
			wsd_sock_put(s);
			errno = EINVAL;
			return -1;
		}
		ts.tv_sec = tv->tv_sec + tv->tv_usec / 1000000;
		ts.tv_nsec = tv->tv_usec % 1000000 * 1000;
		rem = ts;
	}
	n = select_slow(nfds, sets, fd, s, tv ? &ts : NULL, NULL, &rem);
	/* Linux tells select's caller the time left */
	if (tv && (ts.tv_sec || ts.tv_nsec)) {
		tv->tv_sec = rem.tv_sec;
		tv->tv_usec = rem.tv_nsec / 1000;
	}
	return (int)wsd_ret(n);
}

EXPORT int select(int nfds, fd_set *rd, fd_set *wr, fd_set *ex, struct timeval *tv)
{
	return select_any(nfds, rd, wr, ex, tv, NULL, NULL, true);
}

EXPORT int pselect(int nfds, fd_set *rd, fd_set *wr, fd_set *ex, const struct timespec *timeout,
		   const sigset_t *sigmask)
{
	return select_any(nfds, rd, wr, ex, NULL, timeout, sigmask, false);
}

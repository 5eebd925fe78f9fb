/* SPDX-License-Identifier: MIT */
/*
 * The readiness calls: poll, ppoll, select, pselect and epoll.
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
 * epoll keeps a shadow of every registration: the kernel holds a token
 * (generation and fd) in data.u64 and the shadow the application's
 * events and data.  Accelerated sockets are registered for their doorbell
 * and their readiness is computed on each wait; everything else is
 * translated back from the kernel's events.  Each set has an eventfd in
 * its kernel set that makes sleeping waiters look again when one of its
 * sockets is accelerated or joins while they sleep.
 */
#define _GNU_SOURCE
/* poll and ppoll are defined here: keep the fortified inline wrappers out */
#undef _FORTIFY_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "switch/switch.h"

#define NSEC 1000000000L
#define POLL_STACK 32            /* entries handled without malloc */

extern void __chk_fail(void) __attribute__((__noreturn__));

/* ---- time ------------------------------------------------------------------ */

/* The end of a wait on CLOCK_MONOTONIC; inf: none. */
struct deadline {
	bool inf;
	struct timespec at;
};

static void deadline_init(struct deadline *d, const struct timespec *rel)
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

static void deadline_ms(struct deadline *d, int ms)
{
	struct timespec ts = { ms / 1000, ms % 1000 * 1000000L };

	deadline_init(d, ms < 0 ? NULL : &ts);
}

/* The time left in *left (0 once past); false when none is. */
static bool deadline_left(const struct deadline *d, struct timespec *left)
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
static int deadline_to_ms(const struct deadline *d, const struct timespec *left)
{
	if (d->inf)
		return -1;
	if (left->tv_sec >= INT_MAX / 1000 - 1)
		return INT_MAX;
	return (int)(left->tv_sec * 1000 + (left->tv_nsec + 999999) / 1000000);
}

/* Bound a sleep by wsd_recheck_ms (set while arming): true when it did. */
static bool cap_wait(const struct deadline *dl, struct timespec *left)
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

static bool timespec_bad(const struct timespec *ts)
{
	return ts && (ts->tv_sec < 0 || ts->tv_nsec < 0 || ts->tv_nsec >= NSEC);
}

/* ---- an accelerated socket's readiness ----------------------------------------- */

/*
 * What the application sees on an accelerated socket, in the kernel's bits:
 * tcp_poll sets POLLRDNORM with POLLIN and POLLWRNORM with POLLOUT, and
 * urgent data (POLLPRI) still comes only through the kernel stream.
 */
static short accel_revents(struct wsd_sock *s, short events, short krev, bool arm)
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
static int64_t spin_room(const struct deadline *dl)
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

/* The first entry naming an accelerated socket (its reference in *sp), or nfds. */
static nfds_t poll_first_accel(const struct pollfd *fds, nfds_t nfds, struct wsd_sock **sp)
{
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

static int do_ppoll(struct pollfd *fds, nfds_t nfds, const struct timespec *timeout,
		    const sigset_t *sigmask)
{
	struct wsd_sock *s;
	nfds_t first;

	wsd_real_init();
	first = poll_first_accel(fds, nfds, &s);
	if (first == nfds)
		return real.ppoll(fds, nfds, timeout, sigmask);
	return (int)wsd_ret(poll_slow(fds, nfds, first, s, timeout, sigmask, false, NULL));
}

EXPORT int poll(struct pollfd *fds, nfds_t nfds, int timeout)
{
	struct timespec ts = { timeout / 1000, timeout % 1000 * 1000000L };
	struct wsd_sock *s;
	nfds_t first;

	wsd_real_init();
	first = poll_first_accel(fds, nfds, &s);
	if (first == nfds)
		return real.poll(fds, nfds, timeout);
	return (int)wsd_ret(poll_slow(fds, nfds, first, s, timeout < 0 ? NULL : &ts, NULL,
				      false, NULL));
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

EXPORT int select(int nfds, fd_set *rd, fd_set *wr, fd_set *ex, struct timeval *tv)
{
	fd_set *const sets[3] = { rd, wr, ex };
	struct timespec ts, rem;
	struct wsd_sock *s;
	int fd, n;

	wsd_real_init();
	fd = select_first_accel(nfds, sets, &s);
	if (fd >= nfds)
		return real.select(nfds, rd, wr, ex, tv);
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

EXPORT int pselect(int nfds, fd_set *rd, fd_set *wr, fd_set *ex, const struct timespec *timeout,
		   const sigset_t *sigmask)
{
	fd_set *const sets[3] = { rd, wr, ex };
	struct wsd_sock *s;
	int fd;

	wsd_real_init();
	fd = select_first_accel(nfds, sets, &s);
	if (fd >= nfds)
		return real.pselect(nfds, rd, wr, ex, timeout, sigmask);
	return (int)wsd_ret(select_slow(nfds, sets, fd, s, timeout, sigmask, NULL));
}

/* ---- epoll: the shadow of the registrations --------------------------------------- */

struct ep_link {
	struct ep_link *prev, *next;
};

struct epset;

/* One registration (fd in a set).  All but s_next under set->mu; set, sock,
 * fd and gen are fixed at birth (the hooks read them under sock->mu). */
struct wsd_epitem {
	struct epset *set;
	struct wsd_sock *sock;         /* held; NULL for other fds */
	struct wsd_epitem *s_next;     /* on sock->ep_items (sock->mu) */
	struct wsd_epitem *h_next;     /* the set's hash chain */
	struct ep_link alink;          /* on set->accel while accelerated */
	int fd;
	uint32_t gen;                  /* with fd, the token the kernel holds */
	uint32_t events;               /* the application's */
	epoll_data_t data;             /* the application's, returned unchanged */
	uint32_t krev;                 /* kernel events not yet looked at */
	bool accel;                    /* registered with the kernel for the doorbell */
	bool txs;                      /* ...and for POLLOUT: its sending side is the stream */
	bool kicked;                   /* an edge to report if ready (ET) */
	bool disabled;                 /* EPOLLONESHOT fired */
	uint32_t last_rx_eagain, last_tx_eagain;   /* when last reported (ET) */
	uint64_t last_mark;                        /* the ring's data end then (ET) */
};

/* One epoll set (one kernel object, however many fds name it). */
struct epset {
	_Atomic int refs;              /* fds naming it, plus calls working on it */
	pthread_mutex_t mu;            /* the shadow; never held while asleep */
	struct wsd_epitem **hash;      /* by fd */
	unsigned hmask, count;
	struct ep_link accel;          /* accelerated items, looked at by each wait */
	_Atomic int naccel;
	uint32_t gen;
	int efd;                       /* wakes the waiters; -1 until a socket joins */
	_Atomic int waiters;           /* threads asleep in the kernel on the set */
	_Atomic bool nested;           /* in another epoll set: keep its fd's readiness true */
	_Atomic bool has_inner;        /* an epoll set was added to it (arm_nested looks) */
	/* sockets accelerated since the last look (tokens); rq_mu is innermost */
	pthread_mutex_t rq_mu;
	uint64_t *rq;
	unsigned rq_len, rq_cap;
	bool rq_all;                   /* the queue could not grow: look at every item */
	_Atomic bool rq_any;
};

#define TOKEN_WAKE UINT64_MAX      /* the eventfd's (no item has fd -1) */
#define POLL_BITS (EPOLLIN | EPOLLPRI | EPOLLOUT | EPOLLRDNORM | EPOLLRDBAND | EPOLLWRNORM | \
		   EPOLLWRBAND | EPOLLMSG | EPOLLERR | EPOLLHUP | EPOLLRDHUP)
/* the flags that shape delivery, kept on an accelerated socket's doorbell */
#define DOORBELL_FLAGS (EPOLLET | EPOLLONESHOT | EPOLLRDHUP | EPOLLPRI | EPOLLEXCLUSIVE | \
			EPOLLWAKEUP)
#define POLL_WR_ALL (POLLOUT | POLLWRNORM | POLLWRBAND)

static inline uint64_t item_token(const struct wsd_epitem *it)
{
	return (uint64_t)it->gen << 32 | (uint32_t)it->fd;
}

/*
 * What the kernel watches for an item: the application's events, or for an
 * accelerated socket the doorbell (EPOLLIN), plus the application's
 * EPOLLOUT while the socket still sends by the stream (txs), whose room
 * only the kernel knows.
 */
static struct epoll_event kernel_event(uint32_t events, bool accel, bool txs, uint64_t token)
{
	struct epoll_event kev = { .events = events, .data.u64 = token };

	if (accel)
		kev.events = EPOLLIN | (events & DOORBELL_FLAGS) |
			     (txs ? events & (EPOLLOUT | EPOLLWRNORM | EPOLLWRBAND) : 0);
	return kev;
}

static void link_init(struct ep_link *h)
{
	h->prev = h->next = h;
}

static void link_del(struct ep_link *l)
{
	l->prev->next = l->next;
	l->next->prev = l->prev;
	link_init(l);
}

static void link_add_tail(struct ep_link *l, struct ep_link *h)
{
	l->prev = h->prev;
	l->next = h;
	h->prev->next = l;
	h->prev = l;
}

#define item_of(l) ((struct wsd_epitem *)((char *)(l) - offsetof(struct wsd_epitem, alink)))

static struct wsd_epitem **item_slot(struct epset *set, int fd)
{
	struct wsd_epitem **p = &set->hash[(unsigned)fd & set->hmask];

	while (*p && (*p)->fd != fd)
		p = &(*p)->h_next;
	return p;
}

static struct wsd_epitem *item_by_token(struct epset *set, uint64_t token)
{
	struct wsd_epitem *it = *item_slot(set, (int)(uint32_t)token);

	return it && it->gen == (uint32_t)(token >> 32) ? it : NULL;
}

static void hash_grow(struct epset *set)
{
	unsigned n = (set->hmask + 1) * 2;
	struct wsd_epitem **h = calloc(n, sizeof(*h)), *it, *next;

	if (!h)
		return;         /* longer chains, still right */
	for (unsigned b = 0; b <= set->hmask; b++)
		for (it = set->hash[b]; it; it = next) {
			next = it->h_next;
			it->h_next = h[(unsigned)it->fd & (n - 1)];
			h[(unsigned)it->fd & (n - 1)] = it;
		}
	free(set->hash);
	set->hash = h;
	set->hmask = n - 1;
}

static void item_set_accel(struct epset *set, struct wsd_epitem *it, bool accel)
{
	if (accel == it->accel)
		return;
	if (accel) {
		link_add_tail(&it->alink, &set->accel);
		atomic_fetch_add(&set->naccel, 1);
	} else {
		link_del(&it->alink);
		atomic_fetch_sub(&set->naccel, 1);
	}
	it->accel = accel;
}

static void item_unlink_sock(struct wsd_epitem *it)
{
	struct wsd_epitem **p;

	if (!it->sock)
		return;
	pthread_mutex_lock(&it->sock->mu);
	for (p = &it->sock->ep_items; *p; p = &(*p)->s_next)
		if (*p == it) {
			*p = it->s_next;
			break;
		}
	pthread_mutex_unlock(&it->sock->mu);
}

/* Out of the set's hash and list (set->mu). */
static void item_unhash(struct epset *set, struct wsd_epitem *it)
{
	struct wsd_epitem **p = item_slot(set, it->fd);

	if (*p == it) {
		*p = it->h_next;
		set->count--;
	}
	item_set_accel(set, it, false);
}

/* Freed outside every lock: the last reference to a socket may go here. */
static void items_free(struct wsd_epitem *dead)
{
	while (dead) {
		struct wsd_epitem *next = dead->s_next;

		if (dead->sock)
			wsd_sock_put(dead->sock);
		free(dead);
		dead = next;
	}
}

static void set_wake(struct epset *set)
{
	uint64_t one = 1;

	if (set->efd >= 0)
		(void)real.write(set->efd, &one, sizeof(one));
}

static bool set_tryhold(struct epset *set)
{
	int r = atomic_load(&set->refs);

	while (r > 0)
		if (atomic_compare_exchange_weak(&set->refs, &r, r + 1))
			return true;
	return false;
}

static void set_free(struct epset *set)
{
	struct wsd_epitem *it, *dead = NULL;

	/* once unlinked from its sockets nothing else can reach the set */
	for (unsigned b = 0; b <= set->hmask; b++)
		while ((it = set->hash[b])) {
			set->hash[b] = it->h_next;
			item_unlink_sock(it);
			it->s_next = dead;
			dead = it;
		}
	items_free(dead);
	if (set->efd >= 0)
		real.close(set->efd);
	pthread_mutex_destroy(&set->mu);
	pthread_mutex_destroy(&set->rq_mu);
	free(set->hash);
	free(set->rq);
	free(set);
}

static void set_put(struct epset *set)
{
	if (atomic_fetch_sub(&set->refs, 1) == 1)
		set_free(set);
}

/* ---- epoll fd -> set: pages of pointers, never freed, written under map_lock ---- */

#define MAP_SHIFT 12
#define MAP_PAGES 1024                      /* epoll fds below 4M */
#define MAP_FDS (MAP_PAGES << MAP_SHIFT)
#define MAP_IDX(fd) ((fd) & ((1 << MAP_SHIFT) - 1))

static struct epset **map[MAP_PAGES];
static pthread_rwlock_t map_lock = PTHREAD_RWLOCK_INITIALIZER;

static struct epset *set_get(int fd)
{
	struct epset **page, *set = NULL;

	if (fd < 0 || fd >= MAP_FDS)
		return NULL;
	pthread_rwlock_rdlock(&map_lock);
	page = map[fd >> MAP_SHIFT];
	if (page && (set = page[MAP_IDX(fd)]))
		atomic_fetch_add(&set->refs, 1);
	pthread_rwlock_unlock(&map_lock);
	return set;
}

/*
 * fork, in the child: threads of the parent may have held these (one asleep
 * in epoll_wait holds nothing, but one inside epoll_ctl does).
 */
void wsd_poll_atfork_child(void)
{
	pthread_rwlock_init(&map_lock, NULL);
	for (unsigned p = 0; p < MAP_PAGES; p++) {
		if (!map[p])
			continue;
		for (unsigned i = 0; i < (1u << MAP_SHIFT); i++) {
			struct epset *set = map[p][i];

			if (set) {
				pthread_mutex_init(&set->mu, NULL);
				pthread_mutex_init(&set->rq_mu, NULL);
			}
		}
	}
}

/* fd names set (the caller's reference passes to the map). */
static int map_put(int fd, struct epset *set)
{
	struct epset **page, *old;

	if (fd < 0 || fd >= MAP_FDS)
		return -EMFILE;
	pthread_rwlock_wrlock(&map_lock);
	page = map[fd >> MAP_SHIFT];
	if (!page) {
		page = calloc(1 << MAP_SHIFT, sizeof(*page));
		if (!page) {
			pthread_rwlock_unlock(&map_lock);
			return -ENOMEM;
		}
		__atomic_store_n(&map[fd >> MAP_SHIFT], page, __ATOMIC_RELEASE);
	}
	old = page[MAP_IDX(fd)];
	__atomic_store_n(&page[MAP_IDX(fd)], set, __ATOMIC_RELEASE);
	pthread_rwlock_unlock(&map_lock);
	if (old)           /* its close went unreported */
		set_put(old);
	return 0;
}

void wsd_poll_fd_closed(int fd)
{
	struct epset **page, *set;

	if (fd < 0 || fd >= MAP_FDS)
		return;
	/* every close comes here: look without the lock first (fd is the
	 * caller's until its close, so its entry cannot change under us) */
	page = __atomic_load_n(&map[fd >> MAP_SHIFT], __ATOMIC_ACQUIRE);
	if (!page || !__atomic_load_n(&page[MAP_IDX(fd)], __ATOMIC_ACQUIRE))
		return;
	pthread_rwlock_wrlock(&map_lock);
	set = page[MAP_IDX(fd)];
	__atomic_store_n(&page[MAP_IDX(fd)], NULL, __ATOMIC_RELEASE);
	pthread_rwlock_unlock(&map_lock);
	if (set)
		set_put(set);
}

/* fds lo..hi were closed together (close_range, closefrom): pages never made hold no set. */
void wsd_poll_fds_closed(unsigned lo, unsigned hi)
{
	for (unsigned fd = lo; fd <= hi && fd < MAP_FDS; fd++) {
		if (!__atomic_load_n(&map[fd >> MAP_SHIFT], __ATOMIC_ACQUIRE)) {
			fd |= (1u << MAP_SHIFT) - 1;   /* the next page */
			continue;
		}
		wsd_poll_fd_closed((int)fd);
	}
}

/* newfd is now a dup of oldfd: if that is an epoll set, newfd names it too. */
void wsd_poll_fd_dup(int oldfd, int newfd)
{
	struct epset *set = set_get(oldfd);

	if (set && map_put(newfd, set))
		set_put(set);
}

static int set_new(int epfd)
{
	struct epset *set = calloc(1, sizeof(*set));
	int ret;

	if (!set || !(set->hash = calloc(16, sizeof(*set->hash)))) {
		free(set);
		return -ENOMEM;
	}
	set->hmask = 15;
	set->refs = 1;
	set->efd = -1;
	link_init(&set->accel);
	pthread_mutex_init(&set->mu, NULL);
	pthread_mutex_init(&set->rq_mu, NULL);
	ret = map_put(epfd, set);
	if (ret)
		set_put(set);
	return ret;
}

static int epoll_created(int fd)
{
	int ret;

	if (fd < 0)
		return fd;
	ret = set_new(fd);
	if (ret) {
		real.close(fd);
		return (int)wsd_ret(ret);
	}
	return fd;
}

EXPORT int epoll_create(int size)
{
	wsd_real_init();
	return epoll_created(real.epoll_create(size));
}

EXPORT int epoll_create1(int flags)
{
	wsd_real_init();
	return epoll_created(real.epoll_create1(flags));
}

/* ---- the hooks --------------------------------------------------------------------- */

/*
 * s was just accelerated.  The session may call this from any thread, so
 * it takes only s->mu and the queues' innermost locks: each set learns
 * which items to move to the doorbell, and its waiters wake to do it.
 */
void wsd_poll_sock_accelerated(struct wsd_sock *s)
{
	pthread_mutex_lock(&s->mu);
	for (struct wsd_epitem *it = s->ep_items; it; it = it->s_next) {
		struct epset *set = it->set;

		pthread_mutex_lock(&set->rq_mu);
		if (set->rq_len == set->rq_cap && !set->rq_all) {
			unsigned cap = set->rq_cap ? set->rq_cap * 2 : 8;
			uint64_t *rq = realloc(set->rq, cap * sizeof(*rq));

			if (rq) {
				set->rq = rq;
				set->rq_cap = cap;
			} else {
				set->rq_all = true;
			}
		}
		if (!set->rq_all)
			set->rq[set->rq_len++] = item_token(it);
		atomic_store(&set->rq_any, true);
		pthread_mutex_unlock(&set->rq_mu);
		set_wake(set);
	}
	pthread_mutex_unlock(&s->mu);
}

void wsd_poll_sock_gone(struct wsd_sock *s)
{
	struct wsd_epitem *it, **p, *dead = NULL;
	struct epset *set;

	for (;;) {
		pthread_mutex_lock(&s->mu);
		/* a set being freed frees its items: only let go of them here */
		while ((it = s->ep_items) && !set_tryhold(it->set))
			s->ep_items = it->s_next;
		pthread_mutex_unlock(&s->mu);
		if (!it)
			break;
		set = it->set;
		pthread_mutex_lock(&set->mu);
		pthread_mutex_lock(&s->mu);
		for (p = &s->ep_items; (it = *p);) {
			if (it->set != set) {
				p = &it->s_next;
				continue;
			}
			*p = it->s_next;
			item_unhash(set, it);
			it->s_next = dead;
			dead = it;
		}
		pthread_mutex_unlock(&s->mu);
		pthread_mutex_unlock(&set->mu);
		set_put(set);
	}
	items_free(dead);
}

/* ---- epoll_ctl ------------------------------------------------------------------------ */

/* The item's registration does not match its socket's state any more. */
static bool item_stale(const struct wsd_epitem *it)
{
	return it->sock && (it->accel != wsd_sock_accel(it->sock) ||
			    it->txs != (it->accel && wsd_sock_tx_stream(it->sock)));
}

/*
 * Register an item as its socket now needs (set->mu): for the doorbell when
 * it was accelerated, back to the application's events when it is plain
 * again.  On failure its fd is gone, and so is the kernel's registration:
 * the item stays as it was.
 */
static void item_sync(struct epset *set, int epfd, struct wsd_epitem *it)
{
	bool accel = wsd_sock_accel(it->sock), txs = accel && wsd_sock_tx_stream(it->sock);
	struct epoll_event kev = kernel_event(it->events, accel, txs, item_token(it));
	int r;

	if (it->events & EPOLLEXCLUSIVE) {
		/* the kernel never modifies an exclusive registration */
		r = real.epoll_ctl(epfd, EPOLL_CTL_DEL, it->fd, &kev);
		if (!r)
			r = real.epoll_ctl(epfd, EPOLL_CTL_ADD, it->fd, &kev);
	} else {
		r = real.epoll_ctl(epfd, EPOLL_CTL_MOD, it->fd, &kev);
	}
	if (r)
		return;
	item_set_accel(set, it, accel);
	it->txs = txs;
	it->kicked = true;      /* as after EPOLL_CTL_MOD: report what is ready now */
	it->krev = 0;
}

/* Items whose sockets were accelerated since the last look (set->mu). */
static void set_requeue(struct epset *set, int epfd)
{
	struct wsd_epitem *it;
	uint64_t *rq;
	unsigned n;
	bool all;

	if (!atomic_load(&set->rq_any))
		return;
	pthread_mutex_lock(&set->rq_mu);
	rq = set->rq;
	n = set->rq_len;
	all = set->rq_all;
	set->rq = NULL;
	set->rq_len = set->rq_cap = 0;
	set->rq_all = false;
	atomic_store(&set->rq_any, false);
	pthread_mutex_unlock(&set->rq_mu);
	if (all) {
		for (unsigned b = 0; b <= set->hmask; b++)
			for (it = set->hash[b]; it; it = it->h_next)
				if (item_stale(it))
					item_sync(set, epfd, it);
	}
	for (unsigned i = 0; i < n && !all; i++)
		if ((it = item_by_token(set, rq[i])) && item_stale(it))
			item_sync(set, epfd, it);
	free(rq);
}

/* The set's eventfd, in its kernel set under TOKEN_WAKE (set->mu). */
static int set_wake_init(struct epset *set, int epfd)
{
	struct epoll_event kev = { .events = EPOLLIN, .data.u64 = TOKEN_WAKE };
	int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK), err;

	if (efd < 0)
		return -errno;
	if (real.epoll_ctl(epfd, EPOLL_CTL_ADD, efd, &kev)) {
		err = errno;
		real.close(efd);
		return -err;
	}
	set->efd = efd;
	return 0;
}

static int ep_add(struct epset *set, int epfd, int fd, struct wsd_epitem *nit,
		  struct wsd_sock *s, const struct epoll_event *ev, struct wsd_epitem **dead)
{
	struct wsd_epitem **p;
	struct epoll_event kev;
	bool accel = s && wsd_sock_accel(s);
	int ret;

	if (s && set->efd < 0 && (ret = set_wake_init(set, epfd)))
		return ret;
	nit->set = set;
	nit->sock = s;
	nit->fd = fd;
	nit->gen = ++set->gen;
	nit->events = ev->events;
	nit->data = ev->data;
	nit->kicked = true;
	nit->last_mark = UINT64_MAX;   /* data already there is an edge, as ADD's */
	link_init(&nit->alink);
	nit->txs = accel && wsd_sock_tx_stream(s);
	kev = kernel_event(ev->events, accel, nit->txs, item_token(nit));
	if (real.epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &kev))
		return -errno;
	/* an item left by an fd closed without a DEL: the kernel forgot it */
	p = item_slot(set, fd);
	if (*p) {
		struct wsd_epitem *old = *p;

		item_unhash(set, old);
		item_unlink_sock(old);
		old->s_next = *dead;
		*dead = old;
	}
	if (set->count > set->hmask)
		hash_grow(set);
	p = &set->hash[(unsigned)fd & set->hmask];
	nit->h_next = *p;
	*p = nit;
	set->count++;
	item_set_accel(set, nit, accel);
	if (s) {
		pthread_mutex_lock(&s->mu);
		nit->s_next = s->ep_items;
		s->ep_items = nit;
		pthread_mutex_unlock(&s->mu);
		/* changed before it was linked: the hook did not see it */
		if (item_stale(nit))
			item_sync(set, epfd, nit);
	}
	return 0;
}

static int ep_mod(struct epset *set, int epfd, int fd, struct wsd_epitem *it,
		  struct epoll_event *ev)
{
	struct epoll_event kev;
	bool accel, txs;

	if (!it)        /* none of ours (ENOENT, or a registration made behind our back) */
		return real.epoll_ctl(epfd, EPOLL_CTL_MOD, fd, ev) ? -errno : 0;
	accel = it->sock && wsd_sock_accel(it->sock);
	txs = accel && wsd_sock_tx_stream(it->sock);
	kev = kernel_event(ev->events, accel, txs, item_token(it));
	if (real.epoll_ctl(epfd, EPOLL_CTL_MOD, fd, &kev))
		return -errno;
	it->txs = txs;
	it->events = ev->events;
	it->data = ev->data;
	it->disabled = false;
	it->kicked = true;
	it->krev = 0;
	item_set_accel(set, it, accel);
	return 0;
}

static int ep_ctl(struct epset *set, int epfd, int op, int fd, struct epoll_event *ev)
{
	struct wsd_epitem *nit = NULL, *it, *dead = NULL;
	struct wsd_sock *s = NULL;
	struct epset *inner = NULL;
	int ret;

	if (op != EPOLL_CTL_DEL && (!ev || (op != EPOLL_CTL_ADD && op != EPOLL_CTL_MOD)))
		return real.epoll_ctl(epfd, op, fd, ev) ? -errno : 0;
	if (op == EPOLL_CTL_ADD) {
		if (!(nit = calloc(1, sizeof(*nit))))
			return -ENOMEM;
		s = wsd_fd_get(fd);
		inner = set_get(fd);
	}
	pthread_mutex_lock(&set->mu);
	it = *item_slot(set, fd);
	switch (op) {
	case EPOLL_CTL_ADD:
		ret = ep_add(set, epfd, fd, nit, s, ev, &dead);
		if (!ret) {
			it = nit;
			nit = NULL;
			s = NULL;
		}
		break;
	case EPOLL_CTL_MOD:
		ret = ep_mod(set, epfd, fd, it, ev);
		break;
	default:
		ret = real.epoll_ctl(epfd, op, fd, ev) ? -errno : 0;
		if (!ret && it) {
			item_unhash(set, it);
			item_unlink_sock(it);
			it->s_next = dead;
			dead = it;
			it = NULL;
		}
		break;
	}
	/* a waiter asleep has not armed a socket that joined or changed */
	if (!ret && it && it->accel && atomic_load(&set->waiters))
		set_wake(set);
	pthread_mutex_unlock(&set->mu);
	if (!ret && inner) {
		struct ep_link *l;

		atomic_store(&inner->nested, true);
		atomic_store(&set->has_inner, true);
		/* the outer set's sleep must hear of the inner sockets' data */
		pthread_mutex_lock(&inner->mu);
		for (l = inner->accel.next; l != &inner->accel; l = l->next)
			wsd_sock_arm(item_of(l)->sock, (short)(item_of(l)->events & POLL_BITS));
		pthread_mutex_unlock(&inner->mu);
	}
	items_free(dead);
	free(nit);
	if (s)
		wsd_sock_put(s);
	if (inner)
		set_put(inner);
	return ret;
}

EXPORT int epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
	struct epset *set;
	int ret;

	wsd_real_init();
	set = set_get(epfd);
	if (!set)
		return real.epoll_ctl(epfd, op, fd, ev);
	ret = ep_ctl(set, epfd, op, fd, ev);
	set_put(set);
	return (int)wsd_ret(ret);
}

/* ---- epoll_wait ------------------------------------------------------------------------ */

/*
 * An accelerated item's events to report now, or 0 (set->mu).  Level-
 * triggered: whatever is ready.  Edge-triggered: only after a kernel event
 * (a doorbell, EOF) or once the application has run dry since the last
 * report (its EAGAIN counters moved).  With arm, what is not ready (or for
 * ET, not yet reportable) asks for a doorbell.
 */
static uint32_t item_ready(struct wsd_epitem *it, bool arm)
{
	struct wsd_sock *s = it->sock;
	uint32_t rx = atomic_load(&s->rx_eagain), tx = atomic_load(&s->tx_eagain);
	short want = (short)(it->events & POLL_BITS), r, fresh;
	bool kicked = it->kicked;

	it->kicked = false;
	if (it->disabled)
		return 0;
	uint64_t mark = wsd_sock_rx_mark(s);

	r = accel_revents(s, want, (short)it->krev, false);
	if (!(it->events & EPOLLET) || kicked)
		fresh = r;
	else
		fresh = (rx != it->last_rx_eagain || mark != it->last_mark ? r & ~POLL_WR_ALL : 0) |
			(tx != it->last_tx_eagain ? r & POLL_WR_ALL : 0);
	if (!fresh && arm && (it->events & EPOLLET)) {
		/*
		 * Edge-triggered, nothing new: ask for a doorbell on the next
		 * arrival even though old data waits (the edge is spent), then
		 * look once more for data that came meanwhile.
		 */
		wsd_sock_arm(s, want);
		mark = wsd_sock_rx_mark(s);
		r = accel_revents(s, want, (short)it->krev, false);
		fresh = (mark != it->last_mark ? r & ~POLL_WR_ALL : 0) |
			(tx != it->last_tx_eagain ? r & POLL_WR_ALL : 0);
	} else if (!fresh && arm && (want & ~r & (POLLIN | POLLPRI | POLLRDHUP | POLL_WR_ALL))) {
		short r2 = accel_revents(s, want & ~r, (short)it->krev, true);

		if (r2)
			fresh = r |= r2;
	}
	if (!fresh)
		return 0;
	it->last_rx_eagain = rx;
	it->last_tx_eagain = tx;
	it->last_mark = mark;
	return (uint16_t)r;
}

/*
 * The application's events from the nk the kernel returned in ev (in place)
 * and the accelerated items ready now, at most max.  Takes set->mu.
 */
static int harvest(struct epset *set, int epfd, struct epoll_event *ev, int nk, int max, bool arm)
{
	struct ep_link moved, *l, *next;
	bool more = false, lt = false;
	int out = 0;

	pthread_mutex_lock(&set->mu);
	set_requeue(set, epfd);
	for (int i = 0; i < nk; i++) {
		uint64_t token = ev[i].data.u64;
		struct wsd_epitem *it;

		if (token == TOKEN_WAKE) {
			uint64_t v;

			(void)real.read(set->efd, &v, sizeof(v));
			continue;
		}
		it = item_by_token(set, token);
		if (!it)        /* removed while its event was on the way */
			continue;
		if (it->accel) {
			it->krev |= ev[i].events;
			it->kicked = true;
			continue;
		}
		if (it->events & EPOLLONESHOT)
			it->disabled = true;
		ev[out].events = ev[i].events;
		ev[out].data = it->data;
		out++;
	}

	/* Others asleep on the set (or an outer set watching it) rely on
	 * what is not ready being armed when this thread leaves. */
	arm = arm || atomic_load(&set->waiters) || atomic_load(&set->nested);
	link_init(&moved);
	for (l = set->accel.next; l != &set->accel; l = next) {
		struct wsd_epitem *it = item_of(l);
		uint32_t r;

		next = l->next;
		if (out >= max) {
			more = true;
			break;
		}
		r = item_ready(it, arm);
		if (r) {
			ev[out].events = r;
			ev[out].data = it->data;
			out++;
			if (it->events & EPOLLONESHOT)
				it->disabled = true;
			lt |= !(it->events & EPOLLET);
			/* to the back: a busy socket does not starve the rest */
			link_del(l);
			link_add_tail(l, &moved);
		} else if (it->krev && (it->events & EPOLLONESHOT) && !it->disabled) {
			/* the kernel spent its one shot on a doorbell that did not count */
			struct epoll_event kev = kernel_event(it->events, true, it->txs,
							      item_token(it));

			real.epoll_ctl(epfd, EPOLL_CTL_MOD, it->fd, &kev);
		}
		it->krev = 0;
	}
	while ((l = moved.next) != &moved) {
		link_del(l);
		link_add_tail(l, &set->accel);
	}
	/* an outer set sees this one ready only through its kernel fd: keep it
	 * readable while level-triggered readiness may remain */
	if (atomic_load(&set->nested) && (more || lt))
		set_wake(set);
	pthread_mutex_unlock(&set->mu);
	return out;
}

enum { EW_WAIT, EW_PWAIT, EW_PWAIT2 };

static int (*real_epoll_pwait2)(int, struct epoll_event *, int, const struct timespec *,
				const sigset_t *);
static pthread_once_t pwait2_once = PTHREAD_ONCE_INIT;

static void pwait2_resolve(void)
{
	real_epoll_pwait2 = (int (*)(int, struct epoll_event *, int, const struct timespec *,
				     const sigset_t *))dlsym(RTLD_NEXT, "epoll_pwait2");
}

/* The kernel's wait, as the application called it, for the time left. */
static int ep_block(int kind, int epfd, struct epoll_event *ev, int max, const struct deadline *dl,
		    const struct timespec *left, const sigset_t *sigmask)
{
	switch (kind) {
	case EW_WAIT:
		return real.epoll_wait(epfd, ev, max, deadline_to_ms(dl, left));
	case EW_PWAIT:
		return real.epoll_pwait(epfd, ev, max, deadline_to_ms(dl, left), sigmask);
	default:
		return real_epoll_pwait2(epfd, ev, max, dl->inf ? NULL : left, sigmask);
	}
}

/*
 * Before a set sleeps: the accelerated sockets of epoll sets inside it
 * (one level) ring when data comes, though nobody waited on the inner set
 * itself since.  Arming changes no edge state; it only asks for doorbells.
 */
static void arm_nested(struct epset *set)
{
	struct epset *inner[16];
	unsigned n = 0;

	/* most sets hold sockets only: no walk over them before every sleep */
	if (!atomic_load(&set->has_inner))
		return;
	pthread_mutex_lock(&set->mu);
	for (unsigned b = 0; set->hash && b <= set->hmask && n < 16; b++)
		for (struct wsd_epitem *it = set->hash[b]; it && n < 16; it = it->h_next)
			if (!it->sock && (inner[n] = set_get(it->fd)))
				n++;
	pthread_mutex_unlock(&set->mu);
	for (unsigned i = 0; i < n; i++) {
		struct ep_link *l;

		bool ready = false;

		pthread_mutex_lock(&inner[i]->mu);
		for (l = inner[i]->accel.next; l != &inner[i]->accel; l = l->next) {
			struct wsd_epitem *it = item_of(l);
			short want = (short)(it->events & POLL_BITS);

			if (it->disabled)
				continue;
			wsd_sock_arm(it->sock, want);
			ready |= accel_revents(it->sock, want, 0, false) != 0;
		}
		/*
		 * The inner set's wake-up fd keeps it readable for level-triggered
		 * readiness that may remain; when none does, the outer set must
		 * not see it ready (its sockets' own doorbells still count).
		 */
		if (!ready && inner[i]->efd >= 0) {
			uint64_t v;

			(void)real.read(inner[i]->efd, &v, sizeof(v));
		}
		pthread_mutex_unlock(&inner[i]->mu);
		set_put(inner[i]);
	}
}

static int ep_wait(struct epset *set, int epfd, struct epoll_event *ev, int max,
		   const struct deadline *dl, const sigset_t *sigmask, int kind)
{
	struct timespec left = { 0, 0 };
	bool polled = false;
	int n, r, err;

	for (;;) {
		bool more = deadline_left(dl, &left), capped = false;

		if (atomic_load(&set->naccel)) {
			if (!polled) {
				r = real.epoll_wait(epfd, ev, max, 0);
				if (r < 0)
					return -errno;
				n = harvest(set, epfd, ev, r, max, false);
				if (n)
					return n;
			}
			if (!more)
				return 0;
			/* spin on the rings first; now and then ask the kernel too */
			for (int64_t end = polled ? 0 : wsd_spin_until(spin_room(dl)), k = 1;
			     end && wsd_spin_burst(end); k++) {
				r = k % 16 ? 0 : real.epoll_wait(epfd, ev, max, 0);
				if (r < 0)
					return -errno;
				n = harvest(set, epfd, ev, r, max, false);
				if (n)
					return n;
			}
			wsd_recheck_ms = -1;
			n = harvest(set, epfd, ev, 0, max, true);
			if (n)
				return n;
			deadline_left(dl, &left);
			capped = cap_wait(dl, &left);
		}
		arm_nested(set);
		atomic_fetch_add(&set->waiters, 1);
		r = ep_block(kind, epfd, ev, max, capped ? &(struct deadline){ .inf = false } : dl,
			     &left, sigmask);
		err = errno;
		atomic_fetch_sub(&set->waiters, 1);
		if (r < 0)
			return -err;
		n = harvest(set, epfd, ev, r, max, false);
		/* only doorbells and wakes: wait again for the time left */
		if (n || (r == 0 && !capped) || !deadline_left(dl, &left))
			return n;
		polled = true;
	}
}

/* The waits on a set we know; one we do not (made before us) is the kernel's. */
static int epoll_wait_any(int kind, int epfd, struct epoll_event *ev, int max,
			  const struct deadline *dl, const sigset_t *sigmask)
{
	struct epset *set = set_get(epfd);
	int n;

	if (!set) {
		struct timespec left = { 0, 0 };

		deadline_left(dl, &left);
		return ep_block(kind, epfd, ev, max, dl, &left, sigmask);
	}
	n = ep_wait(set, epfd, ev, max, dl, sigmask, kind);
	set_put(set);
	return (int)wsd_ret(n);
}

EXPORT int epoll_wait(int epfd, struct epoll_event *ev, int max, int timeout)
{
	struct deadline dl;

	wsd_real_init();
	deadline_ms(&dl, timeout);
	return epoll_wait_any(EW_WAIT, epfd, ev, max, &dl, NULL);
}

EXPORT int epoll_pwait(int epfd, struct epoll_event *ev, int max, int timeout,
		       const sigset_t *sigmask)
{
	struct deadline dl;

	wsd_real_init();
	deadline_ms(&dl, timeout);
	return epoll_wait_any(EW_PWAIT, epfd, ev, max, &dl, sigmask);
}

EXPORT int epoll_pwait2(int epfd, struct epoll_event *ev, int max, const struct timespec *timeout,
			const sigset_t *sigmask)
{
	struct deadline dl;

	wsd_real_init();
	pthread_once(&pwait2_once, pwait2_resolve);
	if (!real_epoll_pwait2)
		return (int)wsd_ret(-ENOSYS);
	if (timespec_bad(timeout))
		return (int)wsd_ret(-EINVAL);
	deadline_init(&dl, timeout);
	return epoll_wait_any(EW_PWAIT2, epfd, ev, max, &dl, sigmask);
}

/* SPDX-License-Identifier: MIT */
/*
 * epoll's waits: epoll_wait, epoll_pwait and epoll_pwait2 on a set we
 * know.  Each looks at the set's accelerated items (harvest, item_ready)
 * and at the kernel's events, translated back through the shadow (epoll.c);
 * spins on the rings for the time it has; arms what is not ready, and the
 * sockets of sets nested inside (arm_nested); and sleeps in the kernel's
 * wait for the time left.  Locks: set->mu while it looks, never while
 * asleep.  It does not change registrations (epoll.c).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>

#include "switch/epoll_int.h"
#include "switch/poll_int.h"

/* ---- epoll_wait ------------------------------------------------------------------------ */

/*
 * An accelerated item's events to report now, or 0 (set->mu).  Level-
 * triggered: whatever is ready.  Edge-triggered: only after a kernel event
 * (a doorbell, EOF) or once the application has run dry since the last
 * report (its EAGAIN counters moved).  With arm, what is not ready (or for
 * ET, not yet reportable) asks for a doorbell.
 */
/* Looks at an idle item before a wait that has not slept arms and parks it. */
#define PARK_LOOKS 64

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
			/* a bell may have spent its arm; and it is looked at again */
			wsd_sock_bell_seen(it->sock);
			item_unpark(set, it);
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
		/* one that waits for room is never parked (that bell is the
		 * peer's reading, and a reading of ours may take it) */
		bool may_park = it->disabled || !(it->events & POLL_WR_ALL);
		/* idle for PARK_LOOKS looks of a wait that does not sleep yet
		 * (one busy with other sockets): armed and parked all the same */
		bool arm_it = arm || (may_park && ++it->idle >= PARK_LOOKS);
		bool park = false, ready = false;
		uint32_t r;

		next = l->next;
		if (out >= max) {
			more = true;
			break;
		}
		r = item_ready(it, arm_it);
		if (!r && arm_it && may_park) {
			/*
			 * Armed and idle: its peer rings on the next arrival, so
			 * later waits need not look until a kernel event.  The look
			 * that says so may move the socket on (the peer's proof
			 * read, its data behind it): when it found the socket
			 * ready, it is reported now.
			 */
			if (it->disabled || wsd_sock_parkable(it->sock, &ready))
				park = true;
			else if (ready)
				r = item_ready(it, false);
		}
		if (r) {
			it->idle = 0;
			ev[out].events = r;
			ev[out].data = it->data;
			out++;
			if (it->events & EPOLLONESHOT)
				it->disabled = true;
			lt |= !(it->events & EPOLLET);
			/* to the back: a busy socket does not starve the rest */
			link_del(l);
			link_add_tail(l, &moved);
		} else {
			if (it->krev && (it->events & EPOLLONESHOT) && !it->disabled) {
				/* the kernel spent its one shot on a doorbell that did not count */
				struct epoll_event kev = kernel_event(it->events, true, it->txs,
								      item_token(it));

				real.epoll_ctl(epfd, EPOLL_CTL_MOD, it->fd, &kev);
			}
			if (park)
				item_park(set, it);
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
 * A set watched through its fd (inside another, or polled): its sockets
 * armed, so that data rings; and its wake-up fd, which keeps the set
 * readable for level-triggered readiness that may remain, emptied when
 * none does (its sockets' own doorbells still count).  Arming changes no
 * edge state; it only asks for doorbells.
 */
void set_refresh(struct epset *set)
{
	bool ready = false;

	pthread_mutex_lock(&set->mu);
	for (struct ep_link *l = set->accel.next; l != &set->accel; l = l->next) {
		struct wsd_epitem *it = item_of(l);
		short want = (short)(it->events & POLL_BITS);

		if (it->disabled)
			continue;
		wsd_sock_arm(it->sock, want);
		ready |= accel_revents(it->sock, want, 0, false) != 0;
	}
	if (!ready && set->efd >= 0) {
		uint64_t v;

		(void)real.read(set->efd, &v, sizeof(v));
	}
	pthread_mutex_unlock(&set->mu);
}

/*
 * Before a set sleeps: the sets inside it (one level), though nobody
 * waited on them since.
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
		set_refresh(inner[i]);
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
		bool more = deadline_left(dl, &left), capped = false, counted = false;

		if (atomic_load(&set->naccel)) {
			/* every item parked: each rings, nothing to spin on */
			bool idle = __atomic_load_n(&set->accel.next, __ATOMIC_RELAXED) == &set->accel;

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
			for (int64_t end = polled || idle ? 0 : wsd_spin_until(spin_room(dl)), k = 1;
			     end && wsd_spin_burst(end); k++) {
				r = k % 16 ? 0 : real.epoll_wait(epfd, ev, max, 0);
				if (r < 0)
					return -errno;
				n = harvest(set, epfd, ev, r, max, false);
				if (n)
					return n;
			}
			wsd_recheck_ms = -1;
			/*
			 * Counted asleep before the last look: a socket another
			 * thread reads dry from now on stays armed for us
			 * (wsd_poll_sock_watched).
			 */
			atomic_fetch_add(&set->waiters, 1);
			counted = true;
			n = harvest(set, epfd, ev, 0, max, true);
			if (n) {
				atomic_fetch_sub(&set->waiters, 1);
				return n;
			}
			deadline_left(dl, &left);
			capped = cap_wait(dl, &left);
		}
		arm_nested(set);
		if (!counted)
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
	struct epset *set;
	int n;

	wsd_settle_pending(false);
	set = set_get(epfd);
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

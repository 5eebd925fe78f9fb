/* SPDX-License-Identifier: MIT */
/*
 * epoll keeps a shadow of every registration: the kernel holds a token
 * (generation and fd) in data.u64 and the shadow the application's
 * events and data.  Accelerated sockets are registered for their doorbell
 * and their readiness is computed on each wait; everything else is
 * translated back from the kernel's events.  Each set has an eventfd in
 * its kernel set that makes sleeping waiters look again when one of its
 * sockets is accelerated or joins while they sleep.
 *
 * This file keeps that shadow: the sets and their items, the epoll fd ->
 * set map, the hooks the session calls when a socket is accelerated or
 * goes, epoll_create and epoll_ctl; the waits are epoll_wait.c's.  Locks:
 * set->mu, then a socket's mu, then set->rq_mu (innermost); map_lock is
 * taken alone.  It does not compute a socket's readiness (poll.c,
 * ready.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <sys/eventfd.h>

#include "switch/epoll_int.h"

/* ---- epoll: the shadow of the registrations --------------------------------------- */

/*
 * What the kernel watches for an item: the application's events, or for an
 * accelerated socket the doorbell (EPOLLIN), plus the application's
 * EPOLLOUT while the socket still sends by the stream (txs), whose room
 * only the kernel knows.
 */
struct epoll_event kernel_event(uint32_t events, bool accel, bool txs, uint64_t token)
{
	struct epoll_event kev = { .events = events, .data.u64 = token };

	if (accel)
		kev.events = EPOLLIN | (events & DOORBELL_FLAGS) |
			     (txs ? events & (EPOLLOUT | EPOLLWRNORM | EPOLLWRBAND) : 0);
	return kev;
}

void link_init(struct ep_link *h)
{
	h->prev = h->next = h;
}

void link_del(struct ep_link *l)
{
	l->prev->next = l->next;
	l->next->prev = l->prev;
	link_init(l);
}

void link_add_tail(struct ep_link *l, struct ep_link *h)
{
	l->prev = h->prev;
	l->next = h;
	h->prev->next = l;
	h->prev = l;
}

static struct wsd_epitem **item_slot(struct epset *set, int fd)
{
	struct wsd_epitem **p = &set->hash[(unsigned)fd & set->hmask];

	while (*p && (*p)->fd != fd)
		p = &(*p)->h_next;
	return p;
}

struct wsd_epitem *item_by_token(struct epset *set, uint64_t token)
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

static void park_count(struct wsd_epitem *it, bool parked)
{
	if (it->parked == parked)
		return;
	it->parked = parked;
	atomic_fetch_add(&it->sock->ep_parked, parked ? 1 : -1);
}

/* set->mu: an idle armed item leaves the waits' walk (epoll_int.h, parked). */
void item_park(struct epset *set, struct wsd_epitem *it)
{
	if (!it->accel || it->parked)
		return;
	link_del(&it->alink);
	link_add_tail(&it->alink, &set->parked);
	park_count(it, true);
	it->idle = 0;
}

/* set->mu: back in the waits' walk. */
void item_unpark(struct epset *set, struct wsd_epitem *it)
{
	if (!it->parked)
		return;
	link_del(&it->alink);
	link_add_tail(&it->alink, &set->accel);
	park_count(it, false);
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
		park_count(it, false);
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

void set_wake(struct epset *set)
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

static _Atomic int sets_live;

bool wsd_poll_sets_any(void)
{
	return atomic_load_explicit(&sets_live, memory_order_relaxed) > 0;
}

static void set_free(struct epset *set)
{
	struct wsd_epitem *it, *dead = NULL;

	/* once unlinked from its sockets nothing else can reach the set */
	for (unsigned b = 0; b <= set->hmask; b++)
		while ((it = set->hash[b])) {
			set->hash[b] = it->h_next;
			if (it->parked)
				park_count(it, false);
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
	atomic_fetch_sub(&sets_live, 1);
}

void set_put(struct epset *set)
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

struct epset *set_get(int fd)
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
	atomic_fetch_add(&sets_live, 1);
	set->hmask = 15;
	set->refs = 1;
	set->efd = -1;
	link_init(&set->accel);
	link_init(&set->parked);
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
/* s->mu held: the set's next look takes the item (set_requeue), and its waiters wake. */
static void rq_push(struct wsd_epitem *it)
{
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

void wsd_poll_sock_accelerated_locked(struct wsd_sock *s)
{
	for (struct wsd_epitem *it = s->ep_items; it; it = it->s_next)
		rq_push(it);
}

void wsd_poll_sock_accelerated(struct wsd_sock *s)
{
	pthread_mutex_lock(&s->mu);
	wsd_poll_sock_accelerated_locked(s);
	pthread_mutex_unlock(&s->mu);
}

void wsd_poll_sock_unpark(struct wsd_sock *s)
{
	bool parked = atomic_load(&s->ep_parked) > 0;

	/*
	 * Not only the sets it is parked in: a thread asleep in the kernel on
	 * a set (or a wait on the set's own fd) was woken by the same bell,
	 * and the kernel looks at the fd again before it returns, which may
	 * be after the bell was read: it would sleep on with the data there.
	 */
	for (struct wsd_epitem *it = s->ep_items; it; it = it->s_next)
		if (parked || atomic_load(&it->set->waiters) || atomic_load(&it->set->nested))
			rq_push(it);
}

bool wsd_poll_sock_watched(struct wsd_sock *s)
{
	bool w = atomic_load(&s->ep_parked) > 0;

	pthread_mutex_lock(&s->mu);
	for (struct wsd_epitem *it = s->ep_items; it && !w; it = it->s_next)
		w = atomic_load(&it->set->waiters) || atomic_load(&it->set->nested);
	pthread_mutex_unlock(&s->mu);
	return w;
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
	item_unpark(set, it);
	it->txs = txs;
	it->kicked = true;      /* as after EPOLL_CTL_MOD: report what is ready now */
	it->krev = 0;
}

/* Items whose sockets were accelerated since the last look (set->mu). */
void set_requeue(struct epset *set, int epfd)
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
			for (it = set->hash[b]; it; it = it->h_next) {
				item_unpark(set, it);
				if (item_stale(it))
					item_sync(set, epfd, it);
			}
	}
	for (unsigned i = 0; i < n && !all; i++)
		if ((it = item_by_token(set, rq[i]))) {
			item_unpark(set, it);
			if (item_stale(it))
				item_sync(set, epfd, it);
		}
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
	item_unpark(set, it);
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
		atomic_store(&set->has_inner, true);
		set_watch(inner);
	}
	items_free(dead);
	free(nit);
	if (s)
		wsd_sock_put(s);
	if (inner)
		set_put(inner);
	return ret;
}

/*
 * The set's readiness is watched through its own fd (another set, poll,
 * select): from now on its sockets stay armed (wsd_poll_sock_watched), and
 * set_refresh arms those that are not yet.
 */
void set_watch(struct epset *set)
{
	atomic_store(&set->nested, true);
	set_refresh(set);
}

void wsd_poll_fd_watched(int fd)
{
	struct epset **page, *set;

	/* a look without the lock first: most fds name no set */
	if (fd < 0 || fd >= MAP_FDS ||
	    !(page = __atomic_load_n(&map[fd >> MAP_SHIFT], __ATOMIC_ACQUIRE)) ||
	    !__atomic_load_n(&page[MAP_IDX(fd)], __ATOMIC_RELAXED))
		return;
	if ((set = set_get(fd))) {
		set_watch(set);
		set_put(set);
	}
}

EXPORT int epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
	struct epset *set;
	int ret;

	wsd_real_init();
	set = set_get(epfd);
	if (!set) {
		/* a set of ours inside one made before us */
		if (op == EPOLL_CTL_ADD)
			wsd_poll_fd_watched(fd);
		return real.epoll_ctl(epfd, op, fd, ev);
	}
	ret = ep_ctl(set, epfd, op, fd, ev);
	set_put(set);
	return (int)wsd_ret(ret);
}

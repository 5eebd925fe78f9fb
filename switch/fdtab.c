/* SPDX-License-Identifier: MIT */
/*
 * fd -> socket.  Dups share one struct wsd_sock, as they share one open file
 * description in the kernel.  Lookups take the table's read lock just long
 * enough to take a reference, so a concurrent close can't free under them.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "switch/switch.h"

#define CHUNK 1024
#define NCHUNKS 4096                 /* 4M fds */

static _Atomic(struct wsd_sock *) *chunks[NCHUNKS];
static pthread_rwlock_t tab_lock = PTHREAD_RWLOCK_INITIALIZER;
static _Atomic long live;           /* fds naming a sock */

bool wsd_fd_any(void)
{
	return atomic_load_explicit(&live, memory_order_relaxed) > 0;
}

static _Atomic(struct wsd_sock *) *slot(int fd, bool make)
{
	unsigned c = (unsigned)fd / CHUNK;

	if (fd < 0 || c >= NCHUNKS)
		return NULL;
	if (!chunks[c]) {
		if (!make)
			return NULL;
		chunks[c] = calloc(CHUNK, sizeof(*chunks[c]));
		if (!chunks[c])
			return NULL;
	}
	return &chunks[c][(unsigned)fd % CHUNK];
}

struct wsd_sock *wsd_fd_get(int fd)
{
	struct wsd_sock *s = NULL;
	_Atomic(struct wsd_sock *) *p;

	if (!wsd_fd_any())
		return NULL;
	pthread_rwlock_rdlock(&tab_lock);
	p = slot(fd, false);
	if (p) {
		s = atomic_load(p);
		if (s)
			wsd_sock_hold(s);
	}
	pthread_rwlock_unlock(&tab_lock);
	return s;
}

void wsd_fd_set(int fd, struct wsd_sock *s)
{
	_Atomic(struct wsd_sock *) *p;
	struct wsd_sock *old = NULL;

	wsd_sock_hold(s);
	pthread_rwlock_wrlock(&tab_lock);
	p = slot(fd, true);
	if (p) {
		old = atomic_exchange(p, s);
		if (!old)
			live++;
		s->nfds++;
		if (old)
			old->nfds--;
	}
	pthread_rwlock_unlock(&tab_lock);
	if (!p)
		wsd_sock_put(s);     /* out of range: the fd stays plain */
	if (old)
		wsd_sock_put(old);
}

struct wsd_sock *wsd_fd_take(int fd)
{
	_Atomic(struct wsd_sock *) *p;
	struct wsd_sock *s = NULL;

	if (!wsd_fd_any())
		return NULL;
	pthread_rwlock_wrlock(&tab_lock);
	p = slot(fd, false);
	if (p) {
		s = atomic_exchange(p, NULL);
		if (s) {
			live--;
			s->nfds--;
		}
	}
	pthread_rwlock_unlock(&tab_lock);
	return s;
}

void wsd_fd_each(void (*fn)(int fd, struct wsd_sock *s, void *arg), void *arg)
{
	pthread_rwlock_rdlock(&tab_lock);
	for (unsigned c = 0; c < NCHUNKS; c++) {
		if (!chunks[c])
			continue;
		for (unsigned i = 0; i < CHUNK; i++) {
			struct wsd_sock *s = atomic_load(&chunks[c][i]);

			if (s)
				fn((int)(c * CHUNK + i), s, arg);
		}
	}
	pthread_rwlock_unlock(&tab_lock);
}

static void find_other(int fd, struct wsd_sock *s, void *arg)
{
	struct wsd_sock **want = arg;

	if (s == *want && s->fd < 0)
		s->fd = fd;
}

void wsd_sock_refd(struct wsd_sock *s, int closed_fd)
{
	if (s->fd != closed_fd)
		return;
	s->fd = -1;
	wsd_fd_each(find_other, &s);
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

struct wsd_stat_slot *wsd_sock_slot(int fd)
{
	struct wsd_stat_slot *slot = wsd_stat_alloc();

	wsd_stat_begin(slot);
	slot->used = 1;
	slot->fd = fd;
	slot->reason = R_PENDING;
	wsd_stat_end(slot);
	return slot;
}

struct wsd_sock *wsd_sock_new(int fd, int family)
{
	struct wsd_sock *s = calloc(1, sizeof(*s));

	if (!s)
		return NULL;
	s->refs = 1;
	s->fd = fd;
	s->family = family;
	s->created_ns = now_ns();
	s->pre_fd = -1;
	pthread_mutex_init(&s->mu, NULL);
	pthread_mutex_init(&s->tx_lock, NULL);
	pthread_mutex_init(&s->rx_lock, NULL);
	s->stat = wsd_sock_slot(fd);
	if (wsd_guard_stopped()) {
		s->no_upgrade = true;
		s->why_not = (uint8_t)wsd_guard_stopped();
		s->stat->reason = s->why_not;
	}
	return s;
}

void wsd_sock_hold(struct wsd_sock *s)
{
	atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
}

void wsd_sock_put(struct wsd_sock *s)
{
	if (atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) != 1)
		return;
	if (s->sess)
		wsd_session_free(s->sess);
	if (s->pre)
		wsd_prefix_close(s->pre);
	if (s->pre_fd >= 0)
		real.close(s->pre_fd);
	wsd_stat_free(s->stat);
	pthread_mutex_destroy(&s->mu);
	pthread_mutex_destroy(&s->tx_lock);
	pthread_mutex_destroy(&s->rx_lock);
	free(s);
}

void wsd_fd_atfork_child(void)
{
	pthread_rwlock_init(&tab_lock, NULL);
}

void wsd_sock_list_add(struct wsd_sock_list *l, struct wsd_sock *s)
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

void wsd_sock_list_free(struct wsd_sock_list *l)
{
	for (size_t i = 0; i < l->n; i++)
		wsd_sock_put(l->socks[i]);
	free(l->socks);
	l->socks = NULL;
	l->n = l->cap = 0;
}

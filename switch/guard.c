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
#include <errno.h>
#include <stdlib.h>

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
	int64_t end = wsd_now_ms() + WSD_BACK_MS;
	int st, r = 0;

	pthread_mutex_lock(&s->mu);
	if (!s->no_upgrade) {
		s->no_upgrade = true;
		s->why_not = (uint8_t)why;
	}
	pthread_mutex_unlock(&s->mu);
	/* an upgrade under way finishes (or fails, seeing no_upgrade) first */
	while (((st = atomic_load(&s->upgrade_state)) == UP_QUEUED || st == UP_RUNNING) &&
	       wsd_now_ms() < end)
		real.poll(NULL, 0, 1);
	if (st == UP_QUEUED || st == UP_RUNNING)
		return -ETIMEDOUT;
	if (s->listening)
		return 0;
	if (wsd_sock_upgraded(s))
		r = wsd_sock_downgrade(s, WSD_BACK_MS);
	if (!r)
		show_reason(s, why);
	wsd_debug("switch: fd %d stays on TCP (%s)%s", s->fd, wsd_reason_name(why),
		  r ? ": its peer did not answer" : "");
	return r;
}

struct sock_list {
	struct wsd_sock **socks;
	size_t n, cap;
};

static void note(int fd, struct wsd_sock *s, void *arg)
{
	struct sock_list *l = arg;

	(void)fd;
	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 64;
		struct wsd_sock **p = realloc(l->socks, cap * sizeof(*p));

		if (!p)
			return;
		l->socks = p;
		l->cap = cap;
	}
	for (size_t i = 0; i < l->n; i++)
		if (l->socks[i] == s)
			return;
	wsd_sock_hold(s);
	l->socks[l->n++] = s;
}

void wsd_guard_io_uring(void)
{
	struct sock_list l = { 0 };
	uint8_t none = R_NONE;

	wsd_real_init();
	if (!atomic_compare_exchange_strong(&stop_reason, &none, R_IO_URING))
		return;
	wsd_debug("switch: the program made an io_uring: its sockets go back to TCP");
	if (!wsd_fd_any())
		return;
	wsd_fd_each(note, &l);
	for (size_t i = 0; i < l.n; i++) {
		wsd_sock_keep_tcp(l.socks[i], R_IO_URING);
		wsd_sock_put(l.socks[i]);
	}
	free(l.socks);
}

/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <poll.h>
#include <string.h>

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "provider/engine.h"
#include "provider/fault.h"

__thread bool wsd_uring_own_call;

/*
 * Our ring fds: a few per process (the engine's, one per completion port).
 * A ring is made and recorded under own_lock, which fork takes first: a
 * child never inherits a ring of ours that is not in its copy of the list
 * (it would take it for the program's own).
 */
static pthread_mutex_t own_lock = PTHREAD_MUTEX_INITIALIZER;
static int *own_fds;
static size_t own_n, own_cap;

static void own_lock_take(void)
{
	pthread_mutex_lock(&own_lock);
}

static void own_lock_give(void)
{
	pthread_mutex_unlock(&own_lock);
}

/*
 * Descriptors that give this process a name others find it by (a
 * listener's registry socket): a fork child closes its copies, so the name
 * is its parent's alone and is free once the parent closes it (a server
 * that forks and exits hands its port to the child, which registers anew).
 */
static int *named_fds;
static size_t named_n, named_cap;

void wsd_fd_named(int fd, bool on)
{
	pthread_mutex_lock(&own_lock);
	if (!on) {
		for (size_t i = 0; i < named_n; i++)
			if (named_fds[i] == fd) {
				named_fds[i] = named_fds[--named_n];
				break;
			}
	} else if (fd >= 0) {
		if (named_n == named_cap) {
			size_t cap = named_cap ? 2 * named_cap : 8;
			int *p = realloc(named_fds, cap * sizeof(*p));

			if (!p) {
				pthread_mutex_unlock(&own_lock);
				return;   /* the child keeps a copy: its registry stays the parent's */
			}
			named_fds = p;
			named_cap = cap;
		}
		named_fds[named_n++] = fd;
	}
	pthread_mutex_unlock(&own_lock);
}

static void own_child(void)
{
	for (size_t i = 0; i < named_n; i++)
		close(named_fds[i]);
	named_n = 0;
	pthread_mutex_unlock(&own_lock);
}

__attribute__((constructor)) static void own_atfork(void)
{
	pthread_atfork(own_lock_take, own_lock_give, own_child);
}

int wsd_uring_init(unsigned entries, struct io_uring *ring)
{
	int ret;

	pthread_mutex_lock(&own_lock);
	wsd_uring_own_call = true;
	ret = io_uring_queue_init(entries, ring, 0);
	wsd_uring_own_call = false;
	if (ret < 0) {
		pthread_mutex_unlock(&own_lock);
		return ret;
	}
	if (own_n == own_cap) {
		size_t cap = own_cap ? 2 * own_cap : 8;
		int *p = realloc(own_fds, cap * sizeof(*p));

		if (!p) {
			pthread_mutex_unlock(&own_lock);
			io_uring_queue_exit(ring);
			return -ENOMEM;
		}
		own_fds = p;
		own_cap = cap;
	}
	own_fds[own_n++] = ring->ring_fd;
	pthread_mutex_unlock(&own_lock);
	return 0;
}

void wsd_uring_exit(struct io_uring *ring)
{
	pthread_mutex_lock(&own_lock);
	for (size_t i = 0; i < own_n; i++)
		if (own_fds[i] == ring->ring_fd) {
			own_fds[i] = own_fds[--own_n];
			break;
		}
	pthread_mutex_unlock(&own_lock);
	io_uring_queue_exit(ring);
}

bool wsd_uring_is_own(int fd)
{
	bool own = false;

	pthread_mutex_lock(&own_lock);
	for (size_t i = 0; i < own_n && !own; i++)
		own = own_fds[i] == fd;
	pthread_mutex_unlock(&own_lock);
	return own;
}

int wsd_engine_init(struct wsd_engine *e)
{
	int ret = wsd_fault("io-uring", NULL) ? -ENOMEM : wsd_uring_init(4, &e->ring);

	e->ready = ret == 0;
	return ret;
}

void wsd_engine_fini(struct wsd_engine *e)
{
	if (e->ready)
		wsd_uring_exit(&e->ring);
	e->ready = 0;
}

int wsd_engine_wait_fd(struct wsd_engine *e, int fd, int64_t timeout_ns)
{
	struct io_uring_sqe *sqe;
	struct io_uring_cqe *cqe;
	struct __kernel_timespec ts;
	int ret, res = 0;
	int got_poll = 0;

	if (!e->ready)
		return -ENODEV;
	sqe = io_uring_get_sqe(&e->ring);
	if (!sqe)
		return -EBUSY;
	io_uring_prep_poll_add(sqe, fd, POLLIN);
	io_uring_sqe_set_data64(sqe, 1);
	if (timeout_ns >= 0) {
		ts.tv_sec = timeout_ns / 1000000000;
		ts.tv_nsec = timeout_ns % 1000000000;
		sqe->flags |= IOSQE_IO_LINK;
		sqe = io_uring_get_sqe(&e->ring);
		io_uring_prep_link_timeout(sqe, &ts, 0);
		io_uring_sqe_set_data64(sqe, 2);
	}
	ret = io_uring_submit(&e->ring);
	if (ret < 0)
		return ret;
	/* Reap until the poll's own completion is seen (the timeout's may follow). */
	for (int pending = timeout_ns >= 0 ? 2 : 1; pending > 0; pending--) {
		do {
			ret = io_uring_wait_cqe(&e->ring, &cqe);
		} while (ret == -EINTR);
		if (ret < 0)
			return ret;
		if (io_uring_cqe_get_data64(cqe) == 1) {
			got_poll = 1;
			res = cqe->res;
		}
		io_uring_cqe_seen(&e->ring, cqe);
	}
	if (!got_poll)
		return -EIO;
	if (res == -ECANCELED)
		return 0;
	if (res < 0)
		return res;
	return 1;
}

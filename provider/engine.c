/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
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

/* A list of fds (own_lock held): our rings, and the descriptors that hold a name. */
struct fd_list {
	int *v;
	size_t n, cap;
};

static int fd_list_add(struct fd_list *l, int fd)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 8;
		int *p = realloc(l->v, cap * sizeof(*p));

		if (!p)
			return -ENOMEM;
		l->v = p;
		l->cap = cap;
	}
	l->v[l->n++] = fd;
	return 0;
}

static void fd_list_del(struct fd_list *l, int fd)
{
	for (size_t i = 0; i < l->n; i++)
		if (l->v[i] == fd) {
			l->v[i] = l->v[--l->n];
			return;
		}
}

static bool fd_list_has(const struct fd_list *l, int fd)
{
	for (size_t i = 0; i < l->n; i++)
		if (l->v[i] == fd)
			return true;
	return false;
}

static struct fd_list own_fds;

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
static struct fd_list named_fds;

void wsd_fd_named(int fd, bool on)
{
	pthread_mutex_lock(&own_lock);
	if (!on)
		fd_list_del(&named_fds, fd);
	else if (fd >= 0)
		(void)fd_list_add(&named_fds, fd);   /* no memory: the child keeps a copy */
	pthread_mutex_unlock(&own_lock);
}

static void own_child(void)
{
	for (size_t i = 0; i < named_fds.n; i++)
		close(named_fds.v[i]);
	named_fds.n = 0;
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
	if (fd_list_add(&own_fds, ring->ring_fd)) {
		pthread_mutex_unlock(&own_lock);
		io_uring_queue_exit(ring);
		return -ENOMEM;
	}
	pthread_mutex_unlock(&own_lock);
	return 0;
}

void wsd_uring_exit(struct io_uring *ring)
{
	/*
	 * Closed before it leaves the list, both under the lock: a scan for
	 * foreign rings (the switch's guard) that read this descriptor's link
	 * in between took it for the program's own io_uring and sent every
	 * later connection to TCP (scribble_check: "refused", reason io-uring).
	 */
	pthread_mutex_lock(&own_lock);
	fd_list_del(&own_fds, ring->ring_fd);
	io_uring_queue_exit(ring);
	pthread_mutex_unlock(&own_lock);
}

bool wsd_uring_is_own(int fd)
{
	bool own;

	pthread_mutex_lock(&own_lock);
	own = fd_list_has(&own_fds, fd);
	pthread_mutex_unlock(&own_lock);
	return own;
}

bool wsd_uring_foreign(int fd)
{
	char path[64], link[32];
	ssize_t n;
	bool foreign;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	/* what fd is and whether it is ours, read together: ours come and go under the lock */
	pthread_mutex_lock(&own_lock);
	n = readlink(path, link, sizeof(link) - 1);
	if (n > 0)
		link[n] = 0;
	foreign = n > 0 && !strcmp(link, "anon_inode:[io_uring]") && !fd_list_has(&own_fds, fd);
	pthread_mutex_unlock(&own_lock);
	return foreign;
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

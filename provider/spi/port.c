/* SPDX-License-Identifier: MIT */
/*
 * Completion ports on io_uring.  A completion is a NOP submitted to the
 * port's ring whose user data points at a small record (bytes, key,
 * overlapped); waiting is io_uring_wait_cqe.  Threads take turns at the
 * ring: one waits in the kernel, the others on a mutex, so each completion
 * goes to exactly one of them.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

#include "provider/spi/spi.h"

struct wsd_port {
	struct io_uring ring;
	pthread_mutex_t sq_lock;         /* submitters */
	pthread_mutex_t cq_lock;         /* the waiter in the kernel */
	pthread_mutex_t state_lock;
	pthread_cond_t idle;
	unsigned sockets, waiters;
	bool closing;
};

struct packet {
	uint32_t bytes;
	uintptr_t key;
	WSAOVERLAPPED *ov;
	bool cancel;                     /* wakes a waiter of a closing port */
};

int wsd_port_create(struct wsd_port **out)
{
	struct wsd_port *p;
	int ret;

	if (!out)
		return -EINVAL;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	ret = wsd_uring_init(256, &p->ring);
	if (ret < 0) {
		free(p);
		return ret;
	}
	pthread_mutex_init(&p->sq_lock, NULL);
	pthread_mutex_init(&p->cq_lock, NULL);
	pthread_mutex_init(&p->state_lock, NULL);
	pthread_cond_init(&p->idle, NULL);
	*out = p;
	return 0;
}

static int submit_packet(struct wsd_port *p, struct packet *k)
{
	struct io_uring_sqe *sqe;
	int ret;

	pthread_mutex_lock(&p->sq_lock);
	sqe = io_uring_get_sqe(&p->ring);
	if (!sqe) {
		/* the ring is full of unsubmitted entries: push them and retry */
		io_uring_submit(&p->ring);
		sqe = io_uring_get_sqe(&p->ring);
	}
	if (!sqe) {
		pthread_mutex_unlock(&p->sq_lock);
		return -EBUSY;
	}
	io_uring_prep_nop(sqe);
	io_uring_sqe_set_data(sqe, k);
	ret = io_uring_submit(&p->ring);
	pthread_mutex_unlock(&p->sq_lock);
	return ret < 0 ? ret : 0;
}

int wsd_port_post(struct wsd_port *p, uint32_t bytes, uintptr_t key, WSAOVERLAPPED *ov)
{
	struct packet *k;
	int ret;

	if (!p)
		return -EINVAL;
	k = malloc(sizeof(*k));
	if (!k)
		return -ENOMEM;
	*k = (struct packet){ bytes, key, ov, false };
	ret = submit_packet(p, k);
	if (ret < 0)
		free(k);
	return ret;
}

int wsd_port_wait(struct wsd_port *p, uint32_t *bytes, uintptr_t *key, WSAOVERLAPPED **ov,
		  int timeout_ms)
{
	struct io_uring_cqe *cqe;
	struct packet *k;
	struct timespec dl;
	int ret;

	if (!p || !bytes || !key || !ov)
		return -EINVAL;
	pthread_mutex_lock(&p->state_lock);
	if (p->closing) {
		pthread_mutex_unlock(&p->state_lock);
		return -ECANCELED;
	}
	p->waiters++;
	pthread_mutex_unlock(&p->state_lock);
	if (timeout_ms >= 0) {
		dl = wsd_timespec_in(CLOCK_REALTIME, (int64_t)timeout_ms * 1000000);
		ret = pthread_mutex_timedlock(&p->cq_lock, &dl);
	} else {
		ret = pthread_mutex_lock(&p->cq_lock);
	}
	if (ret) {
		ret = ret == ETIMEDOUT ? 0 : -ret;
		goto out;
	}
	if (timeout_ms >= 0) {
		struct timespec now;
		struct __kernel_timespec ts;
		int64_t left;

		clock_gettime(CLOCK_REALTIME, &now);
		left = (int64_t)(dl.tv_sec - now.tv_sec) * 1000000000 + (dl.tv_nsec - now.tv_nsec);
		if (left < 0)
			left = 0;
		ts.tv_sec = left / 1000000000;
		ts.tv_nsec = left % 1000000000;
		do {
			ret = io_uring_wait_cqe_timeout(&p->ring, &cqe, &ts);
		} while (ret == -EINTR);
	} else {
		do {
			ret = io_uring_wait_cqe(&p->ring, &cqe);
		} while (ret == -EINTR);
	}
	if (ret == -ETIME) {
		ret = 0;
	} else if (ret == 0) {
		k = io_uring_cqe_get_data(cqe);
		io_uring_cqe_seen(&p->ring, cqe);
		if (k->cancel) {
			ret = -ECANCELED;
		} else {
			*bytes = k->bytes;
			*key = k->key;
			*ov = k->ov;
			ret = 1;
		}
		free(k);
	}
	pthread_mutex_unlock(&p->cq_lock);
out:
	pthread_mutex_lock(&p->state_lock);
	if (--p->waiters == 0)
		pthread_cond_broadcast(&p->idle);
	pthread_mutex_unlock(&p->state_lock);
	return ret;
}

int wsd_port_associate(struct wsd_port *p, SOCKET h, uintptr_t key)
{
	int err = 0;
	struct wsp_socket *s;

	if (!p)
		return -EINVAL;
	s = wsp_sock_get(h, &err);
	if (!s)
		return -ENOTSOCK;
	pthread_mutex_lock(&s->pv->lock);
	if (s->port && s->port != p) {
		pthread_mutex_unlock(&s->pv->lock);
		wsp_sock_put(s);
		return -EINVAL;
	}
	if (!s->port && wsp_port_attach(p) < 0) {
		pthread_mutex_unlock(&s->pv->lock);
		wsp_sock_put(s);
		return -ECANCELED;
	}
	s->port = p;
	s->key = key;
	pthread_mutex_unlock(&s->pv->lock);
	wsp_sock_put(s);
	return 0;
}

int wsp_port_attach(struct wsd_port *p)
{
	int ret = 0;

	pthread_mutex_lock(&p->state_lock);
	if (p->closing)
		ret = -ECANCELED;
	else
		p->sockets++;
	pthread_mutex_unlock(&p->state_lock);
	return ret;
}

void wsp_port_detach(struct wsd_port *p)
{
	pthread_mutex_lock(&p->state_lock);
	p->sockets--;
	pthread_mutex_unlock(&p->state_lock);
}

int wsd_port_close(struct wsd_port *p)
{
	struct io_uring_cqe *cqe;

	if (!p)
		return -EINVAL;
	pthread_mutex_lock(&p->state_lock);
	if (p->sockets || p->closing) {
		pthread_mutex_unlock(&p->state_lock);
		return p->closing ? -EINVAL : -EBUSY;
	}
	p->closing = true;
	/* wake every waiter with a cancel packet, then wait for them to leave */
	for (unsigned i = 0; i < p->waiters; i++) {
		struct packet *k = calloc(1, sizeof(*k));

		if (k) {
			k->cancel = true;
			if (submit_packet(p, k) < 0)
				free(k);
		}
	}
	while (p->waiters)
		pthread_cond_wait(&p->idle, &p->state_lock);
	pthread_mutex_unlock(&p->state_lock);
	/* what nobody took */
	while (io_uring_peek_cqe(&p->ring, &cqe) == 0) {
		free(io_uring_cqe_get_data(cqe));
		io_uring_cqe_seen(&p->ring, cqe);
	}
	wsd_uring_exit(&p->ring);
	pthread_mutex_destroy(&p->sq_lock);
	pthread_mutex_destroy(&p->cq_lock);
	pthread_mutex_destroy(&p->state_lock);
	pthread_cond_destroy(&p->idle);
	free(p);
	return 0;
}

/* SPDX-License-Identifier: MIT */
/* Completion queues: results, progress, notification, and sleeping. */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "provider/internal.h"

nd_status nd_cq_create(struct nd_adapter *ad, uint32_t depth, struct nd_cq **out)
{
	struct nd_cq *cq;
	struct epoll_event ev = { .events = EPOLLIN };

	if (!ad || !out || !depth || depth > ad->info.max_cq_entries)
		return ND_INVALID_PARAMETER;
	cq = calloc(1, sizeof(*cq));
	if (!cq)
		return ND_NO_MEMORY;
	cq->ring = calloc(depth, sizeof(*cq->ring));
	cq->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	cq->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (!cq->ring || cq->efd < 0 || cq->epfd < 0 ||
	    epoll_ctl(cq->epfd, EPOLL_CTL_ADD, cq->efd, &ev) < 0 ||
	    wsd_engine_init(&cq->engine) < 0) {
		nd_status st = cq->ring ? ND_INSUFFICIENT_RESOURCES : ND_NO_MEMORY;

		if (cq->efd >= 0)
			close(cq->efd);
		if (cq->epfd >= 0)
			close(cq->epfd);
		free(cq->ring);
		free(cq);
		return st;
	}
	cq->ad = ad;
	cq->depth = depth;
	pthread_mutex_lock(&ad->lock);
	ad->nobjects++;
	pthread_mutex_unlock(&ad->lock);
	*out = cq;
	return ND_SUCCESS;
}

nd_status nd_cq_destroy(struct nd_cq *cq)
{
	struct nd_adapter *ad;

	if (!cq)
		return ND_INVALID_PARAMETER;
	ad = cq->ad;
	pthread_mutex_lock(&ad->lock);
	for (struct nd_ep *ep = ad->eps; ep; ep = ep->next) {
		if (ep->attr.inbound_cq == cq || ep->attr.outbound_cq == cq) {
			pthread_mutex_unlock(&ad->lock);
			return ND_DEVICE_BUSY;
		}
	}
	ad->nobjects--;
	pthread_mutex_unlock(&ad->lock);
	wsd_engine_fini(&cq->engine);
	close(cq->efd);
	close(cq->epfd);
	free(cq->ring);
	free(cq);
	return ND_SUCCESS;
}

/* The device reported a solicited event for this CQ (verbs): it fires. */
void wsd_cq_solicited(struct nd_cq *cq)
{
	if (cq->armed)
		cq->fired = true;
}

bool wsd_cq_full(const struct nd_cq *cq)
{
	return cq->count == cq->depth;
}

void wsd_cq_push(struct nd_cq *cq, const struct nd_result *r)
{
	cq->ring[(cq->head + cq->count) % cq->depth] = *r;
	cq->count++;
	if (cq->armed == ND_CQ_NOTIFY_ANY ||
	    (cq->armed == ND_CQ_NOTIFY_SOLICITED &&
	     ((r->flags & ND_RESULT_FLAG_SOLICITED) || r->status != ND_SUCCESS)))
		cq->fired = true;
}

/* Wake a thread sleeping on this CQ (used for local events such as terminate). */
void wsd_cq_kick(struct nd_cq *cq)
{
	if (atomic_load(&cq->sleeping))
		(void)eventfd_write(cq->efd, 1);
}

int wsd_cq_attach(struct nd_cq *cq, int fd)
{
	struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP, .data.fd = fd };

	if (epoll_ctl(cq->epfd, EPOLL_CTL_ADD, fd, &ev) < 0 && errno != EEXIST)
		return -errno;
	return 0;
}

void wsd_cq_detach(struct nd_cq *cq, int fd)
{
	(void)epoll_ctl(cq->epfd, EPOLL_CTL_DEL, fd, NULL);
}



/* Lock held.  Progress every endpoint that reports into this CQ. */
static void cq_progress(struct nd_cq *cq)
{
	for (struct nd_ep *ep = cq->ad->eps; ep; ep = ep->next) {
		if (ep->attr.inbound_cq != cq && ep->attr.outbound_cq != cq)
			continue;
		if (ep->state == EP_CONNECTED)
			ep->tp->progress(ep);
		wsd_ep_drain(ep);
	}
}

static int cq_take(struct nd_cq *cq, struct nd_result *results, int count)
{
	int n = 0;

	while (n < count && cq->count) {
		results[n++] = cq->ring[cq->head];
		cq->head = (cq->head + 1) % cq->depth;
		cq->count--;
	}
	return n;
}

int nd_cq_poll(struct nd_cq *cq, struct nd_result *results, int count)
{
	int n;

	if (!cq || (!results && count > 0) || count < 0)
		return -(int)ND_INVALID_PARAMETER;
	pthread_mutex_lock(&cq->ad->lock);
	n = cq_take(cq, results, count);
	if (n < count) {
		cq_progress(cq);
		n += cq_take(cq, results + n, count - n);
	}
	pthread_mutex_unlock(&cq->ad->lock);
	return n;
}

/* Lock held.  Ask every peer for a doorbell; 1 if work turned up meanwhile. */
static int cq_arm(struct nd_cq *cq)
{
	int busy = 0;

	for (struct nd_ep *ep = cq->ad->eps; ep; ep = ep->next)
		if (ep->attr.inbound_cq == cq || ep->attr.outbound_cq == cq)
			if (ep->state == EP_CONNECTED)
				busy |= ep->tp->arm(ep, cq);
	return busy;
}

nd_status nd_cq_notify(struct nd_cq *cq, enum nd_cq_notify_type type)
{
	if (!cq || (type != ND_CQ_NOTIFY_ANY && type != ND_CQ_NOTIFY_SOLICITED))
		return ND_INVALID_PARAMETER;
	pthread_mutex_lock(&cq->ad->lock);
	cq->armed = type;
	cq->fired = false;
	/*
	 * The caller is about to sleep on nd_cq_fd: forget doorbells already
	 * answered, so the fd turns readable only on news.  Work already here
	 * rings it again just below.
	 */
	{
		eventfd_t junk;

		(void)eventfd_read(cq->efd, &junk);
	}
	/* Ask the peers for doorbells so nd_cq_fd turns readable on news. */
	if (cq_arm(cq))
		(void)eventfd_write(cq->efd, 1);
	pthread_mutex_unlock(&cq->ad->lock);
	return ND_SUCCESS;
}

int nd_cq_fd(struct nd_cq *cq)
{
	return cq ? cq->epfd : -1;
}


/* Lock held.  Has the armed notification fired?  Disarms when it has. */
static bool cq_fired(struct nd_cq *cq)
{
	if (cq->fired || (cq->armed == ND_CQ_NOTIFY_ANY && cq->count)) {
		cq->armed = 0;
		cq->fired = false;
		return true;
	}
	return false;
}

nd_status nd_cq_wait(struct nd_cq *cq, int timeout_ms)
{
	int64_t start, deadline, spin_end;
	nd_status st = ND_TIMEOUT;
	eventfd_t junk;

	if (!cq)
		return ND_INVALID_PARAMETER;
	start = wsd_now_ns();
	spin_end = start + wsd_spin_ns();
	deadline = timeout_ms < 0 ? INT64_MAX : start + (int64_t)timeout_ms * 1000000;
	pthread_mutex_lock(&cq->ad->lock);
	if (!cq->armed)
		cq->armed = ND_CQ_NOTIFY_ANY;
	for (;;) {
		int64_t t;
		int ret;

		cq_progress(cq);
		if (cq_fired(cq)) {
			st = ND_SUCCESS;
			break;
		}
		t = wsd_now_ns();
		if (t >= deadline)
			break;
		if (t < spin_end) {
			/* Yield so a peer sharing this core can run and answer. */
			pthread_mutex_unlock(&cq->ad->lock);
			sched_yield();
			pthread_mutex_lock(&cq->ad->lock);
			continue;
		}
		atomic_store(&cq->sleeping, 1);
		if (cq_arm(cq)) {
			atomic_store(&cq->sleeping, 0);
			continue;
		}
		pthread_mutex_unlock(&cq->ad->lock);
		bool away = wsd_threads_away();   /* blocks: a fork need not wait for it */

		ret = wsd_engine_wait_fd(&cq->engine, cq->epfd,
					 deadline == INT64_MAX ? -1 : deadline - t);
		wsd_threads_back(away);
		(void)eventfd_read(cq->efd, &junk);
		pthread_mutex_lock(&cq->ad->lock);
		atomic_store(&cq->sleeping, 0);
		if (ret < 0 && ret != -EINTR) {
			st = wsd_nd_from_errno(ret);
			break;
		}
	}
	pthread_mutex_unlock(&cq->ad->lock);
	return st;
}

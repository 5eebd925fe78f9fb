/* SPDX-License-Identifier: MIT */
/*
 * epoll's shadow of the registrations, shared by epoll.c (the sets and
 * their items, the fd -> set map, epoll_ctl) and epoll_wait.c (the waits):
 * the structures, the event bits, and what epoll.c defines for the waits.
 */
#ifndef WSD_SWITCH_EPOLL_INT_H
#define WSD_SWITCH_EPOLL_INT_H

#include <stddef.h>

#include "switch/switch.h"

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
	struct ep_link alink;          /* on set->accel or set->parked while accelerated */
	int fd;
	uint32_t gen;                  /* with fd, the token the kernel holds */
	uint32_t events;               /* the application's */
	epoll_data_t data;             /* the application's, returned unchanged */
	uint32_t krev;                 /* kernel events not yet looked at */
	bool accel;                    /* registered with the kernel for the doorbell */
	bool txs;                      /* ...and for POLLOUT: its sending side is the stream */
	bool kicked;                   /* an edge to report if ready (ET) */
	bool disabled;                 /* EPOLLONESHOT fired */
	bool parked;                   /* on set->parked: armed, waits for a kernel event */
	uint16_t idle;                 /* looks since it was last ready or parked */
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
	/*
	 * Accelerated items a wait armed before it slept and found idle: their
	 * peers ring on the next arrival, so no wait looks at their rings until
	 * a kernel event (or a call that read their bells: rq) moves them back.
	 * This keeps a wait's cost to the busy items, not to all of them.
	 */
	struct ep_link parked;
	_Atomic int naccel;            /* on either list */
	uint32_t gen;
	int efd;                       /* wakes the waiters; -1 until a socket joins */
	_Atomic int waiters;           /* threads asleep in the kernel on the set */
	/* in another epoll set, or its fd given to poll or select: keep its
	 * fd's readiness true (its sockets stay armed) */
	_Atomic bool nested;
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

#define item_of(l) ((struct wsd_epitem *)((char *)(l) - offsetof(struct wsd_epitem, alink)))

/* epoll.c: the kernel's registration of an item, the lists, the sets */
struct epoll_event kernel_event(uint32_t events, bool accel, bool txs, uint64_t token);
void link_init(struct ep_link *h);
void link_del(struct ep_link *l);
void link_add_tail(struct ep_link *l, struct ep_link *h);
struct wsd_epitem *item_by_token(struct epset *set, uint64_t token);
void set_wake(struct epset *set);
void set_put(struct epset *set);
struct epset *set_get(int fd);
void set_requeue(struct epset *set, int epfd);
void item_unpark(struct epset *set, struct wsd_epitem *it);
void item_park(struct epset *set, struct wsd_epitem *it);
void set_watch(struct epset *set);
/* epoll_wait.c */
void set_refresh(struct epset *set);

#endif /* WSD_SWITCH_EPOLL_INT_H */

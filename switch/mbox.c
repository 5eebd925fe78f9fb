/* SPDX-License-Identifier: MIT */
/*
 * The mailbox (wsd-protocol(7), "Channels", "The mailbox"): on shm, the
 * tag page of a side's receive segment holds WSD_BOX_N entries: its
 * owner grants sessions ahead, the peer that made the channel posts its
 * OPENs into the grants, and the owner answers them in place.  Both sides
 * map the segment, so an OPEN and its answer are a few stores: the
 * listening side takes the OPEN in the program's own accept (or its first
 * receive), and the connecting side reads the answer when it next needs
 * it (connect.c), where a message would cost a wake-up of each side's
 * channel thread.  An OPEN not taken in time is taken back by its poster.
 * After the entries, the page holds the SHUT queue.
 *
 * An entry's state word decides who may touch it: free, given up and
 * rejected are the owner's to grant, granted and filling the poster's,
 * posted is the poster's to take back or the owner's to take (one
 * compare-and-swap decides), taken is the owner's, answered is the
 * poster's again.  The owner copies what it takes and checks the
 * copy as it checks a message: the peer can write the page at any time.
 */
#define _GNU_SOURCE
#include <netinet/in.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "provider/fault.h"

#include "switch/chan_int.h"
#include "switch/session.h"
#include "switch/upgrade_int.h"

#define BOX_OFF 64u                  /* after the tag */

enum { BOX_FREE = 0, BOX_FILLING = 1, BOX_POSTED = 2, BOX_TAKEN = 3, BOX_ANSWERED = 4,
       BOX_GRANTED = 5, BOX_VOID = 6, BOX_REJECTED = 7 };

/* An entry the peer is done with, which wants a new grant: free, given up, rejected. */
#define BOX_DONE (1u << BOX_FREE | 1u << BOX_VOID | 1u << BOX_REJECTED)

/* A state word (the peer writes it, any value) among those of mask (1 << state). */
static bool among(uint32_t mask, uint32_t st)
{
	return st < 32 && (mask >> st & 1);
}

struct box {
	_Atomic uint32_t state;
	uint32_t pad;
	struct wsd_chmsg m;
	uint8_t pad2[8];
};
_Static_assert(sizeof(struct box) == 176, "a mailbox entry");
_Static_assert(BOX_OFF + WSD_BOX_N * sizeof(struct box) <= WSD_SEG_PAGE,
	       "the mailbox fits the tag page");

/* Our own mailbox (peer posts here), or NULL: not shm, or no segment. */
static struct box *own_box(struct wsd_chan *ch)
{
	if (ch->path != PATH_SHM || !ch->nsegs || !ch->segs[0].shared)
		return NULL;
	return (struct box *)(ch->segs[0].mem + ch->segs[0].len - WSD_SEG_PAGE + BOX_OFF);
}

/* The peer's mailbox mapped here (we post there), or NULL. */
static struct box *peer_box(struct wsd_chan *ch)
{
	struct peer_seg *p = &ch->peers[0];

	if (ch->path != PATH_SHM || !p->map || p->failed)
		return NULL;
	return (struct box *)(p->map + p->len - WSD_SEG_PAGE + BOX_OFF);
}

/*
 * After the entries, the SHUT queue: slots of ours the peer will not write
 * again, which a SHUT message would name (wsd-protocol(7)): the peer
 * appends (a compare-and-swap on head, then the entry), we take them from
 * tail.  An entry holds the slot's offset plus one; 0 is empty.
 */
#define SHUTQ_N 256u

struct shutq {
	_Atomic uint32_t head, tail;
	_Atomic uint32_t e[SHUTQ_N];
};
#define SHUTQ_OFF (BOX_OFF + WSD_BOX_N * sizeof(struct box))
_Static_assert(SHUTQ_OFF + sizeof(struct shutq) <= WSD_SEG_PAGE, "the SHUT queue fits too");

bool wsd_chan_shut_post(struct wsd_chan *ch, uint32_t seg, uint32_t off)
{
	struct box *b = seg == 0 ? peer_box(ch) : NULL;
	struct shutq *q;
	uint32_t h;

	if (!b || off == UINT32_MAX)
		return false;
	q = (struct shutq *)((uint8_t *)b - BOX_OFF + SHUTQ_OFF);
	h = atomic_load_explicit(&q->head, memory_order_relaxed);
	do {
		if (h - atomic_load_explicit(&q->tail, memory_order_acquire) >= SHUTQ_N)
			return false;   /* full: a message instead */
	} while (!atomic_compare_exchange_weak(&q->head, &h, h + 1));
	atomic_store_explicit(&q->e[h % SHUTQ_N], off + 1, memory_order_release);
	return true;
}

int wsd_chan_shut_take(struct wsd_chan *ch, uint32_t *offs, int max)
{
	struct box *b = own_box(ch);
	struct shutq *q;
	uint32_t t;
	int n = 0;

	if (!b)
		return 0;
	q = (struct shutq *)((uint8_t *)b - BOX_OFF + SHUTQ_OFF);
	t = atomic_load_explicit(&q->tail, memory_order_relaxed);
	while (n < max) {
		uint32_t v = atomic_exchange_explicit(&q->e[t % SHUTQ_N], 0, memory_order_acquire);

		if (!v)
			break;
		offs[n++] = v - 1;
		atomic_store_explicit(&q->tail, ++t, memory_order_release);
	}
	return n;
}

/* ---- the listening side --------------------------------------------------------- */

void wsd_chan_no_box(struct wsd_chan *ch)
{
	ch->no_box = true;
}

void wsd_chan_box_grant(struct wsd_chan *ch)
{
	struct box *b = ch->connector || ch->no_box ? NULL : own_box(ch);
	struct wsd_session *old[WSD_BOX_N];
	struct wsd_sock *done[WSD_BOX_N];
	bool rejected[WSD_BOX_N];
	int nold = 0, ndone = 0;

	if (!b || atomic_load(&ch->dead))
		return;
	pthread_mutex_lock(&ch->box_mu);
	for (uint32_t i = 0; i < WSD_BOX_N; i++) {
		uint32_t st = atomic_load_explicit(&b[i].state, memory_order_acquire);
		struct wsd_session *ss;

		if (!among(BOX_DONE, st))
			continue;
		/* the peer is done with the old grant's slot (it freed or voided the entry) */
		if (ch->grant[i])
			old[nold++] = ch->grant[i];
		ch->grant[i] = NULL;
		/* the connection answered OPENED: kept, or (REJECTED) the peer stayed on the stream */
		if (ch->taken[i]) {
			rejected[ndone] = st == BOX_REJECTED;
			done[ndone++] = ch->taken[i];
			ch->taken[i] = NULL;
		}
		ss = wsd_session_new(ch);
		if (!ss) {
			atomic_store_explicit(&b[i].state, BOX_FREE, memory_order_release);
			continue;
		}
		memset(&b[i].m, 0, sizeof(b[i].m));
		wsd_session_hello(ss, &b[i].m.h, MSG_OPENED);
		ch->grant[i] = ss;
		atomic_store_explicit(&b[i].state, BOX_GRANTED, memory_order_release);
	}
	pthread_mutex_unlock(&ch->box_mu);
	while (nold)
		wsd_session_free(old[--nold]);
	while (ndone--) {
		if (rejected[ndone])
			wsd_sock_unswitched(done[ndone]);
		wsd_sock_put(done[ndone]);
	}
}

static bool wants_grant(struct wsd_chan *ch)
{
	struct box *b = own_box(ch);

	for (uint32_t i = 0; b && i < WSD_BOX_N; i++)
		if (among(BOX_DONE, atomic_load_explicit(&b[i].state, memory_order_relaxed)))
			return true;
	return false;
}

void wsd_chan_box_refill(void)
{
	struct wsd_chan *live[64];
	int n = 0;

	pthread_mutex_lock(&wsd_chan_tab_lock);
	for (struct wsd_chan *ch = wsd_chans; ch && n < 64; ch = ch->next)
		if (!ch->connector && !atomic_load(&ch->dead) && ch->owner == wsd_pid() &&
		    wants_grant(ch)) {
			wsd_chan_hold(ch);
			live[n++] = ch;
		}
	pthread_mutex_unlock(&wsd_chan_tab_lock);
	while (n) {
		wsd_chan_box_grant(live[--n]);
		wsd_chan_put(live[n]);
	}
}

void wsd_chan_box_drop(struct wsd_chan *ch)
{
	struct wsd_session *old[WSD_BOX_N];
	struct wsd_sock *done[WSD_BOX_N];
	int nold = 0, ndone = 0;

	pthread_mutex_lock(&ch->box_mu);
	for (uint32_t i = 0; i < WSD_BOX_N; i++) {
		if (ch->grant[i])
			old[nold++] = ch->grant[i];
		ch->grant[i] = NULL;
		if (ch->taken[i])
			done[ndone++] = ch->taken[i];
		ch->taken[i] = NULL;
	}
	pthread_mutex_unlock(&ch->box_mu);
	while (nold)
		wsd_session_free(old[--nold]);
	while (ndone)
		wsd_sock_put(done[--ndone]);
}

/* Some entry of a listening channel of ours is in a state of mask (1 << state). */
static bool box_scan(uint32_t mask)
{
	bool hit = false;

	pthread_mutex_lock(&wsd_chan_tab_lock);
	for (struct wsd_chan *ch = wsd_chans; ch && !hit; ch = ch->next) {
		struct box *b = ch->connector || atomic_load(&ch->dead) ? NULL : own_box(ch);

		for (uint32_t i = 0; b && i < WSD_BOX_N && !hit; i++)
			hit = among(mask, atomic_load_explicit(&b[i].state, memory_order_relaxed));
	}
	pthread_mutex_unlock(&wsd_chan_tab_lock);
	return hit;
}

bool wsd_chan_box_any(void)
{
	return box_scan(1u << BOX_POSTED);
}

bool wsd_chan_box_busy(void)
{
	return box_scan(1u << BOX_POSTED | 1u << BOX_FILLING | 1u << BOX_GRANTED);
}

static bool names(const struct wsd_chmsg *m, const struct wsd_stat_addr *local,
		  const struct wsd_stat_addr *peer)
{
	return same(&m->t.server, local) && same(&m->t.client, peer);
}

/* An answer in entry i; the grant stays ours until the peer frees the entry. */
static void reply(struct box *b, uint32_t i, const struct wsd_chmsg *a)
{
	memcpy(&b[i].m, a, sizeof(*a));
	atomic_store_explicit(&b[i].state, BOX_ANSWERED, memory_order_release);
}

struct wsd_chan *wsd_chan_box_take(const struct wsd_stat_addr *local,
				   const struct wsd_stat_addr *peer, int *idx, struct wsd_chmsg *m,
				   struct wsd_session **grant)
{
	struct wsd_chan *hit = NULL;

	pthread_mutex_lock(&wsd_chan_tab_lock);
	for (struct wsd_chan *ch = wsd_chans; ch && !hit; ch = ch->next) {
		struct box *b = ch->connector || atomic_load(&ch->dead) ||
				ch->owner != wsd_pid() ? NULL : own_box(ch);

		for (uint32_t i = 0; b && i < WSD_BOX_N && !hit; i++) {
			uint32_t st = BOX_POSTED;

			if (atomic_load_explicit(&b[i].state, memory_order_acquire) != BOX_POSTED)
				continue;
			memcpy(m, &b[i].m, sizeof(*m));
			if (!names(m, local, peer) ||
			    !atomic_compare_exchange_strong(&b[i].state, &st, BOX_TAKEN))
				continue;
			/* ours now: the copy that counts is the one made after taking it */
			memcpy(m, &b[i].m, sizeof(*m));
			pthread_mutex_lock(&ch->box_mu);
			*grant = ch->grant[i];
			ch->grant[i] = NULL;   /* the connection's, if answered OPENED */
			pthread_mutex_unlock(&ch->box_mu);
			if (!names(m, local, peer) || !*grant) {
				/* changed under us, or no grant: refused, looked at no further */
				struct wsd_chmsg no = decline_msg(m->req, R_PROTOCOL);

				pthread_mutex_lock(&ch->box_mu);
				ch->grant[i] = *grant;
				pthread_mutex_unlock(&ch->box_mu);
				reply(b, i, &no);
				continue;
			}
			wsd_chan_hold(ch);
			hit = ch;
			*idx = (int)i;
		}
	}
	pthread_mutex_unlock(&wsd_chan_tab_lock);
	return hit;
}

void wsd_chan_box_reply(struct wsd_chan *ch, int idx, const struct wsd_chmsg *a,
			struct wsd_session *grant, struct wsd_sock *s)
{
	struct box *b = own_box(ch);

	if (!b)
		return;
	pthread_mutex_lock(&ch->box_mu);
	/* declined: the peer may still write the grant's slot until it frees the entry */
	if (grant)
		ch->grant[idx] = grant;
	/* OPENED: the peer may yet stay on the stream (REJECTED) */
	if (s) {
		wsd_sock_hold(s);
		ch->taken[idx] = s;
	}
	pthread_mutex_unlock(&ch->box_mu);
	reply(b, (uint32_t)idx, a);
}

/* ---- the connecting side -------------------------------------------------------- */

int wsd_chan_box_claim(struct wsd_chan *ch, struct wsd_hello *g)
{
	struct box *b;
	const char *why;

	pthread_mutex_lock(&ch->mu);
	b = peer_box(ch);
	pthread_mutex_unlock(&ch->mu);
	if (!b || atomic_load(&ch->dead))
		return -1;
	for (uint32_t i = 0; i < WSD_BOX_N; i++) {
		uint32_t st = BOX_GRANTED;

		if (atomic_load_explicit(&b[i].state, memory_order_relaxed) != BOX_GRANTED ||
		    !atomic_compare_exchange_strong(&b[i].state, &st, BOX_FILLING))
			continue;
		memcpy(g, &b[i].m.h, sizeof(*g));
		if (wsd_wire_hello_check(g, MSG_OPENED, &why)) {
			wsd_debug("switch: channel %u: a grant: %s", ch->id, why);
			atomic_store_explicit(&b[i].state, BOX_VOID, memory_order_release);
			return -1;
		}
		return (int)i;
	}
	return -1;
}

void wsd_chan_box_post(struct wsd_chan *ch, int idx, const struct wsd_chmsg *m)
{
	struct box *b = peer_box(ch);

	memcpy(&b[idx].m, m, sizeof(*m));
	atomic_store_explicit(&b[idx].state, BOX_POSTED, memory_order_release);
}

int wsd_chan_box_answer(struct wsd_chan *ch, int idx, struct wsd_chmsg *a)
{
	struct box *b = peer_box(ch);

	if (!b || atomic_load_explicit(&b[idx].state, memory_order_acquire) != BOX_ANSWERED)
		return 0;
	memcpy(a, &b[idx].m, sizeof(*a));
	return 1;
}

void wsd_chan_box_release(struct wsd_chan *ch, int idx, bool rejected)
{
	struct box *b = peer_box(ch);

	if (b)
		atomic_store_explicit(&b[idx].state, rejected ? BOX_REJECTED : BOX_FREE,
				      memory_order_release);
}

bool wsd_chan_box_withdraw(struct wsd_chan *ch, int idx)
{
	struct box *b = peer_box(ch);
	uint32_t st = BOX_POSTED;

	return b && atomic_compare_exchange_strong(&b[idx].state, &st, BOX_VOID);
}

/* ---- the poster's socket --------------------------------------------------------- */

#ifndef SO_NETNS_COOKIE
#define SO_NETNS_COOKIE 71           /* Linux 5.14 */
#endif

uint64_t wsd_netns_cookie(int fd)
{
	uint64_t c = 0;
	socklen_t l = sizeof(c);

	return real.getsockopt(fd, SOL_SOCKET, SO_NETNS_COOKIE, &c, &l) ? 0 : c;
}

/* ch->mu held: a pidfd of the peer the kernel named to the shm transport, or < 0. */
static int peer_pidfd(struct wsd_chan *ch)
{
	if (ch->peer_pidfd == -1) {
		ch->peer_pidfd = -2;
		if (peer_pid_is(ch->ws, ch->peer_pid)) {
			int fd = (int)syscall(SYS_pidfd_open, (pid_t)ch->peer_pid, 0);

			if (fd >= 0)
				ch->peer_pidfd = fd;
		}
	}
	return ch->peer_pidfd;
}

bool wsd_chan_box_held(struct wsd_chan *ch, int fd, const struct wsd_sock *s)
{
	struct sockaddr_storage a, b;
	socklen_t la = sizeof(a), lb = sizeof(b), lp = sizeof(int), lc = sizeof(uint64_t);
	struct wsd_stat_addr x, y;
	uint64_t ns_theirs = 0, ns_ours;
	int pfd, d, proto = 0;
	bool ok;

	if (ch->path != PATH_SHM || fd < 0 || !s->tuple_known || wsd_fault("box-held", NULL))
		return false;
	pthread_mutex_lock(&ch->mu);
	pfd = peer_pidfd(ch);
	pthread_mutex_unlock(&ch->mu);
	if (pfd < 0 || (d = (int)syscall(SYS_pidfd_getfd, pfd, fd, 0)) < 0)
		return false;
	ok = !real.getsockopt(d, SOL_SOCKET, SO_PROTOCOL, &proto, &lp) && proto == IPPROTO_TCP &&
	     !getsockname(d, (struct sockaddr *)&a, &la) && !getpeername(d, (struct sockaddr *)&b, &lb);
	if (ok) {
		to_addr(&a, &x);
		to_addr(&b, &y);
		ok = same(&x, &s->stat->peer) && same(&y, &s->stat->local);
	}
	/*
	 * The same addresses in another namespace are another connection.
	 * Ours is the listener's, taken at the accept (0: the kernel does not
	 * say, and then neither is seen).
	 */
	ns_ours = atomic_load(&s->netns);
	ok = ok && ns_ours && !real.getsockopt(d, SOL_SOCKET, SO_NETNS_COOKIE, &ns_theirs, &lc) &&
	     ns_theirs == ns_ours;
	real.close(d);
	return ok;
}

/* SPDX-License-Identifier: MIT */
/*
 * Channels (chan.h): one provider connection and receive memory per pair
 * of processes, shared by every connection the switch moved between them.
 *
 * Memory: its receive segments and the slots in them (chan_seg.c).
 *
 * Messages.  One thread per process waits on one completion port for the
 * channels' messages (NRECV receives posted per channel, wsd-protocol(7)
 * "Channel credits") and, every SWEEP_MS, gives back idle rings and ends a
 * connector's idle channels.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "provider/fault.h"
#include "provider/internal.h"
#include "switch/chan_int.h"
#include "switch/session.h"

pthread_mutex_t wsd_chan_tab_lock = PTHREAD_MUTEX_INITIALIZER;
struct wsd_chan *wsd_chans;           /* every live channel of this process */
static uint32_t next_id = 1;
static struct wsd_port *port;
static bool thread_up;

static void *chan_main(void *arg);
static void chan_free(struct wsd_chan *ch);

SOCKET wsd_chan_socket(const struct wsd_chan *ch)
{
	return ch->ws;
}

enum wsd_path wsd_chan_path(const struct wsd_chan *ch)
{
	return ch->path;
}

uint32_t wsd_chan_id(const struct wsd_chan *ch)
{
	return ch->id;
}

int wsd_chan_with(uint32_t pid)
{
	int n = 0;

	pthread_mutex_lock(&wsd_chan_tab_lock);
	for (struct wsd_chan *ch = wsd_chans; ch; ch = ch->next)
		n += ch->peer_pid == pid && !atomic_load(&ch->dead) && ch->owner == wsd_pid();
	pthread_mutex_unlock(&wsd_chan_tab_lock);
	return n;
}

uint32_t wsd_chan_peer_pid(const struct wsd_chan *ch)
{
	return ch->peer_pid;
}

void wsd_chan_mem_inodes(struct wsd_chan *ch, uint64_t ino[2])
{
	pthread_mutex_lock(&ch->mu);
	ino[0] = ch->nsegs && ch->segs[0].shared ? ch->segs[0].ino : 0;
	ino[1] = ch->peers[0].map ? ch->peers[0].ino : 0;
	pthread_mutex_unlock(&ch->mu);
}

bool wsd_chan_dead(const struct wsd_chan *ch)
{
	return atomic_load(&ch->dead);
}

bool wsd_chan_copy(const struct wsd_chan *ch)
{
	return ch->copy;
}

int64_t wsd_chan_sock_uid(SOCKET ws)
{
	int uid = -1, err;
	socklen_t len = sizeof(uid);

	if (wsd_spi()->lpWSPGetSockOpt(ws, SOL_WSP, SO_WSP_PEER_UID, (char *)&uid, &len, &err))
		return -1;
	return (int64_t)(uint32_t)uid;
}

/*
 * A channel with a process of another user (copy): that process may not
 * take our segment's memfd from us (pidfd_getfd), so it goes over the
 * transport's socket now, before any message names it.  0, or -1 when it
 * cannot (the channel is not made).
 */
static int copy_start(struct wsd_chan *ch)
{
	int err;

	if (!ch->copy)
		return 0;
	return ch->segs[0].memfd >= 0 &&
	       !wsd_spi()->lpWSPIoctl(ch->ws, SIO_WSP_SEND_FD, &ch->segs[0].memfd, sizeof(int),
				      NULL, 0, NULL, NULL, NULL, NULL, &err) ? 0 : -1;
}

void wsd_chan_lost_socket(struct wsd_chan *ch)
{
	ch->ws = INVALID_SOCKET;
	atomic_store(&ch->dead, true);
}

void wsd_chan_hold(struct wsd_chan *ch)
{
	atomic_fetch_add(&ch->refs, 1);
}


/* ---- sessions ------------------------------------------------------------------ */

void wsd_chan_session_add(struct wsd_chan *ch, struct wsd_session *ss)
{
	pthread_mutex_lock(&ch->mu);
	if (ch->nsess == ch->capsess) {
		size_t cap = ch->capsess ? 2 * ch->capsess : 16;
		struct wsd_session **n = realloc(ch->sess, cap * sizeof(*n));

		if (!n) {
			pthread_mutex_unlock(&ch->mu);
			return;   /* only the sweep misses it */
		}
		ch->sess = n;
		ch->capsess = cap;
	}
	ch->sess[ch->nsess++] = ss;
	pthread_mutex_unlock(&ch->mu);
}

void wsd_chan_session_del(struct wsd_chan *ch, struct wsd_session *ss)
{
	pthread_mutex_lock(&ch->mu);
	for (size_t i = 0; i < ch->nsess; i++)
		if (ch->sess[i] == ss) {
			ch->sess[i] = ch->sess[--ch->nsess];
			break;
		}
	pthread_mutex_unlock(&ch->mu);
}

/* ---- the channel ------------------------------------------------------------------ */

struct wsd_chan *wsd_chan_new(SOCKET ws, enum wsd_path path, bool connector,
			      const struct wsd_stat_addr *key)
{
	struct wsd_chan *ch = calloc(1, sizeof(*ch));

	if (!ch)
		return NULL;
	atomic_init(&ch->refs, 1);
	pthread_mutex_init(&ch->mu, NULL);
	pthread_mutex_init(&ch->send_mu, NULL);
	pthread_mutex_init(&ch->box_mu, NULL);
	pthread_cond_init(&ch->grown, NULL);
	ch->ws = ws;
	ch->path = path;
	ch->connector = connector;
	ch->bl_tail = &ch->bl_head;
	if (key)
		ch->key = *key;
	ch->owner = wsd_pid();
	ch->peer_pidfd = -1;
	ch->ring = wsd_switch_params()->ring_size;
	if (!ch->ring)
		ch->ring = path == PATH_SHM ? SHM_RING : VERBS_RING;
	atomic_flag_clear(&ch->seg_handed);
	if (path == PATH_SHM) {
		int64_t uid = wsd_chan_sock_uid(ws);

		int rdv = 0, err;
		socklen_t len = sizeof(rdv);

		/* through the rendezvous directory: by copy whatever the users (no pid to use) */
		(void)wsd_spi()->lpWSPGetSockOpt(ws, SOL_WSP, SO_WSP_RENDEZVOUS, (char *)&rdv, &len,
						 &err);
		ch->copy = (uid >= 0 && uid != (int64_t)geteuid()) || rdv == 1;
		/* nothing goes before the stream's proof there: no first bytes by mailbox */
		ch->no_box = rdv == 1;
	}
	if (chan_seg_add(ch, ch->ring, path == PATH_SHM ? SHM_SLOTS : VERBS_SLOTS)) {
		ch->ws = INVALID_SOCKET;   /* still the caller's */
		chan_free(ch);
		return NULL;
	}
	ch->nsegs = 1;
	if (copy_start(ch)) {
		ch->ws = INVALID_SOCKET;   /* still the caller's */
		chan_free(ch);
		return NULL;
	}
	pthread_mutex_lock(&wsd_chan_tab_lock);
	ch->id = next_id++;
	pthread_mutex_unlock(&wsd_chan_tab_lock);
	return ch;
}

static void chan_free(struct wsd_chan *ch)
{
	int err;

	if (ch->owner != wsd_pid())
		return;   /* the parent's, in a fork child: left as it is */
	if (ch->ws != INVALID_SOCKET)
		wsd_spi()->lpWSPCloseSocket(ch->ws, &err);
	if (ch->peer_pidfd >= 0)
		real.close(ch->peer_pidfd);
	for (uint32_t i = 0; i < ch->nsegs; i++) {
		chan_seg_fd_close(&ch->segs[i]);
		munmap(ch->segs[i].mem, ch->segs[i].len);
		free(ch->segs[i].state);
		free(ch->segs[i].freel);
	}
	for (uint32_t i = 0; i < MAX_SEGS; i++)
		if (ch->peers[i].map)
			munmap(ch->peers[i].map, ch->peers[i].len);
	while (ch->bl_head) {
		struct backlog *b = ch->bl_head;

		ch->bl_head = b->next;
		free(b);
	}
	free(ch->sess);
	free(ch);
}

void wsd_chan_put(struct wsd_chan *ch)
{
	if (ch && atomic_fetch_sub(&ch->refs, 1) == 1)
		chan_free(ch);
}

/*
 * send_mu held: m into a free slot, sent; false when none is free, the
 * peer has no receive for it (the last is kept for a CREDIT, so that one
 * always goes), or the send failed (*failed).
 */
static bool out_post(struct wsd_chan *ch, const struct wsd_chmsg *m, bool *failed)
{
	if (ch->sent - ch->peer_taken >= NRECV - (m->h.kind == MSG_CREDIT ? 0u : 1u))
		return false;
	for (int i = 0; i < OUTS; i++) {
		struct out *o = &ch->outs[i];
		WSABUF b = { sizeof(o->m), (char *)&o->m };
		uint32_t n;
		int err = 0;

		if (o->busy)
			continue;
		o->m = *m;
		o->m.taken = ch->told = atomic_load(&ch->rx_taken);
		memset(&o->ov, 0, sizeof(o->ov));
		o->busy = true;
		wsd_chan_hold(ch);   /* until its completion */
		if (wsd_spi()->lpWSPSend(ch->ws, &b, 1, &n, 0, &o->ov, NULL, NULL, &err) &&
		    err != WSA_IO_PENDING) {
			o->busy = false;
			atomic_fetch_sub(&ch->refs, 1);   /* never the last: the caller holds one */
			*failed = true;
			return false;
		}
		ch->sent++;
		return true;
	}
	return false;
}

/*
 * send_mu held: the line, in order, as far as slots and credit go; then a
 * CREDIT if no message told the peer of half its credit since it came
 * back (wsd-protocol(7), "Credits").
 */
static void out_drain(struct wsd_chan *ch, bool *failed)
{
	while (!*failed && ch->bl_head && !atomic_load(&ch->dead)) {
		struct backlog *b = ch->bl_head;

		if (!out_post(ch, &b->m, failed))
			break;
		ch->bl_head = b->next;
		if (!ch->bl_head)
			ch->bl_tail = &ch->bl_head;
		ch->nbacklog--;
		free(b);
	}
	if (!*failed && !atomic_load(&ch->dead) && atomic_load(&ch->rx_taken) - ch->told >= NRECV / 2) {
		struct wsd_chmsg c = { .h = { .magic = WSD_PROTO_MAGIC,
					      .version = WSD_PROTO_VERSION, .kind = MSG_CREDIT } };

		(void)out_post(ch, &c, failed);   /* else at the next completion or credit */
	}
}

int wsd_chan_send(struct wsd_chan *ch, struct wsd_chmsg *m)
{
	bool failed = false;
	int r = 0;

	if (atomic_load(&ch->dead) || ch->owner != wsd_pid())
		return -EPIPE;
	pthread_mutex_lock(&ch->send_mu);
	if (ch->bl_head || !out_post(ch, m, &failed)) {
		struct backlog *b = failed || ch->nbacklog >= BACKLOG_MAX ? NULL : malloc(sizeof(*b));

		if (b) {
			b->m = *m;
			b->next = NULL;
			*ch->bl_tail = b;
			ch->bl_tail = &b->next;
			ch->nbacklog++;
		} else {
			/* a peer that took none of so many: it is gone or does not play */
			failed = failed || ch->nbacklog >= BACKLOG_MAX;
			r = -EPIPE;
		}
	}
	pthread_mutex_unlock(&ch->send_mu);
	if (failed)
		wsd_chan_end(ch);
	return r;
}

/* A send completed (the reader): its slot takes the next message in line. */
static void out_done(struct wsd_chan *ch, WSAOVERLAPPED *ov)
{
	struct out *o = (struct out *)(void *)((char *)ov - offsetof(struct out, ov));
	bool failed = ov->Internal != 0;

	pthread_mutex_lock(&ch->send_mu);
	o->busy = false;
	if (!failed)
		out_drain(ch, &failed);
	pthread_mutex_unlock(&ch->send_mu);
	if (failed)
		wsd_chan_end(ch);
}

/* wsd_chan_tab_lock held: the port and its thread, once per process. */
static int start_thread(void)
{
	if (thread_up)
		return 0;
	if (!port && wsd_port_create(&port))
		return -ENOMEM;
	thread_up = wsd_thread_start(chan_main, NULL) == 0;
	return thread_up ? 0 : -EAGAIN;
}

/* One receive posted on the port, holding a reference of its own: 0 or -EPIPE. */
static int post_in(struct wsd_chan *ch, struct in *in)
{
	uint32_t n = 0, fl = 0;
	int err = 0;

	memset(&in->ov, 0, sizeof(in->ov));
	in->b = (WSABUF){ sizeof(in->m), (char *)&in->m };
	wsd_chan_hold(ch);
	if (wsd_spi()->lpWSPRecv(ch->ws, &in->b, 1, &n, &fl, &in->ov, NULL, NULL, &err) &&
	    err != WSA_IO_PENDING) {
		atomic_fetch_sub(&ch->refs, 1);   /* never the last: the caller holds one */
		return -EPIPE;
	}
	return 0;   /* either way its completion comes through the port */
}

static void rx_end(struct wsd_chan *ch);

int wsd_chan_receive(struct wsd_chan *ch, uint32_t peer_pid)
{
	uint32_t posted = 0;
	int r;

	if (ch->receiving)
		return atomic_load(&ch->dead) ? -EPIPE : 0;
	ch->receiving = true;
	ch->peer_pid = peer_pid;
	pthread_mutex_lock(&wsd_chan_tab_lock);
	r = start_thread();
	if (!r)
		r = wsd_port_associate(port, ch->ws, (uintptr_t)ch);
	if (!r) {
		ch->next = wsd_chans;
		wsd_chans = ch;
		while (posted < NRECV && post_in(ch, &ch->ins[posted]) == 0)
			posted++;
	}
	pthread_mutex_unlock(&wsd_chan_tab_lock);
	if (!r && posted < NRECV) {
		int err;

		/* the ones posted complete, aborted, and the reader ends it; else here */
		atomic_store(&ch->dead, true);
		if (posted)
			wsd_spi()->lpWSPShutdown(ch->ws, SD_BOTH, &err);
		else
			rx_end(ch);
		r = -EPIPE;
	}
	return r;
}

int wsd_chan_start(struct wsd_chan *ch, uint32_t peer_pid)
{
	int r = wsd_chan_receive(ch, peer_pid);
	bool tell[MAX_SEGS] = { false };

	/* under mu, as chan_seg.c looks at it before it defers a MAPPED to here */
	pthread_mutex_lock(&ch->mu);
	ch->reading = true;
	for (uint32_t i = 0; i < MAX_SEGS; i++) {
		tell[i] = ch->peers[i].tell;
		ch->peers[i].tell = false;
	}
	pthread_mutex_unlock(&ch->mu);
	for (uint32_t i = 0; !r && i < MAX_SEGS; i++)
		if (tell[i])
			chan_send_mapped(ch, i);
	if (!r)
		wsd_chan_box_grant(ch);   /* the listening side's: its peer's first-byte OPENs */
	return r;
}

struct wsd_chan *wsd_chan_find(const struct wsd_stat_addr *key)
{
	struct wsd_chan *ch;

	pthread_mutex_lock(&wsd_chan_tab_lock);
	for (ch = wsd_chans; ch; ch = ch->next)
		if (ch->connector && !atomic_load(&ch->dead) && ch->owner == wsd_pid() &&
		    ch->key.family == key->family && ch->key.port == key->port &&
		    !memcmp(ch->key.addr, key->addr, sizeof(key->addr)))
			break;
	if (ch) {
		wsd_chan_hold(ch);
		ch->idle_since = 0;   /* taken: not idle (mu not needed for a hint) */
	}
	pthread_mutex_unlock(&wsd_chan_tab_lock);
	return ch;
}

/* wsd_chan_tab_lock held: unlink; the receive's reference is the caller's to drop. */
static void unlink_chan(struct wsd_chan *ch)
{
	for (struct wsd_chan **pp = &wsd_chans; *pp; pp = &(*pp)->next)
		if (*pp == ch) {
			*pp = ch->next;
			break;
		}
}

/* The channel broke (or we ended it): requests answered, slots the peer held freed. */
static void chan_died(struct wsd_chan *ch)
{
	atomic_store(&ch->dead, true);
	wsd_upgrade_chan_dead(ch);
	wsd_chan_box_drop(ch);
	pthread_mutex_lock(&ch->mu);
	for (uint32_t i = 0; i < ch->nsegs; i++)
		for (uint32_t k = 0; k < ch->segs[i].fresh; k++)
			chan_slot_drop(ch, i, k, SL_PEER);
	pthread_mutex_unlock(&ch->mu);
	wsd_debug("switch: channel %u ended", ch->id);
}

/*
 * The reader saw the channel's end (or ended it): out of the table, its
 * requests answered; the other receives complete, aborted, and let their
 * references go.
 */
static void rx_end(struct wsd_chan *ch)
{
	int err;

	if (atomic_exchange(&ch->rx_ended, true))
		return;
	pthread_mutex_lock(&wsd_chan_tab_lock);
	unlink_chan(ch);
	pthread_mutex_unlock(&wsd_chan_tab_lock);
	chan_died(ch);
	if (ch->ws != INVALID_SOCKET)
		wsd_spi()->lpWSPShutdown(ch->ws, SD_BOTH, &err);
}

/* The peer's word on our credit: the messages of ours it took. */
static bool credit_back(struct wsd_chan *ch, uint32_t taken)
{
	bool failed = false, ok = true;

	pthread_mutex_lock(&ch->send_mu);
	if ((int32_t)(taken - ch->peer_taken) > 0) {
		ok = (int32_t)(taken - ch->sent) <= 0;   /* no more than we sent */
		if (ok)
			ch->peer_taken = taken;
	}
	if (ok)
		out_drain(ch, &failed);   /* the line may go now; a CREDIT if we owe one */
	pthread_mutex_unlock(&ch->send_mu);
	if (failed)
		wsd_chan_end(ch);
	return ok;
}

/* m: the reader's copy, its receive already posted again */
static void on_message(struct wsd_chan *ch, const struct wsd_chmsg *m, uint32_t bytes)
{
	const char *why = NULL;   /* the check names a broken rule; a bad credit is not one */

	if (bytes != sizeof(*m) || wsd_wire_chmsg_check(m, &why) || !credit_back(ch, m->taken)) {
		wsd_debug("switch: channel %u: %s", ch->id,
			  bytes != sizeof(*m) ? "message length" :
			  why ? why : "credit for messages never sent");
		atomic_store(&ch->dead, true);   /* a peer that breaks the protocol: no more */
		return;
	}
	switch (m->h.kind) {
	case MSG_OPEN:
		wsd_upgrade_on_open(ch, m);
		break;
	case MSG_OPENED:
	case MSG_DECLINE:
		wsd_upgrade_on_answer(ch, m->req, m);
		break;
	case MSG_SHUT:
		chan_on_shut(ch, m->h.seg, m->h.slot_off);
		break;
	case MSG_MAPPED:
		chan_on_mapped(ch, m->h.seg);
		break;
	case MSG_CREDIT:
		break;   /* its word on our credit was all */
	}
}

/* ---- the sweep: idle rings give their pages back, idle channels end --------------- */

static void sweep(int64_t now)
{
	struct wsd_chan *ch, *end = NULL;

	pthread_mutex_lock(&wsd_chan_tab_lock);
	for (ch = wsd_chans; ch; ch = ch->next) {
		pthread_mutex_lock(&ch->mu);
		chan_slots_rest(ch);
		for (size_t i = 0; i < ch->nsess; i++)
			wsd_session_sweep(ch->sess[i], now);
		if (!end && ch->connector && !atomic_load(&ch->dead) && ch->slots_used == 0 &&
		    ch->idle_since && now - ch->idle_since > IDLE_MS) {
			atomic_store(&ch->dead, true);   /* found no more */
			end = ch;
			wsd_chan_hold(end);
		}
		pthread_mutex_unlock(&ch->mu);
	}
	pthread_mutex_unlock(&wsd_chan_tab_lock);
	if (end) {
		int err;

		/* the receive completes aborted, and the thread lets the channel go */
		wsd_spi()->lpWSPShutdown(end->ws, SD_BOTH, &err);
		wsd_chan_put(end);
	}
}

/* ov is one of ch's receives (else a send's). */
static bool is_in(const struct wsd_chan *ch, const WSAOVERLAPPED *ov)
{
	for (int i = 0; i < NRECV; i++)
		if (ov == &ch->ins[i].ov)
			return true;
	return false;
}

static void *chan_main(void *arg)
{
	int64_t last = wsd_now_ms();

	(void)arg;
	for (;;) {
		uint32_t bytes = 0;
		uintptr_t key = 0;
		WSAOVERLAPPED *ov = NULL;
		int r;

		wsd_threads_rest();   /* waiting (wsd_threads_hold) */
		r = wsd_port_wait(port, &bytes, &key, &ov, SWEEP_MS);
		wsd_threads_work();
		if (r < 0 && r != -EINTR)
			break;
		if (r == 1 && key && !is_in((struct wsd_chan *)key, ov)) {
			struct wsd_chan *ch = (struct wsd_chan *)key;

			out_done(ch, ov);
			wsd_chan_put(ch);   /* the send's */
		} else if (r == 1 && key) {
			struct wsd_chan *ch = (struct wsd_chan *)key;
			struct in *in = (struct in *)(void *)((char *)ov - offsetof(struct in, ov));

			if (ov->Internal == 0 && bytes > 0 && !atomic_load(&ch->dead) &&
			    !atomic_load(&ch->rx_ended)) {
				struct wsd_chmsg m = in->m;

				/* its receive back first: that is the peer's credit */
				if (post_in(ch, in) == 0) {
					atomic_fetch_add(&ch->rx_taken, 1);
					on_message(ch, &m, bytes);
				} else {
					atomic_store(&ch->dead, true);
				}
				if (!atomic_load(&ch->dead)) {
					wsd_chan_put(ch);   /* the completed receive's */
					continue;
				}
			}
			rx_end(ch);
			wsd_chan_put(ch);   /* the receive's */
		}
		if (wsd_now_ms() - last >= SWEEP_MS) {
			last = wsd_now_ms();
			sweep(last);
			wsd_upgrade_box_sweep();
			wsd_chan_box_refill();
		}
	}
	return NULL;   /* counted_start stops counting us */
}

/* ---- fork, ending --------------------------------------------------------------- */

void wsd_chan_atfork_child(void)
{
	pthread_mutex_init(&wsd_chan_tab_lock, NULL);
	wsd_chans = NULL;       /* the parent's: the child's sessions on them are detached */
	port = NULL;        /* its ring is the parent's too */
	thread_up = false;
}

void wsd_chan_end(struct wsd_chan *ch)
{
	int err;

	if (ch->owner != wsd_pid() || atomic_exchange(&ch->dead, true))
		return;
	if (ch->ws != INVALID_SOCKET)
		wsd_spi()->lpWSPShutdown(ch->ws, SD_BOTH, &err);
}

/* SPDX-License-Identifier: MIT */
/*
 * The connecting side's requests on a channel (wsd-protocol(7),
 * "Connections on a channel", "The mailbox", "First bytes"): an OPEN sent
 * as a message and answered on the channel's reader, or posted in a grant
 * of the peer's mailbox with the connection's first bytes already in the
 * granted ring, and settled from the entry (committed, or those bytes
 * sent by the stream).  Where there is no mailbox (verbs), the first bytes
 * sent after an OPEN message are held here until its answer, a while, and
 * then go into the ring the answer names, or by the stream.  pend_lock
 * guards the OPENs in flight.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "provider/fault.h"
#include "provider/internal.h"
#include "switch/chan.h"
#include "switch/session.h"
#include "switch/upgrade_int.h"

/*
 * An OPEN we sent, until its answer: the socket and the session it is for.
 * One posted in the peer's mailbox (boxed) is answered there: the thread
 * that claimed it looks, while the others leave it alone.
 */
struct open_req {
	struct open_req *next;
	uint64_t req;
	struct wsd_chan *ch;
	struct wsd_sock *s;          /* held */
	struct wsd_session *ss;
	bool boxed, claimed;         /* pend_lock */
	/*
	 * A message OPEN whose socket holds its first bytes (s->prov_hold):
	 * its answer is kept here (kind 0: the channel ended) for the thread
	 * that claims it to settle (pend_lock).
	 */
	bool hold, answered;
	struct wsd_chmsg ans;
	int box;
	int64_t posted_ns;
};

static struct open_req *opens;        /* pend_lock */
static uint64_t next_req = 1;

/* pend_lock held: o out of the list; false when it was not there (already taken). */
static bool open_unlink(struct open_req *o)
{
	for (struct open_req **pp = &opens; *pp; pp = &(*pp)->next)
		if (*pp == o) {
			*pp = o->next;
			return true;
		}
	return false;
}

static void open_fail(struct wsd_sock *s, struct wsd_session *ss, enum wsd_reason why)
{
	wsd_session_free(ss);
	connect_fail(s, why);
	wsd_sock_put(s);
}

/* The connection's upgrade is one message on the channel, answered later. */
void open_send(struct wsd_sock *s, struct wsd_chan *ch, const struct wsd_tuple *t)
{
	struct wsd_chmsg m = { .t = *t, .fd = -1 };
	struct open_req *o = calloc(1, sizeof(*o));
	struct wsd_session *ss = o ? wsd_session_new(ch) : NULL;

	if (!ss) {
		/* a full channel (verbs: its registered slots) leaves it on TCP, as a limit would */
		enum wsd_reason why = o && errno == ENOSPC ? R_RESOURCES : R_PROVIDER;

		free(o);
		return connect_fail(s, why);
	}
	wsd_session_hello(ss, &m.h, MSG_OPEN);
	wsd_sock_hold(s);
	o->ch = ch;
	o->s = s;
	o->ss = ss;
	s->hold_looked = false;   /* its next send may hold (open_hold_begin) */
	pthread_mutex_lock(&pend_lock);
	o->req = m.req = next_req++;
	o->posted_ns = wsd_now_ns();
	o->next = opens;
	opens = o;
	pthread_mutex_unlock(&pend_lock);
	if (wsd_chan_send(ch, &m) == 0)
		return;
	/* not sent: unless the channel's death took it first, it is ours to end */
	pthread_mutex_lock(&pend_lock);
	if (o->hold) {
		/* another thread of the program holds bytes for it already: settled as ended */
		o->answered = true;
		memset(&o->ans, 0, sizeof(o->ans));
		pthread_mutex_unlock(&pend_lock);
		return;
	}
	if (!open_unlink(o)) {
		pthread_mutex_unlock(&pend_lock);
		return;
	}
	pthread_mutex_unlock(&pend_lock);
	open_fail(s, ss, R_PROVIDER);
	free(o);
}

/*
 * On shm, with a grant in the peer's mailbox: the OPEN is posted there,
 * and the connection's first sends go at once into the granted slot's
 * ring, unproven (the session is the socket's prov, not yet its sess): the
 * peer reads none of it before our proof, which we write only once it
 * answered OPENED and is ready (settle).  A DECLINE, or an OPEN taken back
 * unread, sends those bytes by the stream instead.  false: no grant.
 */
bool open_post(struct wsd_sock *s, struct wsd_chan *ch, const struct wsd_tuple *t)
{
	struct wsd_chmsg m = { .t = *t, .fd = s->fd };   /* the peer may look at it (HELD) */
	struct wsd_hello g;
	struct open_req *o;
	struct wsd_session *ss;
	int idx;

	long arg;

	/* the test build holds first bytes on shm too (open_hold_begin): no grant then */
	if (wsd_fault("hold-shm", &arg))
		return false;
	idx = wsd_chan_box_claim(ch, &g);

	if (idx < 0)
		return false;
	o = calloc(1, sizeof(*o));
	ss = o ? wsd_session_new(ch) : NULL;
	if (!ss) {
		free(o);
		wsd_chan_box_release(ch, idx, false);
		return false;
	}
	wsd_session_peer(ss, &g);
	if (!wsd_session_mapped(ss)) {
		wsd_session_forget_peer(ss);
		wsd_session_free(ss);
		free(o);
		wsd_chan_box_release(ch, idx, false);
		return false;
	}
	wsd_session_hello(ss, &m.h, MSG_OPEN);
	wsd_sock_hold(s);
	o->ch = ch;
	o->s = s;
	o->ss = ss;
	o->boxed = true;
	o->box = idx;
	pthread_mutex_lock(&s->tx_lock);
	s->prov = ss;
	pthread_mutex_unlock(&s->tx_lock);
	atomic_fetch_add(&wsd_prov_open, 1);
	pthread_mutex_lock(&pend_lock);
	o->req = m.req = next_req++;
	o->posted_ns = wsd_now_ns();
	o->next = opens;
	opens = o;
	pthread_mutex_unlock(&pend_lock);
	wsd_chan_box_post(ch, idx, &m);
	return true;
}

/* The answer to o (unlinked), m NULL when the channel died first. */
static void open_answered(struct wsd_chan *ch, struct open_req *o, const struct wsd_chmsg *m)
{
	if (m && m->h.kind == MSG_OPENED) {
		wsd_session_peer(o->ss, &m->h);
		wsd_session_known(o->ss);
		wsd_session_attach_new(o->s, o->ss);
		wsd_debug("switch: fd %d upgraded on channel %u", o->s->fd, wsd_chan_id(ch));
		wsd_sock_put(o->s);
	} else {
		open_fail(o->s, o->ss,
			  m && m->h.reason < R_NREASONS ?
				  connect_follow(o->s, (enum wsd_reason)m->h.reason, m->h.seg) : R_PEER_PLAIN);
	}
	free(o);
}

static bool hold_look(struct open_req *o, bool give_up, bool to_tcp);
static void box_unclaim(struct open_req *o);

void wsd_upgrade_on_answer(struct wsd_chan *ch, uint64_t req, const struct wsd_chmsg *m)
{
	struct open_req *o = NULL;
	bool held = false, mine = false;

	pthread_mutex_lock(&pend_lock);
	for (struct open_req **pp = &opens; *pp; pp = &(*pp)->next)
		if ((*pp)->ch == ch && (*pp)->req == req && !(*pp)->boxed && !(*pp)->answered) {
			o = *pp;
			if (o->hold) {
				/* its socket holds bytes for it: kept for the settling thread */
				o->answered = held = true;
				o->ans = *m;
				mine = !o->claimed;
				o->claimed = true;
			} else {
				*pp = o->next;
			}
			break;
		}
	pthread_mutex_unlock(&pend_lock);
	if (!o) {
		wsd_debug("switch: channel %u: an answer to no request", wsd_chan_id(ch));
		return;
	}
	if (!held)
		open_answered(ch, o, m);
	else if (mine && !hold_look(o, false, false))
		box_unclaim(o);   /* OPENED, the peer not ready yet: the settling thread's */
}

/* ---- first bytes held for an OPEN message's answer (no mailbox: verbs) --------------- */

/* How long sends are held for an OPEN's answer, from its sending; then by the stream. */
#define HOLD_WAIT_NS (wsd_switch_params()->hold_ns)

void open_hold_begin(struct wsd_sock *s)
{
	struct open_req *o;
	long arg;

	pthread_mutex_lock(&s->tx_lock);
	s->hold_looked = true;
	pthread_mutex_lock(&pend_lock);
	for (o = opens; o; o = o->next)
		if (o->s == s && !o->boxed)
			break;
	/*
	 * Where a mailbox would take them (shm) they go by the stream as
	 * before; the test build may hold them there too.
	 */
	if (o && !o->hold && !o->answered && !s->prov && !s->tx_shut && !s->detached &&
	    s->tx_mode == DIR_TCP && wsd_now_ns() - o->posted_ns < HOLD_WAIT_NS &&
	    (wsd_chan_path(o->ch) == PATH_VERBS || wsd_fault("hold-shm", &arg))) {
		o->hold = true;
		s->prov = o->ss;
		s->prov_hold = true;
		s->prov_len = 0;
		atomic_fetch_add(&wsd_prov_open, 1);
	}
	pthread_mutex_unlock(&pend_lock);
	pthread_mutex_unlock(&s->tx_lock);
}

/*
 * The held bytes' end: into the ring of the session o's answer made
 * (commit: the peer answered OPENED and is ready), else by the stream.  o
 * (OPENED, unlinked) attaches its session first; NULL: none.
 */
static void hold_end(struct wsd_sock *s, struct open_req *o, bool commit)
{
	pthread_mutex_lock(&s->tx_lock);
	if (o) {
		wsd_session_peer(o->ss, &o->ans.h);
		wsd_session_known(o->ss);
		wsd_session_attach(s, o->ss);
	}
	if (commit)
		tx_hold_commit(s);
	else
		tx_prov_undo(s);
	s->prov = NULL;
	s->prov_hold = false;
	free(s->prov_buf);
	s->prov_buf = NULL;
	s->prov_len = 0;
	pthread_mutex_unlock(&s->tx_lock);
	atomic_fetch_sub(&wsd_prov_open, 1);
}

/*
 * A look at a held OPEN's answer, by the thread that claimed it: true when
 * it is settled (o freed, or a message OPEN like any from now on), false
 * when left as it was.  give_up: no answer yet, or an OPENED whose peer is
 * not ready, sends the bytes by the stream; to_tcp the same, whatever the
 * answer.  Outcomes:
 *
 *   OPENED, the peer ready      the bytes into its ring after our SWITCH,
 *                               then our proof (tx_hold_commit);
 *   OPENED, given up            the bytes by the stream, the session ours:
 *                               it switches at a later send, as any;
 *   DECLINE, the channel ended  the bytes by the stream, the connection
 *                               plain (or asked again, as the reason says);
 *   no answer, given up         the bytes by the stream; the OPEN stands,
 *                               its answer taken as any message OPEN's.
 */
static bool hold_look(struct open_req *o, bool give_up, bool to_tcp)
{
	struct wsd_sock *s = o->s;
	enum wsd_reason why = R_PEER_PLAIN;
	struct wsd_chmsg a;
	bool answered, commit;

	pthread_mutex_lock(&pend_lock);
	answered = o->answered;
	a = o->ans;
	if (!answered && (give_up || to_tcp)) {
		o->hold = false;
		o->claimed = false;
		wsd_sock_hold(s);   /* o, and its hold on s, may go with the answer from here */
	}
	pthread_mutex_unlock(&pend_lock);
	if (!answered) {
		if (!give_up && !to_tcp)
			return false;
		hold_end(s, NULL, false);
		wsd_debug("switch: fd %d: no answer yet: its first bytes by the stream", s->fd);
		wsd_sock_put(s);
		return true;
	}
	if (a.h.kind == MSG_OPENED) {
		commit = !to_tcp && wsd_session_rx_ready(o->ss);
		if (!commit && !give_up && !to_tcp)
			return false;
	} else if (a.h.kind == MSG_DECLINE && a.h.reason && a.h.reason < R_NREASONS) {
		why = connect_follow(s, (enum wsd_reason)a.h.reason, a.h.seg);
	}
	pthread_mutex_lock(&pend_lock);
	open_unlink(o);
	pthread_mutex_unlock(&pend_lock);
	if (a.h.kind == MSG_OPENED) {
		hold_end(s, o, commit);
		wsd_debug("switch: fd %d upgraded on channel %u, its first bytes by %s", s->fd,
			  wsd_chan_id(o->ch), commit ? "ring" : "the stream");
		wsd_sock_put(s);
	} else {
		hold_end(s, NULL, false);
		open_fail(s, o->ss, why);
	}
	free(o);
	return true;
}

/* The first bytes' end, once o's fate is known: commit (OPENED) or go by the stream. */
static void prov_end(struct open_req *o, bool commit)
{
	struct wsd_sock *s = o->s;

	pthread_mutex_lock(&s->tx_lock);
	s->prov = NULL;
	if (commit) {
		wsd_session_known(o->ss);
		wsd_session_attach(s, o->ss);
		tx_prov_commit(s);
	} else {
		tx_prov_undo(s);
	}
	free(s->prov_buf);
	s->prov_buf = NULL;
	s->prov_len = 0;
	pthread_mutex_unlock(&s->tx_lock);
	atomic_fetch_sub(&wsd_prov_open, 1);
}

/*
 * A look at the mailbox for o's answer, by the thread that claimed it:
 * true when o is done, false when it is left as it was.  give_up: an OPEN
 * not yet taken is taken back, an OPENED whose peer is not ready is given
 * up.  to_tcp: the connection is to stay on the stream (MSG_OOB, fork,
 * exec), whatever the answer.  Outcomes:
 *
 *   OPENED, the peer ready      committed: our proof, the session ours;
 *   OPENED, given up            the bytes by the stream; the peer, whose
 *                               session knew our slot, finds no proof and
 *                               goes on as plain TCP; each side's SHUT as
 *                               for any session;
 *   DECLINE, taken back, or     the bytes by the stream; the peer never
 *   the channel dead unanswered knew our slot: no SHUT either way.
 */
static bool box_look(struct open_req *o, bool give_up, bool to_tcp)
{
	struct wsd_chmsg a;
	struct wsd_chan *ch = o->ch;
	struct wsd_sock *s = o->s;
	enum wsd_reason why = R_PEER_PLAIN;
	const char *bad;
	bool answered = wsd_chan_box_answer(ch, o->box, &a), opened = false, commit = false;

	if (answered && (wsd_wire_chmsg_check(&a, &bad) || a.req != o->req ||
			 (a.h.kind != MSG_OPENED && a.h.kind != MSG_DECLINE))) {
		wsd_debug("switch: channel %u: a posted answer: %s", wsd_chan_id(ch),
			  a.req != o->req ? "another request's" : "not an answer");
		wsd_chan_end(ch);   /* a peer that breaks the protocol: no more */
		a.h.kind = MSG_DECLINE;
		a.h.reason = R_PROTOCOL;
	}
	if (answered && a.h.kind == MSG_OPENED && (a.flags & WSD_OPENED_HELD)) {
		/*
		 * The peer saw our socket and reads our first bytes from its
		 * answer on, without a proof: committed whatever comes (a
		 * connection to stay on the stream goes back to it the usual way).
		 */
		opened = commit = true;
		o->ss->proof_waived = true;
	} else if (answered && a.h.kind == MSG_OPENED) {
		opened = true;
		/* its rx_ready comes as it answers, unless a read of its holds the stream */
		commit = !to_tcp && wsd_session_rx_ready(o->ss);
		if (!commit && !give_up && !to_tcp)
			return false;
		why = to_tcp ? R_UNSUPPORTED : R_BUSY;
	} else if (answered) {
		why = a.h.reason && a.h.reason < R_NREASONS ?
			      connect_follow(s, (enum wsd_reason)a.h.reason, a.h.seg) : R_PEER_PLAIN;
	} else if (!wsd_chan_dead(ch)) {
		if (!(give_up || to_tcp) || !wsd_chan_box_withdraw(ch, o->box))
			return false;
		why = R_NONE;   /* taken back unread: asked again later, by a message */
	}
	pthread_mutex_lock(&pend_lock);
	open_unlink(o);
	pthread_mutex_unlock(&pend_lock);
	prov_end(o, commit);
	if (answered)
		wsd_chan_box_release(ch, o->box, opened && !commit);
	if (commit) {
		wsd_debug("switch: fd %d upgraded on channel %u from its first byte", s->fd,
			  wsd_chan_id(ch));
		wsd_sock_put(s);
	} else {
		if (opened)
			wsd_session_known(o->ss);   /* the peer's session may write our slot */
		else
			wsd_session_forget_peer(o->ss);   /* the grant was never ours */
		if (why == R_NONE) {
			wsd_session_free(o->ss);
			s->box_missed = true;   /* by message: the peer will not look again */
			atomic_store(&s->upgrade_state, UP_NONE);   /* the next data call asks */
			wsd_sock_put(s);
		} else {
			open_fail(s, o->ss, why);
		}
	}
	free(o);
	return true;
}

/* s's posted OPEN, claimed for this thread, or NULL (any s: one posted before older_than). */
static struct open_req *box_claim(const struct wsd_sock *s, int64_t older_than)
{
	struct open_req *o;

	pthread_mutex_lock(&pend_lock);
	for (o = opens; o; o = o->next)
		if ((o->boxed || o->hold) && !o->claimed &&
		    (s ? o->s == s : o->posted_ns < older_than)) {
			o->claimed = true;
			break;
		}
	pthread_mutex_unlock(&pend_lock);
	return o;
}

static void box_unclaim(struct open_req *o)
{
	pthread_mutex_lock(&pend_lock);
	o->claimed = false;
	pthread_mutex_unlock(&pend_lock);
}

/* How long a posted OPEN may wait for the peer's answer before it is taken back. */
#define BOX_WAIT_NS 200000
/* ...and one the peer took, for its answer (it answers in the same call). */
#define BOX_TAKEN_NS 2000000

_Atomic int wsd_prov_open;

/* A look at o's answer, posted or held (box_look, hold_look). */
static bool req_look(struct open_req *o, bool give_up, bool to_tcp)
{
	return o->hold ? hold_look(o, give_up, to_tcp) : box_look(o, give_up, to_tcp);
}

void open_box_wait(struct wsd_sock *s, bool spin, bool to_tcp)
{
	struct open_req *o;
	int64_t end, hard;

	if (!s->prov || !(o = box_claim(s, 0)))
		return;
	end = o->posted_ns + (o->hold ? HOLD_WAIT_NS : BOX_WAIT_NS);
	hard = o->hold ? end : o->posted_ns + BOX_TAKEN_NS;
	for (;;) {
		int64_t now = wsd_now_ns();

		if (req_look(o, spin ? now >= end : now >= hard, to_tcp))
			return;
		if (!spin || now >= hard + BOX_WAIT_NS)
			break;
		sched_yield();   /* the peer may share our CPU: it must run to answer */
	}
	box_unclaim(o);
}

void wsd_upgrade_settle(struct wsd_sock *s, bool to_tcp)
{
	/* claimed by another thread meanwhile: it settles it; wait for that */
	while (s->prov) {
		open_box_wait(s, true, to_tcp);
		if (s->prov)
			sched_yield();
	}
}

void wsd_upgrade_settle_all(bool to_tcp)
{
	struct open_req *o;

	while (atomic_load(&wsd_prov_open) && (o = box_claim(NULL, INT64_MAX))) {
		struct wsd_sock *s = o->s;

		wsd_sock_hold(s);
		box_unclaim(o);
		wsd_upgrade_settle(s, to_tcp);
		wsd_sock_put(s);
	}
}

void wsd_upgrade_box_sweep(void)
{
	int64_t old = wsd_now_ns() - BOX_WAIT_NS;
	struct open_req *o;

	/* each claimed once a sweep: one left as it was is not claimed again */
	for (int n = 0; n < 64 && (o = box_claim(NULL, old)); n++)
		if (!req_look(o, !o->hold || wsd_now_ns() - o->posted_ns >= HOLD_WAIT_NS, false)) {
			pthread_mutex_lock(&pend_lock);
			o->posted_ns = wsd_now_ns();
			o->claimed = false;
			pthread_mutex_unlock(&pend_lock);
		}
}

void wsd_upgrade_chan_dead(struct wsd_chan *ch)
{
	struct open_req *mine = NULL;

	pthread_mutex_lock(&pend_lock);
	for (struct open_req **pp = &opens; *pp;) {
		struct open_req *o = *pp;

		/*
		 * a posted one is settled from its mailbox entry (box_look), which
		 * outlives the channel; a held one as answered by the end (below)
		 */
		if (o->ch == ch && o->hold) {
			o->answered = true;
			memset(&o->ans, 0, sizeof(o->ans));
			pp = &o->next;
		} else if (o->ch == ch && !o->boxed) {
			*pp = o->next;
			o->next = mine;
			mine = o;
		} else {
			pp = &o->next;
		}
	}
	pthread_mutex_unlock(&pend_lock);
	/* the held ones' bytes by the stream now: a thread asleep may wait for them */
	for (;;) {
		struct open_req *o;

		pthread_mutex_lock(&pend_lock);
		for (o = opens; o; o = o->next)
			if (o->ch == ch && o->hold && !o->claimed)
				break;
		if (o)
			o->claimed = true;
		pthread_mutex_unlock(&pend_lock);
		if (!o)
			break;
		(void)hold_look(o, true, false);   /* answered (ended): always settled */
	}
	accept_chan_dead(ch);
	while (mine) {
		struct open_req *o = mine;

		mine = o->next;
		open_fail(o->s, o->ss, R_PEER_PLAIN);
		free(o);
	}
}

/* fork, in the child: no requests of ours in flight. */
void open_atfork_child(void)
{
	opens = NULL;
}

/* SPDX-License-Identifier: MIT */
/*
 * The session object: one connection's slot on its channel (chan.h), on
 * each side: our receive slot and the peer's, mapped here when the
 * transport can (shm), else written by RDMA from registered staging; the
 * handshake's part (our slot described, the peer's taken); the sender's
 * window over a mapped ring, which grows while it streams and gives its
 * pages back when idle; and attaching it to a socket, from which the peer
 * may switch (rx_ready).  Locks: attach takes mu (publish_rx_ready needs
 * it); the window is the sender's (tx_lock); the rest runs before the
 * session is shared.  It does not move data, nor switch a direction
 * (proof.c).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <netinet/tcp.h>
#include <time.h>

#include "switch/chan.h"
#include "switch/sess_int.h"
#include "switch/upgrade_int.h"

/* ---- the session object ---------------------------------------------------- */

/*
 * Pages of the peer's ring (wsd-protocol(7), "Pages on demand"): nothing
 * is populated ahead, so a connection that carries little touches only the
 * page holding the control words and the ring's first bytes.  A sender
 * whose records went past that page gives the ring's other pages back once
 * it has been idle IDLE_MS with the ring empty.
 */
#define IDLE_MS 1000
/* The sender's window as it starts, and after its pages went back (WIN_MIN). */
static uint32_t win_start(const struct wsd_session *ss)
{
	return ss->peer_ring < WIN_MIN ? ss->peer_ring : WIN_MIN;
}

struct wsd_session *wsd_session_new(struct wsd_chan *ch)
{
	struct wsd_session *ss = calloc(1, sizeof(*ss));
	uint8_t rnd[sizeof(ss->rx_key) + sizeof(ss->nonce)];

	if (!ss)
		return NULL;
	ss->ws = wsd_chan_socket(ch);
	ss->path = wsd_chan_path(ch);
	ss->k_base = -1;
	ss->k_tx_base = -1;
	/* staging for a mapped peer: a record's header and the words (see wsd_session_peer) */
	ss->stage = (uint8_t *)ss->small;
	ss->words = ss->small + 8;
	/* the key and the challenge in one draw */
	if ((errno = -wsd_random(rnd, sizeof(rnd))) ||
	    (errno = -wsd_chan_slot_get(ch, &ss->slot))) {
		int err = errno;   /* ENOSPC: the channel is full */

		free(ss);   /* a guessable challenge proves nothing */
		errno = err;
		return NULL;
	}
	wsd_chan_hold(ch);
	ss->ch = ch;
	ss->ring_size = ss->slot.ring;   /* WSD_SWITCH_RING, or an added verbs segment's */
	ss->region_len = CTL_SIZE + ss->ring_size;
	ss->region = ss->slot.base;
	memcpy(ss->rx_desc, ss->slot.desc, sizeof(ss->rx_desc));
	ss->ctl = (struct wsd_ctl *)ss->region;
	ss->ring = ss->region + CTL_SIZE;
	memcpy(&ss->rx_key, rnd, sizeof(ss->rx_key));
	ss->rx_key |= 1;   /* a zeroed header never matches position 0 */
	memcpy(ss->nonce, rnd + sizeof(ss->rx_key), sizeof(ss->nonce));
	ss->rxr = (struct wire_ring){ ss->ring, ss->ring_size, ss->rx_key };
	wsd_chan_session_add(ch, ss);
	return ss;
}

/*
 * Unmapped peer (verbs, or shm that could not map): records and words go by
 * RDMA writes from registered staging.  0 or -ENOMEM.
 */
static int stage_registered(struct wsd_session *ss)
{
	WSPPROC_TABLE *t = wsd_spi();
	int err;

	ss->stage_len = 65536 + REC_HDR + REC_TRAILER;
	ss->stage = mmap(NULL, ss->stage_len + 4096, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (ss->stage == MAP_FAILED) {
		ss->stage = NULL;
		return -ENOMEM;
	}
	ss->words = (uint64_t *)(ss->stage + ss->stage_len);
	ss->stage_handle = t->lpWSPRegisterMemory(ss->ws, ss->stage, ss->stage_len, MEM_READ,
						  &err);
	/* word pairs at [0, 8), our offer's block at [8, 16) */
	ss->words_handle = ss->stage_handle ?
			   t->lpWSPRegisterMemory(ss->ws, ss->words, 128, MEM_READ, &err) : 0;
	return ss->words_handle ? 0 : -ENOMEM;
}

/* The session stops: its channel ends (exec, or a peer that failed its proof). */
void wsd_session_abandon(struct wsd_session *ss)
{
	if (ss->ch)
		wsd_chan_end(ss->ch);
	ss->ws = INVALID_SOCKET;
}

void wsd_session_free(struct wsd_session *ss)
{
	if (!ss)
		return;
	if (ss->ch) {
		wsd_chan_session_del(ss->ch, ss);
		wsd_chan_slot_done(ss->ch, &ss->slot, ss->slot_known, ss->peer_known,
				   ss->peer_seg, ss->peer_off);
		wsd_chan_put(ss->ch);
	}
	if (ss->stage && ss->stage != (uint8_t *)ss->small)
		munmap(ss->stage, ss->stage_len + 4096);
	free(ss);
}

void wsd_session_hello(const struct wsd_session *ss, struct wsd_hello *h, uint16_t kind)
{
	h->magic = WSD_PROTO_MAGIC;
	h->version = WSD_PROTO_VERSION;
	h->kind = kind;
	h->ring_size = ss->ring_size;
	h->key = ss->rx_key;
	wsd_chan_slot_describe(ss->ch, &ss->slot, h);
	memcpy(h->nonce, ss->nonce, sizeof(h->nonce));
}

void wsd_session_peer(struct wsd_session *ss, const struct wsd_hello *h)
{
	memcpy(ss->peer_desc, h->desc, sizeof(ss->peer_desc));
	memcpy(ss->peer_nonce, h->nonce, sizeof(ss->peer_nonce));
	ss->peer_ring = h->ring_size;
	ss->tx_win = win_start(ss);
	winsize_init(&ss->win, ss->peer_ring);
	ss->tx_key = h->key;
	ss->peer_seg = h->seg;
	ss->peer_off = h->slot_off;
	ss->peer_known = true;
	ss->peer_map = wsd_chan_peer_slot(ss->ch, h);
	/* no staging: the words below fail, and so does the session's first record */
	if (!ss->peer_map)
		(void)stage_registered(ss);
	/* whether the peer's sends to us are stores or RDMA (zc_threshold) */
	put_word(ss, W_MU, CW_MAPPED, ss->peer_map ? 1 : 2);
}

bool wsd_session_mapped(const struct wsd_session *ss)
{
	return ss->peer_map != NULL;
}

void wsd_session_forget_peer(struct wsd_session *ss)
{
	ss->peer_known = false;
}

bool wsd_session_rx_ready(struct wsd_session *ss)
{
	return ctl_get(ss, CW_RX_READY) != 0;
}

/* The peer learnt our slot (its answer came, or ours went): it may write there. */
void wsd_session_known(struct wsd_session *ss)
{
	ss->slot_known = true;
}

/* tx_lock held: a record was stored at ring offset off (size bytes). */
void wsd_session_touched(struct wsd_session *ss, uint64_t off, uint32_t size)
{
	uint64_t end = CTL_SIZE + off + size;

	if (end <= WSD_SEG_PAGE)
		return;
	if ((CTL_SIZE + off) / WSD_SEG_PAGE != (end - 1) / WSD_SEG_PAGE || !ss->tx_page_ms)
		ss->tx_page_ms = wsd_now_ms();
}

/*
 * tx_lock held: an idle ring gives its pages back (it is empty: the
 * receiver reads nothing there), keeping the first page and the one the
 * next record goes to.
 */
static void shrink(struct wsd_session *ss, int64_t now)
{
	uint64_t at = ss->tx_pos % ss->peer_ring + CTL_SIZE;
	size_t lo = WSD_SEG_PAGE, hi = (CTL_SIZE + ss->peer_ring + WSD_SEG_PAGE - 1) &
				       ~(size_t)(WSD_SEG_PAGE - 1);
	size_t keep = at & ~(size_t)(WSD_SEG_PAGE - 1);

	if (!ss->peer_map || !ss->tx_page_ms || now - ss->tx_page_ms < IDLE_MS ||
	    ctl_get(ss, CW_CONSUMED) != ss->tx_pos)
		return;
	if (keep >= lo && keep < hi) {
		if (keep > lo)
			madvise(ss->peer_map + lo, keep - lo, MADV_REMOVE);
		lo = keep + WSD_SEG_PAGE;
	}
	if (hi > lo)
		madvise(ss->peer_map + lo, hi - lo, MADV_REMOVE);
	ss->tx_page_ms = 0;
	/* the next stream grows its window again, and learns its size afresh */
	ss->tx_win = win_start(ss);
	winsize_init(&ss->win, ss->peer_ring);
}

/* The channel's sweep (its mu held): an idle ring gives its pages back. */
void wsd_session_sweep(struct wsd_session *ss, int64_t now)
{
	struct wsd_sock *s = ss->sock;

	if (s)
		bell_retry(s, ss);   /* a ring the kernel refused: its bell, late */
	if (!s || !ss->peer_map || !ss->tx_page_ms || now - ss->tx_page_ms < IDLE_MS ||
	    pthread_mutex_trylock(&s->tx_lock))
		return;
	if (s->sess == ss && s->tx_mode == DIR_RING && !s->detached)
		shrink(ss, now);
	pthread_mutex_unlock(&s->tx_lock);
}

static void set_stat_path(struct wsd_sock *s)
{
	wsd_stat_begin(s->stat);
	s->stat->path = (uint8_t)(s->sess->path);
	s->stat->reason = R_NONE;
	s->stat->way = s->sess->path == PATH_VERBS ? WAY_RDMA :
		       wsd_chan_copy(s->sess->ch) ? WAY_COPY :
		       s->sess->peer_map ? WAY_MAP : WAY_VM;
	wsd_stat_end(s->stat);
	atomic_store_explicit(&s->stat->channel, wsd_chan_id(s->sess->ch), memory_order_relaxed);
	atomic_store_explicit(&s->stat->peer_pid, wsd_chan_peer_pid(s->sess->ch),
			      memory_order_relaxed);
	{
		uint64_t ino[2];

		wsd_chan_mem_inodes(s->sess->ch, ino);
		atomic_store_explicit(&s->stat->mem_ino[0], ino[0], memory_order_relaxed);
		atomic_store_explicit(&s->stat->mem_ino[1], ino[1], memory_order_relaxed);
	}
}

_Atomic uint64_t wsd_accel_gen;

/*
 * A connection we accepted, which our program has neither sent nor
 * received on (a peek does not count), moves only once it has: the
 * server may yet fork a handler for it, and while nothing went by ring
 * the fork takes it back to the stream alone (proc.c).  Once the peer
 * sends by ring, only the peer can end that, and a peer asleep in a
 * receive on the stream hears nothing we could send it.  A grant's
 * first bytes are in the ring already: those move at once.
 */
static bool ready_deferred(const struct wsd_sock *s)
{
	return wsd_sock_unserved(s) && !s->sess->granted;
}

/* mu held.  From now on the peer may switch its direction to the ring. */
void publish_rx_ready(struct wsd_sock *s)
{
	bool was = s->accel;
	long ms;

	if (s->rx_ready_sent || !s->sess || s->plain_waiters || s->detached || s->rx_back ||
	    s->closing || ready_deferred(s))
		return;
	/*
	 * Before the peer can act on it, and in this order: the socket
	 * accelerated, then the count moved (a release).  A wait that read
	 * the count after it moved finds the socket accelerated and does not
	 * go to the kernel alone; one that read it before and is woken by the
	 * peer's switch point and proof finds it moved, and the socket
	 * accelerated, however late this thread gets to the end (poll.c,
	 * woke_by_switch).  Accelerated only after RX_READY, a wait that
	 * began in between, or woke before the flag, took the peer's proof
	 * on the stream for data.  So for epoll: its sets re-register the
	 * socket at their next look, before they read what the stream woke
	 * them with (epoll_wait.c, harvest).
	 */
	s->accel = true;
	if (!was)
		wsd_poll_sock_accelerated_locked(s);
	atomic_fetch_add(&wsd_accel_gen, 1);
	/*
	 * Armed first: a poll or epoll already asleep on the fd started while
	 * the socket was plain, and must hear of the peer's first ring data.
	 */
	put_word(s->sess, W_MU, CW_DATA_ARM,
		 __atomic_add_fetch(&s->sess->data_gen, 1, __ATOMIC_RELAXED) << 1);
	if (put_word(s->sess, W_MU, CW_RX_READY, 1)) {
		s->accel = was;
		return;
	}
	/* the test build's late end (tests/sock/waitup_late_check.sh): no wait may need it */
	if (!s->connected_side && wsd_fault("rx-ready-late", &ms))
		usleep((useconds_t)ms * 1000);
	s->rx_ready_sent = true;
}

/* Our program's first data call on s (served): the peer may be told now (ready_deferred). */
void first_data_call(struct wsd_sock *s)
{
	bool was;

	s->data_called = true;
	if (!s->sess || s->rx_ready_sent)
		return;
	pthread_mutex_lock(&s->mu);
	was = s->accel;
	publish_rx_ready(s);
	pthread_mutex_unlock(&s->mu);
	became_accel(s, was);
}

void became_accel(struct wsd_sock *s, bool was)
{
	if (!was && s->accel) {
		socklen_t len = sizeof(s->app_nodelay);
		int one = 1;

		/*
		 * Doorbells are single bytes: Nagle would hold the second behind
		 * the first one's delayed ACK (40 ms).  getsockopt still answers
		 * what the application set.
		 */
		if (s->nodelay_known && s->app_nodelay)
			s->nodelay_forced = true;   /* the program's own: nothing to ask or set */
		else if ((s->nodelay_known ||
			  !real.getsockopt(s->fd, IPPROTO_TCP, TCP_NODELAY, &s->app_nodelay, &len)) &&
			 !real.setsockopt(s->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)))
			s->nodelay_forced = true;
		set_stat_path(s);
		wsd_poll_sock_accelerated(s);
	}
}

/*
 * may_back: the caller holds none of s's locks, and s may have been kept
 * on TCP while the handshake ran (a fork or spawn now shares the socket,
 * the program made an io_uring; no_upgrade set under mu).  Then the peer
 * is never told we are ready, so it never switches, and the socket goes
 * back to the stream here, at once, rather than in the fork that would
 * otherwise have waited for this handshake (proc.c).
 */
static void attach(struct wsd_sock *s, struct wsd_session *ss, bool may_back)
{
	bool was, back;

	pthread_mutex_lock(&s->mu);
	ss->sock = s;
	s->sess = ss;
	atomic_store(&s->upgrade_state, UP_DONE);
	was = s->accel;
	back = may_back && s->no_upgrade;
	if (!back)
		publish_rx_ready(s);
	pthread_mutex_unlock(&s->mu);
	if (back) {
		wsd_debug("switch: fd %d attached after a fork or stop: back to the stream",
			  s->fd);
		/* rx_ready never sent, nothing sent by ring: neither side waits for the other */
		if (wsd_sock_downgrade(s, WSD_BACK_MS)) {
			s->detached = true;
			set_reason(s, R_FORKED);
		}
		return;
	}
	became_accel(s, was);
	probe_upgraded(s);   /* a shared listener's short connections start their count again */
	wsd_debug("switch: fd %d attached (%s)", s->fd, ss->path == PATH_VERBS ? "verbs" : "shm");
}

void wsd_session_attach(struct wsd_sock *s, struct wsd_session *ss)
{
	attach(s, ss, false);
}

void wsd_session_attach_new(struct wsd_sock *s, struct wsd_session *ss)
{
	attach(s, ss, true);
}

bool wsd_sock_accel(struct wsd_sock *s)
{
	return s->accel && !s->detached;
}

bool wsd_sock_tx_stream(struct wsd_sock *s)
{
	return s->tx_mode != DIR_RING;
}

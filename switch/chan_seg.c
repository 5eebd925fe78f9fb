/* SPDX-License-Identifier: MIT */
/*
 * A channel's memory (chan.c owns the channel; wsd-protocol(7),
 * "Channels"): its receive segments, the slots in them that sessions take
 * and give back, and the peer's segments mapped on shm.
 *
 * A slot is CTL_SIZE control bytes and a ring, page-aligned; a segment
 * ends with a page holding its tag.  On shm a segment is a sealed memfd
 * the peer maps once (pidfd_getfd, the same right as process_vm_writev,
 * which the transport checked) and then writes with plain stores; it is
 * never populated ahead: a page exists once a sender wrote it, and the
 * sender gives pages back when its ring is idle.  On verbs a segment is
 * registered memory, pinned: the first holds VERBS_SLOTS slots, and a
 * connection that finds every slot taken adds a segment of smaller rings
 * (up to MAX_SEGS), registered while the channel carries traffic: the
 * memory window's bind goes behind the sends in flight, and every one of
 * those finds a receive posted (the credits), so it completes without
 * the peer's reader.  A slot is ours to give again only once both sides
 * are done with it (SHUT from the peer, or the peer never wrote it).
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

#include "provider/fault.h"
#include "provider/internal.h"
#include "switch/chan_int.h"
#include "switch/session.h"

/* ---- segments ------------------------------------------------------------------ */

static uint64_t ino_of(int fd)
{
	struct stat st;

	return fstat(fd, &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* Close a segment's memfd, if the number still is it (a program may close all fds). */
void chan_seg_fd_close(struct seg *g)
{
	if (g->memfd >= 0 && ino_of(g->memfd) == g->ino)
		real.close(g->memfd);
	g->memfd = -1;
}

/*
 * Make and register segs[ch->nsegs], of n slots of ring bytes; the caller
 * counts it in (nsegs, under mu once the channel is shared).  The first
 * comes before the channel's first message; later ones (verbs) from
 * wsd_chan_slot_get, with ch->growing keeping others out of segs[nsegs].
 */
int chan_seg_add(struct wsd_chan *ch, uint32_t ring, uint32_t n)
{
	struct seg *g = &ch->segs[ch->nsegs];
	uint32_t dlen = sizeof(g->desc);
	int err, fd = -1;

	if (ch->nsegs == MAX_SEGS)
		return -ENOMEM;
	memset(g, 0, sizeof(*g));
	g->ring = ring;
	g->stride = (CTL_SIZE + ring + WSD_SEG_PAGE - 1) & ~(WSD_SEG_PAGE - 1);
	if ((uint64_t)n * g->stride + WSD_SEG_PAGE > UINT32_MAX)
		n = (uint32_t)((UINT32_MAX - WSD_SEG_PAGE) / g->stride);
	/* mapped here and by the peer: within the program's address-space reserve */
	while (n > 1 && !wsd_guard_room(0, 2 * ((uint64_t)n * g->stride + WSD_SEG_PAGE)))
		n /= 2;
	g->nslots = n;
	g->len = (size_t)n * g->stride + WSD_SEG_PAGE;
	g->state = calloc(n, 1);
	g->freel = calloc(n, sizeof(*g->freel));
	if (!g->state || !g->freel || !wsd_guard_room(1, ch->path == PATH_SHM ? 0 : g->len))
		goto fail;
	g->mem = MAP_FAILED;
	if (ch->path == PATH_SHM && !wsd_fault("ring-memfd", NULL))
		fd = memfd_create("wsd-chan", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	/*
	 * Sealed at its size: the peer maps it from a descriptor of its own,
	 * and a file cut short under a mapping is SIGBUS at the next access.
	 * Never populated: a page exists once a sender stored into it.
	 */
	if (fd >= 0 && ftruncate(fd, (off_t)g->len) == 0 &&
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0)
		g->mem = mmap(NULL, g->len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE,
			      fd, 0);
	if (g->mem == MAP_FAILED) {
		if (fd >= 0)
			real.close(fd);
		fd = -1;
		g->mem = mmap(NULL, g->len, PROT_READ | PROT_WRITE,
			      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (g->mem == MAP_FAILED)
			goto fail;
	}
	if (getrandom(&g->tag, sizeof(g->tag), 0) != sizeof(g->tag))
		g->tag = (uint32_t)(uintptr_t)g ^ (uint32_t)time(NULL);
	memcpy(g->mem + g->len - WSD_SEG_PAGE, &g->tag, sizeof(g->tag));
	/* registered for the peer's RDMA writes, should it not map it; not by copy */
	if (ch->copy ? fd < 0 :
	    wsd_spi()->lpWSPRegisterRdmaMemory(ch->ws, g->mem, (uint32_t)g->len, MEM_WRITE,
					       g->desc, &dlen, &err)) {
		munmap(g->mem, g->len);
		if (fd >= 0)
			real.close(fd);
		goto fail;
	}
	g->memfd = fd;
	g->shared = fd >= 0;
	g->ino = fd >= 0 ? ino_of(fd) : 0;
	return 0;
fail:
	free(g->state);
	free(g->freel);
	g->state = NULL;
	g->freel = NULL;
	return -ENOMEM;
}


/* mu held: the SHUTs the peer queued in our mailbox page, taken as messages are. */
static void shuts_taken(struct wsd_chan *ch)
{
	uint32_t offs[64];
	int n = wsd_chan_shut_take(ch, offs, 64);

	for (int i = 0; i < n; i++) {
		struct seg *g = &ch->segs[0];

		if (ch->nsegs && offs[i] % g->stride == 0 && offs[i] / g->stride < g->nslots)
			chan_slot_drop(ch, 0, offs[i] / g->stride, SL_PEER);
	}
}

/*
 * mu held: every slot taken, may we add a segment?  The channel alive and
 * ours.  On shm the first holds 511 slots of the default 8 MiB rings, and
 * an added one 16,384 of SHM_GROW_RING (4 GiB each, the registration's
 * bound): 10,000 connections between two processes still fit, and pages
 * exist only once written.
 */
static bool may_grow(const struct wsd_chan *ch)
{
	/* (with another user the one segment went at the start: no second) */
	return ch->nsegs && ch->nsegs < MAX_SEGS && !ch->grow_failed && !ch->copy &&
	       !atomic_load(&ch->dead) && ch->owner == wsd_pid();
}

/* mu held, for a while not: add a segment to the full channel.  0 or -ENOSPC. */
static int grow(struct wsd_chan *ch)
{
	bool shm = ch->path == PATH_SHM;
	uint32_t grow_ring = shm ? SHM_GROW_RING : VERBS_GROW_RING;
	uint32_t ring = ch->ring < grow_ring ? ch->ring : grow_ring;
	int r;

	ch->growing = true;
	pthread_mutex_unlock(&ch->mu);
	r = chan_seg_add(ch, ring, shm ? SHM_SLOTS : VERBS_GROW_SLOTS);
	pthread_mutex_lock(&ch->mu);
	ch->growing = false;
	pthread_cond_broadcast(&ch->grown);
	if (r) {
		ch->grow_failed = true;   /* the rest stay on TCP: no registration tried each */
		return -ENOSPC;
	}
	ch->nsegs++;
	wsd_debug("switch: channel %u has %u segments", ch->id, ch->nsegs);
	return 0;
}

int wsd_chan_slot_get(struct wsd_chan *ch, struct wsd_slot *sl)
{
	struct seg *g = NULL;
	uint32_t i, k;

	pthread_mutex_lock(&ch->mu);
	shuts_taken(ch);
	for (;;) {
		for (i = 0; i < ch->nsegs; i++) {
			g = &ch->segs[i];
			if (g->nfree || g->fresh < g->nslots)
				break;
		}
		if (i < ch->nsegs)
			break;
		if (ch->growing && may_grow(ch)) {
			/* another connection adds one: a slot in it, not TCP */
			pthread_cond_wait(&ch->grown, &ch->mu);
			continue;
		}
		if (!may_grow(ch) || grow(ch)) {
			pthread_mutex_unlock(&ch->mu);
			return -ENOSPC;   /* a full channel: the connection stays on TCP */
		}
	}
	k = g->nfree ? g->freel[--g->nfree] : g->fresh++;
	g->state[k] = SL_USED | SL_PEER;
	sl->seg = i;
	sl->off = k * g->stride;
	sl->ring = g->ring;
	sl->base = g->mem + sl->off;
	memcpy(sl->desc, g->desc, sizeof(sl->desc));
	memset(sl->base, 0, CTL_SIZE);
	ch->slots_used++;
	ch->idle_since = 0;
	pthread_mutex_unlock(&ch->mu);
	return 0;
}

/* mu held: side (SL_*) is done with slot k; free when neither writes it, its pages back. */
void chan_slot_drop(struct wsd_chan *ch, uint32_t seg, uint32_t k, uint8_t side)
{
	struct seg *g = &ch->segs[seg];

	if (!(g->state[k] & side))
		return;   /* a SHUT for a slot not in use (free, or warm): the peer's mistake */
	g->state[k] &= (uint8_t)~side;
	if (g->state[k])
		return;
	g->freel[g->nfree++] = k;
	/*
	 * A slot at rest costs nothing: its pages go back at the next sweep
	 * (slots_rest), unless a connection takes it first, as short ones
	 * following each other do: giving pages back shoots down the TLB of
	 * every CPU that maps them, and the next connection faults them in.
	 */
	if (ch->path == PATH_SHM)
		g->state[k] = SL_WARM;
	/* registered memory (verbs) stays: the adapter holds its pages */
}

/* mu held: free slots' pages back, the SHUTs queued to us taken first (the sweep). */
void chan_slots_rest(struct wsd_chan *ch)
{
	shuts_taken(ch);
	for (uint32_t i = 0; i < ch->nsegs; i++) {
		struct seg *g = &ch->segs[i];

		for (uint32_t f = 0; f < g->nfree; f++) {
			uint32_t k = g->freel[f];

			if (g->state[k] != SL_WARM)
				continue;
			g->state[k] = 0;
			if (g->shared)
				madvise(g->mem + (size_t)k * g->stride, g->stride, MADV_REMOVE);
			else
				madvise(g->mem + (size_t)k * g->stride, g->stride, MADV_DONTNEED);
		}
	}
}

void wsd_chan_slot_done(struct wsd_chan *ch, const struct wsd_slot *sl, bool peer_writes,
			bool shut, uint32_t peer_seg, uint32_t peer_off)
{
	uint32_t k;
	struct seg *g;

	if (!ch || ch->owner != wsd_pid())
		return;   /* a fork child's copy: the parent's */
	if (shut && !atomic_load(&ch->dead) && !wsd_chan_shut_post(ch, peer_seg, peer_off)) {
		struct wsd_chmsg m = { .h = { .magic = WSD_PROTO_MAGIC,
					      .version = WSD_PROTO_VERSION, .kind = MSG_SHUT,
					      .region_fd = -1, .seg = peer_seg,
					      .slot_off = peer_off } };

		wsd_chan_send(ch, &m);
	}
	pthread_mutex_lock(&ch->mu);
	g = &ch->segs[sl->seg];
	k = sl->off / g->stride;
	if (!peer_writes || atomic_load(&ch->dead))
		chan_slot_drop(ch, sl->seg, k, SL_PEER);
	chan_slot_drop(ch, sl->seg, k, SL_USED);
	if (--ch->slots_used == 0)
		ch->idle_since = wsd_now_ms();
	pthread_mutex_unlock(&ch->mu);
}

void wsd_chan_slot_describe(struct wsd_chan *ch, const struct wsd_slot *sl, struct wsd_hello *h)
{
	struct seg *g = &ch->segs[sl->seg];

	memcpy(h->desc, g->desc, sizeof(h->desc));
	h->seg = sl->seg;
	h->slot_off = sl->off;
	h->seg_len = (uint32_t)g->len;
	h->seg_tag = g->tag;
	pthread_mutex_lock(&ch->mu);
	h->region_fd = g->memfd;
	pthread_mutex_unlock(&ch->mu);
	h->pid = h->region_fd >= 0 ? (uint32_t)wsd_pid() : 0;
}

/* The peer mapped our segment (or will not): its memfd can go. */
void chan_on_mapped(struct wsd_chan *ch, uint32_t seg)
{
	pthread_mutex_lock(&ch->mu);
	if (seg < ch->nsegs)
		chan_seg_fd_close(&ch->segs[seg]);
	pthread_mutex_unlock(&ch->mu);
}

/* The peer writes into our slot no more. */
void chan_on_shut(struct wsd_chan *ch, uint32_t seg, uint32_t off)
{
	pthread_mutex_lock(&ch->mu);
	if (seg < ch->nsegs && off % ch->segs[seg].stride == 0 &&
	    off / ch->segs[seg].stride < ch->segs[seg].nslots) {
		chan_slot_drop(ch, seg, off / ch->segs[seg].stride, SL_PEER);
	}
	pthread_mutex_unlock(&ch->mu);
}

/* Either way the memfd of the peer's segment seg can go. */
void chan_send_mapped(struct wsd_chan *ch, uint32_t seg)
{
	struct wsd_chmsg m = { .h = { .magic = WSD_PROTO_MAGIC, .version = WSD_PROTO_VERSION,
				      .kind = MSG_MAPPED, .region_fd = -1, .seg = seg } };

	wsd_chan_send(ch, &m);
}

/*
 * A channel with another user (copy): the segment the peer handed over at
 * the start (chan.c, copy_start), taken from the transport, by one thread
 * once, before mu (no call into the provider under it); the checks below
 * (size, seals, tag) are the same.  -1: none came, or taken already.
 */
static int peer_seg_handed(struct wsd_chan *ch)
{
	int fd = -1, err;
	uint32_t n = 0;

	if (wsd_spi()->lpWSPIoctl(ch->ws, SIO_WSP_RECV_FD, NULL, 0, &fd, sizeof(fd), &n, NULL,
				  NULL, NULL, &err) || n != sizeof(fd))
		return -1;
	return fd;
}

uint8_t *wsd_chan_peer_slot(struct wsd_chan *ch, const struct wsd_hello *h)
{
	struct peer_seg *p;
	uint8_t *m = MAP_FAILED, *slot = NULL;
	bool told = false;
	int handed = -1;

	if (ch->path != PATH_SHM || h->seg >= MAX_SEGS)
		return NULL;
	if (ch->copy && h->seg == 0 && !atomic_flag_test_and_set(&ch->seg_handed))
		handed = peer_seg_handed(ch);
	pthread_mutex_lock(&ch->mu);
	p = &ch->peers[h->seg];
	/* (by copy, a thread that finds it taken by another and not mapped yet maps nothing) */
	if (!p->map && !p->failed && h->pid && h->region_fd >= 0 &&
	    (!ch->copy || handed >= 0 || h->seg != 0)) {
		int pfd, fd = -1;
		struct stat st;

		if (ch->copy) {
			fd = handed;   /* (a segment past the first: none, failed) */
			handed = -1;
		} else {
			pfd = wsd_fault("ring-pidfd", NULL) ? -1 :
			      (int)syscall(SYS_pidfd_open, (pid_t)h->pid, 0);
			if (pfd >= 0) {
				fd = (int)syscall(SYS_pidfd_getfd, pfd, h->region_fd, 0);
				real.close(pfd);
			}
		}
		/* only a segment its owner cannot cut short under our stores (SIGBUS) */
		if (fd >= 0 && fstat(fd, &st) == 0 && (size_t)st.st_size == h->seg_len &&
		    (fcntl(fd, F_GET_SEALS) & F_SEAL_SHRINK) && !wsd_fault("ring-mmap", NULL)) {
			m = mmap(NULL, h->seg_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
			p->ino = (uint64_t)st.st_ino;
		}
		if (fd >= 0)
			real.close(fd);
		if (m != MAP_FAILED) {
			uint32_t tag;

			memcpy(&tag, m + h->seg_len - WSD_SEG_PAGE, sizeof(tag));
			if (tag != h->seg_tag) {
				munmap(m, h->seg_len);
				m = MAP_FAILED;
			}
		}
		if (m != MAP_FAILED) {
			p->map = m;
			p->len = h->seg_len;
			p->tag = h->seg_tag;
		} else {
			p->failed = true;
		}
		told = true;
	}
	if (p->map && p->tag == h->seg_tag && p->len == h->seg_len)
		slot = p->map + h->slot_off;
	if (handed >= 0)
		real.close(handed);   /* mapped or failed meanwhile: not ours to use */
	/* the handshake's two messages come first: MAPPED waits for wsd_chan_start */
	if (told && !ch->reading) {
		p->tell = true;
		told = false;
	}
	pthread_mutex_unlock(&ch->mu);
	if (told)
		chan_send_mapped(ch, h->seg);
	return slot;
}
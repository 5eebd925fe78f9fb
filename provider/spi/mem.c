/* SPDX-License-Identifier: MIT */
/*
 * Memory for the SPI.  Local buffers go through a registration cache: a
 * registration covering the range with the rights asked for is reused, and
 * kept (unused, least recently used first out) after its last user is gone,
 * until WSPMemoryRegistrationCacheCallback says its memory is going away
 * (only in a process that has said it will: wsd_rcache_enable).
 * Buffers offered to the peer (WSPRegisterRdmaMemory) take their region from
 * the same cache, with the peer's rights kept apart (WSP_RC_REMOTE_*), and
 * each gets a memory window bound on the connection and invalidated when it
 * is deregistered: the pinning is paid once per buffer, the peer's access
 * lasts one registration.  Unbound windows are kept for the next one.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "provider/spi/spi.h"

struct range {
	uintptr_t a;
	size_t len;
};

static void apply_pending(struct wsp_provider *pv);
static void sweep(struct wsp_provider *pv);

static long page_size(void)
{
	static long ps;

	if (!ps)
		ps = sysconf(_SC_PAGESIZE);
	return ps;
}

/*
 * Whether the process tells the cache of memory going away: set once, by
 * wsd_rcache_enable (the memory hooks of libwsd-preload.so or
 * libwsd-hooks.so when they stand first in the process, or an integrator
 * that calls WSPMemoryRegistrationCacheCallback itself).  Until then no
 * registration is kept past its last user: a buffer freed and another
 * allocated at its address would otherwise be served the old registration.
 */
static atomic_bool reported;

int wsd_rcache_enable(void)
{
	atomic_store_explicit(&reported, true, memory_order_relaxed);
	return 0;
}

static unsigned cache_limit(void)
{
	long n = wsd_param_long("WSD_RCACHE_ENTRIES");

	if (!atomic_load_explicit(&reported, memory_order_relaxed))
		return 0;   /* a freed buffer's registration would outlive it unseen */
	return n > 0 && n < 1000000 ? (unsigned)n : 256;
}

/* Is the whole range mapped?  msync says ENOMEM for a hole. */
static int mapped(uintptr_t a, size_t len)
{
	uintptr_t start = a & ~(uintptr_t)(page_size() - 1);

	return msync((void *)start, a + len - start, MS_ASYNC) == 0;
}

/* Cached registrations in the process: the memory hooks do nothing while 0. */
static _Atomic unsigned long live_entries;

static void entry_drop(struct wsp_provider *pv, struct rc_entry *e)
{
	atomic_fetch_sub(&live_entries, 1);
	for (struct rc_entry **p = &pv->cache; *p; p = &(*p)->next) {
		if (*p == e) {
			*p = e->next;
			break;
		}
	}
	pv->cached--;
	(void)nd_mr_deregister(e->mr);
	free(e);
}

/*
 * Lock held.  Keep at most the limit of unused entries, and at most
 * WSP_RC_UNUSED_BYTES of memory in them (a region may be pinned): the
 * oldest go.
 */
static void trim(struct wsp_provider *pv)
{
	unsigned limit = cache_limit(), unused = 0;
	size_t bytes = 0;

	for (struct rc_entry *e = pv->cache; e; e = e->next)
		if (!e->refs) {
			unused++;
			bytes += e->len;
		}
	while (unused > limit || (unused && bytes > WSP_RC_UNUSED_BYTES)) {
		struct rc_entry *old = NULL;

		for (struct rc_entry *e = pv->cache; e; e = e->next)
			if (!e->refs && (!old || e->used < old->used))
				old = e;
		bytes -= old->len;
		entry_drop(pv, old);
		unused--;
	}
}

/*
 * Lock held.  Widen [*start, *end) over the unused entries with the same
 * rights that overlap or touch it, up to four times its length and
 * WSP_RC_MERGE_MAX: a program that sends from (or receives into) ever other
 * parts of one buffer ends up with one region over it, not one per call.
 * The entries taken in go once the new one is registered (drop_inside).
 * Entries in use are left alone: they stay, and taking them in would pin
 * their memory twice, a little more at each new neighbour (a thousand
 * connections' staging areas side by side grew to 64 MiB regions, and the
 * verbs rig's guest ran out of memory to pin).
 */
static void widen(struct wsp_provider *pv, uint32_t flags, uintptr_t *start, uintptr_t *end)
{
	uintptr_t a = *start, b = *end;
	size_t most = 4 * (b - a) < WSP_RC_MERGE_MAX ? 4 * (b - a) : WSP_RC_MERGE_MAX;
	bool more = true;

	while (more) {
		more = false;
		for (struct rc_entry *e = pv->cache; e; e = e->next) {
			uintptr_t ea = e->addr, eb = e->addr + e->len;

			if (e->stale || e->refs || e->flags != flags || ea > b || eb < a ||
			    (ea >= a && eb <= b))
				continue;
			if ((eb > b ? eb : b) - (ea < a ? ea : a) > most)
				continue;
			a = ea < a ? ea : a;
			b = eb > b ? eb : b;
			more = true;
		}
	}
	if ((a != *start || b != *end) && mapped(a, b - a)) {
		*start = a;
		*end = b;
	}
}

/*
 * Lock held.  Drop the unused entries inside keep: it serves them now.  One
 * in use stays as it is, since its handle must keep working.
 */
static void drop_inside(struct wsp_provider *pv, struct rc_entry *keep)
{
	for (struct rc_entry *e = pv->cache, *next; e; e = next) {
		next = e->next;
		if (e != keep && !e->refs && e->flags == keep->flags && e->addr >= keep->addr &&
		    e->addr + e->len <= keep->addr + keep->len)
			entry_drop(pv, e);
	}
}

static uint32_t mr_flags(uint32_t rc)
{
	return ((rc & MEM_WRITE) ? ND_MR_FLAG_ALLOW_LOCAL_WRITE : 0) |
	       ((rc & WSP_RC_REMOTE_READ) ? ND_MR_FLAG_ALLOW_REMOTE_READ : 0) |
	       ((rc & WSP_RC_REMOTE_WRITE) ? ND_MR_FLAG_ALLOW_REMOTE_WRITE : 0);
}

/* Lock held.  Drop the entries nobody uses (only the stale ones: sweep). */
static unsigned drop_unused(struct wsp_provider *pv, bool stale_only)
{
	unsigned n = 0;

	for (struct rc_entry *e = pv->cache, *next; e; e = next) {
		next = e->next;
		if (!e->refs && (e->stale || !stale_only)) {
			entry_drop(pv, e);
			n++;
		}
	}
	return n;
}

/* Lock held.  A referenced registration covering [buf, buf+len) with flags. */
struct rc_entry *wsp_rc_get(struct wsp_provider *pv, const void *buf, size_t len,
			    uint32_t flags, int *err)
{
	uintptr_t a = (uintptr_t)buf, start, end;
	/*
	 * A region for the peer covers exactly the bytes offered: some devices
	 * (rxe in Debian 12's kernel) check an access through a window against
	 * the region's bounds, not the window's (wsd-verbs(7)).
	 */
	bool exact = flags & (WSP_RC_REMOTE_READ | WSP_RC_REMOTE_WRITE);
	struct rc_entry *e;

	if (!buf || !len || a + len < a) {
		*err = WSAEFAULT;
		return NULL;
	}
	apply_pending(pv);
	sweep(pv);
	for (e = pv->cache; e; e = e->next) {
		if (e->stale || (exact ? e->addr != a || e->len != len || e->flags != flags :
				 a < e->addr || a + len > e->addr + e->len ||
				 (e->flags & flags) != flags))
			continue;
		e->refs++;
		e->used = ++pv->tick;
		return e;
	}
	if (!mapped(a, len)) {
		*err = WSAEFAULT;
		return NULL;
	}
	if (exact) {
		start = a;
		end = a + len;
	} else {
		/* whole pages: the next buffer nearby hits the same entry */
		start = a & ~(uintptr_t)(page_size() - 1);
		end = (a + len + (uintptr_t)page_size() - 1) & ~(uintptr_t)(page_size() - 1);
		widen(pv, flags, &start, &end);
	}
	e = calloc(1, sizeof(*e));
	if (!e) {
		*err = WSAENOBUFS;
		return NULL;
	}
	/* over the locked-memory limit, maybe: what the cache keeps unused goes first */
	if (nd_mr_register(pv->ad, (void *)start, end - start, mr_flags(flags), &e->mr) !=
	    ND_SUCCESS && (!drop_unused(pv, false) ||
			   nd_mr_register(pv->ad, (void *)start, end - start, mr_flags(flags),
					  &e->mr) != ND_SUCCESS)) {
		free(e);
		*err = WSAENOBUFS;
		return NULL;
	}
	e->addr = start;
	e->len = end - start;
	e->flags = flags;
	e->refs = 1;
	e->used = ++pv->tick;
	e->handle = pv->next_handle++;
	e->next = pv->cache;
	pv->cache = e;
	pv->cached++;
	atomic_fetch_add(&live_entries, 1);
	if (!exact)
		drop_inside(pv, e);
	trim(pv);
	return e;
}

/* Lock held. */
void wsp_rc_put(struct wsp_provider *pv, struct rc_entry *e)
{
	if (--e->refs)
		return;
	if (e->stale)
		entry_drop(pv, e);
	else
		trim(pv);
}

/* Lock held.  The live registration a handle names. */
struct rc_entry *wsp_rc_find(struct wsp_provider *pv, uint64_t handle)
{
	apply_pending(pv);
	for (struct rc_entry *e = pv->cache; e; e = e->next)
		if (e->handle == handle && e->refs && !e->stale)
			return e;
	return NULL;
}

void wsp_rc_drop_all(struct wsp_provider *pv)
{
	while (pv->cache)
		entry_drop(pv, pv->cache);
	while (pv->nmw_pool)
		(void)nd_mw_destroy(pv->mw_pool[--pv->nmw_pool]);
}

static struct wsp_socket *any_socket(SOCKET h, int *err)
{
	struct wsp_socket *s = wsp_sock_get(h, err);

	if (s && s->pv->down) {
		*err = WSAENETDOWN;
		wsp_sock_put(s);
		return NULL;
	}
	return s;
}

uint64_t WSPRegisterMemory(SOCKET h, void *buf, uint32_t len, uint32_t flags, int *err)
{
	struct wsp_socket *s = any_socket(h, err);
	struct rc_entry *e;

	if (!s)
		return 0;
	if (!flags || (flags & ~MEM_READWRITE)) {
		*err = WSAEINVAL;
		wsp_sock_put(s);
		return 0;
	}
	pthread_mutex_lock(&s->pv->lock);
	e = wsp_rc_get(s->pv, buf, len, flags, err);
	pthread_mutex_unlock(&s->pv->lock);
	wsp_sock_put(s);
	return e ? e->handle : 0;
}

int WSPDeregisterMemory(SOCKET h, uint64_t handle, int *err)
{
	struct wsp_socket *s = any_socket(h, err);
	struct rc_entry *e;

	if (!s)
		return SOCKET_ERROR;
	pthread_mutex_lock(&s->pv->lock);
	e = wsp_rc_find(s->pv, handle);
	if (e)
		wsp_rc_put(s->pv, e);
	pthread_mutex_unlock(&s->pv->lock);
	wsp_sock_put(s);
	if (!e) {
		*err = WSAEINVAL;
		return SOCKET_ERROR;
	}
	return 0;
}


/*
 * lock held: forget what was cached over [a, a + len): mark it stale, never
 * to be found again.  len 0: the ranges were lost (too many freed while the
 * lock was busy): forget every entry not in use; one in use keeps working
 * (its memory went away only if its user freed it while registered, and then
 * the copy itself faults), or every connection would fail at once.  Only marked: this runs from
 * the memory hooks, inside whatever unmapped the memory, and that may be the
 * provider itself holding an adapter's lock (a connection's rings going
 * away), which deregistering would take again.  sweep() drops the entries.
 */
static void apply_range(struct wsp_provider *pv, uintptr_t a, size_t len)
{
	for (struct rc_entry *e = pv->cache; e; e = e->next)
		if (len ? e->addr < a + len && a < e->addr + e->len : !e->refs)
			e->stale = true;
}

/* lock held, called by the SPI's own calls only: drop the unused stale entries. */
static void sweep(struct wsp_provider *pv)
{
	(void)drop_unused(pv, true);
}

/* lock held: the ranges freed while someone else held it. */
static void apply_pending(struct wsp_provider *pv)
{
	struct range r[WSP_PENDING_INVAL];
	unsigned n;
	bool all;

	if (!__atomic_load_n(&pv->ninval, __ATOMIC_ACQUIRE) &&
	    !__atomic_load_n(&pv->inval_overflow, __ATOMIC_ACQUIRE))
		return;
	pthread_spin_lock(&pv->inval_lock);
	n = pv->ninval;
	all = pv->inval_overflow;
	for (unsigned i = 0; i < n; i++)
		r[i] = (struct range){ pv->inval[i].a, pv->inval[i].len };
	pv->ninval = 0;
	pv->inval_overflow = false;
	pthread_spin_unlock(&pv->inval_lock);
	if (all)
		apply_range(pv, 0, 0);
	for (unsigned i = 0; i < n && !all; i++)
		apply_range(pv, r[i].a, r[i].len);
}

static void invalidate_range(struct wsp_provider *pv, void *arg)
{
	const struct range *r = arg;

	if (pthread_mutex_trylock(&pv->lock) == 0) {
		apply_pending(pv);
		apply_range(pv, r->a, r->len);
		pthread_mutex_unlock(&pv->lock);
		return;
	}
	pthread_spin_lock(&pv->inval_lock);
	if (pv->ninval < WSP_PENDING_INVAL) {
		pv->inval[pv->ninval].a = r->a;
		pv->inval[pv->ninval].len = r->len;
		__atomic_store_n(&pv->ninval, pv->ninval + 1, __ATOMIC_RELEASE);
	} else {
		__atomic_store_n(&pv->inval_overflow, true, __ATOMIC_RELEASE);
	}
	pthread_spin_unlock(&pv->inval_lock);
}

/* Memory is going away: every instance forgets what it cached over it. */
void wsp_rc_invalidate(const void *addr, size_t size)
{
	static __thread bool inside;
	struct range r = { (uintptr_t)addr, size };

	/* dropping an entry frees its bookkeeping, which lands here again */
	if (inside || !atomic_load_explicit(&live_entries, memory_order_relaxed))
		return;
	inside = true;
	wsp_for_each_provider(invalidate_range, &r);
	inside = false;
}

int WSPMemoryRegistrationCacheCallback(void *addr, size_t size, int *err)
{
	if (!addr || !size) {
		*err = WSAEINVAL;
		return SOCKET_ERROR;
	}
	wsp_rc_invalidate(addr, size);
	return 0;
}

/* ---- buffers offered to the peer --------------------------------------- */

/* Lock held.  Post a bind or invalidate and wait for it. */
static int window_op(struct wsp_socket *s, enum req_kind kind, struct rdma_reg *g,
		     uint32_t rights, struct nd_mw_descriptor *d)
{
	struct wsp_req *r = wsp_req_new(s, kind, NULL);
	nd_status st;

	if (!r)
		return WSAENOBUFS;
	if (kind == REQ_BIND)
		st = nd_ep_bind(s->ep, r, g->rc->mr, g->mw, (void *)(uintptr_t)d->base, d->length,
				rights, d);
	else
		st = nd_ep_invalidate(s->ep, r, g->mw, 0);
	if (st != ND_SUCCESS) {
		int code = wsp_posted_error(s, st);

		wsp_req_release(r);
		return code;
	}
	r->nd_pending = true;
	return wsp_req_wait(r, NULL);
}

/* Lock held.  An unbound window: one kept from before, or a new one. */
static struct nd_mw *mw_take(struct wsp_provider *pv)
{
	struct nd_mw *mw = NULL;

	if (pv->nmw_pool)
		return pv->mw_pool[--pv->nmw_pool];
	return nd_mw_create(pv->ad, &mw) == ND_SUCCESS ? mw : NULL;
}

/* Lock held.  A window that is unbound again: kept for the next, or freed. */
static void mw_give(struct wsp_provider *pv, struct nd_mw *mw)
{
	if (pv->nmw_pool < WSP_MW_POOL)
		pv->mw_pool[pv->nmw_pool++] = mw;
	else
		(void)nd_mw_destroy(mw);
}

int WSPRegisterRdmaMemory(SOCKET h, void *buf, uint32_t len, uint32_t flags, void *desc,
			  uint32_t *desclen, int *err)
{
	struct wsp_socket *s = any_socket(h, err);
	struct nd_mw_descriptor d = { (uintptr_t)buf, len, 0 };
	uint32_t rc = 0, rights = 0;
	struct wire_desc w;
	struct rdma_reg *g;
	int e;

	if (!s)
		return SOCKET_ERROR;
	if (!flags || (flags & ~MEM_READWRITE)) {
		*err = WSAEINVAL;
		goto out;
	}
	if (!buf || !len || !desc || !desclen || *desclen < WSP_RDMA_DESCRIPTOR_SIZE ||
	    !mapped((uintptr_t)buf, len)) {
		*err = WSAEFAULT;
		goto out;
	}
	if (s->state != S_CONNECTED) {
		*err = WSAENOTCONN;
		goto out;
	}
	if (flags & MEM_READ) {
		rc |= WSP_RC_REMOTE_READ;
		rights |= ND_OP_FLAG_ALLOW_READ;
	}
	if (flags & MEM_WRITE) {
		rc |= WSP_RC_REMOTE_WRITE;
		rights |= ND_OP_FLAG_ALLOW_WRITE;
	}
	g = calloc(1, sizeof(*g));
	if (!g) {
		*err = WSAENOBUFS;
		goto out;
	}
	pthread_mutex_lock(&s->pv->lock);
	/* the region comes from the cache; the window, bound for this one, is the peer's access */
	g->rc = wsp_rc_get(s->pv, buf, len, rc, err);
	g->mw = g->rc ? mw_take(s->pv) : NULL;
	if (!g->mw) {
		if (g->rc) {
			wsp_rc_put(s->pv, g->rc);
			*err = WSAENOBUFS;
		}
		pthread_mutex_unlock(&s->pv->lock);
		free(g);
		goto out;
	}
	e = window_op(s, REQ_BIND, g, rights, &d);
	if (e) {
		/* a bind that failed leaves the window unbound, but say nothing of it */
		(void)nd_mw_destroy(g->mw);
		wsp_rc_put(s->pv, g->rc);
		pthread_mutex_unlock(&s->pv->lock);
		free(g);
		*err = e;
		goto out;
	}
	w = (struct wire_desc){ d.base, d.length, d.token, flags, DESC_MAGIC };
	memcpy(g->desc, &w, sizeof(w));
	g->next = s->rdma;
	s->rdma = g;
	pthread_mutex_unlock(&s->pv->lock);
	memcpy(desc, &w, sizeof(w));
	*desclen = WSP_RDMA_DESCRIPTOR_SIZE;
	wsp_sock_put(s);
	return 0;
out:
	wsp_sock_put(s);
	return SOCKET_ERROR;
}

int WSPDeregisterRdmaMemory(SOCKET h, void *desc, uint32_t desclen, int *err)
{
	struct wsp_socket *s = any_socket(h, err);
	struct rdma_reg *g = NULL;
	bool unbound = false;

	if (!s)
		return SOCKET_ERROR;
	if (!desc || desclen != WSP_RDMA_DESCRIPTOR_SIZE) {
		*err = desc ? WSAEINVAL : WSAEFAULT;
		wsp_sock_put(s);
		return SOCKET_ERROR;
	}
	pthread_mutex_lock(&s->pv->lock);
	for (struct rdma_reg **p = &s->rdma; *p; p = &(*p)->next) {
		if (!memcmp((*p)->desc, desc, WSP_RDMA_DESCRIPTOR_SIZE)) {
			g = *p;
			*p = g->next;
			break;
		}
	}
	/* a connection that ended took the window down with it */
	if (g && s->state == S_CONNECTED && !s->fail)
		unbound = window_op(s, REQ_INVAL, g, 0, NULL) == 0;
	if (unbound) {
		mw_give(s->pv, g->mw);
		wsp_rc_put(s->pv, g->rc);
	}
	pthread_mutex_unlock(&s->pv->lock);
	if (!g) {
		*err = WSAEINVAL;
		wsp_sock_put(s);
		return SOCKET_ERROR;
	}
	if (!unbound) {
		if (nd_mw_destroy(g->mw) == ND_DEVICE_BUSY) {
			/* still bound (the invalidate failed): ending the connection frees it */
			(void)nd_ep_disconnect(s->ep);
			(void)nd_mw_destroy(g->mw);
		}
		pthread_mutex_lock(&s->pv->lock);
		wsp_rc_put(s->pv, g->rc);
		pthread_mutex_unlock(&s->pv->lock);
	}
	free(g);
	wsp_sock_put(s);
	return 0;
}

/* Lock held, connection over: every window is unbound, let them go. */
void wsp_rdma_release_all(struct wsp_socket *s)
{
	while (s->rdma) {
		struct rdma_reg *g = s->rdma;

		s->rdma = g->next;
		(void)nd_mw_destroy(g->mw);
		wsp_rc_put(s->pv, g->rc);
		free(g);
	}
}

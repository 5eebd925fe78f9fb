/* SPDX-License-Identifier: MIT */
/*
 * A registration's page: the table of the connections its fork children
 * accepted (regpage.h says what it holds, why, and why it is read as
 * untrusted input).  It owns the table and the checks of what is read
 * from it; registry.c decides when to note, forget and look, and keeps
 * each process's regpage_seen.
 *
 * No lock: each slot is one word, read once per step of a walk and
 * changed by compare-and-swap from the value read.  Sequentially
 * consistent atomics throughout (a walk is at most REGPAGE_PROBES loads;
 * nothing here is hot enough to be worth weaker orders).  Every loop is
 * bounded by REGPAGE_PROBES, or by NOTE_TRIES walks, whatever the page
 * holds.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <sys/mman.h>

#include "switch/regpage.h"

#define TAG 0xffffffffffff0000ull
#define PORT 0xffffull
/* a forgotten entry: any value with no port is one; this is the one we write */
#define TOMB TAG
/* walks a note retries when another process took the slot it chose */
#define NOTE_TRIES 8

struct wsd_reg_page *regpage_new(void)
{
	struct wsd_reg_page *p = mmap(NULL, sizeof(*p), PROT_READ | PROT_WRITE,
				      MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		return NULL;
	p->magic = REGPAGE_MAGIC;
	return p;
}

void regpage_free(struct wsd_reg_page *p)
{
	munmap(p, sizeof(*p));
}

static bool ours(const struct wsd_reg_page *p)
{
	return __atomic_load_n(&p->magic, __ATOMIC_RELAXED) == REGPAGE_MAGIC;
}

static size_t home(uint64_t v)
{
	return (size_t)((v >> 16) % REGPAGE_SLOTS);
}

static size_t next(size_t i)
{
	return (i + 1) % REGPAGE_SLOTS;
}

static bool live(uint64_t s)
{
	return (s & PORT) != 0;
}

int regpage_note(struct wsd_reg_page *p, uint64_t h, uint16_t port)
{
	uint64_t v = regpage_value(h, port);

	if (!ours(p))
		return -EBADMSG;
	for (int tries = 0; tries < NOTE_TRIES; tries++) {
		size_t i = home(v), hit = SIZE_MAX, free_at = SIZE_MAX;
		uint64_t hit_was = 0, free_was = 0;

		/* the entry with h's hash, else the first free slot, within the walk */
		for (unsigned n = 0; n < REGPAGE_PROBES; n++, i = next(i)) {
			uint64_t s = atomic_load(&p->slot[i]);

			if (live(s) && (s & TAG) == (v & TAG)) {
				hit = i, hit_was = s;
				break;
			}
			if (!live(s) && free_at == SIZE_MAX)
				free_at = i, free_was = s;
			if (!s)
				break;   /* never used: nothing of h's lies further */
		}
		if (hit != SIZE_MAX) {
			if (atomic_compare_exchange_strong(&p->slot[hit], &hit_was, v))
				return 0;
		} else if (free_at == SIZE_MAX) {
			return -ENOSPC;
		} else if (atomic_compare_exchange_strong(&p->slot[free_at], &free_was, v)) {
			return 0;
		}
		/* another process changed the slot since: walk again */
	}
	return -EAGAIN;
}

void regpage_forget(struct wsd_reg_page *p, uint64_t v)
{
	size_t i = home(v);

	for (unsigned n = 0; n < REGPAGE_PROBES; n++, i = next(i)) {
		uint64_t s = atomic_load(&p->slot[i]);

		if (s == v) {
			/* a process that changed it since has made it another's: left */
			(void)atomic_compare_exchange_strong(&p->slot[i], &s, TOMB);
			return;
		}
		if (!s)
			return;
	}
}

int regpage_find(struct wsd_reg_page *p, uint64_t h, uint16_t listener,
		 struct regpage_seen *seen)
{
	size_t i = home(h);
	bool passed_free = false;

	if (seen->bad)
		return -EBADMSG;
	if (!ours(p)) {
		seen->bad = true;
		return -EBADMSG;
	}
	for (unsigned n = 0; n < REGPAGE_PROBES; n++, i = next(i)) {
		uint64_t s = atomic_load(&p->slot[i]);
		uint16_t port = (uint16_t)(s & PORT);

		if (!s)
			return 0;
		if (!port) {
			passed_free = true;   /* a tombstone: the walk goes on past it */
			continue;
		}
		if ((s & TAG) != (h & TAG))
			continue;
		/* no child's registry is on the listener's port: not written by one */
		if (port == listener) {
			seen->bad = true;
			return -EBADMSG;
		}
		return port;
	}
	/*
	 * The walk's end: past a tombstone it is a miss, as on a page that
	 * churned long; past other entries only, the page is full (or filled).
	 */
	return passed_free ? 0 : -ENOSPC;
}

uint32_t regpage_count(struct wsd_reg_page *p, struct regpage_seen *seen)
{
	uint32_t c;

	if (!seen->bad) {
		c = atomic_load(&p->count);
		/* honest children only add themselves, and there are no more of them than pids */
		if (c < seen->count || c > REGPAGE_COUNT_MAX || !ours(p))
			seen->bad = true;
		else
			seen->count = c;
	}
	return seen->bad ? UINT32_MAX : seen->count;
}

void regpage_count_self(struct wsd_reg_page *p)
{
	atomic_fetch_add(&p->count, 1);
}

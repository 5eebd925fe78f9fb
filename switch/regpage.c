/* SPDX-License-Identifier: MIT */
/*
 * A registration's page: the table of the connections its fork children
 * accepted (regpage.h says what it holds and why).  It owns the table and
 * its lock; registry.c decides when to note, forget and look.
 */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>

#include "switch/regpage.h"

#define TAG 0xffffffffffff0000ull

struct wsd_reg_page *regpage_new(void)
{
	struct wsd_reg_page *p = mmap(NULL, sizeof(*p), PROT_READ | PROT_WRITE,
				      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	pthread_mutexattr_t a;
	bool ok;

	if (p == MAP_FAILED)
		return NULL;
	ok = !pthread_mutexattr_init(&a);
	if (ok) {
		ok = !pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED) &&
		     !pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST) &&
		     !pthread_mutex_init(&p->lock, &a);
		pthread_mutexattr_destroy(&a);
	}
	if (!ok) {
		munmap(p, sizeof(*p));
		return NULL;
	}
	return p;
}

void regpage_free(struct wsd_reg_page *p)
{
	munmap(p, sizeof(*p));
}

static bool page_lock(struct wsd_reg_page *p)
{
	int e = pthread_mutex_lock(&p->lock);

	if (e == EOWNERDEAD) {
		/* its holder died in the middle of a change: start empty */
		memset(p->slot, 0, sizeof(p->slot));
		p->used = 0;
		pthread_mutex_consistent(&p->lock);
		return true;
	}
	return e == 0;
}

static size_t home(uint64_t v)
{
	return (size_t)((v >> 16) % REGPAGE_SLOTS);
}

static size_t next(size_t i)
{
	return (i + 1) % REGPAGE_SLOTS;
}

/*
 * Lock held: the index of the entry that matches v under mask (its hash,
 * or all of it), else of the free slot where the walk from v's home ended.
 * The table is never full, so a free slot ends every walk.
 */
static size_t walk(const struct wsd_reg_page *p, uint64_t v, uint64_t mask)
{
	size_t i = home(v);

	while (p->slot[i] && (p->slot[i] & mask) != (v & mask))
		i = next(i);
	return i;
}

bool regpage_note(struct wsd_reg_page *p, uint64_t h, uint16_t port)
{
	uint64_t v = regpage_value(h, port);
	bool ok = true;
	size_t i;

	if (!page_lock(p))
		return false;
	i = walk(p, v, TAG);
	if (p->slot[i])
		p->slot[i] = v;
	else if ((ok = p->used < REGPAGE_FULL))
		p->slot[i] = v, p->used++;
	pthread_mutex_unlock(&p->lock);
	return ok;
}

/*
 * Each entry after the hole up to the next free slot moves back into it
 * when its home is not between the hole and where it is (a walk from its
 * home would otherwise stop at the hole before reaching it).
 */
void regpage_forget(struct wsd_reg_page *p, uint64_t v)
{
	size_t i;

	if (!page_lock(p))
		return;
	i = walk(p, v, ~0ull);
	if (p->slot[i]) {
		for (size_t k = next(i); p->slot[k]; k = next(k)) {
			size_t h = home(p->slot[k]);
			bool stays = i <= k ? (h > i && h <= k) : (h > i || h <= k);

			if (!stays) {
				p->slot[i] = p->slot[k];
				i = k;
			}
		}
		p->slot[i] = 0;
		p->used--;
	}
	pthread_mutex_unlock(&p->lock);
}

uint16_t regpage_find(struct wsd_reg_page *p, uint64_t h)
{
	uint16_t port;

	if (!page_lock(p))
		return 0;
	port = (uint16_t)p->slot[walk(p, h, TAG)];
	pthread_mutex_unlock(&p->lock);
	return port;
}

/* SPDX-License-Identifier: MIT */
/*
 * A registration's page (regpage.c), shared with the fork children that
 * inherit its listener (MAP_SHARED): they count themselves in it at their
 * first accept, and one that opened a registry of its own (its parent
 * keeps the port's) notes there each connection it accepts, and forgets it
 * at its last close, so that the port's registry can send a request for it
 * on (R_MOVED; registry.c).
 *
 * Any child may write it, and a child may have dropped to another user
 * (nginx's and Apache's workers do) or run code its parent would not
 * trust: the page is untrusted input to every process that reads it.  So
 * no lock lives in it (a holder could keep it for ever), no walk is longer
 * than REGPAGE_PROBES slots (a page of garbage has no free slot to end
 * one), and each value read is checked before it is used: the magic, the
 * count (it only grows, up to a pid's limit), a found port (never 0 nor
 * the listener's own).  A page found written as no honest process writes
 * it is taken as bad by the process that read it (struct regpage_seen, in
 * its own memory) and not used for moves again: its connections' requests
 * are answered shared and stay on TCP, counted as R_PAGE.  What a child
 * can do through the page is cost acceleration, never an answer.
 *
 * The notes are a hash table of single 64-bit words, each changed only by
 * compare-and-swap: an entry is the tuple's hash in the high 48 bits and
 * the child's registry port in the low 16, within REGPAGE_PROBES slots of
 * the index its hash names (linear probing).  A forgotten entry leaves a
 * tombstone (port 0), which a later note reuses and a walk passes; only a
 * never-used slot (0) ends a walk early.  Tombstones are never turned back
 * into free slots: that would need the quiet the page cannot promise, and
 * a walk costs REGPAGE_PROBES reads at worst anyway.  No free slot within
 * the walk, and a connection is not noted (R_PAGE): its request is
 * answered shared.  Untouched pages cost no memory: a server that never
 * forks touches the first.
 */
#ifndef WSD_SWITCH_REGPAGE_H
#define WSD_SWITCH_REGPAGE_H

#include <stdbool.h>
#include <stdint.h>

#define REGPAGE_BYTES (256u << 10)
#define REGPAGE_HEAD 128u
#define REGPAGE_SLOTS ((REGPAGE_BYTES - REGPAGE_HEAD) / 8u)
/* the longest walk: at the loads of honest servers, a full run of this many is never met */
#define REGPAGE_PROBES 64u
#define REGPAGE_MAGIC 0x3165676170647377ull   /* "wsdpage1" */
/* no more children than pids (PID_MAX_LIMIT) */
#define REGPAGE_COUNT_MAX (4u << 20)

struct wsd_reg_page {
	union {
		struct {
			uint64_t magic;           /* REGPAGE_MAGIC, written by its maker alone */
			_Atomic uint32_t count;   /* fork children that accepted on the listener */
		};
		uint8_t head[REGPAGE_HEAD];
	};
	_Atomic uint64_t slot[REGPAGE_SLOTS];
};
_Static_assert(sizeof(struct wsd_reg_page) == REGPAGE_BYTES, "the registration's page");

/*
 * What one process has read of a page, in its own memory (registry.c keeps
 * it under up_lock): the highest count read, and whether the page was
 * found bad.  Zeroed, it has read nothing.
 */
struct regpage_seen {
	uint32_t count;
	bool bad;
};

/* A new page, shared with the children we fork from now on; NULL when none. */
struct wsd_reg_page *regpage_new(void);
void regpage_free(struct wsd_reg_page *p);
/* The entry for a connection whose tuple hashes to h, noted by the registry on port. */
static inline uint64_t regpage_value(uint64_t h, uint16_t port)
{
	return (h & 0xffffffffffff0000ull) | port;
}
/*
 * Noted (an entry with h's hash replaced): 0; -ENOSPC when no slot within
 * the walk is free (full, or garbage), -EBADMSG when the page is not one
 * of ours, -EAGAIN when others kept changing the slots it took.
 */
int regpage_note(struct wsd_reg_page *p, uint64_t h, uint16_t port);
/* The entry v (regpage_value) removed, if found within the walk. */
void regpage_forget(struct wsd_reg_page *p, uint64_t v);
/*
 * The port noted for the connection whose tuple hashes to h, or 0 when
 * none is; -ENOSPC when the walk met only other entries (the page full,
 * or garbage); -EBADMSG when the page is, or was before, found bad
 * (seen->bad): the entry's port is 0 or listener, or the magic is wrong.
 */
int regpage_find(struct wsd_reg_page *p, uint64_t h, uint16_t listener,
		 struct regpage_seen *seen);
/*
 * The count of children that accepted, checked: it only grows, and stays
 * below REGPAGE_COUNT_MAX.  A page found bad here or before: UINT32_MAX
 * (its listener is shared, whatever the page says).
 */
uint32_t regpage_count(struct wsd_reg_page *p, struct regpage_seen *seen);
/* A child's first accept: counted among those that accept on the listener. */
void regpage_count_self(struct wsd_reg_page *p);

#endif /* WSD_SWITCH_REGPAGE_H */

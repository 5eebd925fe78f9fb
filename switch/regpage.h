/* SPDX-License-Identifier: MIT */
/*
 * A registration's page (regpage.c), shared with the fork children that
 * inherit its listener (MAP_SHARED): they count themselves in it at their
 * first accept, and one that opened a registry of its own (its parent
 * keeps the port's) notes there each connection it accepts, and forgets it
 * at its last close, so that the port's registry can send a request for it
 * on (R_MOVED; registry.c).  Only the processes of one program write it.
 *
 * The notes are a hash table (open addressing, linear probing, deletion by
 * shifting back) under a process-shared robust mutex: an entry is the
 * tuple's hash in the high 48 bits and the child's registry port in the
 * low 16, at the index its hash names or after.  Full (REGPAGE_FULL live
 * connections), a connection is not noted and its request is answered
 * shared.  A process that dies holding the lock leaves the table half
 * changed: the next one empties it (those connections' requests are
 * answered shared).  Untouched pages cost no memory: a server that never
 * forks touches the first.  (Until 2026-11-25 an entry was one
 * overwriting store at hash % 511: wrk's 200 connections to one nginx
 * worker left 35 on TCP, the birthday count of 200 in 511.)
 */
#ifndef WSD_SWITCH_REGPAGE_H
#define WSD_SWITCH_REGPAGE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#define REGPAGE_BYTES (256u << 10)
#define REGPAGE_HEAD 128u
#define REGPAGE_SLOTS ((REGPAGE_BYTES - REGPAGE_HEAD) / 8u)
#define REGPAGE_FULL (REGPAGE_SLOTS / 8u * 7u)

struct wsd_reg_page {
	union {
		struct {
			_Atomic uint32_t count;   /* fork children that accepted on the listener */
			uint32_t used;            /* live entries (lock held) */
			pthread_mutex_t lock;
		};
		uint8_t head[REGPAGE_HEAD];
	};
	uint64_t slot[REGPAGE_SLOTS];
};
_Static_assert(sizeof(struct wsd_reg_page) == REGPAGE_BYTES, "the registration's page");

/* A new page, shared with the children we fork from now on; NULL when none. */
struct wsd_reg_page *regpage_new(void);
void regpage_free(struct wsd_reg_page *p);
/* The entry for a connection whose tuple hashes to h, noted by the registry on port. */
static inline uint64_t regpage_value(uint64_t h, uint16_t port)
{
	return (h & 0xffffffffffff0000ull) | port;
}
/* Noted (an entry with h's hash replaced); false when full. */
bool regpage_note(struct wsd_reg_page *p, uint64_t h, uint16_t port);
/* The entry v (regpage_value) removed, if there. */
void regpage_forget(struct wsd_reg_page *p, uint64_t v);
/* The port noted for the connection whose tuple hashes to h, or 0. */
uint16_t regpage_find(struct wsd_reg_page *p, uint64_t h);

#endif /* WSD_SWITCH_REGPAGE_H */

/* SPDX-License-Identifier: MIT */
/*
 * How large a sender's window on a mapped ring should be, learnt from what
 * runs of large sends cost (winsize.c; tx.c keeps the window, zc.c times
 * the runs).  Pure functions: no locks, no clock.
 *
 * The best size depends on the machine's caches and on where the sender's
 * data comes from, and it differs from one machine to the next.  Measured
 * with `wsd bench-worker tput` (1 MiB sends, pinned), runs in turns:
 *   - 2026-11-27, a 2-vCPU machine with 18 GB/s cold memcpy: an 8 MiB
 *     window beat 256 KiB both from a reused buffer (25 against 12 to 16
 *     GB/s) and from a 256 MiB source (13 to 16 against 12);
 *   - 2026-11-27, a 2-vCPU AMD EPYC (2 MiB L2 a core) with 28 GB/s cold
 *     memcpy: from a reused buffer 8 MiB still won (59 against 55 at
 *     512 KiB), but from the 256 MiB source 512 KiB gave 27 GB/s in six
 *     runs of six, and 2 to 8 MiB anywhere from 17 to 29.
 * So the window grows under pressure (tx_widen), and once it stops
 * growing, a trial now and then halves or doubles it for a run; the size
 * that ran cheaper is kept.
 */
#ifndef WSD_SWITCH_WINSIZE_H
#define WSD_SWITCH_WINSIZE_H

#include <stdbool.h>
#include <stdint.h>

enum { WINSIZE_IDLE, WINSIZE_SETTLE, WINSIZE_MEASURE };

/*
 * Runs until the next trial, for this learner and zc.c's choice of way
 * alike: after a trial that lost, twice the last gap, up to
 * TRIAL_GAP_MAX; after one that won, TRIAL_GAP_MIN.
 */
#define TRIAL_GAP_MIN 4u
#define TRIAL_GAP_MAX 256u
static inline uint32_t trial_gap(uint32_t gap, bool lost)
{
	if (!lost || gap < TRIAL_GAP_MIN / 2)
		return TRIAL_GAP_MIN;
	return gap >= TRIAL_GAP_MAX / 2 ? TRIAL_GAP_MAX : 2 * gap;
}

struct wsd_winsize {
	uint32_t cap;        /* the largest the window may be: the ring, or the size learnt */
	uint32_t ref;        /* ns per MiB of runs at ref_at (0: not known) */
	uint32_t ref_at;
	uint32_t trial;      /* the size under trial (0: none) */
	uint32_t back;       /* the size before it, kept when it loses */
	uint32_t in, gap;    /* runs until the next trial; the gap after the last one */
	uint8_t phase;       /* WINSIZE_* */
	bool up;             /* the next trial doubles (else halves) */
	bool stalled;        /* the last run cost far more than ref: not counted in it */
};

/* The window's bounds: the smallest, and the ring. */
void winsize_init(struct wsd_winsize *w, uint32_t ring);

/*
 * A run of large sends went by ring at v ns per MiB, the window win_then
 * at its start and win_now at its end, the smallest window min.  Returns
 * the window the sender should have from now: larger than win_now, at
 * once; smaller, once it next starts at the ring's start (w->cap says so).
 * *count: whether v is a fair cost of the ring as it now stands (not of a
 * trial that lost, nor of the runs that settle one).
 */
uint32_t winsize_run(struct wsd_winsize *w, uint32_t ring, uint32_t min, uint32_t win_then,
		     uint32_t win_now, uint32_t v, bool *count);

#endif

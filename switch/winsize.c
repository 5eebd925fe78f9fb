/* SPDX-License-Identifier: MIT */
/*
 * The sender's window size, learnt by trials (winsize.h).  A trial starts
 * only from a window that held still for a run and whose cost is known; it
 * settles for a run (a smaller window takes effect at the ring's start, a
 * larger one touches new pages), then one run at the trial's size is
 * compared with the known cost.  A trial that is not at least 1/32 cheaper
 * loses: noise does not move the window.  After a loss the next trial goes
 * the other way, twice as many runs later (trial_gap); after a
 * win, the same way soon.  Once a trial was made, the window grows only by
 * trials: the size learnt is its cap.
 */
#include "switch/winsize.h"


void winsize_init(struct wsd_winsize *w, uint32_t ring)
{
	*w = (struct wsd_winsize){ .cap = ring };
}

/* The trial is over: keep size, and wait gap runs for the next. */
static uint32_t settle_on(struct wsd_winsize *w, uint32_t size, uint32_t gap)
{
	w->cap = size;
	w->in = w->gap = gap;
	w->trial = 0;
	w->phase = WINSIZE_IDLE;
	return size;
}

uint32_t winsize_run(struct wsd_winsize *w, uint32_t ring, uint32_t min, uint32_t win_then,
		     uint32_t win_now, uint32_t v, bool *count)
{
	bool up;

	*count = true;
	switch (w->phase) {
	case WINSIZE_SETTLE:
		*count = false;
		if (win_now == w->trial)
			w->phase = WINSIZE_MEASURE;
		return win_now;
	case WINSIZE_MEASURE:
		*count = false;
		/* the window moved under the trial (pages given back): no verdict */
		if (win_then != w->trial || win_now != w->trial)
			return settle_on(w, w->back, w->gap);
		if (v < w->ref - w->ref / 32) {
			*count = true;
			w->ref = v;
			w->ref_at = w->trial;
			return settle_on(w, w->trial, trial_gap(w->gap, false));
		}
		w->up = !w->up;
		return settle_on(w, w->back, trial_gap(w->gap, true));
	default:
		break;
	}
	if (win_then != win_now || w->ref_at != win_now || !w->ref) {
		/* still growing: a fresh reference at the size it reached */
		w->ref = win_then == win_now ? v : 0;
		w->ref_at = win_now;
		if (!w->gap)
			w->in = w->gap = TRIAL_GAP_MIN;
		return win_now;
	}
	/*
	 * One run half as dear again is the machine's stall (a preemption, a
	 * page fault), not the window's cost, and would let a trial win on it:
	 * not averaged in.  Two in a row are: the machine got slower.
	 */
	if (v > w->ref + w->ref / 2 && !w->stalled) {
		w->stalled = true;
	} else {
		w->stalled = false;
		w->ref = (uint32_t)((3 * (uint64_t)w->ref + v) / 4);
	}
	if (w->in && --w->in)
		return win_now;
	up = w->up;
	if (up && win_now > ring / 2)
		up = false;
	if (!up && win_now / 2 < min)
		up = true;
	if (up && win_now > ring / 2) {
		w->in = TRIAL_GAP_MAX;   /* a ring of the smallest window: nothing to try */
		return win_now;
	}
	w->up = up;
	w->back = win_now;
	w->trial = up ? win_now * 2 : win_now / 2;
	w->cap = w->trial;
	w->phase = WINSIZE_SETTLE;
	return w->trial > win_now ? w->trial : win_now;
}

/* SPDX-License-Identifier: MIT */
/*
 * The window size a sender learns (switch/winsize.c): nothing is tried
 * while the window grows; a trial halves or doubles it; one that is not
 * clearly cheaper gives the old size back and the next trial goes the
 * other way, later; a stalled run does not buy a trial a win; a ring of the
 * smallest window tries nothing.
 */
#include <check.h>
#include <stdlib.h>

#include "switch/winsize.h"
#include "tests/pair.h"

#define KIB 1024u
#define MIB (1024u * KIB)
#define RING (8 * MIB)
#define MIN (256 * KIB)

/* One run: the window at its start and end, its cost; the window wanted after it. */
static uint32_t run(struct wsd_winsize *w, uint32_t then, uint32_t now, uint32_t v, bool *count)
{
	return winsize_run(w, RING, MIN, then, now, v, count);
}

/* Steady runs at win and cost v until a trial begins: the trial's size. */
static uint32_t until_trial(struct wsd_winsize *w, uint32_t win, uint32_t v, int *runs)
{
	bool count;

	for (*runs = 1; *runs < 1000; ++*runs) {
		uint32_t want = run(w, win, win, v, &count);

		ck_assert(count);
		if (w->phase != WINSIZE_IDLE) {
			/* a larger trial begins at once, a smaller one at the ring's start */
			ck_assert_uint_eq(want, w->trial > win ? w->trial : win);
			ck_assert_uint_eq(w->cap, w->trial);
			return w->trial;
		}
		ck_assert_uint_eq(want, win);
	}
	ck_abort_msg("no trial in 1000 runs");
	return 0;
}

/* The trial's settling run and its measured one: the window wanted after. */
static uint32_t trial(struct wsd_winsize *w, uint32_t size, uint32_t v, bool *count)
{
	ck_assert_uint_eq(run(w, w->back, size, v, count), size);
	ck_assert(!*count);
	ck_assert_int_eq(w->phase, WINSIZE_MEASURE);
	return run(w, size, size, v, count);
}

START_TEST(growing_tries_nothing)
{
	struct wsd_winsize w;
	bool count;

	winsize_init(&w, RING);
	ck_assert_uint_eq(w.cap, RING);
	for (uint32_t win = MIN; win < RING; win *= 2) {
		ck_assert_uint_eq(run(&w, win, win * 2, 40000, &count), win * 2);
		ck_assert(count);
		ck_assert_int_eq(w.phase, WINSIZE_IDLE);
		ck_assert_uint_eq(w.cap, RING);
	}
}
END_TEST

START_TEST(smaller_wins)
{
	struct wsd_winsize w;
	bool count;
	int runs;

	winsize_init(&w, RING);
	/* at the ring's size only a smaller one can be tried */
	ck_assert_uint_eq(until_trial(&w, RING, 60000, &runs), RING / 2);
	ck_assert_int_le(runs, 8);
	ck_assert_uint_eq(trial(&w, RING / 2, 40000, &count), RING / 2);
	ck_assert(count);
	ck_assert_uint_eq(w.cap, RING / 2);
	ck_assert_uint_eq(w.ref, 40000);
	/* a win: the same way again, soon */
	ck_assert_uint_eq(until_trial(&w, RING / 2, 40000, &runs), RING / 4);
	ck_assert_int_le(runs, 8);
}
END_TEST

START_TEST(noise_loses)
{
	struct wsd_winsize w;
	bool count;
	int first, second;

	winsize_init(&w, RING);
	ck_assert_uint_eq(until_trial(&w, RING, 40000, &first), RING / 2);
	/* 1 % cheaper is noise: the old size back at once, its cost not counted */
	ck_assert_uint_eq(trial(&w, RING / 2, 39600, &count), RING);
	ck_assert(!count);
	ck_assert_uint_eq(w.cap, RING);
	/* the other way cannot be tried at the ring's size: smaller again, later */
	ck_assert_uint_eq(until_trial(&w, RING, 40000, &second), RING / 2);
	ck_assert_int_gt(second, first);
}
END_TEST

START_TEST(larger_tried_after_a_loss)
{
	struct wsd_winsize w;
	bool count;
	int runs;

	winsize_init(&w, RING);
	/* grown to 2 MiB and no further */
	ck_assert_uint_eq(run(&w, MIB, 2 * MIB, 50000, &count), 2 * MIB);
	ck_assert_uint_eq(until_trial(&w, 2 * MIB, 50000, &runs), MIB);
	ck_assert_uint_eq(trial(&w, MIB, 70000, &count), 2 * MIB);
	ck_assert(!count);
	ck_assert_uint_eq(w.cap, 2 * MIB);
	/* next: the larger size, at once; it wins and becomes the cap */
	ck_assert_uint_eq(until_trial(&w, 2 * MIB, 50000, &runs), 4 * MIB);
	ck_assert_uint_eq(trial(&w, 4 * MIB, 30000, &count), 4 * MIB);
	ck_assert(count);
	ck_assert_uint_eq(w.cap, 4 * MIB);
	/* a larger one that loses is given back at the ring's start (the cap) */
	ck_assert_uint_eq(until_trial(&w, 4 * MIB, 30000, &runs), 8 * MIB);
	ck_assert_uint_eq(trial(&w, 8 * MIB, 45000, &count), 4 * MIB);
	ck_assert_uint_eq(w.cap, 4 * MIB);
}
END_TEST

START_TEST(stall_buys_nothing)
{
	struct wsd_winsize w;
	bool count;
	int runs;

	winsize_init(&w, RING);
	run(&w, RING, RING, 40000, &count);
	run(&w, RING, RING, 40000, &count);
	/* one run the machine stalled for a millisecond */
	run(&w, RING, RING, 2000000, &count);
	ck_assert_uint_le(w.ref, 60000);
	ck_assert_uint_eq(until_trial(&w, RING, 40000, &runs), RING / 2);
	/* a trial no better than the usual cost does not win on the stall */
	ck_assert_uint_eq(trial(&w, RING / 2, 41000, &count), RING);
	ck_assert_uint_eq(w.cap, RING);
}
END_TEST

START_TEST(moved_under_trial)
{
	struct wsd_winsize w;
	bool count;
	int runs;

	winsize_init(&w, RING);
	ck_assert_uint_eq(until_trial(&w, RING, 40000, &runs), RING / 2);
	ck_assert_uint_eq(run(&w, RING, RING / 2, 40000, &count), RING / 2);
	/* the window changed during the measured run: no verdict, the old size back */
	ck_assert_uint_eq(run(&w, RING / 2, MIN, 10000, &count), RING);
	ck_assert(!count);
	ck_assert_int_eq(w.phase, WINSIZE_IDLE);
	ck_assert_uint_eq(w.cap, RING);
}
END_TEST

START_TEST(gap_bounded)
{
	struct wsd_winsize w;
	bool count;
	int runs = 0, last = 0;

	winsize_init(&w, RING);
	for (int i = 0; i < 20; i++) {
		ck_assert_uint_eq(until_trial(&w, RING, 40000, &runs), RING / 2);
		ck_assert_uint_eq(trial(&w, RING / 2, 50000, &count), RING);
		ck_assert_int_ge(runs, last);
		last = runs;
	}
	/* a trial still comes, however many lost */
	ck_assert_int_le(runs, 300);
}
END_TEST

START_TEST(smallest_ring_tries_nothing)
{
	struct wsd_winsize w;
	bool count;

	w = (struct wsd_winsize){ 0 };
	winsize_init(&w, MIN);
	for (int i = 0; i < 2000; i++) {
		ck_assert_uint_eq(winsize_run(&w, MIN, MIN, MIN, MIN, 40000, &count), MIN);
		ck_assert_int_eq(w.phase, WINSIZE_IDLE);
		ck_assert_uint_eq(w.cap, MIN);
	}
}
END_TEST

int main(int argc, char **argv)
{
	TCase *tc = t_case("learn", argc, argv);

	tcase_add_test(tc, growing_tries_nothing);
	tcase_add_test(tc, smaller_wins);
	tcase_add_test(tc, noise_loses);
	tcase_add_test(tc, larger_tried_after_a_loss);
	tcase_add_test(tc, stall_buys_nothing);
	tcase_add_test(tc, moved_under_trial);
	tcase_add_test(tc, gap_bounded);
	tcase_add_test(tc, smallest_ring_tries_nothing);
	return t_run("winsize", tc);
}

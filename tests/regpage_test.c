/* SPDX-License-Identifier: MIT */
/*
 * The table of a registration's page (switch/regpage.c): what is noted is
 * found until it is forgotten, whatever else was noted and forgotten
 * around it, also where entries collide, run past the table's end, and
 * fill it; a process that dies holding the lock leaves an empty table, not
 * a lock nobody can take.
 */
#include <check.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "switch/regpage.h"
#include "tests/pair.h"

/* A hash whose home is slot `at` (the k-th such one: they collide). */
static uint64_t hash_at(size_t at, uint64_t k)
{
	return ((uint64_t)at + k * REGPAGE_SLOTS) << 16;
}

START_TEST(note_find_forget)
{
	struct wsd_reg_page *p = regpage_new();
	uint64_t h = hash_at(7, 3) | 0xbeef;   /* the low bits are not the hash's */

	ck_assert_ptr_nonnull(p);
	ck_assert_uint_eq(regpage_find(p, h), 0);
	ck_assert(regpage_note(p, h, 4242));
	ck_assert_uint_eq(regpage_find(p, h), 4242);
	/* the same connection noted again by another registry: replaced */
	ck_assert(regpage_note(p, h, 4343));
	ck_assert_uint_eq(regpage_find(p, h), 4343);
	ck_assert_uint_eq(p->used, 1);
	/* forgetting what another registry noted leaves it */
	regpage_forget(p, regpage_value(h, 4242));
	ck_assert_uint_eq(regpage_find(p, h), 4343);
	regpage_forget(p, regpage_value(h, 4343));
	ck_assert_uint_eq(regpage_find(p, h), 0);
	ck_assert_uint_eq(p->used, 0);
	regpage_free(p);
}
END_TEST

/*
 * Random notes and forgets of hashes whose homes lie in a few slots near
 * `base` (long runs of collisions, and entries whose homes lie inside
 * another's run), against a plain list: after every step each live entry
 * is found with its port and each forgotten one is not.
 */
static void model_run(size_t base, unsigned seed)
{
	enum { N = 400 };
	struct wsd_reg_page *p = regpage_new();
	uint64_t h[N];
	uint16_t port[N] = { 0 };

	ck_assert_ptr_nonnull(p);
	srand(seed);
	for (int i = 0; i < N; i++)
		h[i] = hash_at((base + (size_t)(i % 12)) % REGPAGE_SLOTS, (uint64_t)i);
	for (int step = 0; step < 4000; step++) {
		int i = rand() % N;

		if (port[i]) {
			regpage_forget(p, regpage_value(h[i], port[i]));
			port[i] = 0;
		} else {
			port[i] = (uint16_t)(1 + rand() % 65535);
			ck_assert(regpage_note(p, h[i], port[i]));
		}
		for (int j = 0; j < N; j++)
			ck_assert_msg(regpage_find(p, h[j]) == port[j],
				      "step %d: entry %d (home %zu): found %u, want %u", step, j,
				      (size_t)((h[j] >> 16) % REGPAGE_SLOTS),
				      (unsigned)regpage_find(p, h[j]), (unsigned)port[j]);
	}
	regpage_free(p);
}

START_TEST(collisions_model)
{
	model_run(1000, 1);
}
END_TEST

/* The same where the runs pass the table's last slot and go on at 0. */
START_TEST(wraparound_model)
{
	model_run(REGPAGE_SLOTS - 6, 2);
}
END_TEST

START_TEST(full)
{
	struct wsd_reg_page *p = regpage_new();
	uint64_t i;

	ck_assert_ptr_nonnull(p);
	for (i = 0; i < REGPAGE_FULL; i++)
		ck_assert(regpage_note(p, hash_at(i % REGPAGE_SLOTS, i / REGPAGE_SLOTS), 1));
	/* full: a new connection is not noted, one noted before is still found */
	ck_assert(!regpage_note(p, hash_at(5, 99), 2));
	ck_assert_uint_eq(regpage_find(p, hash_at(5, 99)), 0);
	ck_assert_uint_eq(regpage_find(p, hash_at(5, 0)), 1);
	/* one closes: room again */
	regpage_forget(p, regpage_value(hash_at(5, 0), 1));
	ck_assert(regpage_note(p, hash_at(5, 99), 2));
	ck_assert_uint_eq(regpage_find(p, hash_at(5, 99)), 2);
	regpage_free(p);
}
END_TEST

START_TEST(holder_dies)
{
	struct wsd_reg_page *p = regpage_new();
	int st;
	pid_t pid;

	ck_assert_ptr_nonnull(p);
	ck_assert(regpage_note(p, hash_at(3, 1), 77));
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		pthread_mutex_lock(&p->lock);
		_exit(0);   /* in the middle of a change, as far as anyone knows */
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	/* the next look takes the lock and finds the table emptied */
	ck_assert_uint_eq(regpage_find(p, hash_at(3, 1)), 0);
	ck_assert_uint_eq(p->used, 0);
	ck_assert(regpage_note(p, hash_at(3, 1), 78));
	ck_assert_uint_eq(regpage_find(p, hash_at(3, 1)), 78);
	regpage_free(p);
}
END_TEST

int main(int argc, char **argv)
{
	TCase *tc = t_case("table", argc, argv);

	tcase_add_test(tc, note_find_forget);
	tcase_add_test(tc, collisions_model);
	tcase_add_test(tc, wraparound_model);
	tcase_add_test(tc, full);
	tcase_add_test(tc, holder_dies);
	return t_run("regpage", tc);
}

/* SPDX-License-Identifier: MIT */
/*
 * The table of a registration's page (switch/regpage.c): what is noted is
 * found until it is forgotten, whatever else was noted and forgotten
 * around it, also where entries collide, run past the table's end, fill
 * the walk, churn for long and are written by two processes at once.  And
 * the page as untrusted input: garbage in every slot, a wrong magic, a
 * count that shrinks or is past any pid, a port no child's registry has,
 * and a process that rewrites the page while we use it, each cost a
 * bounded walk and the page's use (seen->bad), never a hang.
 */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "switch/regpage.h"
#include "tests/pair.h"

#define LISTENER 8080

/* A hash whose home is slot `at` (the k-th such one: they collide). */
static uint64_t hash_at(size_t at, uint64_t k)
{
	return ((uint64_t)at + k * REGPAGE_SLOTS) << 16;
}

static int find(struct wsd_reg_page *p, uint64_t h)
{
	struct regpage_seen seen = { 0 };

	return regpage_find(p, h, LISTENER, &seen);
}

START_TEST(note_find_forget)
{
	struct wsd_reg_page *p = regpage_new();
	uint64_t h = hash_at(7, 3) | 0xbeef;   /* the low bits are not the hash's */

	ck_assert_ptr_nonnull(p);
	ck_assert_int_eq(find(p, h), 0);
	ck_assert_int_eq(regpage_note(p, h, 4242), 0);
	ck_assert_int_eq(find(p, h), 4242);
	/* the same connection noted again by another registry: replaced */
	ck_assert_int_eq(regpage_note(p, h, 4343), 0);
	ck_assert_int_eq(find(p, h), 4343);
	/* forgetting what another registry noted leaves it */
	regpage_forget(p, regpage_value(h, 4242));
	ck_assert_int_eq(find(p, h), 4343);
	regpage_forget(p, regpage_value(h, 4343));
	ck_assert_int_eq(find(p, h), 0);
	/* its tombstone is taken again, and a walk passes it */
	ck_assert_int_eq(regpage_note(p, hash_at(7, 4), 1), 0);
	ck_assert_int_eq(regpage_note(p, hash_at(7, 5), 2), 0);
	regpage_forget(p, regpage_value(hash_at(7, 4), 1));
	ck_assert_int_eq(find(p, hash_at(7, 5)), 2);
	ck_assert_int_eq(regpage_note(p, h, 5), 0);
	ck_assert_uint_eq(atomic_load(&p->slot[7]), regpage_value(h, 5));
	regpage_free(p);
}
END_TEST

/*
 * Random notes and forgets of hashes whose homes lie in a few slots near
 * `base` (long runs of collisions, and entries whose homes lie inside
 * another's run), at most LIVE at once so that every run fits the walk,
 * against a plain list: after every step each live entry is found with its
 * port and each forgotten one is not.
 */
static void model_run(size_t base, unsigned seed)
{
	enum { N = 300, HOMES = 20, LIVE = 40 };
	struct wsd_reg_page *p = regpage_new();
	uint64_t h[N];
	uint16_t port[N] = { 0 };
	int live = 0;

	ck_assert_ptr_nonnull(p);
	srand(seed);
	for (int i = 0; i < N; i++)
		h[i] = hash_at((base + (size_t)(i % HOMES)) % REGPAGE_SLOTS, (uint64_t)i);
	for (int step = 0; step < 6000; step++) {
		int i = rand() % N;

		if (port[i]) {
			regpage_forget(p, regpage_value(h[i], port[i]));
			port[i] = 0;
			live--;
		} else if (live < LIVE) {
			port[i] = (uint16_t)(1 + rand() % 65535);
			if (port[i] == LISTENER)
				port[i]++;
			ck_assert_int_eq(regpage_note(p, h[i], port[i]), 0);
			live++;
		}
		for (int j = 0; j < N; j++)
			ck_assert_msg(find(p, h[j]) == port[j],
				      "step %d: entry %d (home %zu): found %d, want %u", step, j,
				      (size_t)((h[j] >> 16) % REGPAGE_SLOTS), find(p, h[j]),
				      (unsigned)port[j]);
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

/* A walk's worth of entries from one home: the next is not noted, the others still found. */
START_TEST(full)
{
	struct wsd_reg_page *p = regpage_new();
	uint64_t i;

	ck_assert_ptr_nonnull(p);
	for (i = 0; i < REGPAGE_PROBES; i++)
		ck_assert_int_eq(regpage_note(p, hash_at(5, i), 1), 0);
	ck_assert_int_eq(regpage_note(p, hash_at(5, 99), 2), -ENOSPC);
	ck_assert_int_eq(find(p, hash_at(5, 99)), -ENOSPC);
	ck_assert_int_eq(find(p, hash_at(5, 0)), 1);
	ck_assert_int_eq(find(p, hash_at(5, REGPAGE_PROBES - 1)), 1);
	/* one closes: room again */
	regpage_forget(p, regpage_value(hash_at(5, 0), 1));
	ck_assert_int_eq(find(p, hash_at(5, 99)), 0);
	ck_assert_int_eq(regpage_note(p, hash_at(5, 99), 2), 0);
	ck_assert_int_eq(find(p, hash_at(5, 99)), 2);
	regpage_free(p);
}
END_TEST

/*
 * A long-lived server: a million connections over its life, a thousand
 * open at a time, spread over the whole table.  Tombstones are reused, so
 * no note ever fails and every entry is found.
 */
START_TEST(churn)
{
	enum { OPEN = 1000, STEPS = 1000000 };
	struct wsd_reg_page *p = regpage_new();
	uint64_t *h = calloc(OPEN, sizeof(*h)), x = 88172645463325252ull;

	ck_assert_ptr_nonnull(p);
	ck_assert_ptr_nonnull(h);
	for (int step = 0; step < STEPS; step++) {
		int k = step % OPEN;

		if (h[k]) {
			ck_assert_int_eq(find(p, h[k]), 1 + k);
			regpage_forget(p, regpage_value(h[k], (uint16_t)(1 + k)));
			ck_assert_int_eq(find(p, h[k]), 0);
		}
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		h[k] = x & 0xffffffffffff0000ull;
		ck_assert_int_eq(regpage_note(p, h[k], (uint16_t)(1 + k)), 0);
	}
	for (int k = 0; k < OPEN; k++)
		ck_assert_int_eq(find(p, h[k]), 1 + k);
	free(h);
	regpage_free(p);
}
END_TEST

/* Garbage in every slot: notes refused, looks bounded, no port of the garbage's taken as ours. */
START_TEST(garbage)
{
	struct wsd_reg_page *p = regpage_new();
	struct regpage_seen seen = { 0 };

	ck_assert_ptr_nonnull(p);
	for (size_t i = 0; i < REGPAGE_SLOTS; i++)
		atomic_store(&p->slot[i], 0x5a5a5a5a5a5a0000ull | (i % 60000 + 1));
	ck_assert_int_eq(regpage_note(p, hash_at(9, 1), 7), -ENOSPC);
	ck_assert_int_eq(find(p, hash_at(9, 1)), -ENOSPC);
	regpage_forget(p, regpage_value(hash_at(9, 1), 7));
	/* the garbage names a hash: its port is found, as any child could note it */
	ck_assert_int_eq(regpage_find(p, 0x5a5a5a5a5a5a0000ull, LISTENER, &seen) > 0, 1);
	ck_assert(!seen.bad);
	regpage_free(p);
}
END_TEST

/* Values no honest process writes: the page is taken as bad, for good. */
START_TEST(bad_values)
{
	struct wsd_reg_page *p = regpage_new();
	struct regpage_seen seen = { 0 };

	ck_assert_ptr_nonnull(p);
	/* a count that grows is believed; once above one, the listener stays shared */
	atomic_store(&p->count, 2);
	ck_assert_uint_eq(regpage_count(p, &seen), 2);
	atomic_store(&p->count, 3);
	ck_assert_uint_eq(regpage_count(p, &seen), 3);
	ck_assert(!seen.bad);
	/* one that shrinks is not */
	atomic_store(&p->count, 0);
	ck_assert_uint_eq(regpage_count(p, &seen), UINT32_MAX);
	ck_assert(seen.bad);
	/* a child's note, not used */
	ck_assert_int_eq(regpage_note(p, hash_at(4, 1), 9), 0);
	ck_assert_int_eq(regpage_find(p, hash_at(4, 1), LISTENER, &seen), -EBADMSG);
	atomic_store(&p->count, 3);
	ck_assert_uint_eq(regpage_count(p, &seen), UINT32_MAX);   /* for good */

	/* a count past any number of pids */
	seen = (struct regpage_seen){ 0 };
	atomic_store(&p->count, REGPAGE_COUNT_MAX + 1);
	ck_assert_uint_eq(regpage_count(p, &seen), UINT32_MAX);

	/* an entry naming the listener's own port */
	seen = (struct regpage_seen){ 0 };
	atomic_store(&p->count, 1);
	ck_assert_int_eq(regpage_note(p, hash_at(4, 2), LISTENER), 0);
	ck_assert_int_eq(regpage_find(p, hash_at(4, 1), LISTENER, &seen), 9);
	ck_assert_int_eq(regpage_find(p, hash_at(4, 2), LISTENER, &seen), -EBADMSG);
	ck_assert(seen.bad);
	ck_assert_int_eq(regpage_find(p, hash_at(4, 1), LISTENER, &seen), -EBADMSG);
	ck_assert_uint_eq(regpage_count(p, &seen), UINT32_MAX);

	/* the magic overwritten: not a page of ours, for anyone */
	seen = (struct regpage_seen){ 0 };
	p->magic = 0;
	ck_assert_int_eq(regpage_note(p, hash_at(4, 3), 10), -EBADMSG);
	ck_assert_int_eq(regpage_find(p, hash_at(4, 1), LISTENER, &seen), -EBADMSG);
	ck_assert(seen.bad);
	seen = (struct regpage_seen){ 0 };
	ck_assert_uint_eq(regpage_count(p, &seen), UINT32_MAX);
	regpage_free(p);
}
END_TEST

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/*
 * Another process rewrites the whole page with garbage, head and slots,
 * over and over, while this one notes, forgets, looks and counts: each
 * call returns (the page's lock of old let such a writer hold everyone
 * for ever), and 100,000 rounds take well under the case's timeout.
 */
START_TEST(rewritten_meanwhile)
{
	struct wsd_reg_page *p = regpage_new();
	struct regpage_seen seen = { 0 };
	double t0;
	pid_t pid;
	int st;

	ck_assert_ptr_nonnull(p);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		uint64_t x = 0x9e3779b97f4a7c15ull;

		alarm(30);
		for (;;) {
			uint64_t *w = (uint64_t *)p;

			for (size_t i = 0; i < REGPAGE_BYTES / 8; i++) {
				x ^= x << 13, x ^= x >> 7, x ^= x << 17;
				__atomic_store_n(&w[i], i & 1 ? x : ~0ull, __ATOMIC_RELAXED);
			}
		}
	}
	t0 = now_s();
	for (uint64_t k = 0; k < 100000; k++) {
		(void)regpage_note(p, hash_at(k % REGPAGE_SLOTS, k), 7);
		regpage_forget(p, regpage_value(hash_at(k % REGPAGE_SLOTS, k), 7));
		(void)regpage_find(p, hash_at(k % REGPAGE_SLOTS, k), LISTENER, &seen);
		(void)regpage_count(p, &seen);
	}
	ck_assert_msg(now_s() - t0 < 20, "100,000 rounds took %.1f s", now_s() - t0);
	ck_assert(seen.bad);
	kill(pid, SIGKILL);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	regpage_free(p);
}
END_TEST

/*
 * Two processes note and forget their own connections at once, all homed
 * in the same few slots: neither loses or overwrites the other's.
 */
START_TEST(two_writers)
{
	enum { N = 24, ROUNDS = 20000 };
	struct wsd_reg_page *p = regpage_new();
	pid_t pid;
	int st, who;

	ck_assert_ptr_nonnull(p);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	who = pid == 0;
	for (int r = 0; r < ROUNDS; r++) {
		int k = r % N;
		uint64_t h = hash_at(100 + (size_t)(k % 4), (uint64_t)(2 * k + who));
		uint16_t port = (uint16_t)(1000 + who);

		if (regpage_note(p, h, port) || find(p, h) != port) {
			if (pid == 0)
				_exit(1);
			ck_abort_msg("round %d: noted %d, found %d", r, regpage_note(p, h, port),
				     find(p, h));
		}
		if (r % 3)
			regpage_forget(p, regpage_value(h, port));
	}
	if (pid == 0)
		_exit(0);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
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
	tcase_add_test(tc, churn);
	tcase_add_test(tc, garbage);
	tcase_add_test(tc, bad_values);
	tcase_add_test(tc, rewritten_meanwhile);
	tcase_add_test(tc, two_writers);
	return t_run("regpage", tc);
}

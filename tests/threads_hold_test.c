/* SPDX-License-Identifier: MIT */
/*
 * The hold fork puts on the library's own threads (provider/params.c):
 * wsd_threads_hold waits for a thread at work to reach its wait, holds a
 * thread that wakes meanwhile until wsd_threads_release, and gives up
 * after its bound when a thread stays at work.
 */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include "provider/internal.h"

static _Atomic int started, woke;

static int64_t ms_since(const struct timespec *t0)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (t.tv_sec - t0->tv_sec) * 1000 + (t.tv_nsec - t0->tv_nsec) / 1000000;
}

/* At work for 150 ms, then a wait, then a wake: held there while the hold lasts. */
static void *worker(void *arg)
{
	(void)arg;
	wsd_threads_work();
	atomic_store(&started, 1);
	usleep(150 * 1000);
	atomic_fetch_sub(&wsd_threads_busy, 1);   /* waiting */
	usleep(20 * 1000);
	wsd_threads_work();                       /* woken */
	atomic_store(&woke, 1);
	atomic_fetch_sub(&wsd_threads_busy, 1);
	return NULL;
}

START_TEST(hold_waits_then_holds)
{
	struct timespec t0;
	pthread_t t;
	int64_t ms;

	ck_assert_int_eq(pthread_create(&t, NULL, worker, NULL), 0);
	while (!atomic_load(&started))
		usleep(1000);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	wsd_threads_hold(5000);
	ms = ms_since(&t0);
	ck_assert_msg(ms >= 90 && ms < 5000, "the hold came back after %lld ms", (long long)ms);
	ck_assert_int_eq(atomic_load(&wsd_threads_busy), 0);
	usleep(200 * 1000);
	ck_assert_msg(!atomic_load(&woke), "a thread woke while held");
	ck_assert_int_eq(atomic_load(&wsd_threads_busy), 0);
	wsd_threads_release();
	pthread_join(t, NULL);
	ck_assert(atomic_load(&woke));
	ck_assert_int_eq(atomic_load(&wsd_threads_busy), 0);
}
END_TEST

static void *stays_busy(void *arg)
{
	(void)arg;
	wsd_threads_work();
	atomic_store(&started, 1);
	usleep(800 * 1000);
	atomic_fetch_sub(&wsd_threads_busy, 1);
	return NULL;
}

START_TEST(hold_gives_up_after_its_bound)
{
	struct timespec t0;
	pthread_t t;
	int64_t ms;

	ck_assert_int_eq(pthread_create(&t, NULL, stays_busy, NULL), 0);
	while (!atomic_load(&started))
		usleep(1000);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	wsd_threads_hold(100);
	ms = ms_since(&t0);
	ck_assert_msg(ms >= 90 && ms < 700, "the hold came back after %lld ms", (long long)ms);
	ck_assert_int_eq(atomic_load(&wsd_threads_busy), 1);
	wsd_threads_release();
	pthread_join(t, NULL);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("threads_hold");
	TCase *tc = tcase_create("hold");
	SRunner *sr;
	int failed;

	tcase_add_test(tc, hold_waits_then_holds);
	tcase_add_test(tc, hold_gives_up_after_its_bound);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}

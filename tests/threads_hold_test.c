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
#include "tests/pair.h"

static _Atomic int started, woke;

/* Start fn, wait until it is at work, then hold (up to ms): the hold's time in ms. */
static int64_t hold_after(void *(*fn)(void *), pthread_t *t, int ms)
{
	struct timespec t0, t1;

	ck_assert_int_eq(pthread_create(t, NULL, fn, NULL), 0);
	while (!atomic_load(&started))
		usleep(1000);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	wsd_threads_hold(ms);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	return (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
}

/* Counted at work for ms, then waiting (as the library's threads do). */
static void at_work(int ms)
{
	wsd_threads_work();
	atomic_store(&started, 1);
	usleep(ms * 1000);
	wsd_threads_rest();
}

/* At work for 150 ms, then a wait, then a wake: held there while the hold lasts. */
static void *worker(void *arg)
{
	(void)arg;
	at_work(150);
	usleep(20 * 1000);
	wsd_threads_work();                       /* woken */
	atomic_store(&woke, 1);
	wsd_threads_rest();
	return NULL;
}

START_TEST(hold_waits_then_holds)
{
	pthread_t t;
	int64_t ms = hold_after(worker, &t, 5000);

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
	at_work(800);
	return NULL;
}

START_TEST(hold_gives_up_after_its_bound)
{
	pthread_t t;
	int64_t ms = hold_after(stays_busy, &t, 100);

	ck_assert_msg(ms >= 90 && ms < 700, "the hold came back after %lld ms", (long long)ms);
	ck_assert_int_eq(atomic_load(&wsd_threads_busy), 1);
	wsd_threads_release();
	pthread_join(t, NULL);
}
END_TEST

int main(int argc, char **argv)
{
	TCase *tc = t_case("hold", argc, argv);

	tcase_add_test(tc, hold_waits_then_holds);
	tcase_add_test(tc, hold_gives_up_after_its_bound);
	return t_run("threads_hold", tc);
}

/* SPDX-License-Identifier: MIT */
/*
 * The shm targets link the set-up code (provider/shm/ctl.c) without the
 * provider's count of its threads at work, which only a fork reads
 * (provider/params.c): a wait on the peer counts nothing here, and the
 * provider's poll is poll.
 */
#ifndef WSD_FUZZ_THREADS_H
#define WSD_FUZZ_THREADS_H

#include <poll.h>
#include <stdbool.h>

bool wsd_threads_away(void)
{
	return false;
}

void wsd_threads_back(bool away)
{
	(void)away;
}

int wsd_wait_fds(struct pollfd *p, unsigned n, int timeout_ms)
{
	return poll(p, n, timeout_ms);
}

#endif

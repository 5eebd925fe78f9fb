/* SPDX-License-Identifier: MIT */
/*
 * What the readiness calls share: poll.c defines them, epoll_wait.c uses
 * them too.  A wait's deadline on CLOCK_MONOTONIC and its helpers, and an
 * accelerated socket's readiness in the kernel's bits.
 */
#ifndef WSD_SWITCH_POLL_INT_H
#define WSD_SWITCH_POLL_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "switch/switch.h"

#define NSEC 1000000000L

/* The end of a wait on CLOCK_MONOTONIC; inf: none. */
struct deadline {
	bool inf;
	struct timespec at;
};

/* time */
void deadline_init(struct deadline *d, const struct timespec *rel);
void deadline_ms(struct deadline *d, int ms);
bool deadline_left(const struct deadline *d, struct timespec *left);
int deadline_to_ms(const struct deadline *d, const struct timespec *left);
bool cap_wait(const struct deadline *dl, struct timespec *left);
bool timespec_bad(const struct timespec *ts);
/* an accelerated socket's readiness, and how long a wait may spin */
short accel_revents(struct wsd_sock *s, short events, short krev, bool arm);
int64_t spin_room(const struct deadline *dl);

#endif /* WSD_SWITCH_POLL_INT_H */

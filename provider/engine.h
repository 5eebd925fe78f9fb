/* SPDX-License-Identifier: MIT */
/*
 * The completion engine: the one place that sleeps.  Everything that must
 * wake a waiter (a CQ doorbell, a peer's liveness socket, later overlapped
 * completions) is an fd; the engine waits for it on io_uring with a timeout.
 */
#ifndef WSD_PROVIDER_ENGINE_H
#define WSD_PROVIDER_ENGINE_H

#include <liburing.h>
#include <stdint.h>

struct wsd_engine {
	struct io_uring ring;
	int ready;
};

#define WSD_ENGINE_API __attribute__((visibility("hidden")))

WSD_ENGINE_API int wsd_engine_init(struct wsd_engine *e);
WSD_ENGINE_API void wsd_engine_fini(struct wsd_engine *e);
/* Wait until fd is readable: 1, 0 on timeout (timeout_ns < 0: forever), or -errno. */
WSD_ENGINE_API int wsd_engine_wait_fd(struct wsd_engine *e, int fd, int64_t timeout_ns);

#endif

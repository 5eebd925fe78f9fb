/* SPDX-License-Identifier: MIT */
/*
 * The completion engine: the one place that sleeps.  Everything that must
 * wake a waiter (a CQ doorbell, a peer's liveness socket, later overlapped
 * completions) is an fd; the engine waits for it on io_uring with a timeout.
 */
#ifndef WSD_PROVIDER_ENGINE_H
#define WSD_PROVIDER_ENGINE_H

#include <liburing.h>
#include <stdbool.h>
#include <stdint.h>

#include "provider/private.h"

struct wsd_engine {
	struct io_uring ring;
	int ready;
};

#define WSD_ENGINE_API __attribute__((visibility("hidden")))

/*
 * The provider's own io_urings are made and ended only through these: the
 * switch moves a program's connections back to TCP when the program makes
 * an io_uring of its own (it could move socket bytes no preload sees), and
 * must not count ours.  wsd_uring_own_call is true inside them; a ring fd
 * of ours answers true to wsd_uring_is_own.  What the switch calls of this
 * (wsd_uring_own_call, wsd_uring_foreign, wsd_fd_named) is in
 * provider/private.h: it leaves libwsd.so for libwsd-preload.so.
 */
WSD_ENGINE_API int wsd_uring_init(unsigned entries, struct io_uring *ring);
WSD_ENGINE_API void wsd_uring_exit(struct io_uring *ring);
WSD_ENGINE_API bool wsd_uring_is_own(int fd);

WSD_ENGINE_API int wsd_engine_init(struct wsd_engine *e);
WSD_ENGINE_API void wsd_engine_fini(struct wsd_engine *e);
/* Wait until fd is readable: 1, 0 on timeout (timeout_ns < 0: forever), or -errno. */
WSD_ENGINE_API int wsd_engine_wait_fd(struct wsd_engine *e, int fd, int64_t timeout_ns);

#endif

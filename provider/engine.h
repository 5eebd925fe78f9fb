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
 * of ours answers true to wsd_uring_is_own.
 */
WSD_ENGINE_API int wsd_uring_init(unsigned entries, struct io_uring *ring);
WSD_ENGINE_API void wsd_uring_exit(struct io_uring *ring);
WSD_ENGINE_API bool wsd_uring_is_own(int fd);
/*
 * fd is an io_uring and not one of ours, both read under the lock that our
 * rings are made and closed under (a look at /proc and a look at the list
 * apart could see one of ours as it closes).
 */
WSD_ENGINE_API bool wsd_uring_foreign(int fd);
WSD_ENGINE_API extern __thread bool wsd_uring_own_call;

/* fd (on) or no longer (off) closed in a fork child: a listener's registry socket. */
WSD_ENGINE_API void wsd_fd_named(int fd, bool on);

WSD_ENGINE_API int wsd_engine_init(struct wsd_engine *e);
WSD_ENGINE_API void wsd_engine_fini(struct wsd_engine *e);
/* Wait until fd is readable: 1, 0 on timeout (timeout_ns < 0: forever), or -errno. */
WSD_ENGINE_API int wsd_engine_wait_fd(struct wsd_engine *e, int fd, int64_t timeout_ns);

#endif

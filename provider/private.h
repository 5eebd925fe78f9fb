/* SPDX-License-Identifier: MIT */
/*
 * The provider's internal calls that the switch makes.  The switch is a
 * library of its own (libwsd-preload.so) linked against libwsd.so, not a
 * second copy of the provider, so these leave libwsd.so under wsd_ names
 * (its map exports wsd_*).  Declared here only, never in an installed
 * header: they are no API, promise integrators nothing, and change along
 * with the preload built from the same tree.  tests/symbols_check.sh keeps
 * libwsd.so's exports to the public headers' names and this file's.
 *
 * Everything else the provider shares inside itself stays hidden
 * (WSD_HIDDEN, provider/internal.h).
 */
#ifndef WSD_PROVIDER_PRIVATE_H
#define WSD_PROVIDER_PRIVATE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define WSD_PRIVATE __attribute__((visibility("default")))

/* self.c: this process's pid, and unguessable bytes, without a system call each time */
WSD_PRIVATE pid_t wsd_pid(void);
/* n bytes from the kernel's generator, by the batch: 0 or -errno */
WSD_PRIVATE int wsd_random(void *buf, size_t n);
/* a fork child: its own pid, none of its parent's bytes (atfork; switch/raw.c) */
WSD_PRIVATE void wsd_self_forget(void);

/* params.c: WSD_* runtime parameters */
WSD_PRIVATE long wsd_param_long(const char *name);
WSD_PRIVATE const char *wsd_param_str(const char *name);
WSD_PRIVATE int64_t wsd_spin_ns(void);
/* A line to stderr when WSD_DEBUG is set. */
WSD_PRIVATE void wsd_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/*
 * The library's own threads at work (counted from the moment they run,
 * except while they wait).  In the sanitizer build fork waits for 0
 * before it goes on: an allocator without fork handling would otherwise
 * leave the child a lock one of them held, and the child's first
 * allocation of that size waits for ever (glibc's fork locks its own).
 * So a thread rests only where it blocks, not before a call that may
 * allocate on its way to blocking.
 *
 * wsd_threads_hold, the last thing before fork, holds each thread that
 * wakes at its next wsd_threads_work and waits up to ms for the others to
 * reach a wait; wsd_threads_release lets them go (after fork, in the
 * parent and the child).  A thread back from a wait calls wsd_threads_work
 * before it touches anything, and wsd_threads_rest before it waits again
 * (or ends).  The switch's threads count here too.
 */
WSD_PRIVATE extern _Atomic int wsd_threads_busy;
WSD_PRIVATE void wsd_threads_hold(int ms);
WSD_PRIVATE void wsd_threads_release(void);
WSD_PRIVATE void wsd_threads_work(void);
WSD_PRIVATE void wsd_threads_rest(void);
/*
 * Around a system call that waits on another process (a connect, a poll
 * for its message), outside the allocator and any lock: a thread counted
 * busy rests, so that a fork does not wait for that process
 * (wsd_threads_away true), and is counted again after (wsd_threads_back
 * with what away returned).  Other threads are left as they are.
 */
WSD_PRIVATE bool wsd_threads_away(void);
WSD_PRIVATE void wsd_threads_back(bool away);
/*
 * The library's poll of its own descriptors, away (above) while it
 * blocks: straight to the kernel (not through the switch's poll, which may
 * allocate), restarted after a signal for the time left.  As poll returns.
 */
struct pollfd;
WSD_PRIVATE int wsd_wait_fds(struct pollfd *p, unsigned n, int timeout_ms);

/*
 * engine.c: the provider's own io_urings (provider/engine.h).  The switch
 * moves a program's connections back to TCP when the program makes a ring
 * of its own, and must not count ours: wsd_uring_own_call is true while
 * one of ours is made; wsd_uring_foreign(fd) says fd is an io_uring and not
 * one of ours, both read under the lock our rings are made and closed under
 * (a look at /proc and a look at the list apart could see one of ours as it
 * closes).
 */
WSD_PRIVATE extern __thread bool wsd_uring_own_call;
WSD_PRIVATE bool wsd_uring_foreign(int fd);
/* fd (on) or no longer (off) closed in a fork child: a listener's registry socket. */
WSD_PRIVATE void wsd_fd_named(int fd, bool on);

/*
 * What a listener turned away below the switch (the shm registry: its uid
 * check, the proof, the proof's deadline, a process's share of the proof
 * slots), counted from its start by why.  The switch adds them to wsd
 * stat.  spi/socket.c: those of SPI listening socket s (a SOCKET) into
 * counts; 0, or -1 when s is no listener.
 */
enum wsd_lrefused {
	WSD_LREF_USER,               /* another user: turned away on SO_PEERCRED */
	WSD_LREF_PROOF,              /* a proof that failed: it may not read us */
	WSD_LREF_TIMEOUT,            /* no complete proof within the deadline */
	WSD_LREF_PEER,               /* its process already held its share of the slots */
	WSD_LREF_EVICTED,            /* dropped for a newcomer: its process held the most */
	WSD_LREF_PROTOCOL,           /* a message out of turn or malformed */
	WSD_LREF_N
};
WSD_PRIVATE int wsd_listen_refused(uintptr_t s, uint64_t counts[WSD_LREF_N]);

#endif

/* SPDX-License-Identifier: MIT */
/*
 * This process, without a system call each time it is asked: its pid,
 * and unguessable bytes drawn from the kernel a batch at a time.  Both
 * are forgotten in a fork child: its pid is its own, and bytes its parent
 * also holds are no secret from the parent (nor from any other child).
 * The atfork handler that forgets them is registered before any other of
 * the library's (constructor priority), so the child's other handlers
 * see the child's pid; a fork by syscall() forgets them too (switch/raw.c).
 * A connection costs a few dozen system calls on its way to the fast path,
 * at about a microsecond each on a paravirtualised guest.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "provider/internal.h"

#define POOL 512                     /* bytes drawn at once, per thread */

static _Atomic pid_t pid_now;

/* Each thread's bytes: a child keeps only the forking thread's, emptied. */
static __thread struct {
	uint8_t b[POOL];
	unsigned left;               /* the unused bytes are the last `left` of b */
} pool;

pid_t wsd_pid(void)
{
	pid_t p = atomic_load_explicit(&pid_now, memory_order_relaxed);

	if (!p) {
		p = (pid_t)syscall(SYS_getpid);
		atomic_store_explicit(&pid_now, p, memory_order_relaxed);
	}
	return p;
}

/* n bytes from the kernel's generator into p: 0 or -errno */
static int draw(uint8_t *p, size_t n)
{
	while (n) {
		ssize_t r = getrandom(p, n, 0);

		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += r;
		n -= (size_t)r;
	}
	return 0;
}

int wsd_random(void *buf, size_t n)
{
	int r;

	if (n > POOL / 4)
		return draw(buf, n);   /* large draws straight from the kernel */
	if (pool.left < n) {
		pool.left = 0;
		if ((r = draw(pool.b, POOL)))
			return r;
		pool.left = POOL;
	}
	memcpy(buf, pool.b + POOL - pool.left, n);
	/* a byte handed out is not kept */
	memset(pool.b + POOL - pool.left, 0, n);
	pool.left -= (unsigned)n;
	return 0;
}

void wsd_self_forget(void)
{
	atomic_store_explicit(&pid_now, 0, memory_order_relaxed);
	memset(pool.b, 0, sizeof(pool.b));
	pool.left = 0;
}

__attribute__((constructor(101))) static void self_atfork(void)
{
	pthread_atfork(NULL, NULL, wsd_self_forget);
}

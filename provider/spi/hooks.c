/* SPDX-License-Identifier: MIT */
/*
 * Memory hooks: memory that is unmapped, remapped, discarded or freed
 * leaves the SPI's registration cache first, so a registration never
 * outlives its memory (on verbs a registration pins the old pages, and a
 * new mapping at the same address would not be what the peer reads).
 *
 * Not in libwsd.so: a library that replaced free and munmap in every
 * program linking it would surprise its integrators.  This file is built
 * into libwsd-preload.so, so every program under `wsd run` has the hooks,
 * and into libwsd-hooks.so, which a program linking libwsd.so links (or
 * preloads) to opt in.  It uses only the public SPI: it is an integrator
 * that reports memory going away (WSPMemoryRegistrationCacheCallback), and
 * says so (wsd_rcache_enable) once it finds itself first in the process's
 * lookup order.  Without that the cache keeps no registration past its
 * last user.  Each hook costs one call that returns at once while nothing
 * is cached.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "wsd/wsp.h"

#define EXPORT __attribute__((visibility("default")))

static void gone(void *addr, size_t len)
{
	int err;

	if (addr && len)
		(void)WSPMemoryRegistrationCacheCallback(addr, len, &err);
}

/*
 * Each hook is a static function with the exported name as its alias: the
 * address taken below is then this library's own, not whatever the
 * process binds the name to, and the check in hooks_announce means
 * something.
 */
static int hooks_munmap(void *addr, size_t len)
{
	gone(addr, len);
	return (int)syscall(SYS_munmap, addr, len);
}

static void *hooks_mremap(void *old, size_t old_size, size_t new_size, int flags, ...)
{
	void *new_address = NULL;
	long ret;

	if (flags & MREMAP_FIXED) {
		va_list ap;

		va_start(ap, flags);
		new_address = va_arg(ap, void *);
		va_end(ap);
	}
	gone(old, old_size);
	ret = syscall(SYS_mremap, old, old_size, new_size, flags, new_address);
	return (void *)ret;
}

static int hooks_madvise(void *addr, size_t len, int advice)
{
	/* these hand the pages back: what comes later is other memory */
	if (advice == MADV_DONTNEED || advice == MADV_FREE || advice == MADV_REMOVE)
		gone(addr, len);
	return (int)syscall(SYS_madvise, addr, len, advice);
}

/*
 * free: the next free in line (the C library's, or an allocator preloaded
 * before us).  dlsym may allocate; a free that arrives while it resolves
 * is dropped (a leak of a few bytes, once), never sent to the wrong heap.
 */
static void (*next_free)(void *);
static __thread int resolving;

static void hooks_free(void *p)
{
	void (*fn)(void *) = __atomic_load_n(&next_free, __ATOMIC_ACQUIRE);

	if (!fn) {
		if (resolving)
			return;
		resolving = 1;
		fn = (void (*)(void *))dlsym(RTLD_NEXT, "free");
		resolving = 0;
		if (!fn)
			return;
		__atomic_store_n(&next_free, fn, __ATOMIC_RELEASE);
	}
	if (p)
		gone(p, malloc_usable_size(p));
	fn(p);
}

EXPORT int munmap(void *addr, size_t len) __attribute__((alias("hooks_munmap")));
EXPORT void *mremap(void *old, size_t old_size, size_t new_size, int flags, ...)
	__attribute__((alias("hooks_mremap")));
EXPORT int madvise(void *addr, size_t len, int advice) __attribute__((alias("hooks_madvise")));
EXPORT void free(void *p) __attribute__((alias("hooks_free")));

/*
 * The promise is made only where these hooks are the ones the process
 * calls: not where the program, an allocator or a sanitizer runtime comes
 * first in the lookup order (ASan's free and munmap, whose allocator also
 * unmaps by its own system calls), nor where a second copy of this file
 * (libwsd-hooks.so linked into a program run under wsd run) stands behind
 * the first.  The order is fixed once the program has started, so looking
 * at load time is enough.
 */
__attribute__((constructor)) static void hooks_announce(void)
{
	if (dlsym(RTLD_DEFAULT, "free") == (void *)hooks_free &&
	    dlsym(RTLD_DEFAULT, "munmap") == (void *)hooks_munmap)
		(void)wsd_rcache_enable();
}

/* SPDX-License-Identifier: MIT */
/*
 * Memory hooks of libwsd.so: memory that is unmapped, remapped, discarded
 * or freed leaves the SPI's registration cache first, so a registration
 * never outlives its memory (on verbs a registration pins the old pages,
 * and a new mapping at the same address would not be what the peer reads).
 *
 * Built into the shared library only: a program that loads libwsd.so
 * (linked, or preloaded by `wsd run`) gets these in front of the C
 * library's.  Each costs one relaxed load while nothing is cached.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "provider/spi/spi.h"

#define EXPORT __attribute__((visibility("default")))

EXPORT int munmap(void *addr, size_t len)
{
	wsp_rc_invalidate(addr, len);
	return (int)syscall(SYS_munmap, addr, len);
}

EXPORT void *mremap(void *old, size_t old_size, size_t new_size, int flags, ...)
{
	void *new_address = NULL;
	long ret;

	if (flags & MREMAP_FIXED) {
		va_list ap;

		va_start(ap, flags);
		new_address = va_arg(ap, void *);
		va_end(ap);
	}
	wsp_rc_invalidate(old, old_size);
	ret = syscall(SYS_mremap, old, old_size, new_size, flags, new_address);
	return (void *)ret;
}

EXPORT int madvise(void *addr, size_t len, int advice)
{
	/* these hand the pages back: what comes later is other memory */
	if (advice == MADV_DONTNEED || advice == MADV_FREE || advice == MADV_REMOVE)
		wsp_rc_invalidate(addr, len);
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
		wsp_rc_invalidate(p, malloc_usable_size(p));
	fn(p);
}

EXPORT void free(void *p) __attribute__((alias("hooks_free")));

/*
 * Whether a free in this process passes through hooks_free: not where an
 * allocator or a sanitizer runtime comes first in the lookup order (ASan's
 * free, whose allocator also unmaps by its own system calls).  Then the
 * cache must keep no registration past its last user (mem.c).
 */
bool wsp_hooks_first(void)
{
	return dlsym(RTLD_DEFAULT, "free") == (void *)hooks_free;
}

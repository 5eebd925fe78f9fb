/* SPDX-License-Identifier: MIT */
/*
 * The registration cache forgets memory that goes away: freed, unmapped,
 * remapped or discarded.  Linked against libwsd.so and libwsd-hooks.so,
 * as an integrator who opts in: the hooks stand in front of the C
 * library's and say so (wsd_rcache_enable).
 *
 * Built twice more.  rcache_nohook_test (NO_HOOKS) links libwsd.so alone:
 * the cache cannot hear of memory going away, so it keeps no registration
 * after its last user (a buffer freed and another allocated at its address
 * would be written through the old, pinned pages), until the program
 * promises to report what goes away itself.  rcache_ahead_test
 * (FREE_AHEAD) links the hooks but has a free of its own ahead of them
 * (ASan's is, in a sanitizer build, and its allocator also unmaps by its
 * own system calls): the hooks see that and promise nothing.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "tests/pair.h"
#include "wsd/wsp.h"

static WSAPROTOCOL_INFO info;
static SOCKET s;

static void setup(void)
{
	WSPDATA d;
	WSPPROC_TABLE t = { .cbSize = sizeof(t) };
	int err;

	ck_assert_int_eq(WSPStartup(WSP_VERSION, &d, &info, NULL, &t), 0);
	s = WSPSocket(AF_INET, SOCK_STREAM, 0, &info, 0, 0, &err);
	ck_assert(s != INVALID_SOCKET);
}

/* Still registered: deregistration works.  Gone: the handle is unknown. */
static int handle_known(uint64_t h)
{
	int err = 0;

	if (WSPDeregisterMemory(s, h, &err) == 0)
		return 1;
	ck_assert_int_eq(err, WSAEINVAL);
	return 0;
}

static void *region(size_t n)
{
	void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	ck_assert(p != MAP_FAILED);
	memset(p, 1, n);
	return p;
}

#if defined(FREE_AHEAD) && !defined(WSD_SANITIZERS)
/* the program's own free, first in the lookup order: the hooks' is not called */
extern void __libc_free(void *p);

void free(void *p)
{
	__libc_free(p);
}
#endif

#if defined(NO_HOOKS) || defined(FREE_AHEAD)
START_TEST(not_kept_without_hooks)
{
	void *p = region(65536);
	int err;
	uint64_t a = WSPRegisterMemory(s, p, 65536, MEM_READWRITE, &err);

	ck_assert(a);
	/* while in use, the same registration serves a buffer inside it */
	ck_assert(WSPRegisterMemory(s, p, 4096, MEM_READ, &err) == a);
	ck_assert(handle_known(a));
	ck_assert(handle_known(a));
	/* released by its last user: gone, and the next one registers anew */
	ck_assert(!handle_known(a));
	ck_assert(WSPRegisterMemory(s, p, 4096, MEM_READ, &err) != a);
}
END_TEST
#endif

#ifdef NO_HOOKS
/*
 * A program without hooks that promises to report what goes away: the cache
 * keeps what nobody uses, and forgets it when told.
 */
START_TEST(kept_when_reported)
{
	void *p = region(65536);
	int err;
	uint64_t a;

	ck_assert_int_eq(wsd_rcache_enable(), 0);
	a = WSPRegisterMemory(s, p, 65536, MEM_READWRITE, &err);
	ck_assert(a);
	ck_assert(handle_known(a));
	ck_assert(WSPRegisterMemory(s, p, 4096, MEM_READ, &err) == a);
	ck_assert(handle_known(a));
	/* the program's report, before the memory goes */
	ck_assert_int_eq(WSPMemoryRegistrationCacheCallback(p, 65536, &err), 0);
	ck_assert(!handle_known(a));
	ck_assert_int_eq(munmap(p, 65536), 0);
}
END_TEST
#endif

/*
 * What a program does: free a registered buffer after its last use and
 * allocate again, often at the same address.  The new buffer's
 * registration is its own, hooks or not.
 */
START_TEST(freed_then_reallocated)
{
	int err;

	for (int i = 0; i < 8; i++) {
		uint8_t *p = malloc(1 << 20), *q;
		uint64_t a, b;

		ck_assert(p);
		memset(p, i, 1 << 20);
		a = WSPRegisterMemory(s, p, 1 << 20, MEM_READWRITE, &err);
		ck_assert(a);
		ck_assert(handle_known(a));
		free(p);
		q = malloc(1 << 20);
		ck_assert(q);
		b = WSPRegisterMemory(s, q, 1 << 20, MEM_READWRITE, &err);
		ck_assert(b && b != a);
		ck_assert(handle_known(b));
		free(q);
	}
}
END_TEST

START_TEST(cached_until_released)
{
	void *p = region(65536);
	int err;
	uint64_t a = WSPRegisterMemory(s, p, 65536, MEM_READWRITE, &err);

	ck_assert(a);
	ck_assert(handle_known(a));
	/* kept after its last user: the next registration finds it */
	ck_assert(WSPRegisterMemory(s, p, 4096, MEM_READ, &err) == a);
	ck_assert(handle_known(a));
}
END_TEST

/*
 * A registration next to an unused one takes it in: a program that works
 * through a buffer a piece at a time ends with one registration over it.
 */
START_TEST(unused_neighbours_taken_in)
{
	uint8_t *p = region(65536);
	int err;
	uint64_t x = WSPRegisterMemory(s, p, 4096, MEM_READ, &err), y;

	ck_assert(x);
	ck_assert(handle_known(x));
	y = WSPRegisterMemory(s, p + 4096, 4096, MEM_READ, &err);
	ck_assert(y && y != x);
	ck_assert(handle_known(y));
	/* one registration covers both pages now, and the first is gone */
	ck_assert(WSPRegisterMemory(s, p + 1000, 6000, MEM_READ, &err) == y);
	ck_assert(handle_known(y));
	ck_assert(!handle_known(x));
}
END_TEST

START_TEST(freed)
{
	int err;
	void *big = malloc(1 << 20), *small = malloc(100);
	uint64_t a = WSPRegisterMemory(s, big, 1 << 20, MEM_WRITE, &err);
	uint64_t b = WSPRegisterMemory(s, small, 100, MEM_WRITE, &err);

	ck_assert(a && b);
	free(big);
	ck_assert(!handle_known(a));
	free(small);
	ck_assert(!handle_known(b));
}
END_TEST

START_TEST(unmapped_remapped_discarded)
{
	int err;
	void *p = region(65536), *q = region(65536), *r = region(65536);
	uint64_t a = WSPRegisterMemory(s, p, 65536, MEM_WRITE, &err);
	uint64_t b = WSPRegisterMemory(s, q, 65536, MEM_WRITE, &err);
	uint64_t c = WSPRegisterMemory(s, r, 65536, MEM_WRITE, &err);

	ck_assert(a && b && c);
	ck_assert_int_eq(munmap(p, 65536), 0);
	ck_assert(!handle_known(a));
	ck_assert(mremap(q, 65536, 131072, MREMAP_MAYMOVE) != MAP_FAILED);
	ck_assert(!handle_known(b));
	ck_assert_int_eq(madvise(r, 65536, MADV_DONTNEED), 0);
	ck_assert(!handle_known(c));
}
END_TEST

int main(void)
{
	TCase *tc;

	setenv("WSD_TRANSPORT", "shm", 1);
#if defined(NO_HOOKS) || defined(FREE_AHEAD)
	tc = t_case("nohooks", 0, NULL);
	tcase_add_checked_fixture(tc, setup, NULL);
	tcase_add_test(tc, not_kept_without_hooks);
	tcase_add_test(tc, freed_then_reallocated);
#ifdef NO_HOOKS
	tcase_add_test(tc, kept_when_reported);
#endif
	return t_run("rcache_nohooks", tc);
#endif
#ifdef WSD_SANITIZERS
	/* ASan's runtime comes first in every link and takes free and munmap
	 * for itself; the hooks are tested in the ordinary build. */
	puts("rcache_hook_test: the sanitizer runtime owns free/munmap here; skipped");
	return 77;
#endif
	tc = t_case("hooks", 0, NULL);
	tcase_add_checked_fixture(tc, setup, NULL);
	tcase_add_test(tc, cached_until_released);
	tcase_add_test(tc, unused_neighbours_taken_in);
	tcase_add_test(tc, freed);
	tcase_add_test(tc, freed_then_reallocated);
	tcase_add_test(tc, unmapped_remapped_discarded);
	return t_run("rcache_hooks", tc);
}

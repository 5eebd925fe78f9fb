/* SPDX-License-Identifier: MIT */
/*
 * Pieces the shm targets share: cutting the fuzzer's input into set-up
 * messages, and pointing a message's probe address into a page this
 * process owns (else the proof's process_vm_readv would only ever fail).
 */
#ifndef WSD_FUZZ_SHM_H
#define WSD_FUZZ_SHM_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "provider/shm/shm.h"
#include "tests/fuzz/fuzz_threads.h"

/*
 * The provider's engine is not linked into the shm targets: its log says
 * nothing, its threads are not counted (fuzz_threads.h), the fork
 * bookkeeping of the listener's name socket (wsd_fd_named,
 * provider/engine.c) has no fork to serve here, and no parameter is set
 * (no rendezvous directory: the listener's abstract name alone).
 */
const char *wsd_param_str(const char *name)
{
	(void)name;
	return "";
}

void wsd_debug(const char *fmt, ...)
{
	(void)fmt;
}

void wsd_fd_named(int fd, bool on)
{
	(void)fd;
	(void)on;
}

/* The next message: len bytes (cut to what is left and to cap) into msg. */
static inline size_t fuzz_take(const uint8_t **data, size_t *size, size_t len, uint8_t *msg,
			       size_t cap)
{
	if (len > *size)
		len = *size;
	if (len > cap)
		len = cap;
	memcpy(msg, *data, len);
	*data += len;
	*size -= len;
	return len;
}

/* msg's probe address, when it has one, somewhere in page where a nonce fits. */
static inline void fuzz_probe_in(uint8_t *msg, size_t len, const void *page)
{
	uint64_t a;

	if (len < offsetof(struct shm_ctl, probe_addr) + 8)
		return;
	memcpy(&a, msg + offsetof(struct shm_ctl, probe_addr), 8);
	a = (uint64_t)(uintptr_t)page + a % (4096 - SHM_NONCE + 1);
	memcpy(msg + offsetof(struct shm_ctl, probe_addr), &a, 8);
}

#endif

/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer: the connector's side of the shm proof (provider/shm/proof.c,
 * shm_prove_connector) against a listener's answers: PROVE_ACK (our nonce
 * as it read it, where its own lies, the TCP listener it names) and
 * PROVED, or anything else, queued before the call.  Input: a flags byte,
 * then records of a 16-bit length and the message's bytes.  Flags: bit 0
 * points each message's probe_addr into a page of this process holding
 * the input's last 16 bytes (the fuzzer cannot guess an address); bit 1
 * asks for the owner check (owner.c) of the tcp_fd the answer names, on
 * port 1 of 127.0.0.1.  getrandom gives zeros during the call, so that our
 * nonce is 16 zero bytes the fuzzer can echo.
 *
 * FUZZ_SOURCES: provider/shm/ctl.c provider/shm/proof.c provider/shm/owner.c provider/shm/listen.c provider/shm/rdv.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "provider/shm/shm.h"
#include "tests/fuzz/fuzz_shm.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int fake_random;

/* The process's getrandom: zeros while fake_random is set. */
ssize_t getrandom(void *buf, size_t n, unsigned int flags)
{
	if (fake_random) {
		memset(buf, 0, n);
		return (ssize_t)n;
	}
	return syscall(SYS_getrandom, buf, n, flags);
}

static int lowest_free(void)
{
	int fd = dup(0);

	if (fd >= 0)
		close(fd);
	return fd;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static uint8_t *page;
	struct shm_owner owner = { .addr = { [10] = 0xff, [11] = 0xff, [12] = 127, [15] = 1 },
				   .port = 1 };
	struct shm_ctl first = { 0 }, m;
	uint8_t flags;
	int sv[2], before, ret, nmsg = 0, proved = 0;

	if (!page) {
		page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (page == MAP_FAILED)
			abort();
	}
	if (size < 1)
		return 0;
	if (size >= 16)
		memcpy(page + 4096 - 16, data + size - 16, 16);
	flags = data[0];
	data++;
	size--;
	before = lowest_free();
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
		return 0;
	while (size >= 2 && nmsg < 8) {
		uint8_t msg[512];
		size_t len = (size_t)data[0] | (size_t)data[1] << 8;

		data += 2;
		size -= 2;
		len = fuzz_take(&data, &size, len, msg, sizeof(msg));
		if (flags & 1)
			fuzz_probe_in(msg, len, page);
		if (len == sizeof(m)) {
			memcpy(&m, msg, sizeof(m));
			if (nmsg == 0)
				first = m;
			else if (m.type == SHM_PROVED || m.type == SHM_REJECT)
				proved |= m.type == SHM_PROVED;
		}
		if (send(sv[1], msg, len, MSG_DONTWAIT) < 0)
			break;
		nmsg++;
	}
	fake_random = 1;
	ret = shm_prove_connector(sv[0], getpid(), (flags & 2) ? &owner : NULL, 0);
	fake_random = 0;
	/* proven only by a PROVE_ACK that echoed our nonce, then a PROVED */
	if (ret == 0) {
		static const uint8_t zero[SHM_NONCE];

		if (first.magic != SHM_MAGIC || first.version != SHM_VERSION ||
		    first.type != SHM_PROVE_ACK || memcmp(first.nonce, zero, SHM_NONCE) || !proved)
			abort();
	} else if (ret != -EACCES && ret != -EPROTO && ret != -ETIMEDOUT && ret != -ECONNREFUSED &&
		   ret != -ECONNABORTED && ret != -EPIPE && ret != -EBUSY) {
		abort();    /* an error the caller does not map (conn.c, setup_status) */
	}
	close(sv[0]);
	close(sv[1]);
	if (lowest_free() != before)
		abort();
	return 0;
}

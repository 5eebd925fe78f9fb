/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer: one shm control message as shm_recv_ctl (provider/shm/ctl.c)
 * takes it off the unix socket, with descriptors, and the layout check of
 * a HELLO (shm_layout_ok).  Input: a byte saying how many descriptors go
 * with the message (low 3 bits, 0-4: eventfds) and how many the receiver
 * expects (next 2 bits, 0-3), then the message's bytes as sent (any
 * length up to 512: a short or long one must be refused).
 *
 * FUZZ_SOURCES: provider/shm/ctl.c
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "provider/shm/shm.h"
#include "tests/fuzz/fuzz_threads.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The lowest free descriptor: the same after a case, or the case leaked one. */
static int lowest_free(void)
{
	int fd = dup(0);

	if (fd >= 0)
		close(fd);
	return fd;
}

static void send_msg(int sock, const uint8_t *msg, size_t len, int nsend)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * 4)];
		struct cmsghdr align;
	} u;
	struct iovec iov = { .iov_base = (void *)msg, .iov_len = len };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	int fds[4];

	if (nsend) {
		struct cmsghdr *cm;

		memset(&u, 0, sizeof(u));
		for (int i = 0; i < nsend; i++)
			fds[i] = eventfd(0, EFD_CLOEXEC);
		mh.msg_control = u.buf;
		mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nsend);
		cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nsend);
		memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)nsend);
	}
	(void)sendmsg(sock, &mh, MSG_DONTWAIT);
	for (int i = 0; i < nsend; i++)
		close(fds[i]);      /* the receiver holds its own copies now */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct shm_ctl m;
	int sv[2], fds[3], nsend, nwant, ret, before;

	if (size < 1 || size > 513)
		return 0;
	nsend = data[0] & 7;
	nwant = (data[0] >> 3) & 3;
	if (nsend > 4)
		nsend = 4;
	before = lowest_free();
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
		return 0;
	send_msg(sv[1], data + 1, size - 1, nsend);
	ret = shm_recv_ctl(sv[0], &m, fds, nwant, 0);
	if (ret == 0) {
		/* what the callers rely on (listen.c, proof.c, conn.c) */
		if (size - 1 != sizeof(m) || m.magic != SHM_MAGIC || m.version != SHM_VERSION ||
		    m.plen > SHM_PRIV_MAX)
			abort();
		(void)shm_layout_ok(m.ring_size, m.nwindows);
	}
	for (int i = 0; i < nwant; i++) {
		if (ret < 0 && fds[i] != -1)
			abort();    /* a refused message hands on no descriptor */
		if (fds[i] >= 0 && fcntl(fds[i], F_GETFD) < 0)
			abort();    /* handed on, but not open */
	}
	shm_close_fds(fds, nwant);
	close(sv[0]);
	close(sv[1]);
	if (lowest_free() != before)
		abort();            /* a descriptor beyond what was asked for stayed open */
	return 0;
}

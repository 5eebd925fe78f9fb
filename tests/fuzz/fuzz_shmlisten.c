/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer: the listener's side of the shm set-up (provider/shm/listen.c,
 * pending_step), a connector's messages one after another: PROVE, ECHO,
 * HELLO with its descriptors, in any order and shape.  Input: records of
 * a flags byte, a 16-bit length and the message's bytes.  Flags: bits 0-1
 * how many descriptors go with it, bits 2-3 their kind (eventfds; a
 * memfd then eventfds, a HELLO's shape; pipes; sockets); bit 4 points
 * probe_addr into a page of this process holding the input's last 16
 * bytes (the fuzzer cannot guess an address); bit 5 writes the nonce the
 * listener made into the message (a connector that could read it).
 *
 * FUZZ_SOURCES: provider/shm/ctl.c provider/shm/proof.c provider/shm/owner.c provider/shm/rdv.c
 */
#define _GNU_SOURCE
#include <sys/eventfd.h>
#include <sys/mman.h>

#include "provider/shm/listen.c"
#include "tests/fuzz/fuzz_shm.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int lowest_free(void)
{
	int fd = dup(0);

	if (fd >= 0)
		close(fd);
	return fd;
}

static void one_fd(int kind, int i, int *out, int *extra)
{
	int pair[2];

	*extra = -1;
	switch (kind) {
	case 1:
		if (i == 0) {
			*out = memfd_create("fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);
			break;
		}
		/* fall through */
	case 0:
		*out = eventfd(0, EFD_CLOEXEC);
		break;
	case 2:
		if (pipe2(pair, O_CLOEXEC) < 0) {
			*out = -1;
			break;
		}
		*out = pair[0];
		*extra = pair[1];
		break;
	default:
		if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) < 0) {
			*out = -1;
			break;
		}
		*out = pair[0];
		*extra = pair[1];
	}
}

static void send_msg(int sock, const uint8_t *msg, size_t len, int nsend, int kind)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * 3)];
		struct cmsghdr align;
	} u;
	struct iovec iov = { .iov_base = (void *)msg, .iov_len = len };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	int fds[3], extra[3];

	for (int i = 0; i < nsend; i++)
		one_fd(kind, i, &fds[i], &extra[i]);
	if (nsend) {
		struct cmsghdr *cm;

		memset(&u, 0, sizeof(u));
		mh.msg_control = u.buf;
		mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nsend);
		cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nsend);
		memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)nsend);
	}
	(void)sendmsg(sock, &mh, MSG_DONTWAIT);
	for (int i = 0; i < nsend; i++) {
		if (fds[i] >= 0)
			close(fds[i]);
		if (extra[i] >= 0)
			close(extra[i]);
	}
}

/* What the listener answered: read and dropped (with any descriptor). */
static void drain(int sock)
{
	struct shm_ctl m;
	int fds[3];

	while (shm_recv_ctl(sock, &m, fds, 3, 0) != -ETIMEDOUT) {
		shm_close_fds(fds, 3);
		if (fcntl(sock, F_GETFD) < 0)
			break;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static uint8_t *page;
	struct nd_adapter ad;
	struct nd_listener l = { .ad = &ad };
	struct shm_listener sl = { .fd = -1, .epfd = -1 };
	struct pending p = { 0 };
	struct shm_request r;
	int sv[2], before, ret = 0;

	if (!page) {
		page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (page == MAP_FAILED)
			abort();
	}
	if (size >= 16)
		memcpy(page + 4096 - 16, data + size - 16, 16);
	memset(&ad, 0, sizeof(ad));
	pthread_mutex_init(&ad.lock, NULL);
	atomic_init(&sl.tcp_fd, -1);
	before = lowest_free();
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) < 0)
		return 0;
	p.sock = sv[0];
	p.pid = getpid();
	p.state = P_PROVE;
	p.deadline = wsd_now_ms() + SHM_PROOF_MS;
	while (size >= 3 && ret == 0) {
		uint8_t flags = data[0], msg[512];
		size_t len = (size_t)data[1] | (size_t)data[2] << 8;

		data += 3;
		size -= 3;
		len = fuzz_take(&data, &size, len, msg, sizeof(msg));
		if (flags & 0x10)
			fuzz_probe_in(msg, len, page);
		if ((flags & 0x20) && p.nonce.at && len >= offsetof(struct shm_ctl, nonce) + SHM_NONCE)
			memcpy(msg + offsetof(struct shm_ctl, nonce), p.nonce.at, SHM_NONCE);
		send_msg(sv[1], msg, len, flags & 3, (flags >> 2) & 3);
		memset(&r, 0, sizeof(r));
		ret = pending_step(&l, &sl, &p, &r);
		drain(sv[1]);
	}
	if (ret == 1) {
		/* a request the application may be given: what accept_op relies on */
		if (r.sock != sv[0] || r.memfd < 0 || r.in_efd < 0 || r.out_efd < 0 ||
		    r.hello.type != SHM_HELLO || !shm_layout_ok(r.hello.ring_size, r.hello.nwindows) ||
		    r.hello.plen > SHM_PRIV_MAX || r.hello.plen > sizeof(((struct nd_conn_request *)0)->data) ||
		    shm_check_eventfd(r.in_efd) || shm_check_eventfd(r.out_efd) || p.state != P_HELLO)
			abort();
		close(r.memfd);
		close(r.in_efd);
		close(r.out_efd);
	}
	shm_nonce_free(&p.nonce);
	close(sv[0]);
	close(sv[1]);
	pthread_mutex_destroy(&ad.lock);
	if (lowest_free() != before)
		abort();
	return 0;
}

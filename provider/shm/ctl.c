/* SPDX-License-Identifier: MIT */
/*
 * shm control messages: one struct shm_ctl per SOCK_SEQPACKET message on
 * the connection's unix socket, with descriptors as SCM_RIGHTS.  Every
 * receive is bounded by a timeout, and descriptors beyond what the caller
 * expects are closed at once, so a peer cannot make us wait or leak.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "provider/shm/shm.h"

#define CTL_MAX_FDS 4

int shm_send_ctl(int sock, const struct shm_ctl *m, const int *fds, int nfds)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * CTL_MAX_FDS)];
		struct cmsghdr align;
	} u;
	struct iovec iov = { .iov_base = (void *)m, .iov_len = sizeof(*m) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };

	if (nfds) {
		struct cmsghdr *cm;

		memset(&u, 0, sizeof(u));
		mh.msg_control = u.buf;
		mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
		cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
		memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)nfds);
	}
	/* never block on a peer that stops reading: the socket buffer holds a few */
	return sendmsg(sock, &mh, MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)sizeof(*m) ? 0 : -EPIPE;
}

int shm_wait_readable(int fd, int timeout_ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	int ret = wsd_wait_fds(&p, 1, timeout_ms);   /* a signal does not start it again */

	if (ret < 0)
		return -errno;
	return ret ? 0 : -ETIMEDOUT;
}

/*
 * Receive one control message and up to nfds descriptors (-1 where absent).
 * timeout_ms 0 takes only what is already there (-ETIMEDOUT if nothing).
 */
int shm_recv_ctl(int sock, struct shm_ctl *m, int *fds, int nfds, int timeout_ms)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * CTL_MAX_FDS)];
		struct cmsghdr align;
	} u;
	struct iovec iov = { .iov_base = m, .iov_len = sizeof(*m) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
			     .msg_controllen = sizeof(u.buf) };
	ssize_t n;
	int ret;

	for (int i = 0; i < nfds; i++)
		fds[i] = -1;
	ret = shm_wait_readable(sock, timeout_ms);
	if (ret < 0)
		return ret;
	n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
		return -ETIMEDOUT;
	for (struct cmsghdr *cm = n >= 0 ? CMSG_FIRSTHDR(&mh) : NULL; cm;
	     cm = CMSG_NXTHDR(&mh, cm)) {
		if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
			int got = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
			int tmp[CTL_MAX_FDS];

			if (got > CTL_MAX_FDS)
				got = CTL_MAX_FDS;
			memcpy(tmp, CMSG_DATA(cm), sizeof(int) * (size_t)got);
			for (int i = 0; i < got; i++) {
				if (i < nfds && fds[i] < 0)
					fds[i] = tmp[i];
				else
					close(tmp[i]);
			}
		}
	}
	if (n == 0) {
		/* the end, or an empty message that may still carry descriptors */
		shm_close_fds(fds, nfds);
		return -ECONNABORTED;
	}
	if (n < 0)
		return -errno;
	if (n != (ssize_t)sizeof(*m) || (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) ||
	    m->magic != SHM_MAGIC || m->version != SHM_VERSION || m->plen > SHM_PRIV_MAX) {
		shm_close_fds(fds, nfds);
		return -EPROTO;
	}
	return 0;
}

/* A HELLO's layout (here, with the other checks of a message, for tests/fuzz). */
int shm_layout_ok(uint32_t ring_size, uint32_t nwindows)
{
	return ring_size >= SHM_RING_MIN && ring_size <= SHM_RING_MAX &&
	       !(ring_size & (ring_size - 1)) && nwindows >= 1 && nwindows <= SHM_WINDOWS_MAX;
}

void shm_close_fds(int *fds, int n)
{
	for (int i = 0; i < n; i++)
		if (fds[i] >= 0) {
			close(fds[i]);
			fds[i] = -1;
		}
}

void shm_reject(int sock, uint16_t type, nd_status why)
{
	struct shm_ctl m = { .magic = SHM_MAGIC, .version = SHM_VERSION, .type = type,
			     .reason = why };

	(void)shm_send_ctl(sock, &m, NULL, 0);
}

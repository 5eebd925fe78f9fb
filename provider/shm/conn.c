/* SPDX-License-Identifier: MIT */
/*
 * shm connection setup.  A listener is an abstract unix socket named after
 * the port, so it is scoped to the network namespace.  The connector sends
 * HELLO with the shared memfd and its CQ doorbells; the acceptor answers
 * ACCEPT with its doorbells; the connector confirms with RTU.  Each side
 * first checks that it may read the other's memory (same uid, and a
 * one-byte process_vm_readv probe of a byte the peer names), so a pair that
 * could not ptrace each other is refused before any data moves.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/membarrier.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "provider/shm/shm.h"

/* The byte a peer reads to prove it may read this process. */
static volatile uint8_t probe_byte = 0x5a;

static pthread_once_t features_once = PTHREAD_ONCE_INIT;
static uint32_t features;

/*
 * Global expedited membarrier lets a side about to sleep force a full
 * barrier on every CPU running a registered process, so producers on the
 * hot path can skip their own fence.  Both sides must be registered.
 */
static void features_init(void)
{
	long q = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);

	if (q > 0 && (q & MEMBARRIER_CMD_GLOBAL_EXPEDITED) &&
	    syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, 0, 0) == 0)
		features |= SHM_FEAT_MEMBARRIER;
}

uint32_t shm_features(void)
{
	pthread_once(&features_once, features_init);
	return features;
}

void shm_sleeper_barrier(const struct shm_conn *c)
{
	if (!c->fast_bell ||
	    syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0, 0) != 0)
		atomic_thread_fence(memory_order_seq_cst);
}

struct shm_listener {
	int fd;
};

struct shm_request {
	int sock;
	int memfd, in_efd, out_efd;
	pid_t pid;
	struct shm_ctl hello;
};

size_t shm_half_size(uint32_t ring_size, uint32_t nwindows)
{
	size_t hdr = sizeof(struct shm_half) + (size_t)nwindows * sizeof(struct shm_window);

	hdr = (hdr + 4095) & ~(size_t)4095;
	return hdr + ring_size;
}

int shm_conn_map(struct shm_conn *c, int memfd, uint32_t ring_size, uint32_t nwindows,
		 int side, int init)
{
	size_t half = shm_half_size(ring_size, nwindows);
	struct shm_half *h[2];

	if (init && ftruncate(memfd, (off_t)(2 * half)) < 0)
		return -errno;
	/* populated now, so the first lap through the rings takes no page faults */
	c->map = mmap(NULL, 2 * half, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, memfd, 0);
	if (c->map == MAP_FAILED) {
		c->map = NULL;
		return -errno;
	}
	c->map_len = 2 * half;
	h[0] = c->map;
	h[1] = (struct shm_half *)((uint8_t *)c->map + half);
	if (init) {
		for (int i = 0; i < 2; i++) {
			h[i]->ring_size = ring_size;
			h[i]->nwindows = nwindows;
			h[i]->ring_offset = half - ring_size;
			while (getrandom(&h[i]->stamp_key, sizeof(h[i]->stamp_key), 0) !=
			       sizeof(h[i]->stamp_key))
				;
		}
	} else {
		/* Trust nothing the peer wrote into the layout. */
		for (int i = 0; i < 2; i++)
			if (h[i]->ring_size != ring_size || h[i]->nwindows != nwindows ||
			    h[i]->ring_offset != half - ring_size)
				return -EPROTO;
	}
	c->tx = h[side];
	c->rx = h[!side];
	c->tx_ring = (uint8_t *)c->tx + (half - ring_size);
	c->rx_ring = (uint8_t *)c->rx + (half - ring_size);
	c->mws = calloc(nwindows, sizeof(*c->mws));
	return c->mws ? 0 : -ENOMEM;
}

void shm_conn_free(struct shm_conn *c)
{
	if (!c)
		return;
	if (c->map)
		munmap(c->map, c->map_len);
	if (c->sock >= 0)
		close(c->sock);
	if (c->pidfd >= 0)
		close(c->pidfd);
	if (c->peer_in_efd >= 0)
		close(c->peer_in_efd);
	if (c->peer_out_efd >= 0)
		close(c->peer_out_efd);
	free(c->mws);
	free(c);
}

static struct shm_conn *conn_new(void)
{
	struct shm_conn *c = calloc(1, sizeof(*c));

	if (c) {
		c->sock = c->pidfd = c->peer_in_efd = c->peer_out_efd = -1;
	}
	return c;
}

static int sock_name(const struct sockaddr *addr, socklen_t len, struct sockaddr_un *un,
		     socklen_t *unlen)
{
	unsigned port;
	int n;

	if (addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in))
		port = ntohs(((const struct sockaddr_in *)addr)->sin_port);
	else if (addr->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6))
		port = ntohs(((const struct sockaddr_in6 *)addr)->sin6_port);
	else
		return -EINVAL;
	memset(un, 0, sizeof(*un));
	un->sun_family = AF_UNIX;
	n = snprintf(un->sun_path + 1, sizeof(un->sun_path) - 1, "wsd-nd.%u", port);
	*unlen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
	return 0;
}

/* shm serves only peers on this host: is addr one of its addresses? */
static int addr_is_local(const struct sockaddr *addr, socklen_t len)
{
	struct sockaddr_storage ss;
	int fd, ok;

	if (len > sizeof(ss))
		return 0;
	memcpy(&ss, addr, len);
	if (ss.ss_family == AF_INET) {
		struct sockaddr_in *in = (struct sockaddr_in *)&ss;
		uint32_t a = ntohl(in->sin_addr.s_addr);

		if ((a >> 24) == 127 || a == INADDR_ANY)
			return 1;
		in->sin_port = 0;
	} else if (ss.ss_family == AF_INET6) {
		struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;

		if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr) || IN6_IS_ADDR_UNSPECIFIED(&in6->sin6_addr))
			return 1;
		in6->sin6_port = 0;
	} else {
		return 0;
	}
	fd = socket(ss.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return 0;
	ok = bind(fd, (struct sockaddr *)&ss, len) == 0;
	close(fd);
	return ok;
}

static int send_ctl(int sock, const struct shm_ctl *m, const int *fds, int nfds)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * 4)];
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
	return sendmsg(sock, &mh, MSG_NOSIGNAL) == (ssize_t)sizeof(*m) ? 0 : -EPIPE;
}

static int wait_readable(int fd, int timeout_ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	int ret;

	do {
		ret = poll(&p, 1, timeout_ms);
	} while (ret < 0 && errno == EINTR);
	if (ret < 0)
		return -errno;
	return ret ? 0 : -ETIMEDOUT;
}

/* Receive one control message and up to nfds descriptors (-1 where absent). */
static int recv_ctl(int sock, struct shm_ctl *m, int *fds, int nfds, int timeout_ms)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * 4)];
		struct cmsghdr align;
	} u;
	struct iovec iov = { .iov_base = m, .iov_len = sizeof(*m) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
			     .msg_controllen = sizeof(u.buf) };
	ssize_t n;
	int ret;

	for (int i = 0; i < nfds; i++)
		fds[i] = -1;
	ret = wait_readable(sock, timeout_ms);
	if (ret < 0)
		return ret;
	n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
		if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
			int got = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
			int tmp[4];

			memcpy(tmp, CMSG_DATA(cm), sizeof(int) * (size_t)(got > 4 ? 4 : got));
			for (int i = 0; i < got && i < 4; i++) {
				if (i < nfds)
					fds[i] = tmp[i];
				else
					close(tmp[i]);
			}
		}
	}
	if (n == 0)
		return -ECONNABORTED;
	if (n < 0)
		return -errno;
	if (n != (ssize_t)sizeof(*m) || m->magic != SHM_MAGIC || m->version != SHM_VERSION ||
	    m->plen > SHM_PRIV_MAX)
		return -EPROTO;
	return 0;
}

static void close_fds(int *fds, int n)
{
	for (int i = 0; i < n; i++)
		if (fds[i] >= 0)
			close(fds[i]);
}

/* May this process read the peer's memory, and the peer ours?  0 or -EACCES. */
static int access_check(int sock, uint64_t probe_addr, pid_t *pid)
{
	struct ucred cr;
	socklen_t len = sizeof(cr);
	uint8_t b;
	struct iovec l = { .iov_base = &b, .iov_len = 1 };
	struct iovec r = { .iov_base = (void *)(uintptr_t)probe_addr, .iov_len = 1 };

	if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0)
		return -errno;
	*pid = cr.pid;
	if (cr.uid != geteuid())
		return -EACCES;
	if (process_vm_readv(cr.pid, &l, 1, &r, 1, 0) != 1 || b != 0x5a)
		return -EACCES;
	return 0;
}

static int listen_op(struct nd_listener *l, void **priv, const struct sockaddr *addr,
		     socklen_t len, int backlog)
{
	struct shm_listener *sl;
	struct sockaddr_un un;
	socklen_t unlen;
	int ret = sock_name(addr, len, &un, &unlen);

	if (ret < 0)
		return ret;
	sl = calloc(1, sizeof(*sl));
	if (!sl)
		return -ENOMEM;
	sl->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (sl->fd < 0 || bind(sl->fd, (struct sockaddr *)&un, unlen) < 0 ||
	    listen(sl->fd, backlog > 0 ? backlog : 16) < 0) {
		ret = -errno;
		if (sl->fd >= 0)
			close(sl->fd);
		free(sl);
		return ret;
	}
	(void)l;
	*priv = sl;
	return 0;
}

static void listen_close_op(void *priv)
{
	struct shm_listener *sl = priv;

	close(sl->fd);
	free(sl);
}

static int listen_fd_op(void *priv)
{
	return ((struct shm_listener *)priv)->fd;
}

static void reject_sock(int sock, nd_status why)
{
	struct shm_ctl m = { .magic = SHM_MAGIC, .version = SHM_VERSION, .type = SHM_REJECT,
			     .reason = why };

	(void)send_ctl(sock, &m, NULL, 0);
}


static int remaining(int64_t deadline)
{
	int64_t left;

	if (deadline < 0)
		return -1;
	left = deadline - wsd_now_ms();
	return left > 0 ? (int)left : 0;
}

static int listen_get_op(struct nd_listener *l, void *priv, int timeout_ms,
			 struct nd_conn_request *req)
{
	struct shm_listener *sl = priv;
	int64_t deadline = timeout_ms < 0 ? -1 : wsd_now_ms() + timeout_ms;

	for (;;) {
		struct shm_request *r;
		int fds[3], sock, ret;

		ret = wait_readable(sl->fd, remaining(deadline));
		if (ret < 0)
			return ret;
		sock = accept4(sl->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (sock < 0) {
			if (errno == EAGAIN || errno == ECONNABORTED || errno == EINTR)
				continue;
			return -errno;
		}
		(void)fcntl(sock, F_SETFL, 0);
		r = calloc(1, sizeof(*r));
		if (!r) {
			close(sock);
			return -ENOMEM;
		}
		/* A connector gets a short while to say hello; a silent one is dropped. */
		ret = recv_ctl(sock, &r->hello, fds, 3, 5000);
		if (ret == 0 && (r->hello.type != SHM_HELLO || fds[0] < 0 || fds[1] < 0 ||
				 fds[2] < 0))
			ret = -EPROTO;
		if (ret == 0) {
			ret = access_check(sock, r->hello.probe_addr, &r->pid);
			if (ret < 0) {
				pthread_mutex_lock(&l->ad->lock);
				l->ad->refused_access++;
				pthread_mutex_unlock(&l->ad->lock);
				reject_sock(sock, ND_ACCESS_DENIED);
			}
		}
		if (ret < 0) {
			close_fds(fds, 3);
			close(sock);
			free(r);
			continue;
		}
		r->sock = sock;
		r->memfd = fds[0];
		r->in_efd = fds[1];
		r->out_efd = fds[2];
		req->len = r->hello.plen;
		memcpy(req->data, r->hello.priv, r->hello.plen);
		req->tpriv = r;
		return 0;
	}
}

static void request_free(struct shm_request *r)
{
	int fds[] = { r->sock, r->memfd, r->in_efd, r->out_efd };

	close_fds(fds, 4);
	free(r);
}

static void request_reject_op(struct nd_conn_request *req)
{
	struct shm_request *r = req->tpriv;

	reject_sock(r->sock, ND_CONNECTION_REFUSED);
	request_free(r);
}

/* Lock taken here: the connection goes live and joins its CQs' sleep sets. */
static nd_status conn_go_live(struct nd_ep *ep, struct shm_conn *c, const struct shm_ctl *m)
{
	c->pidfd = (int)syscall(SYS_pidfd_open, c->peer_pid, 0);
	if (c->pidfd < 0)
		return ND_CONNECTION_ABORTED;
	c->peer_read_limit = m->read_limit;
	c->fast_bell = (m->features & shm_features() & SHM_FEAT_MEMBARRIER) != 0;
	ep->peer_len = m->plen;
	memcpy(ep->peer_data, m->priv, m->plen);
	pthread_mutex_lock(&ep->ad->lock);
	if (wsd_cq_attach(ep->attr.inbound_cq, c->sock) < 0 ||
	    wsd_cq_attach(ep->attr.outbound_cq, c->sock) < 0) {
		wsd_cq_detach(ep->attr.inbound_cq, c->sock);
		pthread_mutex_unlock(&ep->ad->lock);
		return ND_INSUFFICIENT_RESOURCES;
	}
	ep->tpriv = c;
	ep->state = EP_CONNECTED;
	shm_progress(ep);   /* messages may already wait in the ring */
	wsd_ep_drain(ep);
	pthread_mutex_unlock(&ep->ad->lock);
	return ND_SUCCESS;
}

static uint32_t windows_param(void)
{
	long w = wsd_param_long("WSD_SHM_WINDOWS");

	return w > 0 && w <= 65536 ? (uint32_t)w : 256;
}

static uint32_t ring_size_param(void)
{
	long v = wsd_param_long("WSD_SHM_RING_SIZE");

	if (v < 4096 || v > (64l << 20) || (v & (v - 1)))
		v = 262144;
	return (uint32_t)v;
}

static nd_status connect_op(struct nd_ep *ep, const struct sockaddr *addr, socklen_t len,
			    const void *priv, size_t plen, int timeout_ms)
{
	struct shm_ctl m = { .magic = SHM_MAGIC, .version = SHM_VERSION, .type = SHM_HELLO };
	int64_t deadline = timeout_ms < 0 ? -1 : wsd_now_ms() + timeout_ms;
	struct sockaddr_un un;
	socklen_t unlen;
	struct shm_conn *c;
	int memfd, fds[2], ret;
	nd_status st;

	if (sock_name(addr, len, &un, &unlen) < 0)
		return ND_INVALID_PARAMETER;
	if (!addr_is_local(addr, len))
		return ND_NOT_SUPPORTED;   /* another host: not ours to serve */
	c = conn_new();
	if (!c)
		return ND_NO_MEMORY;
	m.features = shm_features();
	m.ring_size = ring_size_param();
	m.nwindows = windows_param();
	m.probe_addr = (uintptr_t)&probe_byte;
	m.read_limit = ep->attr.inbound_read_limit;
	m.plen = (uint32_t)plen;
	if (plen)
		memcpy(m.priv, priv, plen);
	memfd = memfd_create("wsd-shm", MFD_CLOEXEC);
	c->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (memfd < 0 || c->sock < 0) {
		st = ND_INSUFFICIENT_RESOURCES;
		goto fail;
	}
	ret = shm_conn_map(c, memfd, m.ring_size, m.nwindows, 0, 1);
	if (ret < 0) {
		st = wsd_nd_from_errno(ret);
		goto fail;
	}
	if (connect(c->sock, (struct sockaddr *)&un, unlen) < 0) {
		/* nobody listens on shm here: maybe another transport reaches it */
		st = errno == ECONNREFUSED || errno == ENOENT ? ND_NOT_SUPPORTED :
							       wsd_nd_from_errno(-errno);
		goto fail;
	}
	{
		int out[3] = { memfd, ep->attr.inbound_cq->efd, ep->attr.outbound_cq->efd };

		if (send_ctl(c->sock, &m, out, 3) < 0) {
			st = ND_CONNECTION_REFUSED;
			goto fail;
		}
	}
	ret = recv_ctl(c->sock, &m, fds, 2, remaining(deadline));
	if (ret < 0) {
		st = ret == -ETIMEDOUT ? ND_TIMEOUT : ND_CONNECTION_REFUSED;
		goto fail;
	}
	if (m.type == SHM_REJECT) {
		close_fds(fds, 2);
		st = m.reason == ND_ACCESS_DENIED ? ND_ACCESS_DENIED : ND_CONNECTION_REFUSED;
		goto fail;
	}
	c->peer_in_efd = fds[0];
	c->peer_out_efd = fds[1];
	if (m.type != SHM_ACCEPT || fds[0] < 0 || fds[1] < 0) {
		st = ND_CONNECTION_ABORTED;
		goto fail;
	}
	if (access_check(c->sock, m.probe_addr, &c->peer_pid) < 0) {
		struct shm_ctl a = { .magic = SHM_MAGIC, .version = SHM_VERSION,
				     .type = SHM_ABORT, .reason = ND_ACCESS_DENIED };

		(void)send_ctl(c->sock, &a, NULL, 0);
		pthread_mutex_lock(&ep->ad->lock);
		ep->ad->refused_access++;
		pthread_mutex_unlock(&ep->ad->lock);
		st = ND_ACCESS_DENIED;
		goto fail;
	}
	{
		struct shm_ctl rtu = { .magic = SHM_MAGIC, .version = SHM_VERSION,
				       .type = SHM_RTU };

		if (send_ctl(c->sock, &rtu, NULL, 0) < 0) {
			st = ND_CONNECTION_ABORTED;
			goto fail;
		}
	}
	close(memfd);
	memfd = -1;
	st = conn_go_live(ep, c, &m);
	if (st == ND_SUCCESS)
		return st;
fail:
	if (memfd >= 0)
		close(memfd);
	shm_conn_free(c);
	return st;
}

static nd_status accept_op(struct nd_ep *ep, struct nd_conn_request *req, const void *priv,
			   size_t plen, int timeout_ms)
{
	struct shm_request *r = req->tpriv;
	struct shm_ctl m = { .magic = SHM_MAGIC, .version = SHM_VERSION, .type = SHM_ACCEPT };
	struct shm_ctl hello = r->hello;
	struct shm_conn *c = conn_new();
	nd_status st = ND_NO_MEMORY;
	int ret;

	if (!c)
		goto fail;
	if (hello.nwindows > 65536 || hello.ring_size < 4096 || hello.ring_size > (64u << 20) ||
	    (hello.ring_size & (hello.ring_size - 1))) {
		st = ND_CONNECTION_ABORTED;
		goto fail;
	}
	ret = shm_conn_map(c, r->memfd, hello.ring_size, hello.nwindows, 1, 0);
	if (ret < 0) {
		st = ND_CONNECTION_ABORTED;
		goto fail;
	}
	m.probe_addr = (uintptr_t)&probe_byte;
	m.read_limit = ep->attr.inbound_read_limit;
	m.features = shm_features();
	m.plen = (uint32_t)plen;
	if (plen)
		memcpy(m.priv, priv, plen);
	{
		int out[2] = { ep->attr.inbound_cq->efd, ep->attr.outbound_cq->efd };

		if (send_ctl(r->sock, &m, out, 2) < 0) {
			st = ND_CONNECTION_ABORTED;
			goto fail;
		}
	}
	ret = recv_ctl(r->sock, &m, NULL, 0, timeout_ms);
	if (ret < 0 || m.type != SHM_RTU) {
		st = ret == -ETIMEDOUT ? ND_TIMEOUT :
		     (ret == 0 && m.type == SHM_ABORT && m.reason == ND_ACCESS_DENIED) ?
		     ND_ACCESS_DENIED : ND_CONNECTION_ABORTED;
		goto fail;
	}
	c->sock = r->sock;
	c->peer_in_efd = r->in_efd;
	c->peer_out_efd = r->out_efd;
	c->peer_pid = r->pid;
	r->sock = r->in_efd = r->out_efd = -1;
	st = conn_go_live(ep, c, &hello);
	if (st == ND_SUCCESS) {
		request_free(r);
		return st;
	}
fail:
	shm_conn_free(c);
	request_free(r);
	return st;
}

static const struct nd_adapter_info shm_caps = {
	.transport = "shm",
	.flags = ND_ADAPTER_FLAG_RDMA_READ_LOCAL_INVALIDATE_SUPPORTED |
		 ND_ADAPTER_FLAG_MEMORY_WINDOWS,
	.max_inbound_sge = 32,
	.max_outbound_sge = 32,
	.max_inbound_requests = 16384,
	.max_outbound_requests = 16384,
	.max_cq_entries = 65536,
	.max_inbound_read_limit = 128,
	.max_transfer_length = 1ull << 30,
	.max_registration_size = 1ull << 40,
	.max_window_size = 1ull << 40,
	.max_windows = 256,
	.private_data_length = SHM_PRIV_MAX,
	.rdma_threshold = 65536,
};

static int adapter_open_op(void **priv, struct nd_adapter_info *caps)
{
	*priv = NULL;
	*caps = shm_caps;
	caps->max_windows = windows_param();
	/* the membarrier registration takes milliseconds: pay it here, not per connect */
	shm_features();
	return 0;
}

/* 64 unguessable bits, new at every bind. */
static uint64_t mw_token_op(struct nd_ep *ep, void *mwpriv)
{
	uint64_t token;

	(void)ep;
	(void)mwpriv;
	while (getrandom(&token, sizeof(token), 0) != sizeof(token))
		;
	return token;
}

static void ep_free_op(struct nd_ep *ep)
{
	shm_conn_free(ep->tpriv);
	ep->tpriv = NULL;
}

const struct nd_transport wsd_transport_shm = {
	.name = "shm",
	.adapter_open = adapter_open_op,
	.adapter_close = wsd_tp_none_free,
	.mr_register = wsd_tp_none_mr,
	.mr_deregister = wsd_tp_none_free,
	.mw_create = wsd_tp_none,
	.mw_destroy = wsd_tp_none_free,
	.mw_token = mw_token_op,
	.listen = listen_op,
	.listen_close = listen_close_op,
	.listen_fd = listen_fd_op,
	.listen_get = listen_get_op,
	.request_reject = request_reject_op,
	.connect = connect_op,
	.accept = accept_op,
	.disconnect = shm_disconnect,
	.ep_free = ep_free_op,
	.progress = shm_progress,
	.arm = shm_arm,
	.remote_check = shm_remote_check,
};

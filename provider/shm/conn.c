/* SPDX-License-Identifier: MIT */
/*
 * shm connections: the shared region and the connect/accept exchange.
 * The listener and the mutual proof that comes before any of this are in
 * listen.c and proof.c; the order of messages is in shm.h.
 *
 * The connector creates the region, a memfd it seals against growing and
 * shrinking, so the mapper can trust its size; the listener maps it only
 * in nd_ep_accept, after the proof, and only a size within the parameter
 * table's limits.  Each side copies the layout into struct shm_conn.
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
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "provider/fault.h"
#include "provider/shm/shm.h"

#define SEALS (F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL)

static pthread_once_t features_once = PTHREAD_ONCE_INIT;
static _Atomic uint32_t features;

/*
 * Global expedited membarrier lets a side about to sleep force a full
 * barrier on every CPU running a registered process, so producers on the
 * hot path can skip their own fence.  Both sides must be registered.
 * Registering waits for a grace period of the kernel's (14 ms measured on
 * the development machine), so the SPI begins it on its completion thread
 * (background_op), counted busy as it is (a fork waits for it, and no
 * thread of ours ends or starts near a fork for it): a connection made
 * before it is done offers no membarrier, and both its sides fence as
 * they would without one.  Without the SPI, the first to ask registers.
 */
static _Atomic bool features_begun;

static void features_register(void)
{
	long q = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);

	if (q > 0 && (q & MEMBARRIER_CMD_GLOBAL_EXPEDITED) &&
	    syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, 0, 0) == 0)
		atomic_fetch_or(&features, SHM_FEAT_MEMBARRIER);
}

static void features_begin(void)
{
	atomic_store(&features_begun, true);
	pthread_once(&features_once, features_register);
}

static void background_op(void *priv)
{
	(void)priv;
	features_begin();
}

uint32_t shm_features(void)
{
	if (!atomic_load(&features_begun))
		features_begin();
	return atomic_load(&features);
}

void shm_sleeper_barrier(const struct shm_conn *c)
{
	if (!c->fast_bell ||
	    syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0, 0) != 0)
		atomic_thread_fence(memory_order_seq_cst);
}

size_t shm_half_size(uint32_t ring_size, uint32_t nwindows)
{
	size_t hdr = sizeof(struct shm_half) + (size_t)nwindows * sizeof(struct shm_window);

	hdr = (hdr + 4095) & ~(size_t)4095;
	return hdr + ring_size;
}

/* The creator's memfd: sealed against resizing, and exactly the size we expect. */
static int memfd_ok(int memfd, size_t len)
{
	struct stat st;
	int seals = fcntl(memfd, F_GET_SEALS);

	if (seals < 0 || (seals & SEALS) != SEALS)
		return -EPROTO;
	if (fstat(memfd, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != len)
		return -EPROTO;
	return 0;
}

static void random_key(uint64_t *k)
{
	while (getrandom(k, sizeof(*k), 0) != sizeof(*k))
		;
}

int shm_conn_map(struct shm_conn *c, int memfd, uint32_t ring_size, uint32_t nwindows,
		 int side, int init)
{
	size_t half, len;
	struct shm_half *h[2];
	int flags = MAP_SHARED, ret;

	if (!shm_layout_ok(ring_size, nwindows))
		return -EPROTO;
	half = shm_half_size(ring_size, nwindows);
	len = 2 * half;
	if (init) {
		if (ftruncate(memfd, (off_t)len) < 0 || fcntl(memfd, F_ADD_SEALS, SEALS) < 0)
			return -errno;
		/* populated now, so the first lap through the rings takes no page faults */
		flags |= MAP_POPULATE;
	} else {
		ret = memfd_ok(memfd, len);
		if (ret < 0)
			return ret;
		/* populate a peer-sized region only up to what we would ask for ourselves */
		if (ring_size <= shm_ring_size_param() && nwindows <= shm_windows_param())
			flags |= MAP_POPULATE;
	}
	c->map = wsd_fault("shm-mmap", NULL) ? (errno = ENOMEM, MAP_FAILED) :
		 mmap(NULL, len, PROT_READ | PROT_WRITE, flags, memfd, 0);
	if (c->map == MAP_FAILED) {
		c->map = NULL;
		return -errno;
	}
	c->map_len = len;
	h[0] = c->map;
	h[1] = (struct shm_half *)((uint8_t *)c->map + half);
	if (init) {
		for (int i = 0; i < 2; i++) {
			h[i]->ring_size = ring_size;
			h[i]->nwindows = nwindows;
			h[i]->ring_offset = half - ring_size;
			random_key(&h[i]->stamp_key);
		}
	} else {
		/* One look at what the peer wrote; from here on only our copy counts. */
		for (int i = 0; i < 2; i++)
			if (h[i]->ring_size != ring_size || h[i]->nwindows != nwindows ||
			    h[i]->ring_offset != half - ring_size)
				return -EPROTO;
	}
	c->ring_size = ring_size;
	c->nwindows = nwindows;
	c->ring_offset = half - ring_size;
	c->tx = h[side];
	c->rx = h[!side];
	c->tx_key = c->tx->stamp_key;
	c->rx_key = c->rx->stamp_key;
	c->tx_head = c->tx_tail = c->rx_tail = 0;
	c->tx_ring = (uint8_t *)c->tx + c->ring_offset;
	c->rx_ring = (uint8_t *)c->rx + c->ring_offset;
	c->mws = calloc(nwindows, sizeof(*c->mws));
	return c->mws ? 0 : -ENOMEM;
}

/* Has the peer rewritten the layout?  That is a broken peer: the caller ends. */
int shm_layout_intact(const struct shm_conn *c)
{
	const struct shm_half *h[2] = { c->tx, c->rx };

	for (int i = 0; i < 2; i++)
		if (h[i]->ring_size != c->ring_size || h[i]->nwindows != c->nwindows ||
		    h[i]->ring_offset != c->ring_offset)
			return 0;
	return c->tx->stamp_key == c->tx_key && c->rx->stamp_key == c->rx_key;
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
	for (unsigned i = 0; i < c->nfds; i++)
		close(c->fds[i]);
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

/* Lock taken here: the connection goes live and joins its CQs' sleep sets. */
static nd_status conn_go_live(struct nd_ep *ep, struct shm_conn *c, const struct shm_ctl *m)
{
	/* by copy nothing needs the peer's process (its pid may be unknown: rendezvous) */
	if (!c->copy || c->peer_pid > 0) {
		c->pidfd = wsd_fault("shm-pidfd", NULL) ? -1 :
			   (int)syscall(SYS_pidfd_open, c->peer_pid, 0);
		if (c->pidfd < 0 && !c->copy)
			return ND_CONNECTION_ABORTED;
	}
	ep->peer_pid = (uint32_t)c->peer_pid;
	ep->rendezvous = c->rdv;
	ep->peer_uid = c->peer_uid;
	ep->no_rdma = c->copy;
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

uint32_t shm_windows_param(void)
{
	long w = wsd_param_long("WSD_SHM_WINDOWS");

	return w > 0 && w <= (long)SHM_WINDOWS_MAX ? (uint32_t)w : 256;
}

uint32_t shm_ring_size_param(void)
{
	long v = wsd_param_long("WSD_SHM_RING_SIZE");

	if (v < (long)SHM_RING_MIN || v > (long)SHM_RING_MAX || (v & (v - 1)))
		v = 262144;
	return (uint32_t)v;
}

static void count_refusal(struct nd_adapter *ad)
{
	pthread_mutex_lock(&ad->lock);
	ad->refused_access++;
	pthread_mutex_unlock(&ad->lock);
}

static nd_status setup_status(int err)
{
	switch (err) {
	case -EACCES: return ND_ACCESS_DENIED;
	case -ETIMEDOUT:
	case -ECONNRESET:   /* the registry's process went away mid-proof (it exits) */
	case -EPIPE:
		return ND_TIMEOUT;
	case -EPROTO: return ND_CONNECTION_ABORTED;
	case -EBUSY: return ND_NO_MORE_ENTRIES;   /* the listener had no room for us now */
	default: return ND_CONNECTION_REFUSED;
	}
}

/*
 * How long one registry name gets.  A full backlog is tried again every
 * few milliseconds for SHM_BUSY_MS (an honest registry takes its backlog
 * in a moment), then the name counts as busy: ND_TIMEOUT.  From the
 * connect to PROVED, SHM_NAME_MS: an honest listener drops a connector
 * that has not sent its HELLO a second after taking it (listen.c), so it
 * answers well within that once it has taken us.  Both within the
 * caller's deadline.
 */
#define SHM_BUSY_MS 100
#define SHM_NAME_MS 5000
#define SHM_ALT_MAX 4      /* alternate names tried (wsd-protocol(7)) */

static int64_t sooner(int64_t deadline, int64_t t)
{
	return deadline < 0 || t < deadline ? t : deadline;
}

/* A non-blocking connect to un, again while its backlog is full: 0 or -errno. */
static int connect_bounded(int sock, const struct sockaddr_un *un, socklen_t unlen,
			   int64_t deadline)
{
	int64_t busy_end = sooner(deadline, wsd_now_ms() + SHM_BUSY_MS);

	for (;;) {
		bool away;
		int wait;

		if (connect(sock, (const struct sockaddr *)un, unlen) == 0)
			return 0;
		if (errno != EAGAIN && errno != EINTR)
			return -errno;   /* a unix socket never answers EINPROGRESS */
		wait = wsd_ms_left(busy_end);
		if (!wait)
			return -ETIMEDOUT;
		away = wsd_threads_away();   /* a fork need not wait for the registry */
		poll(NULL, 0, wait < 5 ? wait : 5);
		wsd_threads_back(away);
	}
}

/*
 * Reach the listener on un and prove both ways (proof.c) before anything
 * of ours is handed over: a squatter on the name, of another user or
 * unable to read us, gets at most our uid's refusal and a nonce's address.
 * When the caller asked (owner not NULL), a squatter of our own user that
 * passes the proof is refused too: it holds no TCP listener on the port
 * (owner.c).  ND_NOT_SUPPORTED when nobody listens on un.
 */
static nd_status connect_prove(struct nd_ep *ep, struct shm_conn *c,
			       const struct sockaddr_un *un, socklen_t unlen,
			       const struct shm_owner *owner, int64_t deadline)
{
	int64_t name_end = sooner(deadline, wsd_now_ms() + SHM_NAME_MS);
	int ret;

	if (c->sock >= 0)
		close(c->sock);   /* the socket of a name tried before */
	c->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (c->sock < 0)
		return ND_INSUFFICIENT_RESOURCES;
	ret = connect_bounded(c->sock, un, unlen, name_end);
	if (ret < 0)
		/* nobody listens on shm here: maybe another transport reaches it */
		return ret == -ECONNREFUSED || ret == -ENOENT ? ND_NOT_SUPPORTED :
							       setup_status(ret);
	/* blocking as before from here; every wait below polls with a deadline */
	(void)fcntl(c->sock, F_SETFL, 0);
	ret = shm_peer_uid_ok(c->sock, &c->peer_pid, &c->peer_uid, ep->other_users, false);
	c->copy = ret == 0 && c->peer_uid != geteuid();
	if (ret == 0 && c->copy)
		ret = shm_prove_copy(c->sock, owner, wsd_ms_left(name_end));
	else if (ret == 0 && owner) {
		/* our own user: the listener, or any connection on it, as before */
		struct shm_owner any = *owner;

		any.from_port = 0;
		ret = shm_prove_connector(c->sock, c->peer_pid, &any, wsd_ms_left(name_end));
	} else if (ret == 0) {
		ret = shm_prove_connector(c->sock, c->peer_pid, NULL, wsd_ms_left(name_end));
	}
	if (ret == -EACCES)
		count_refusal(ep->ad);
	return ret < 0 ? setup_status(ret) : ND_SUCCESS;
}

/*
 * alt[0..n) in turn, each checked as the usual name is: ND_SUCCESS at the
 * first that passes, else the status of the first that someone listened
 * on (ND_NOT_SUPPORTED: nobody did, or none was tried).
 */
static nd_status try_alts(struct nd_ep *ep, struct shm_conn *c, const struct sockaddr_un *alt,
			  const socklen_t *altlen, int n, const struct shm_owner *check,
			  int64_t deadline)
{
	nd_status first = ND_NOT_SUPPORTED;

	for (int i = 0; i < n && wsd_ms_left(deadline) != 0; i++) {
		nd_status a = connect_prove(ep, c, &alt[i], altlen[i], check, deadline);

		wsd_debug("shm: alternate registry %s: %s", alt[i].sun_path + 1, nd_strstatus(a));
		if (a == ND_SUCCESS)
			return a;
		if (first == ND_NOT_SUPPORTED)
			first = a;
	}
	return first;
}

/*
 * The usual name first; when it fails short of our own resources, the
 * alternate names of registries whose usual name was taken (listen.c),
 * found by the kernel's lists (owner.c) from owner (NULL: none).  Every
 * one is checked as the usual one is.  The status of the usual name,
 * unless nobody was there: then that of the first alternate that was.
 */
static nd_status connect_find(struct nd_ep *ep, struct shm_conn *c, const struct sockaddr *addr,
			      socklen_t len, const struct shm_owner *owner, int64_t deadline)
{
	struct sockaddr_un un, alt[SHM_ALT_MAX];
	socklen_t unlen, altlen[SHM_ALT_MAX];
	const struct shm_owner *check = ep->owner_check ? owner : NULL;
	nd_status st, a;
	bool ahead;
	int n = 0;

	if (shm_sock_name(addr, len, &un, &unlen) < 0)
		return ND_INVALID_PARAMETER;
	/*
	 * Taking other users, a usual name another user holds is tried last
	 * when our own user has an alternate one for the port: that is the
	 * server of our user (it found the usual name taken), and whoever
	 * holds that name, a squatter perhaps, would hold us up for its
	 * deadline (SHM_NAME_MS) before.
	 */
	ahead = owner && ep->other_users && shm_name_holder(&un, unlen) != (int)geteuid();
	if (ahead) {
		n = shm_alt_names((unsigned)shm_addr_port(addr, len), owner, alt, altlen,
				  SHM_ALT_MAX);
		if (try_alts(ep, c, alt, altlen, n, check, deadline) == ND_SUCCESS)
			return ND_SUCCESS;
	}
	st = connect_prove(ep, c, &un, unlen, check, deadline);
	if (st == ND_SUCCESS || st == ND_INSUFFICIENT_RESOURCES || st == ND_NO_MEMORY ||
	    st == ND_NO_MORE_ENTRIES || !owner || (ahead && n > 0))
		return st;
	n = shm_alt_names((unsigned)shm_addr_port(addr, len), owner, alt, altlen, SHM_ALT_MAX);
	a = try_alts(ep, c, alt, altlen, n, check, deadline);
	return a == ND_SUCCESS || st == ND_NOT_SUPPORTED ? a : st;
}

/*
 * Another network namespace's registry, through the rendezvous directory
 * (rdv.c): the entry published for our end of the connection (owner_from,
 * SO_WSP_TCP_FROM), by copy whatever the user, its pid unused.  No owner
 * check (sock_diag sees only our namespace): the directory's writers are
 * who a connector trusts here, and the entry's owner must be the
 * registry's user.  ND_NOT_SUPPORTED when nothing is published for us.
 */
static nd_status connect_rdv(struct nd_ep *ep, struct shm_conn *c, int64_t deadline)
{
	uid_t owner = 0;
	int ret, sock;

	if (!ep->owner_from_len)
		return ND_NOT_SUPPORTED;
	sock = shm_rdv_find((const struct sockaddr *)&ep->owner_from, ep->owner_from_len,
			    deadline, &owner);
	if (sock < 0)
		return sock == -ENOENT || sock == -ECONNREFUSED ? ND_NOT_SUPPORTED :
		       sock == -EACCES ? ND_ACCESS_DENIED : setup_status(sock);
	if (c->sock >= 0)
		close(c->sock);
	c->sock = sock;
	(void)fcntl(c->sock, F_SETFL, 0);
	ret = shm_peer_uid_ok(c->sock, &c->peer_pid, &c->peer_uid, ep->other_users, true);
	if (ret == 0 && c->peer_uid != owner)
		ret = -EACCES;   /* the entry is not its registry's */
	c->copy = c->rdv = true;
	c->peer_pid = 0;      /* nothing by pid across namespaces */
	if (ret == 0)
		ret = shm_prove_copy(c->sock, NULL, wsd_ms_left(sooner(deadline,
								  wsd_now_ms() + SHM_NAME_MS)));
	if (ret == -EACCES)
		count_refusal(ep->ad);
	return ret < 0 ? setup_status(ret) : ND_SUCCESS;
}

static nd_status connect_op(struct nd_ep *ep, const struct sockaddr *addr, socklen_t len,
			    const void *priv, size_t plen, int timeout_ms)
{
	struct shm_ctl m = { .magic = SHM_MAGIC, .version = SHM_VERSION, .type = SHM_HELLO };
	int64_t deadline = timeout_ms < 0 ? -1 : wsd_now_ms() + timeout_ms;
	struct shm_owner owner;
	struct shm_conn *c;
	int memfd = -1, fds[2], ret;
	nd_status st;

	bool have_owner = shm_owner_want(addr, len, &owner) == 0;   /* not for port 0 */

	if (shm_addr_port(addr, len) < 0 || (ep->owner_check && !have_owner))
		return ND_INVALID_PARAMETER;
	if (ep->owner_port)
		owner.port = ep->owner_port;   /* a listener serving another TCP port (SO_WSP_TCP_PORT) */
	/* our end of the TCP connection (SO_WSP_TCP_FROM): across users, its other end may show */
	owner.from_port = 0;
	if (ep->owner_from_len) {
		struct shm_owner f;

		if (shm_owner_want((const struct sockaddr *)&ep->owner_from, ep->owner_from_len,
				   &f) == 0) {
			memcpy(owner.from, f.addr, sizeof(owner.from));
			owner.from_port = f.port;
		}
	}
	char dir[108];
	bool local = addr_is_local(addr, len);
	bool rdv = ep->owner_from_len && shm_rdv_dir(dir, sizeof(dir)) == 0;

	if (!local && !rdv)
		return ND_NOT_SUPPORTED;   /* another host: not ours to serve */
	c = conn_new();
	if (!c)
		return ND_NO_MEMORY;
	m.features = shm_features();
	m.ring_size = shm_ring_size_param();
	m.nwindows = shm_windows_param();
	m.read_limit = ep->attr.inbound_read_limit;
	m.plen = (uint32_t)plen;
	if (plen)
		memcpy(m.priv, priv, plen);
	/*
	 * The region first, before the listener's clock starts: it gives a
	 * connector SHM_PROOF_MS from its accept to a complete HELLO, and
	 * populating megabytes takes longer than that on an emulated machine.
	 */
	memfd = wsd_fault("shm-memfd", NULL) ? -1 :
		memfd_create("wsd-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (memfd < 0) {
		st = ND_INSUFFICIENT_RESOURCES;
		goto fail;
	}
	ret = shm_conn_map(c, memfd, m.ring_size, m.nwindows, 0, 1);
	if (ret < 0) {
		st = wsd_nd_from_errno(ret);
		goto fail;
	}
	st = local ? connect_find(ep, c, addr, len, have_owner ? &owner : NULL, deadline) :
		     ND_NOT_SUPPORTED;
	/* nobody here: another namespace's registry may have published for us */
	if (st == ND_NOT_SUPPORTED && rdv)
		st = connect_rdv(ep, c, deadline);
	if (st != ND_SUCCESS)
		goto fail;
	{
		int out[3] = { memfd, ep->attr.inbound_cq->efd, ep->attr.outbound_cq->efd };
		long ms;

		if (wsd_fault("shm-delay", &ms))
			usleep((useconds_t)ms * 1000);
		/* another user gets the region alone: it rings us on the socket */
		if (shm_send_ctl(c->sock, &m, out, c->copy ? 1 : 3) < 0) {
			st = ND_CONNECTION_REFUSED;
			goto fail;
		}
	}
	ret = shm_recv_ctl(c->sock, &m, fds, 2, wsd_ms_left(deadline));
	if (ret < 0) {
		st = ret == -ETIMEDOUT ? ND_TIMEOUT : ND_CONNECTION_REFUSED;
		goto fail;
	}
	if (m.type == SHM_REJECT) {
		shm_close_fds(fds, 2);
		st = ND_CONNECTION_REFUSED;
		goto fail;
	}
	c->peer_in_efd = fds[0];
	c->peer_out_efd = fds[1];
	if (m.type != SHM_ACCEPT ||
	    (c->copy ? fds[0] >= 0 || fds[1] >= 0 :
		       fds[0] < 0 || fds[1] < 0 ||
		       shm_check_eventfd(fds[0]) < 0 || shm_check_eventfd(fds[1]) < 0)) {
		shm_reject(c->sock, SHM_ABORT, ND_CONNECTION_ABORTED);
		st = ND_CONNECTION_ABORTED;
		goto fail;
	}
	{
		struct shm_ctl rtu = { .magic = SHM_MAGIC, .version = SHM_VERSION,
				       .type = SHM_RTU };

		if (shm_send_ctl(c->sock, &rtu, NULL, 0) < 0) {
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

/* The request has passed the proof (listen.c); only now is its region mapped. */
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
	ret = shm_conn_map(c, r->memfd, hello.ring_size, hello.nwindows, 1, 0);
	if (ret < 0) {
		shm_reject(r->sock, SHM_REJECT, ND_CONNECTION_REFUSED);
		st = ND_CONNECTION_ABORTED;
		goto fail;
	}
	m.read_limit = ep->attr.inbound_read_limit;
	m.features = shm_features();
	m.plen = (uint32_t)plen;
	if (plen)
		memcpy(m.priv, priv, plen);
	{
		int out[2] = { ep->attr.inbound_cq->efd, ep->attr.outbound_cq->efd };

		if (shm_send_ctl(r->sock, &m, out, r->copy ? 0 : 2) < 0) {
			st = ND_CONNECTION_ABORTED;
			goto fail;
		}
	}
	ret = shm_recv_ctl(r->sock, &m, NULL, 0, timeout_ms);
	if (ret < 0 || m.type != SHM_RTU) {
		st = ret == -ETIMEDOUT ? ND_TIMEOUT : ND_CONNECTION_ABORTED;
		goto fail;
	}
	c->sock = r->sock;
	c->peer_in_efd = r->in_efd;
	c->peer_out_efd = r->out_efd;
	c->peer_pid = r->pid;
	c->peer_uid = r->uid;
	c->copy = r->copy;
	c->rdv = r->rdv;
	r->sock = r->in_efd = r->out_efd = -1;
	st = conn_go_live(ep, c, &hello);
	if (st == ND_SUCCESS) {
		shm_request_free(r);
		return st;
	}
fail:
	shm_conn_free(c);
	shm_request_free(r);
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
	caps->max_windows = shm_windows_param();
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
	.background = background_op,
	.mr_register = wsd_tp_none_mr,
	.mr_deregister = wsd_tp_none_free,
	.mw_create = wsd_tp_none,
	.mw_destroy = wsd_tp_none_free,
	.mw_token = mw_token_op,
	.listen = shm_listen,
	.listen_close = shm_listen_close,
	.listen_owner = shm_listen_owner,
	.listen_taken = shm_listen_taken,
	.listen_publish = shm_listen_publish,
	.listen_fd = shm_listen_fd,
	.listen_get = shm_listen_get,
	.request_reject = shm_request_reject,
	.connect = connect_op,
	.accept = accept_op,
	.disconnect = shm_disconnect,
	.ep_free = ep_free_op,
	.progress = shm_progress,
	.arm = shm_arm,
	.remote_check = shm_remote_check,
	.fd_send = shm_fd_send,
	.fd_take = shm_fd_take,
};

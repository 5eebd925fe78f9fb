/* SPDX-License-Identifier: MIT */
/*
 * The session object: its receive region (a sealed memfd the peer maps on
 * shm, else anonymous memory) and staging area, registered with the SPI;
 * the handshake's part (our HELLO, the peer's region mapped); and
 * attaching it to a socket, from which the peer may switch (rx_ready).
 * Locks: attach takes mu (publish_rx_ready needs it); the rest runs
 * before the session is shared, or on atomics (region_fd).  It does not
 * move data, nor switch a direction (proof.c).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <netinet/tcp.h>
#include <time.h>

#include "switch/sess_int.h"

/* ---- the session object ---------------------------------------------------- */

static uint64_t ino_of(int fd)
{
	struct stat st;

	return fstat(fd, &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/*
 * shm: the region in a memfd the peer maps (see wsd_session_peer), with a
 * page after it holding rx_key, by which the peer knows it mapped the right
 * one.  Anonymous memory when that fails: the peer then writes by RDMA.
 */
static uint8_t *shared_region(struct wsd_session *ss)
{
	size_t len = ss->region_len + 4096;
	uint8_t *m = MAP_FAILED;
	int fd = wsd_fault("ring-memfd", NULL) ? -1 :
		 memfd_create("wsd-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	/*
	 * Sealed at its size: the peer maps it from a descriptor of its own,
	 * and a file cut short under a mapping is SIGBUS at the next access,
	 * ours or the peer's.  The peer maps only a sealed one (map_peer).
	 */
	if (fd >= 0 && ftruncate(fd, (off_t)len) == 0 &&
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0)
		m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
	if (m == MAP_FAILED) {
		if (fd >= 0)
			close(fd);
		return mmap(NULL, ss->region_len, PROT_READ | PROT_WRITE,
			    MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	}
	memcpy(m + ss->region_len, &ss->rx_key, sizeof(ss->rx_key));
	ss->region_fd = fd;
	ss->region_ino = ino_of(fd);
	ss->map_len = len;
	return m;
}

/*
 * Close our memfd, if the descriptor still is it: a program that closes
 * every descriptor (after fork, say) may have reused the number.
 */
static void region_fd_close(int fd, uint64_t ino)
{
	if (fd >= 0 && ino_of(fd) == ino)
		real.close(fd);
}

/* Our memfd is no longer needed once the peer mapped the region (or will not). */
void region_fd_check(struct wsd_session *ss)
{
	if (__atomic_load_n(&ss->region_fd, __ATOMIC_RELAXED) >= 0 && ctl_get(ss, CW_MAPPED)) {
		region_fd_close(__atomic_exchange_n(&ss->region_fd, -1, __ATOMIC_ACQ_REL),
				ss->region_ino);
	}
}

struct wsd_session *wsd_session_new(SOCKET ws, enum wsd_path path)
{
	WSPPROC_TABLE *t = wsd_spi();
	const struct wsd_switch_params *p = wsd_switch_params();
	struct wsd_session *ss = calloc(1, sizeof(*ss));
	uint32_t dlen = sizeof(ss->rx_desc);
	int err;

	if (!ss)
		return NULL;
	ss->ws = ws;
	ss->path = path;
	ss->ring_size = p->ring_size;
	ss->region_len = CTL_SIZE + ss->ring_size;
	ss->map_len = ss->region_len;
	ss->region_fd = -1;
	ss->k_base = -1;
	ss->k_tx_base = -1;
	ss->stage_len = 65536 + REC_HDR + REC_TRAILER;
	if (getrandom(&ss->rx_key, sizeof(ss->rx_key), 0) != sizeof(ss->rx_key))
		ss->rx_key = (uint64_t)(uintptr_t)ss ^ (uint64_t)time(NULL);
	ss->rx_key |= 1;   /* a zeroed header never matches position 0 */
	if (getrandom(ss->nonce, sizeof(ss->nonce), 0) != sizeof(ss->nonce))
		goto fail;  /* a guessable challenge proves nothing */
	if (path == PATH_SHM)
		ss->region = shared_region(ss);
	else
		ss->region = mmap(NULL, ss->region_len, PROT_READ | PROT_WRITE,
				  MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	ss->stage = mmap(NULL, ss->stage_len + 4096, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (ss->region == MAP_FAILED || ss->stage == MAP_FAILED)
		goto fail;
	ss->words = (uint64_t *)(ss->stage + ss->stage_len);
	ss->ctl = (struct wsd_ctl *)ss->region;
	ss->ring = ss->region + CTL_SIZE;
	ss->rxr = (struct wire_ring){ ss->ring, ss->ring_size, ss->rx_key };
	if (t->lpWSPRegisterRdmaMemory(ws, ss->region, (uint32_t)ss->region_len, MEM_WRITE,
				       ss->rx_desc, &dlen, &err))
		goto fail;
	ss->stage_handle = t->lpWSPRegisterMemory(ws, ss->stage, ss->stage_len, MEM_READ, &err);
	if (!ss->stage_handle)
		goto fail;
	/* word pairs at [0, 8), our offer's block at [8, 16) */
	ss->words_handle = t->lpWSPRegisterMemory(ws, ss->words, 128, MEM_READ, &err);
	if (!ss->words_handle)
		goto fail;
	return ss;
fail:
	wsd_session_free(ss);
	return NULL;
}

void wsd_session_abandon(struct wsd_session *ss)
{
	int err;

	if (ss->ws != INVALID_SOCKET) {
		wsd_spi()->lpWSPCloseSocket(ss->ws, &err);
		ss->ws = INVALID_SOCKET;
	}
}

void wsd_session_free(struct wsd_session *ss)
{
	int err;

	if (!ss)
		return;
	if (ss->ws != INVALID_SOCKET)
		wsd_spi()->lpWSPCloseSocket(ss->ws, &err);
	if (ss->region && ss->region != MAP_FAILED)
		munmap(ss->region, ss->map_len);
	region_fd_close(ss->region_fd, ss->region_ino);
	if (ss->peer_map)
		munmap(ss->peer_map, ss->peer_map_len);
	if (ss->stage && ss->stage != MAP_FAILED)
		munmap(ss->stage, ss->stage_len + 4096);
	free(ss);
}

void wsd_session_hello(const struct wsd_session *ss, struct wsd_hello *h, uint16_t kind)
{
	h->magic = WSD_PROTO_MAGIC;
	h->version = WSD_PROTO_VERSION;
	h->kind = kind;
	h->ring_size = ss->ring_size;
	h->key = ss->rx_key;
	memcpy(h->desc, ss->rx_desc, sizeof(h->desc));
	h->pid = ss->region_fd >= 0 ? (uint32_t)getpid() : 0;
	h->region_fd = ss->region_fd;
	memcpy(h->nonce, ss->nonce, sizeof(h->nonce));
}

/*
 * shm: map the peer's region from its memfd (pidfd_getfd: the same right
 * to the peer's memory as process_vm_writev, which the shm transport
 * checked), if it is the one the HELLO names (its key after it).  Stores
 * then replace RDMA writes: no system call, no page pinning per write.
 */
static void map_peer(struct wsd_session *ss, const struct wsd_hello *h)
{
	size_t len = CTL_SIZE + (size_t)h->ring_size + 4096;
	int pfd, fd = -1;
	struct stat st;
	uint8_t *m;
	uint64_t key;

	if (ss->path != PATH_SHM || !h->pid || h->region_fd < 0)
		return;
	pfd = wsd_fault("ring-pidfd", NULL) ? -1 : (int)syscall(SYS_pidfd_open, (pid_t)h->pid, 0);
	if (pfd >= 0) {
		fd = (int)syscall(SYS_pidfd_getfd, pfd, h->region_fd, 0);
		close(pfd);
	}
	if (fd < 0)
		return;
	/* only a region its owner cannot cut short under our stores (SIGBUS) */
	m = fstat(fd, &st) == 0 && (size_t)st.st_size == len &&
	    (fcntl(fd, F_GET_SEALS) & F_SEAL_SHRINK) && !wsd_fault("ring-mmap", NULL) ?
	    mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
	close(fd);
	if (m == MAP_FAILED)
		return;
	memcpy(&key, m + len - 4096, sizeof(key));
	if (key != h->key) {
		munmap(m, len);
		return;
	}
	ss->peer_map = m;
	ss->peer_map_len = len;
}

void wsd_session_peer(struct wsd_session *ss, const struct wsd_hello *h)
{
	memcpy(ss->peer_desc, h->desc, sizeof(ss->peer_desc));
	memcpy(ss->peer_nonce, h->nonce, sizeof(ss->peer_nonce));
	ss->peer_ring = h->ring_size;
	ss->tx_key = h->key;
	map_peer(ss, h);
	/* either way the peer's memfd can go (the word goes by the new path if mapped) */
	if (h->pid)
		put_word(ss, W_MU, CW_MAPPED, ss->peer_map ? 1 : 2);
}

static void set_stat_path(struct wsd_sock *s)
{
	wsd_stat_begin(s->stat);
	s->stat->path = (uint8_t)(s->sess->path);
	s->stat->reason = R_NONE;
	wsd_stat_end(s->stat);
}

/* mu held.  From now on the peer may switch its direction to the ring. */
void publish_rx_ready(struct wsd_sock *s)
{
	if (s->rx_ready_sent || !s->sess || s->plain_waiters || s->detached || s->rx_back)
		return;
	/*
	 * Armed first: a poll or epoll already asleep on the fd started while
	 * the socket was plain, and must hear of the peer's first ring data.
	 */
	put_word(s->sess, W_MU, CW_DATA_ARM,
		 __atomic_add_fetch(&s->sess->data_gen, 1, __ATOMIC_RELAXED) << 1);
	if (put_word(s->sess, W_MU, CW_RX_READY, 1))
		return;
	s->rx_ready_sent = true;
	s->accel = true;
}

void became_accel(struct wsd_sock *s, bool was)
{
	if (!was && s->accel) {
		socklen_t len = sizeof(s->app_nodelay);
		int one = 1;

		/*
		 * Doorbells are single bytes: Nagle would hold the second behind
		 * the first one's delayed ACK (40 ms).  getsockopt still answers
		 * what the application set.
		 */
		if (!real.getsockopt(s->fd, IPPROTO_TCP, TCP_NODELAY, &s->app_nodelay, &len) &&
		    !real.setsockopt(s->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)))
			s->nodelay_forced = true;
		set_stat_path(s);
		wsd_poll_sock_accelerated(s);
	}
}

void wsd_session_attach(struct wsd_sock *s, struct wsd_session *ss)
{
	bool was;

	pthread_mutex_lock(&s->mu);
	ss->sock = s;
	s->sess = ss;
	atomic_store(&s->upgrade_state, UP_DONE);
	was = s->accel;
	publish_rx_ready(s);
	pthread_mutex_unlock(&s->mu);
	became_accel(s, was);
	wsd_debug("switch: fd %d attached (%s)", s->fd, ss->path == PATH_VERBS ? "verbs" : "shm");
}

bool wsd_sock_accel(struct wsd_sock *s)
{
	return s->accel && !s->detached;
}

bool wsd_sock_tx_stream(struct wsd_sock *s)
{
	return s->tx_mode != DIR_RING;
}

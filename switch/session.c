/* SPDX-License-Identifier: MIT */
/*
 * The ring protocol (wsd-protocol(7)).  Each side owns a receive region:
 * control words its peer writes, then a ring its peer fills with records by
 * WSPRdmaWrite.  Each direction starts on the kernel stream; its sender
 * switches when the receiver said it is ready (rx_ready) by writing a
 * SWITCH record naming the stream byte count N; the receiver delivers
 * exactly N bytes from the kernel stream and then reads the ring.  Kernel
 * bytes after N are doorbells: sent only when the peer armed a generation
 * word, so an idle connection costs no CPU and the application's own fd
 * turns readable for poll/epoll.  Each is counted in the receiver's bells
 * word before it is sent and has a known value, so a byte a call we do not
 * see wrote or read there fails the connection at both ends (R_BYPASS).
 *
 * Each side proves it holds the TCP connection: right after its SWITCH
 * point it writes the challenge the peer sent in the handshake on the
 * stream (proof_write), which only the real TCP peer can do; the receiver
 * takes nothing from the ring before it read that proof (proof_read), and
 * the listening side sends nothing by ring before.  A listening side whose
 * ring peer fails the proof goes on over TCP as if nothing happened.
 *
 * Locks: rx_lock, then tx_lock, then mu.  Nobody sleeps holding one.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <netinet/tcp.h>
#include <linux/sockios.h>
#include <sched.h>
#include <time.h>

#include "provider/fault.h"
#include "provider/internal.h"
#include "switch/session.h"

#define W_RX 0
#define W_TX 1
#define W_MU 2
#define W_FAIL 3                     /* session_fail's: the first report only */
#define TICK_MS 10                   /* waits no doorbell can end */
/*
 * Doorbells the peer announced and our kernel socket does not hold
 * (wsd-protocol(7), Doorbells) are on their way, or were taken by a call
 * we did not see.  The kernel tells which (kernel_taken): we look again
 * every BELL_RECHECK_MS while some are missing.  A kernel that does not
 * tell leaves a grace: on one host the loopback delivers a bell within
 * the sender's call, though a loaded machine may defer that to ksoftirqd;
 * across hosts TCP retransmits a lost segment after a backoff of seconds.
 */
#define BELL_RECHECK_MS 100
#define BELL_GRACE_SHM_MS 2000
#define BELL_GRACE_VERBS_MS 10000

/*
 * struct tcp_info as Linux 4.1 and later fill it (<linux/tcp.h>), past the
 * part glibc's copy declares: tcpi_bytes_received counts every byte the
 * kernel took in order on the connection (and the FIN).
 */
struct tcp_info_rx {
	struct tcp_info base;
	uint64_t pacing_rate, max_pacing_rate, bytes_acked, bytes_received;
};
_Static_assert(offsetof(struct tcp_info_rx, bytes_received) == 128, "tcp_info layout");
#define PROOF_MS 2000                /* part of a proof waits this for the rest */

static size_t iov_total(const struct iovec *iov, int n)
{
	size_t t = 0;

	for (int i = 0; i < n; i++)
		t += iov[i].iov_len;
	return t;
}

/* A position in an iovec array. */
struct cursor {
	const struct iovec *iov;
	int n, i;
	size_t off;
};

static size_t cur_left(const struct cursor *c)
{
	size_t t = 0;

	for (int i = c->i; i < c->n; i++)
		t += c->iov[i].iov_len - (i == c->i ? c->off : 0);
	return t;
}

static void cur_skip(struct cursor *c, size_t n)
{
	while (n && c->i < c->n) {
		size_t k = c->iov[c->i].iov_len - c->off;

		if (k > n)
			k = n;
		c->off += k;
		n -= k;
		if (c->off == c->iov[c->i].iov_len) {
			c->i++;
			c->off = 0;
		}
	}
	while (c->i < c->n && c->iov[c->i].iov_len == 0)
		c->i++;
}

static size_t cur_copy_to(struct cursor *c, const uint8_t *src, size_t n)
{
	size_t done = 0;

	while (done < n && c->i < c->n) {
		size_t k = c->iov[c->i].iov_len - c->off;

		if (k > n - done)
			k = n - done;
		memcpy((uint8_t *)c->iov[c->i].iov_base + c->off, src + done, k);
		done += k;
		cur_skip(c, k);
	}
	return done;
}

static size_t cur_copy_from(struct cursor *c, uint8_t *dst, size_t n)
{
	size_t done = 0;

	while (done < n && c->i < c->n) {
		size_t k = c->iov[c->i].iov_len - c->off;

		if (k > n - done)
			k = n - done;
		memcpy(dst + done, (const uint8_t *)c->iov[c->i].iov_base + c->off, k);
		done += k;
		cur_skip(c, k);
	}
	return done;
}

static int wsa_errno(int e)
{
	switch (e) {
	case WSAECONNRESET: case WSAECONNABORTED: case WSAENOTCONN: case WSAESHUTDOWN:
	case WSAENETDOWN: case WSA_OPERATION_ABORTED:
		return ECONNRESET;
	case WSAENOBUFS:
		return ENOBUFS;
	case WSAEFAULT:
		return EFAULT;
	default:
		return EIO;
	}
}

/* Finish an SPI RDMA call: 0 or -errno. */
static int rdma_done(SOCKET ws, WSAOVERLAPPED *ov, int ret, int err)
{
	uint32_t bytes, fl;

	if (ret == 0)
		return 0;
	if (err != WSA_IO_PENDING)
		return -wsa_errno(err);
	if (!wsd_spi()->lpWSPGetOverlappedResult(ws, ov, &bytes, 1, &fl, &err))
		return -wsa_errno(err);
	return 0;
}

static int rdma_put(struct wsd_session *ss, const uint8_t *desc, WSABUFEX *b, uint32_t nb,
		    uint64_t offset)
{
	WSAOVERLAPPED ov = { .hEvent = (void *)1 };
	uint32_t n;
	int err = 0;
	int r = wsd_spi()->lpWSPRdmaWrite(ss->ws, b, nb, (void *)desc, WSP_RDMA_DESCRIPTOR_SIZE,
					  (uint32_t)offset, &n, 0, &ov, NULL, NULL, &err);

	return rdma_done(ss->ws, &ov, r, err);
}

/*
 * Into the peer's receive region: the pieces in order, each seen before the
 * next.  On shm with the peer's region mapped here, by plain stores, with a
 * store fence between pieces (a copy's fast string stores may otherwise be
 * seen out of order, as in the kernel's); else by RDMA writes.
 */
static int rdma_writev(struct wsd_session *ss, WSABUFEX *b, uint32_t nb, uint64_t offset)
{
	if (ss->peer_map) {
		uint8_t *dst = ss->peer_map + offset;

		for (uint32_t i = 0; i < nb; i++) {
			if (b[i].len == 8)
				atomic_store_explicit((_Atomic uint64_t *)(void *)dst,
						      *(const uint64_t *)(const void *)b[i].buf,
						      memory_order_release);
			else
				memcpy(dst, b[i].buf, b[i].len);
			dst += b[i].len;
			__builtin_ia32_sfence();
		}
		/*
		 * And a full fence: callers write, then read a word the peer
		 * writes (an arm, a credit), as the peer does the other way
		 * round; a load may otherwise pass our store in the store
		 * buffer, both sides read old values, and both sleep.
		 */
		atomic_thread_fence(memory_order_seq_cst);
		return 0;
	}
	return rdma_put(ss, ss->peer_desc, b, nb, offset);
}

/* Write one of the peer's control words. */
static int put_word(struct wsd_session *ss, int which, int idx, uint64_t v)
{
	uint64_t *w = &ss->words[2 * which];
	WSABUFEX b[2] = { { 8, (char *)w, ss->words_handle },
			  { 8, (char *)(w + 1), ss->words_handle } };

	if (idx == CW_CONSUMED && wsd_fault("ctl-word", NULL))
		v += 1ull << 40;      /* past what the peer sent: its check must catch it */
	w[0] = v;
	w[1] = ~v;
	return rdma_writev(ss, b, 2, (uint64_t)idx * sizeof(struct wsd_word));
}

static void protocol_fail(struct wsd_session *ss, const char *why);

/*
 * The listening side's ring peer before its proof (wsd-protocol(7),
 * "Proof"): it may be anyone who named this connection, so nothing it
 * writes is used (its words read as 0, as they started) or judged (it
 * could reset a connection not its own).  Only its SWITCH record is read,
 * and a failed proof costs it the session, never the connection.
 */
static bool peer_untrusted(const struct wsd_session *ss)
{
	const struct wsd_sock *s = ss->sock;

	return s && !s->connected_side && !atomic_load(&s->proven);
}

/*
 * A control word the peer wrote: its value when its check holds, or the
 * last that did.  Checked against what we sent (wsd_wire_word_check): the
 * bounds are ours, read under the lock that guards them (tx_pos and
 * zc_sent: tx_lock; post_gen: rx_lock), where the words that use them are
 * read.  A violation fails the connection; the last good value is returned.
 */
static uint64_t ctl_get(struct wsd_session *ss, int idx)
{
	uint64_t v, bound = idx == CW_CONSUMED ? ss->tx_pos : idx == CW_ZC_DONE ? ss->zc_sent :
			    idx == CW_CLAIM ? ss->post_gen : UINT64_MAX;
	const char *why;
	int e;

	if (peer_untrusted(ss) && idx != CW_BACK_REQ)
		return 0;
	e = wsd_wire_word_get(ss->ctl, idx, &ss->seen[idx], bound, &v, &why);
	if (e && peer_untrusted(ss))
		return 0;   /* a back request it cannot make */
	if (e)
		protocol_fail(ss, why);
	return v;
}

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
static void region_fd_check(struct wsd_session *ss)
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
static void publish_rx_ready(struct wsd_sock *s)
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

static void became_accel(struct wsd_sock *s, bool was)
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

static void prove_self(struct wsd_sock *s);

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

/* ---- doorbells --------------------------------------------------------------- */

/*
 * tx_lock held: one bell on the stream, counted (BACK tells the peer how
 * many).  Announced first (CW_BELLS, with the "one more" bit): the peer
 * takes a byte on the stream that it finds no count for as one moved by a
 * call the switch did not see.  A bell the kernel does not take is
 * unannounced again, or the peer would wait for it (and, after its grace,
 * call it stolen).  false with errno when it was not written.
 */
static bool try_bell(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;
	uint8_t bell = wsd_bell_value(ss->bells_tx + 1);
	int e;

	/* closed: the number may be another file's now (sock.c, last_close) */
	if (atomic_load(&s->closed)) {
		errno = EBADF;
		return false;
	}
	if (put_word(ss, W_TX, CW_BELLS, ss->bells_tx << 1 | 1)) {
		errno = ECONNRESET;
		return false;
	}
	if (real.send(s->fd, &bell, 1, MSG_DONTWAIT | MSG_NOSIGNAL) != 1) {
		e = errno;
		put_word(ss, W_TX, CW_BELLS, ss->bells_tx << 1);
		/*
		 * The kernel reports a reset once, to whichever call comes
		 * first: this bell took it, so keep it for the receiver, who
		 * would otherwise read a clean end of stream.
		 */
		if (e == ECONNRESET && !s->tcp_eof && !s->tcp_err) {
			s->tcp_errno = ECONNRESET;
			s->tcp_err = true;
		}
		errno = e;
		return false;
	}
	ss->bells_tx++;
	wsd_stat_add(s->stat, &s->stat->doorbells_tx, 1);
	return true;
}

/* A bell that finds the buffer full is not needed: the peer looks again after arming. */
static void doorbell(struct wsd_sock *s)
{
	(void)try_bell(s);
}

/* tx_lock held: the peer waits for data, so make its fd readable. */
static void ring_data(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;
	uint64_t v = ctl_get(ss, CW_DATA_ARM);

	if (v != ss->rung_data) {
		ss->rung_data = v;
		doorbell(s);
	}
}

static int write_record(struct wsd_sock *s, uint32_t type, struct cursor *c, uint32_t len,
			const void *inline_payload);
static void finish_kernel(struct wsd_sock *s);
static void reset_if_shut(struct wsd_sock *s);
static void arm_data(struct wsd_sock *s, bool self);
static int broken(struct wsd_sock *s, int r);
static void bells_tx_base(struct wsd_sock *s);

/*
 * tx_lock held, our SWITCH record written: the peer's challenge on the
 * stream, whole, before any doorbell (the peer reads it at our SWITCH
 * point).  0 or -errno: a stream that takes no more is a dead connection.
 */
static int proof_write(struct wsd_sock *s)
{
	const uint8_t *p = s->sess->peer_nonce;
	size_t left = WSD_NONCE;

	for (int tries = 0; left && tries < 1000; tries++) {
		ssize_t n = real.send(s->fd, p, left, MSG_DONTWAIT | MSG_NOSIGNAL);
		struct pollfd w = { .fd = s->fd, .events = POLLOUT };

		if (n > 0) {
			p += n;
			left -= (size_t)n;
			continue;
		}
		if (n < 0 && errno != EAGAIN && errno != EINTR)
			return -errno;
		real.poll(&w, 1, TICK_MS);
	}
	return left ? -ETIMEDOUT : 0;
}

/* tx_lock held: move this direction to the ring if the peer is ready. */
static bool tx_switch(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;
	uint64_t n;
	bool was;

	if (s->tx_mode == DIR_RING)
		return true;
	/*
	 * The connecting side goes first: it dialled the peer's own address
	 * (or its registry, which proved its process).  The listening side
	 * waits for that proof: its ring's peer could be anyone who named
	 * this connection's 4-tuple.
	 */
	if (!ss || s->tx_shut || s->detached || s->tx_back ||
	    (!s->connected_side && !atomic_load(&s->proven)) ||
	    !ctl_get(ss, CW_RX_READY))
		return false;
	n = s->tcp_tx;
	if (write_record(s, REC_SWITCH, NULL, sizeof(n), &n))
		return false;
	if (proof_write(s)) {
		broken(s, -ECONNRESET);
		return false;
	}
	bells_tx_base(s);
	s->tx_mode = DIR_RING;
	pthread_mutex_lock(&s->mu);
	was = s->accel;
	s->accel = true;
	pthread_mutex_unlock(&s->mu);
	became_accel(s, was);
	if (was)
		wsd_poll_sock_accelerated(s);   /* POLLOUT is the ring's to say now */
	wsd_debug("switch: fd %d sends by ring after %llu stream bytes", s->fd,
		  (unsigned long long)n);
	return true;
}

/* rx_lock held: the peer waits for room (or a zero-copy completion). */
static void ring_space(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;
	uint64_t v = ctl_get(ss, CW_SPACE_ARM);

	if (v == ss->rung_space)
		return;
	pthread_mutex_lock(&s->tx_lock);
	if (tx_switch(s)) {
		ss->rung_space = v;
		doorbell(s);
	}
	pthread_mutex_unlock(&s->tx_lock);
}

static void session_fail(struct wsd_session *ss, enum wsd_reason reason, const char *why);
static bool faulted(const struct wsd_session *ss);

/*
 * The bytes read from the kernel socket so far, by anyone, as the kernel
 * counts them (received in order, less those it still holds), or -1 when
 * it does not tell.  high: a byte arriving between the two questions makes
 * the answer one too high (for a base taken before any check), else one
 * too low (for a check): the two errors only ever hide a theft, never
 * invent one.
 */
static int64_t kernel_taken(int fd, bool high)
{
	struct tcp_info_rx ti;
	socklen_t len = sizeof(ti);
	int inq = 0;

	if (high && real.ioctl(fd, FIONREAD, &inq))
		return -1;
	if (real.getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) ||
	    len < offsetof(struct tcp_info_rx, bytes_received) + sizeof(ti.bytes_received))
		return -1;
	if (!high && real.ioctl(fd, FIONREAD, &inq))
		return -1;
	return (int64_t)(ti.bytes_received - (uint64_t)inq);
}

/*
 * The bytes written to the kernel socket so far, by anyone, as the kernel
 * counts them (acknowledged by the peer, plus those it still holds), or -1.
 * high: as kernel_taken's (an acknowledgement arriving between the two
 * questions).  Before our FIN only: the kernel counts that too.
 */
static int64_t kernel_put(int fd, bool high)
{
	struct tcp_info_rx ti;
	socklen_t len = sizeof(ti);
	int outq = 0;

	if (high && real.ioctl(fd, SIOCOUTQ, &outq))
		return -1;
	if (real.getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) ||
	    len < offsetof(struct tcp_info_rx, bytes_acked) + sizeof(ti.bytes_acked))
		return -1;
	if (!high && real.ioctl(fd, SIOCOUTQ, &outq))
		return -1;
	return (int64_t)(ti.bytes_acked + (uint64_t)outq);
}

/*
 * tx_lock held, our direction switched (its proof written): from here the
 * only bytes we write on the stream are bells, so the kernel's count of
 * bytes written stays k_tx_base + bells_tx unless a call we do not see
 * writes.
 */
static void bells_tx_base(struct wsd_sock *s)
{
	int64_t t = kernel_put(s->fd, true);

	s->sess->k_tx_base = t < 0 ? -1 : t - (int64_t)s->sess->bells_tx;
}

static void session_fail(struct wsd_session *ss, enum wsd_reason reason, const char *why);

/*
 * tx_lock held, about to end our direction (FIN by ring): bytes the
 * program wrote on the kernel socket behind our back would otherwise end
 * the stream cleanly short at the peer, the bytes neither delivered nor
 * reported (the peer's drain may not see them before our FIN record, and
 * across hosts they may still be on their way).  True when that failed
 * the connection.
 */
static bool bells_tx_check(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;
	int64_t t;

	if (ss->k_tx_base < 0 || s->tx_mode != DIR_RING || s->kernel_fin || s->tx_back)
		return false;
	t = kernel_put(s->fd, false);
	if (t < 0 || t <= ss->k_tx_base + (int64_t)ss->bells_tx)
		return false;
	session_fail(ss, R_BYPASS, "bytes were written to the kernel socket by a call the "
			       "switch did not see");
	return true;
}

/*
 * mu held, rx entering RING: from here every byte taken from the kernel
 * socket is a doorbell the drain took (bells_rx), so the kernel's count of
 * bytes taken stays k_base + bells_rx unless a call we do not see reads.
 */
static void bells_base(struct wsd_sock *s)
{
	int64_t t = kernel_taken(s->fd, true);

	s->sess->k_base = t < 0 ? -1 : t - (int64_t)s->sess->bells_rx;
}

/* The doorbells the peer still owes on the stream (mu held). */
static uint64_t bells_owed(struct wsd_session *ss)
{
	uint64_t back = ctl_get(ss, CW_BACK_BELLS);
	uint64_t ann = back ? back - 1 : wsd_bells_announced(ctl_get(ss, CW_BELLS));

	return ann > ss->bells_rx ? ann - ss->bells_rx : 0;
}

static int64_t bell_grace_ms(const struct wsd_session *ss)
{
	return ss->path == PATH_VERBS ? BELL_GRACE_VERBS_MS : BELL_GRACE_SHM_MS;
}

/*
 * mu held, our kernel socket empty, doorbells the peer announced missing:
 * on their way, or read by a call we did not see.  The kernel's count of
 * bytes taken from the socket says which; without it, bells missing for a
 * grace count as read.  While some are missing, a wait in poll, select or
 * epoll looks again in time (wsd_recheck_ms), as a blocking receive does
 * (bells_wait_ms).
 */
static void bells_due(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;
	int64_t now, left, t;
	char b;

	if (!bells_owed(ss)) {
		ss->bells_short_since = 0;
		return;
	}
	now = wsd_now_ms();
	if (!ss->bells_short_since || ss->bells_short_at != ss->bells_rx) {
		ss->bells_short_since = now;
		ss->bells_short_at = ss->bells_rx;
	}
	if (ss->k_base >= 0) {
		t = kernel_taken(s->fd, false);
		/* (a FIN that came meanwhile counts in t: the socket must still be empty) */
		if (t >= 0 && t > ss->k_base + (int64_t)ss->bells_rx &&
		    real.recv(s->fd, &b, 1, MSG_DONTWAIT | MSG_PEEK) < 0 && errno == EAGAIN) {
			session_fail(ss, R_BYPASS, "bells: announced doorbells were read from the "
					       "kernel socket by a call the switch did not see");
			return;
		}
		left = BELL_RECHECK_MS;
	} else {
		left = ss->bells_short_since + bell_grace_ms(ss) - now;
		if (left <= 0) {
			session_fail(ss, R_BYPASS, "bells: announced doorbells never came (read "
					       "behind the switch's back)");
			return;
		}
	}
	ss->bells_look_at = now + left;
	if (wsd_recheck_ms < 0 || wsd_recheck_ms > left)
		wsd_recheck_ms = (int)left;
}

/*
 * How long a blocking receive may sleep before bells_due must look again,
 * or -1.  Only without the kernel's count: with it, the bells found missing
 * before the sleep were not taken, so they are on their way and wake it
 * (and the wait stays the kernel's, with its SA_RESTART and SO_RCVTIMEO).
 */
static int bells_wait_ms(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;
	int64_t left;

	if (!ss || !ss->bells_short_since || s->rx_mode != DIR_RING || ss->k_base >= 0)
		return -1;
	left = ss->bells_look_at - wsd_now_ms();
	return left > 0 ? (int)left + 1 : 0;
}

/*
 * mu held: bytes on the stream (want at buf) that the bells word read
 * before did not cover.  That read may have met the word half written (the
 * peer announcing its next bell as we looked), and kept the last whole
 * value, older than the bytes: read it again until it is whole.  0 when
 * the bytes are announced bells after all, -EPROTO when a whole word says
 * they are not, -EAGAIN when it stays half written (the peer's switch off
 * its CPU in the middle of the write: judged later, by the grace at most).
 */
static int bells_settle(struct wsd_sock *s, const uint8_t *buf, size_t want)
{
	struct wsd_session *ss = s->sess;
	const char *why;
	int64_t now;
	uint64_t v;

	for (int i = 0; i < 1000; i++) {
		int k = wsd_wire_word_try(ss->ctl, CW_BELLS, &ss->seen[CW_BELLS], UINT64_MAX, &v,
					  &why);

		if (k < 0) {
			protocol_fail(ss, why);
			return -EPROTO;
		}
		if (k > 0) {
			ss->bells_torn_since = 0;
			return wsd_wire_bells_check(buf, want, ss->bells_rx,
						    wsd_bells_announced(v), &why);
		}
		__builtin_ia32_pause();
		if (i % 100 == 99)
			sched_yield();
	}
	now = wsd_now_ms();
	if (!ss->bells_torn_since)
		ss->bells_torn_since = now;
	if (now - ss->bells_torn_since > bell_grace_ms(ss))
		return -EPROTO;
	sched_yield();
	return -EAGAIN;
}

/*
 * rx_lock held, the peer's FIN record at the head: the end of the stream
 * only when the kernel socket holds nothing but announced bells.  Looked
 * at, not taken (another thread may sleep on them).  0 when it does,
 * -ECONNRESET when it holds something else (the connection was reset,
 * R_BYPASS), -EAGAIN when the bells word was half written (look again).
 */
static int bells_look(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;
	uint8_t buf[4096];
	const char *why = NULL;
	int r = 0;
	ssize_t n;

	pthread_mutex_lock(&s->mu);
	n = s->tcp_eof || s->tcp_err ? 0 :
	    real.recv(s->fd, buf, sizeof(buf), MSG_DONTWAIT | MSG_PEEK);
	if (n > 0) {
		uint64_t back = ctl_get(ss, CW_BACK_BELLS);
		uint64_t ann = wsd_bells_announced(ctl_get(ss, CW_BELLS));
		size_t want = (size_t)n;

		if (back) {
			uint64_t left = back - 1 > ss->bells_rx ? back - 1 - ss->bells_rx : 0;

			if (left < want)
				want = (size_t)left;
		}
		if (wsd_wire_bells_check(buf, want, ss->bells_rx, ann, &why)) {
			r = bells_settle(s, buf, want);
			if (r != -EPROTO)
				why = NULL;   /* announced after all, or half written */
		}
	}
	pthread_mutex_unlock(&s->mu);
	if (why)
		session_fail(ss, R_BYPASS, why);
	return faulted(ss) ? -ECONNRESET : r == -EAGAIN ? -EAGAIN : 0;
}

/*
 * mu held, no other sleeper: read doorbells (ring mode only: they are not
 * data).  Look first (MSG_PEEK), then read the peer's counts: a bell in
 * our kernel socket was announced (CW_BELLS) before it was sent, and the
 * peer sets back_bells before it sends data by the stream, so every byte
 * looked at must be the next announced bell, and once the peer went back
 * the bytes after its last bell are data, left where they are.  Any other
 * byte was written by a call a switch did not see: the connection is
 * reset (R_BYPASS), never the byte delivered nor dropped.
 */
static void drain(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;
	uint8_t buf[256];
	const char *why;
	ssize_t n;

	if (s->rx_mode != DIR_RING || s->tcp_eof || s->tcp_err || faulted(ss) ||
	    atomic_load(&s->closed))
		return;
	for (;;) {
		uint64_t back, ann;
		size_t want;

		n = real.recv(s->fd, buf, sizeof(buf), MSG_DONTWAIT | MSG_PEEK);
		if (n <= 0)
			break;
		want = (size_t)n;
		back = ctl_get(ss, CW_BACK_BELLS);
		ann = wsd_bells_announced(ctl_get(ss, CW_BELLS));
		if (back) {
			uint64_t left = back - 1 > ss->bells_rx ? back - 1 - ss->bells_rx : 0;

			if (left < want)
				want = (size_t)left;
			if (!want)
				return;
		}
		if (wsd_wire_bells_check(buf, want, ss->bells_rx, ann, &why)) {
			int r = bells_settle(s, buf, want);

			if (r == -EAGAIN)
				return;     /* the word half written: judged at the next look */
			if (r) {
				session_fail(ss, R_BYPASS, why);
				return;
			}
		}
		n = real.recv(s->fd, buf, want, MSG_DONTWAIT);
		if (n <= 0)
			break;
		ss->bells_rx += (uint64_t)n;
		wsd_stat_add(s->stat, &s->stat->doorbells_rx, (uint64_t)n);
	}
	if (n == 0) {
		s->tcp_eof = true;
	} else if (errno == EAGAIN) {
		bells_due(s);
	} else if (errno != EINTR) {
		s->tcp_err = true;
		s->tcp_errno = errno;
	}
}

/* ---- records ------------------------------------------------------------------ */

static uint64_t tx_room(struct wsd_session *ss)
{
	uint64_t used = ss->tx_pos - ctl_get(ss, CW_CONSUMED);

	return used >= ss->peer_ring ? 0 : ss->peer_ring - used;
}

static uint32_t max_payload(struct wsd_session *ss)
{
	uint32_t m = ss->peer_ring / 4 - REC_HDR - REC_TRAILER;

	return m < 65536 ? m : 65536;
}

/*
 * tx_lock held.  Room for a record of len payload bytes at tx_pos, with the
 * pad to the ring's end if it does not fit before it.  FIN and SWITCH may
 * use the reserve.
 */
static bool fits(struct wsd_session *ss, uint32_t len, bool reserve)
{
	uint64_t off = ss->tx_pos % ss->peer_ring, need = rec_size(len);

	if (off + need > ss->peer_ring)
		need += ss->peer_ring - off;
	return tx_room(ss) >= need + (reserve ? 0 : REC_RESERVE);
}

/*
 * A record write failed: it may have landed in part or whole, so this
 * direction's ring position is lost and the stream cannot go on (writing
 * the next bytes at the same place could duplicate data).  The connection
 * ends as a reset would end it.
 */
static int broken(struct wsd_sock *s, int r)
{
	s->tcp_err = true;
	s->tcp_errno = ECONNRESET;
	s->tx_shut = true;
	wsd_debug("switch: fd %d: a record write failed (%d): connection reset", s->fd, r);
	return r;
}

/*
 * The peer broke the protocol (why: the check that failed).  Nothing it
 * writes is read any more, and the connection ends as a reset would end
 * it, at both ends: our program's next call fails with ECONNRESET, the
 * kernel stream is shut (the peer's liveness signal; our own sleepers wake
 * on it), and wsd stat shows reason protocol.  Any thread, any lock: the
 * first report wins.  The one place a violation is handled.
 */
static void session_fail(struct wsd_session *ss, enum wsd_reason reason, const char *why)
{
	struct wsd_sock *s = ss->sock;
	struct sockaddr unspec = { .sa_family = AF_UNSPEC };
	const char *none = NULL;

	if (!__atomic_compare_exchange_n(&ss->fault, &none, why, false, __ATOMIC_ACQ_REL,
					 __ATOMIC_ACQUIRE))
		return;
	wsd_debug("switch: fd %d: %s: %s: connection reset", s ? s->fd : -1,
		  reason == R_AUTH ? "the ring's peer failed its proof" :
		  reason == R_BYPASS ? "bytes moved behind the switch's back" :
		  reason == R_PROTOCOL ? "protocol violation" : wsd_reason_name(reason), why);
	if (!s)
		return;
	/*
	 * A bypass is no fault of the peer's switch: tell it why (before the
	 * reset it would otherwise take for a plain one), so that its program
	 * fails too and its wsd stat says bypass.
	 */
	if (reason == R_BYPASS)
		put_word(ss, W_FAIL, CW_CLOSED, 3);
	s->tcp_err = true;
	s->tcp_errno = ECONNRESET;
	s->tx_shut = true;
	wsd_stat_begin(s->stat);
	s->stat->reason = (uint8_t)reason;
	wsd_stat_end(s->stat);
	wsd_stat_add(s->stat, &s->stat->fallbacks, 1);
	/*
	 * The kernel's reset (connect to AF_UNSPEC disconnects a TCP socket
	 * with RST): the TCP peer must not take a FIN for a clean end, and
	 * our own sleepers wake on it.
	 */
	real.connect(s->fd, &unspec, sizeof(unspec));
}

static void protocol_fail(struct wsd_session *ss, const char *why)
{
	session_fail(ss, R_PROTOCOL, why);
}

static bool faulted(const struct wsd_session *ss)
{
	return ss && __atomic_load_n(&ss->fault, __ATOMIC_ACQUIRE);
}

/*
 * The peer's switch found bytes on the stream it did not send (closed 3):
 * this end fails the same way, reason bypass.  True when the session failed.
 */
static bool peer_bypass(struct wsd_session *ss)
{
	if (!ss || faulted(ss))
		return faulted(ss);
	if (!peer_untrusted(ss) && ctl_get(ss, CW_CLOSED) == 3)
		session_fail(ss, R_BYPASS, "the peer's switch found the stream moved by a call no "
				       "switch saw");
	return faulted(ss);
}

/* After a violation: the reset once (as the kernel reports one), then the end. */
static ssize_t fault_rx(struct wsd_sock *s)
{
	if (s->tcp_err) {
		s->tcp_err = false;
		s->tcp_eof = true;
		return -ECONNRESET;
	}
	return 0;
}

/* tx_lock held, fits() checked.  Payload from c (len bytes) or inline. */
/*
 * A record into the peer's mapped ring at off, its header staged: the same
 * pieces in the same order as write_record's RDMA writes, the payload
 * copied straight from the caller (no staging copy).
 */
static void store_record(struct wsd_session *ss, uint64_t off, uint32_t size,
			 struct cursor *c, uint32_t len, const void *inline_payload)
{
	uint8_t *dst = ss->peer_map + CTL_SIZE + off;
	uint64_t stamp = ((const struct wsd_rec *)ss->stage)->stamp;

	memcpy(dst, ss->stage, 8);                      /* len, type */
	__builtin_ia32_sfence();
	atomic_store_explicit((_Atomic uint64_t *)(void *)(dst + 8), stamp, memory_order_release);
	__builtin_ia32_sfence();
	if (c)
		cur_copy_from(c, dst + REC_HDR, len);
	else if (len)
		memcpy(dst + REC_HDR, inline_payload, len);
	memset(dst + REC_HDR + len, 0, size - REC_HDR - len);   /* pad, and the trailer's rest */
	__builtin_ia32_sfence();
	atomic_store_explicit((_Atomic uint64_t *)(void *)(dst + size - REC_TRAILER), stamp,
			      memory_order_release);
	atomic_thread_fence(memory_order_seq_cst);      /* as rdma_writev's */
}

static int write_record(struct wsd_sock *s, uint32_t type, struct cursor *c, uint32_t len,
			const void *inline_payload)
{
	struct wsd_session *ss = s->sess;
	uint64_t off = ss->tx_pos % ss->peer_ring;
	uint32_t size = rec_size(len);
	struct wsd_rec *h = (struct wsd_rec *)ss->stage;
	int r;

	if (off + size > ss->peer_ring) {
		uint32_t pad = (uint32_t)(ss->peer_ring - off);

		h->len = pad;
		h->type = REC_PAD;
		h->stamp = ss->tx_pos ^ ss->tx_key;
		r = rdma_writev(ss, (WSABUFEX[]){ { 8, (char *)ss->stage, ss->stage_handle },
						  { 8, (char *)ss->stage + 8, ss->stage_handle } },
				2, CTL_SIZE + off);
		if (r)
			return broken(s, r);
		ss->tx_pos += pad;
		off = 0;
	}
	h->len = len;
	h->type = type;
	h->stamp = ss->tx_pos ^ ss->tx_key;
	{
		long how;

		/* a header the peer's checks must refuse: a length past its ring, or no type */
		if (type == REC_DATA && wsd_fault("rec-header", &how)) {
			if (how)
				h->type = 0x7f;
			else
				h->len = 0xfffffff0u;
		}
	}
	if (ss->peer_map) {
		store_record(ss, off, size, c, len, inline_payload);
		ss->tx_pos += size;
		return 0;
	}
	if (c)
		cur_copy_from(c, ss->stage + REC_HDR, len);
	else if (len)
		memcpy(ss->stage + REC_HDR, inline_payload, len);
	memset(ss->stage + REC_HDR + len, 0, size - REC_HDR - len);
	*(uint64_t *)(ss->stage + size - REC_TRAILER) = ss->tx_pos ^ ss->tx_key;
	/*
	 * In pieces, in this order: the reader takes a record whose header
	 * stamp and trailer match, and must then find every byte before them
	 * in place.  One copy does not promise that: the kernel copies with
	 * fast string moves, whose stores other CPUs may see out of order
	 * (Intel SDM 3A, 9.2.4); separate moves are seen in program order.
	 */
	{
		WSABUFEX b[4] = {
			{ 8, (char *)ss->stage, ss->stage_handle },                    /* len, type */
			{ 8, (char *)ss->stage + 8, ss->stage_handle },                /* stamp */
			{ size - REC_HDR - REC_TRAILER, (char *)ss->stage + REC_HDR, ss->stage_handle },
			{ REC_TRAILER, (char *)ss->stage + size - REC_TRAILER, ss->stage_handle },
		};

		r = b[2].len ? rdma_writev(ss, b, 4, CTL_SIZE + off) :
			       rdma_writev(ss, (WSABUFEX[]){ b[0], b[1], b[3] }, 3, CTL_SIZE + off);
	}
	if (r)
		return broken(s, r);
	ss->tx_pos += size;
	return 0;
}

/*
 * The record walk over our ring (wsd_wire_walk), from pos past the types
 * in skip.  judge: the caller holds rx_lock, so rx_pos is the walk's true
 * start and the sender cannot be overwriting anything past it; a violation
 * then fails the connection.  A reader without rx_lock may meet a slot of
 * the next lap half written, and only stops there.  After a violation
 * nothing is read.  1 with *r, 0 at the end of the records, -EPROTO.
 */
static int walk(struct wsd_session *ss, uint64_t pos, uint32_t skip, struct wire_rec *r,
		bool judge)
{
	const char *why;
	int k;

	if (faulted(ss)) {
		r->pos = pos;
		r->type = 0;
		return -EPROTO;
	}
	k = wsd_wire_walk(&ss->rxr, judge ? ss->rx_pos : pos, pos, skip, r, &why);
	if (k < 0 && peer_untrusted(ss))
		return 0;   /* not a SWITCH: nothing we will read */
	if (k < 0 && judge)
		protocol_fail(ss, why);
	return k;
}

/* rx_lock held: the complete record at pos? */
static int rec_at(struct wsd_session *ss, uint64_t pos, struct wire_rec *r)
{
	return walk(ss, pos, 0, r, true);
}

/* rx_lock held: a complete record at the head? */
static bool rec_head(struct wsd_session *ss)
{
	struct wire_rec r;

	return rec_at(ss, ss->rx_pos, &r) > 0;
}

/* rx_lock held: tell the sender about room, when it matters. */
static void report(struct wsd_sock *s, bool force)
{
	struct wsd_session *ss = s->sess;
	bool armed = ctl_get(ss, CW_SPACE_ARM) !=
		     ss->rung_space;

	if (force || armed || ss->rx_pos - ss->rx_reported >= ss->ring_size / 4) {
		if (put_word(ss, W_RX, CW_CONSUMED, ss->rx_pos) == 0)
			ss->rx_reported = ss->rx_pos;
		ring_space(s);
	}
}

static void consume(struct wsd_sock *s, const struct wire_rec *r)
{
	struct wsd_session *ss = s->sess;

	ss->rx_pos = r->next;
	ss->rx_off = 0;
}

static void proof_fail(struct wsd_sock *s, const char *why, bool tx_locked);
static void plain_again(struct wsd_sock *s, enum wsd_reason why);
static int set_prefix(struct wsd_sock *s, const uint8_t *data, size_t len);

/*
 * rx_lock held: a SWITCH record at the head moves rx to DRAIN (or straight
 * to PROOF when every stream byte before the switch point was read).
 */
static void check_switch(struct wsd_sock *s, bool tx_locked)
{
	struct wsd_session *ss = s->sess;
	struct wire_rec r;
	const char *why;
	uint64_t n;

	if (!ss || s->rx_mode != DIR_TCP || s->rx_back)
		return;
	if (rec_at(ss, ss->rx_pos, &r) <= 0 || r.type != REC_SWITCH)
		return;
	memcpy(&n, r.payload, sizeof(n));
	if (wsd_wire_switch_check(n, s->tcp_rx, &why)) {
		/* e.g. stream bytes we delivered that it says it never sent */
		if (peer_untrusted(ss))
			proof_fail(s, why, tx_locked);
		else
			protocol_fail(ss, why);
		return;
	}
	s->rx_switch_at = n;
	consume(s, &r);
	report(s, false);
	s->rx_mode = s->tcp_rx == n ? DIR_PROOF : DIR_DRAIN;
	s->proof_got = 0;
	wsd_debug("switch: fd %d receives by ring after %llu stream bytes and the proof", s->fd,
		  (unsigned long long)n);
}

/* ---- the proof ------------------------------------------------------------------ */

/*
 * rx_lock held: the ring's peer failed to show it holds this TCP
 * connection (what the stream carries at its switch point is not our
 * challenge).  The listening side has sent nothing by ring and read
 * nothing from it: it forgets the session and goes on as plain TCP, the
 * stream bytes it looked at still the program's (the part of the
 * challenge it took first, since it matched, is given back as a prefix).
 * The connecting side already sends by ring to whoever that is: the
 * connection fails at both ends (a reset), never to deliver a byte of it.
 */
static void proof_fail(struct wsd_sock *s, const char *why, bool tx_locked)
{
	struct wsd_session *ss = s->sess;
	bool reset;

	/* tx_mode and tx_back are the sender's: decided and set under its lock */
	if (!tx_locked)
		pthread_mutex_lock(&s->tx_lock);
	reset = !peer_untrusted(ss) || s->tx_mode == DIR_RING ||
		(s->proof_got && set_prefix(s, ss->nonce, s->proof_got));
	if (!reset) {
		s->proof_got = 0;
		s->rx_mode = DIR_TCP;
		s->rx_back = true;
		s->tx_back = true;   /* our sending side never switched, nor will */
	}
	if (!tx_locked)
		pthread_mutex_unlock(&s->tx_lock);
	if (reset) {
		session_fail(ss, R_AUTH, why);
		return;
	}
	wsd_debug("switch: fd %d: the ring's peer failed its proof (%s): plain TCP", s->fd, why);
	wsd_session_abandon(ss);
	plain_again(s, R_AUTH);
	wsd_stat_add(s->stat, &s->stat->fallbacks, 1);
	wsd_stat_refused(R_AUTH);
}

/*
 * rx_lock held, rx in PROOF: take the peer's proof from the stream without
 * waiting.  Bytes are looked at before they are taken, so that a mismatch
 * leaves them to the program; they are taken as they match.  Part of a
 * proof that waits PROOF_MS for the rest is a failure (the peer writes all
 * of it at once).
 */
static void proof_read(struct wsd_sock *s, bool tx_locked)
{
	struct wsd_session *ss = s->sess;
	uint8_t b[WSD_NONCE];
	ssize_t n;

	while (s->rx_mode == DIR_PROOF) {
		n = real.recv(s->fd, b, WSD_NONCE - s->proof_got, MSG_DONTWAIT | MSG_PEEK);
		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
			/* the stream ended or failed where the proof should be */
			proof_fail(s, "no proof before the end of the stream", tx_locked);
			return;
		}
		if (n < 0) {
			/*
			 * Not a certain failure: the bytes taken may be an honest
			 * proof's first part, which must never reach the program
			 * as data.  A reset loses nothing that was delivered.
			 */
			if (s->proof_got && wsd_now_ms() - s->proof_since > PROOF_MS)
				session_fail(ss, R_AUTH, "part of a proof, and no more");
			return;
		}
		if (memcmp(b, ss->nonce + s->proof_got, (size_t)n)) {
			proof_fail(s, "the stream does not carry our challenge", tx_locked);
			return;
		}
		n = real.recv(s->fd, b, (size_t)n, MSG_DONTWAIT);
		if (n <= 0)
			continue;
		if (!s->proof_got)
			s->proof_since = wsd_now_ms();
		s->proof_got = (uint8_t)(s->proof_got + n);
		if (s->proof_got == WSD_NONCE) {
			atomic_store(&s->proven, true);
			pthread_mutex_lock(&s->mu);
			bells_base(s);
			s->rx_mode = DIR_RING;
			pthread_mutex_unlock(&s->mu);
			wsd_debug("switch: fd %d: the peer proved the connection", s->fd);
		}
	}
}

/*
 * rx_lock held, rx in TCP and a read of n stream bytes just taken (unless
 * peek) that found the peer's SWITCH point `left` bytes in: the bytes past
 * it (in the caller's buffer, at c) are the proof, then doorbells.  Returns
 * the bytes of the read that are data: left, or all n when the ring's peer
 * failed the proof and the socket went back to plain TCP.
 */
static size_t proof_in_read(struct wsd_sock *s, const struct cursor *c, size_t left, size_t n,
			    bool peek)
{
	struct wsd_session *ss = s->sess;
	struct cursor k = *c;
	uint8_t b[WSD_NONCE];
	size_t m = n - left;

	if (m > WSD_NONCE)
		m = WSD_NONCE;
	cur_skip(&k, left);
	cur_copy_from(&k, b, m);
	if (memcmp(b, ss->nonce, m)) {
		proof_fail(s, "the stream does not carry our challenge", false);
		return s->rx_mode == DIR_TCP && !s->tcp_err ? n : left;
	}
	if (peek)
		return left;   /* nothing taken: the next read finds the same */
	s->rx_mode = DIR_PROOF;
	s->proof_got = (uint8_t)m;
	s->proof_since = wsd_now_ms();
	if (m == WSD_NONCE) {
		uint64_t ann;
		const char *why = NULL;

		atomic_store(&s->proven, true);
		/* read, and not data: each must be the next announced bell (BACK counts them) */
		ann = wsd_bells_announced(ctl_get(ss, CW_BELLS));
		pthread_mutex_lock(&s->mu);
		for (size_t rest = n - left - m; rest && !why;) {
			size_t q = rest < sizeof(b) ? rest : sizeof(b);

			cur_copy_from(&k, b, q);
			/* (already taken: a word half written counts them as the bells they look) */
			if (wsd_wire_bells_check(b, q, ss->bells_rx, ann, &why) &&
			    bells_settle(s, b, q) != -EPROTO)
				why = NULL;
			if (!why)
				ss->bells_rx += q;
			rest -= q;
		}
		/* RING only now: a drain (mu) then finds bells_rx counting these */
		bells_base(s);
		s->rx_mode = DIR_RING;
		pthread_mutex_unlock(&s->mu);
		if (why)
			session_fail(ss, R_BYPASS, why);
	}
	return left;
}

/*
 * rx_lock held: the receiving direction's state moved on as far as it can
 * without waiting (a SWITCH record, the end of the drain, the proof).
 */
static void rx_settle(struct wsd_sock *s, bool tx_locked)
{
	check_switch(s, tx_locked);
	if (s->rx_mode == DIR_DRAIN && s->tcp_rx == s->rx_switch_at)
		s->rx_mode = DIR_PROOF;
	if (s->rx_mode == DIR_PROOF)
		proof_read(s, tx_locked);
}

/*
 * The connecting side switches its sending direction as soon as it may,
 * not only at its next send: the listening side sends nothing by ring
 * before it read our proof, which follows our SWITCH.
 */
static void prove_self(struct wsd_sock *s)
{
	if (!s->connected_side || s->tx_mode == DIR_RING || !s->sess || s->tx_back ||
	    s->tx_shut || !ctl_get(s->sess, CW_RX_READY) || pthread_mutex_trylock(&s->tx_lock))
		return;
	tx_switch(s);
	pthread_mutex_unlock(&s->tx_lock);
}

/* ---- back to the stream (BACK) -------------------------------------------------- */

/*
 * A direction goes back for good when its process forks or execs (or the
 * peer's does and asks): see wsd_sock_downgrade() and wsd-protocol(7).
 * Once both have, the socket is plain TCP again, but for a prefix still to
 * read, which poll must count (so it stays "accelerated" until then).
 */
static void set_back(struct wsd_sock *s, bool rx)
{
	bool both;

	pthread_mutex_lock(&s->mu);
	if (rx)
		s->rx_back = true;
	else
		s->tx_back = true;
	both = s->rx_back && s->tx_back;
	pthread_mutex_unlock(&s->mu);
	if (both)
		plain_again(s, R_BACK);
}

/*
 * Both directions are back (or never left, the ring's peer failing its
 * proof): plain TCP, but for a prefix poll must count.
 */
static void plain_again(struct wsd_sock *s, enum wsd_reason why)
{
	bool was, now;

	pthread_mutex_lock(&s->mu);
	was = s->accel;
	s->rx_ready_sent = false;
	s->accel = wsd_prefix_has_data(s->pre);
	now = s->accel;
	s->no_upgrade = true;
	s->why_not = (uint8_t)why;
	pthread_mutex_unlock(&s->mu);
	wsd_stat_begin(s->stat);
	s->stat->path = PATH_TCP;
	s->stat->reason = (uint8_t)why;
	wsd_stat_end(s->stat);
	if (was != now)
		wsd_poll_sock_accelerated(s);
	wsd_debug("switch: fd %d is back on the stream both ways", s->fd);
}

/* The prefix ran out: the socket's readiness is the kernel's alone now. */
static void pre_spent(struct wsd_sock *s)
{
	bool was;

	pthread_mutex_lock(&s->mu);
	was = s->accel;
	if (s->rx_back && s->tx_back)
		s->accel = false;
	pthread_mutex_unlock(&s->mu);
	if (was && !s->accel)
		wsd_poll_sock_accelerated(s);
}

/* tx_lock held: one doorbell that must go (BACK counts it), waiting if need be. */
static void force_bell(struct wsd_sock *s)
{
	for (int i = 0; i < 100 && !try_bell(s); i++) {
		struct pollfd p = { .fd = s->fd, .events = POLLOUT };

		if (errno != EAGAIN && errno != EINTR)
			return;
		real.poll(&p, 1, TICK_MS);
	}
}

/*
 * tx_lock held: this direction goes back to the stream.  The count of our
 * bells goes first (back_bells: the peer's drain never takes a byte past
 * it), then the BACK record after our last ring data, then one more bell
 * to wake the peer; from then on the stream carries our data.  0, -EAGAIN
 * while the peer's ring has no room for the record, or -errno.
 */
static int go_back(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;
	bool bell = s->tx_mode == DIR_RING && !s->kernel_fin;
	uint64_t bells;
	int r;

	if (s->tx_back)
		return 0;
	if (!ss)
		return -EINVAL;
	if (!fits(ss, sizeof(bells), true))
		return -EAGAIN;
	bells = ss->bells_tx + (bell ? 1 : 0);
	r = put_word(ss, W_TX, CW_BACK_BELLS, bells + 1);
	if (!r)
		r = write_record(s, REC_BACK, NULL, sizeof(bells), &bells);
	if (r)
		return r;
	if (bell)
		force_bell(s);
	if (s->tx_mode == DIR_RING && s->tx_shut && !s->kernel_fin) {
		/* our FIN went by ring: the stream must carry it now */
		s->kernel_fin = true;
		real.shutdown(s->fd, SHUT_WR);
	}
	s->tx_mode = DIR_TCP;
	wsd_poll_sock_accelerated(s);   /* POLLOUT is the kernel's to say again */
	set_back(s, false);
	wsd_debug("switch: fd %d sends by the stream again after %llu bells", s->fd,
		  (unsigned long long)bells);
	return 0;
}

/* tx_lock held: the peer asked us back to the stream (it forks or execs). */
static bool serve_back(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;

	if (!ss || s->tx_back || s->detached ||
	    !ctl_get(ss, CW_BACK_REQ))
		return false;
	return go_back(s) == 0;
}

/* Not holding tx_lock: as serve_back. */
static void serve_back_unlocked(struct wsd_sock *s)
{
	if (!s->sess || s->tx_back ||
	    !ctl_get(s->sess, CW_BACK_REQ))
		return;
	pthread_mutex_lock(&s->tx_lock);
	serve_back(s);
	pthread_mutex_unlock(&s->tx_lock);
}

/*
 * rx_lock held: the peer's BACK at the head (after its FIN, perhaps) moves
 * rx to the stream for good; the peer's bells still on it are skipped first.
 */
static void check_back(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;
	uint64_t lim, bells;
	struct wire_rec r;
	const char *why;
	int e;

	if (!ss || s->rx_back || s->rx_mode == DIR_DRAIN || s->rx_mode == DIR_PROOF)
		return;
	if (walk(ss, ss->rx_pos, WIRE_SKIP(REC_PAD) | WIRE_SKIP(REC_FIN), &r, true) <= 0 ||
	    r.type != REC_BACK)
		return;
	lim = ctl_get(ss, CW_BACK_BELLS);
	if (!lim) {
		/*
		 * The sender writes its count, whole, before the record: a BACK
		 * without it is broken (from a claimant: only ignored).
		 */
		if (!peer_untrusted(ss))
			protocol_fail(ss, "BACK before its count");
		return;
	}
	memcpy(&bells, r.payload, sizeof(bells));
	pthread_mutex_lock(&s->mu);
	e = wsd_wire_back_check(bells, lim, ss->bells_rx, &why);
	if (!e) {
		s->rx_skip = bells - ss->bells_rx;
		s->rx_skip_end = bells;
	}
	pthread_mutex_unlock(&s->mu);
	if (e) {
		protocol_fail(ss, why);
		return;
	}
	consume(s, &r);
	s->rx_mode = DIR_TCP;
	s->peer_fin = false;        /* the stream carries the peer's FIN now */
	s->tcp_eof = false;
	wsd_debug("switch: fd %d receives by the stream again (%llu bells to skip)", s->fd,
		  (unsigned long long)s->rx_skip);
	set_back(s, true);
}

/*
 * A byte that should be a bell is not, on a socket whose rx is back on the
 * stream (a session, or only the prefix a fork or an exec left): reset.
 */
static int bypass_reset(struct wsd_sock *s, const char *why)
{
	struct sockaddr unspec = { .sa_family = AF_UNSPEC };

	if (s->sess && !s->detached) {
		session_fail(s->sess, R_BYPASS, why);
		s->tcp_err = false;   /* the reset is this call's: then the end */
		s->tcp_eof = true;
		return -ECONNRESET;
	}
	wsd_debug("switch: fd %d: bytes moved behind the switch's back: %s: connection reset",
		  s->fd, why);
	wsd_stat_begin(s->stat);
	s->stat->reason = R_BYPASS;
	wsd_stat_end(s->stat);
	real.connect(s->fd, &unspec, sizeof(unspec));
	return -ECONNRESET;
}

/*
 * Skip up to *left bells on the stream without waiting, the last of them
 * number `end`: each looked at first, and a byte that is not the next bell
 * resets the connection (-ECONNRESET).  -EAGAIN while some are on their way.
 */
static int skip_bells(struct wsd_sock *s, uint64_t *left, uint64_t end)
{
	uint8_t junk[256];
	const char *why;

	while (*left) {
		ssize_t n = real.recv(s->fd, junk, *left < sizeof(junk) ? *left : sizeof(junk),
				      MSG_DONTWAIT | MSG_PEEK);

		if (n > 0 && wsd_wire_bells_check(junk, (size_t)n, end - *left, end, &why))
			return bypass_reset(s, why);
		if (n > 0)
			n = real.recv(s->fd, junk, (size_t)n, MSG_DONTWAIT);
		if (n > 0) {
			*left -= (uint64_t)n;
			continue;
		}
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			return -EAGAIN;
		*left = 0;          /* the stream ended or failed: its reads will say so */
	}
	return 0;
}

/*
 * rx_lock held: what the socket owes before its stream's bytes: the prefix,
 * then the peer's bells still on the stream.  Bytes, -EAGAIN while a bell
 * is on its way, or 0: read the stream.
 */
static ssize_t pre_recv(struct wsd_sock *s, struct cursor *c, int flags)
{
	struct wsd_prefix *p = s->pre;

	if (p && !atomic_load_explicit(&p->done, memory_order_acquire)) {
		int r;

		wsd_prefix_lock(p);
		if (p->off < p->len) {
			size_t k = p->len - p->off;

			if (k > cur_left(c))
				k = cur_left(c);
			cur_copy_to(c, p->data + p->off, k);
			if (!(flags & MSG_PEEK))
				p->off += k;
			wsd_prefix_unlock(p);
			return (ssize_t)k;
		}
		/* the prefix keeps the last bell's number's low 32 bits: the values' */
		r = skip_bells(s, &p->skip, (uint32_t)(p->bells_end - (uint32_t)p->skip) + p->skip);
		if (!r)
			atomic_store_explicit(&p->done, 1, memory_order_release);
		wsd_prefix_unlock(p);
		if (r)
			return r;
		pre_spent(s);
	}
	if (s->rx_skip && s->rx_back)
		return skip_bells(s, &s->rx_skip, s->rx_skip_end);
	return 0;
}

/* ---- write-based zero copy: a receive buffer offered ------------------------------ */

/*
 * A receiver about to sleep in a large blocking receive offers its buffer:
 * the block (generation, its ring position, length, descriptor) in the
 * sender's control area, then CW_POST.  A sender that sees it before it
 * has written anything more (its position equals the offer's) claims it
 * (CW_CLAIM), checks that the offer was not withdrawn (CW_POST_CANCEL),
 * writes its data straight into the buffer and then a WZC record.  Any
 * other record reaching the receiver first voids the offer: the sender's
 * position moved, so it will never use it.  A receiver leaving without
 * data (a signal, a timeout) withdraws the offer and then reads the claim;
 * each side writes before it reads the other's word, so at least one sees
 * the other, and a claimed offer is always answered by a WZC record (0
 * bytes when withdrawn).  wsd-protocol(7), Zero copy.
 */

/* rx_lock held: ring empty, c at a large single segment: offer it. */
static void post_offer(struct wsd_sock *s, struct cursor *c)
{
	struct wsd_session *ss = s->sess;
	WSPPROC_TABLE *t = wsd_spi();
	struct wsd_post *b = (struct wsd_post *)(ss->words + 8);
	size_t len = c->iov[c->i].iov_len - c->off;
	uint8_t *buf = (uint8_t *)c->iov[c->i].iov_base + c->off;
	int err;

	if (len > (1u << 30))
		len = 1u << 30;
	ss->post_dlen = sizeof(ss->post_desc);
	if (t->lpWSPRegisterRdmaMemory(ss->ws, buf, (uint32_t)len, MEM_WRITE, ss->post_desc,
				       &ss->post_dlen, &err))
		return;
	b->gen = ++ss->post_gen;
	b->pos = ss->rx_pos;
	b->len = len;
	ss->post_len = len;
	b->pad = 0;
	memcpy(b->desc, ss->post_desc, sizeof(b->desc));
	if (rdma_writev(ss, &(WSABUFEX){ sizeof(*b), (char *)b, ss->words_handle }, 1,
			offsetof(struct wsd_ctl, post)) ||
	    put_word(ss, W_RX, CW_POST, b->gen)) {
		t->lpWSPDeregisterRdmaMemory(ss->ws, ss->post_desc, ss->post_dlen, &err);
		return;
	}
	ss->post_active = true;
}

static void post_release(struct wsd_session *ss)
{
	int err;

	ss->post_active = false;
	wsd_spi()->lpWSPDeregisterRdmaMemory(ss->ws, ss->post_desc, ss->post_dlen, &err);
}

/*
 * rx_lock held: the offer ends without a WZC answer.  0, or -EINPROGRESS
 * when the sender claimed it first: its WZC record is on its way, and the
 * buffer is the sender's until it comes.
 */
static int post_withdraw(struct wsd_sock *s, bool check_claim)
{
	struct wsd_session *ss = s->sess;

	if (!ss || !ss->post_active)
		return 0;
	put_word(ss, W_RX, CW_POST_CANCEL, ss->post_gen);
	if (check_claim && ctl_get(ss, CW_CLAIM) == ss->post_gen)
		return -EINPROGRESS;
	post_release(ss);
	return 0;
}

/*
 * tx_lock held: the peer offered a buffer and we wrote nothing since: put
 * up to its length of c there.  Bytes sent, 0 when the offer is not ours
 * to use, or -errno (the connection is broken).
 */
static ssize_t send_posted(struct wsd_sock *s, struct cursor *c)
{
	struct wsd_session *ss = s->sess;
	WSPPROC_TABLE *t = wsd_spi();
	uint64_t gen = ctl_get(ss, CW_POST);
	struct wsd_wzc w;
	struct wsd_post p;
	const char *why;
	WSABUFEX b;
	int err, r;

	if (gen <= ss->post_answered || c->i >= c->n)
		return 0;
	memcpy(&p, (const void *)&ss->ctl->post, sizeof(p));
	if (p.gen != gen || ctl_get(ss, CW_POST) != gen)
		return 0;   /* a new offer being written: look again next time */
	ss->post_answered = gen;
	if (wsd_wire_post_check(&p, gen, ss->tx_pos, &why)) {
		protocol_fail(ss, why);
		return -ECONNRESET;
	}
	if (p.pos != ss->tx_pos || !fits(ss, sizeof(w), false) ||
	    put_word(ss, W_TX, CW_CLAIM, gen))
		return 0;   /* our records reach it first: the peer lets the offer go */
	w.gen = gen;
	w.len = c->iov[c->i].iov_len - c->off;
	if (w.len > p.len)
		w.len = p.len;
	if (ctl_get(ss, CW_POST_CANCEL) >= gen) {
		w.len = 0;  /* withdrawn, but the peer may have seen our claim: answer */
	} else {
		b.buf = (char *)c->iov[c->i].iov_base + c->off;
		b.len = (uint32_t)w.len;
		b.handle = t->lpWSPRegisterMemory(ss->ws, b.buf, b.len, MEM_READ, &err);
		if (!b.handle)
			w.len = 0;
		else {
			r = rdma_put(ss, p.desc, &b, 1, 0);
			t->lpWSPDeregisterMemory(ss->ws, b.handle, &err);
			if (r)
				return broken(s, r);
		}
	}
	r = write_record(s, REC_WZC, NULL, sizeof(w), &w);
	if (r)
		return r;
	ring_data(s);
	cur_skip(c, (size_t)w.len);
	wsd_stat_add(s->stat, &s->stat->zcopy_tx, w.len);
	return (ssize_t)w.len;
}

/* ---- receive ----------------------------------------------------------------- */

static int zc_read(struct wsd_sock *s, struct wsd_zc *z, uint32_t at, struct cursor *c,
		   size_t n)
{
	struct wsd_session *ss = s->sess;
	WSPPROC_TABLE *t = wsd_spi();
	WSABUFEX b[WSP_MAX_BUFFERS];
	struct cursor k = *c;
	WSAOVERLAPPED ov = { .hEvent = (void *)1 };
	uint32_t nb = 0, got;
	size_t left = n;
	int err = 0, r;

	while (left && nb < WSP_MAX_BUFFERS && k.i < k.n) {
		size_t seg = k.iov[k.i].iov_len - k.off;

		if (seg > left)
			seg = left;
		b[nb].buf = (char *)k.iov[k.i].iov_base + k.off;
		b[nb].len = (uint32_t)seg;
		b[nb].handle = t->lpWSPRegisterMemory(ss->ws, b[nb].buf, b[nb].len, MEM_WRITE,
						      &err);
		if (!b[nb].handle) {
			r = -wsa_errno(err);
			goto out;
		}
		nb++;
		left -= seg;
		cur_skip(&k, seg);
	}
	r = t->lpWSPRdmaRead(ss->ws, b, nb, z->desc, sizeof(z->desc), at, &got, 0, &ov, NULL,
			     NULL, &err);
	r = rdma_done(ss->ws, &ov, r, err);
	if (r == -EFAULT) {
		/* our buffers are registered: it is the peer's descriptor the provider refused */
		protocol_fail(ss, "ZC: descriptor refused by the provider");
		r = -ECONNRESET;
	}
	if (!r)
		r = (int)(n - left);
out:
	for (uint32_t i = 0; i < nb; i++)
		t->lpWSPDeregisterMemory(ss->ws, b[i].handle, &err);
	return r;
}

/*
 * rx_lock held, rx in ring mode: copy what the ring holds.  Bytes, 0 at the
 * end of the stream, -EAGAIN when empty, or -errno.
 */
static ssize_t rx_ring(struct wsd_sock *s, struct cursor *c, int flags)
{
	struct wsd_session *ss = s->sess;
	bool peek = flags & MSG_PEEK;
	uint64_t pos = ss->rx_pos;
	uint32_t off = ss->rx_off;
	const char *why;
	size_t done = 0;

	while (cur_left(c)) {
		struct wire_rec r;
		struct wsd_zc z = { 0 };
		uint64_t plen;
		size_t n;
		int k = walk(ss, pos, WIRE_SKIP(REC_PAD), &r, true);

		if (k < 0)
			return done ? (ssize_t)done : fault_rx(s);
		if (r.pos != pos) {
			/* pads passed: nothing to read in them */
			if (wsd_wire_resume_check(REC_PAD, 0, off, &why))
				goto bad;
			pos = r.pos;
			if (!peek) {
				ss->rx_pos = pos;
				ss->rx_off = 0;
			}
		}
		if (!k)
			break;
		if (r.type == REC_WZC) {
			struct wsd_wzc w;
			uint64_t got;

			memcpy(&w, r.payload, sizeof(w));
			if (wsd_wire_wzc_check(&w, ss->post_gen, ss->post_active,
					       ss->post_len < cur_left(c) ? ss->post_len : cur_left(c),
					       &got, &why) ||
			    wsd_wire_resume_check(r.type, 0, off, &why))
				goto bad;
			pos = r.next;
			if (!peek)
				consume(s, &r);
			if (!ss->post_active || w.gen != ss->post_gen)
				continue;   /* the answer to an offer already let go */
			/* the sender wrote got bytes at the cursor: nothing came before them */
			n = (size_t)got;
			post_release(ss);
			cur_skip(c, n);
			wsd_stat_add(s->stat, &s->stat->zcopy_rx, n);
			done += n;
			continue;
		}
		if (r.type == REC_ZC) {
			memcpy(&z, r.payload, sizeof(z));
			if (wsd_wire_zc_check(&z, &why))
				goto bad;
		}
		plen = r.type == REC_ZC ? z.len : r.len;
		if (wsd_wire_resume_check(r.type, plen, off, &why))
			goto bad;
		if (ss->post_active && !peek)
			post_withdraw(s, false);   /* other data came first: the offer is void */
		if (r.type == REC_BACK)
			break;        /* check_back moves on once its count is there */
		if (r.type == REC_FIN) {
			if (!done && !peek) {
				int e = bells_look(s);

				if (e == -ECONNRESET)
					return fault_rx(s);
				if (e)
					return e;
			}
			if (!done) {
				s->peer_fin = true;
				if (s->tx_shut && !s->kernel_fin)
					finish_kernel(s);
				return 0;
			}
			break;
		}
		if (r.type == REC_DATA) {
			n = r.len - off;
			if (n > cur_left(c))
				n = cur_left(c);
			cur_copy_to(c, r.payload + off, n);
			wsd_stat_add(s->stat, &s->stat->copy_rx, peek ? 0 : n);
		} else if (r.type == REC_ZC) {
			int e;

			n = (size_t)(z.len - off);
			if (n > cur_left(c))
				n = cur_left(c);
			e = zc_read(s, &z, off, c, n);
			if (e < 0)
				return done ? (ssize_t)done : faulted(ss) ? fault_rx(s) : e;
			n = (size_t)e;
			cur_skip(c, n);
			wsd_stat_add(s->stat, &s->stat->zcopy_rx, peek ? 0 : n);
			if (!peek && off + n == z.len) {
				ss->zc_finished++;
				put_word(ss, W_RX, CW_ZC_DONE, ss->zc_finished);
			}
		} else {
			why = "record: SWITCH after the switch";
			goto bad;
		}
		done += n;
		off += (uint32_t)n;
		if (off == plen) {
			pos = r.next;
			off = 0;
			if (!peek)
				consume(s, &r);
		} else if (!peek) {
			ss->rx_off = off;
		}
		if (peek && r.type == REC_ZC)
			break;
	}
	if (!peek && done) {
		report(s, false);
		/*
		 * Ran dry: read the doorbells now, or the kernel fd stays readable
		 * with nothing to read (a nested epoll set would report it).
		 */
		if (!rec_head(ss) && s->ep_items) {
			/* in an epoll set (maybe nested): stay armed for the next arrival */
			arm_data(s, false);
		} else if (!rec_head(ss) && ss->data_gen != ss->drained_gen) {
			pthread_mutex_lock(&s->mu);
			if (!s->sleepers) {
				drain(s);
				ss->drained_gen = ss->data_gen;
			}
			pthread_mutex_unlock(&s->mu);
		}
	}
	if (done)
		return (ssize_t)done;
	if (!s->tcp_err && !s->tcp_eof && ctl_get(ss, CW_CLOSED) == 2) {
		s->tcp_err = true;    /* the peer reset, and all it sent is read */
		s->tcp_errno = ECONNRESET;
	}
	if (s->tcp_err) {
		s->tcp_err = false;   /* reported once, then the end, as the kernel does */
		s->tcp_eof = true;
		return -s->tcp_errno;
	}
	return s->tcp_eof ? 0 : -EAGAIN;
bad:
	protocol_fail(ss, why);
	return done ? (ssize_t)done : fault_rx(s);
}

/* Count and return a kernel read; -errno on failure. */
static ssize_t kernel_recv(struct wsd_sock *s, struct cursor *c, size_t max, int flags)
{
	struct iovec v[64];
	struct msghdr m = { .msg_iov = v };
	struct cursor k = *c;
	size_t left = max;
	ssize_t n;

	while (left && k.i < k.n && m.msg_iovlen < 64) {
		size_t seg = k.iov[k.i].iov_len - k.off;

		if (seg > left)
			seg = left;
		v[m.msg_iovlen].iov_base = (uint8_t *)k.iov[k.i].iov_base + k.off;
		v[m.msg_iovlen++].iov_len = seg;
		left -= seg;
		cur_skip(&k, seg);
	}
	n = real.recvmsg(s->fd, &m, flags);
	return n < 0 ? -errno : n;
}

/*
 * rx_lock held, rx_ready sent: one non-blocking step in whatever mode.
 * Bytes, 0 for the end of the stream, -EAGAIN, or -errno.
 */
static ssize_t rx_step(struct wsd_sock *s, struct cursor *c, int flags)
{
	size_t want = cur_left(c);
	ssize_t n;

	if (peer_bypass(s->sess))
		return fault_rx(s);
	/*
	 * Every look at the ring looks for the peer's BACK request too: the bell
	 * that came with it may have been read by the drain before a sleep.
	 */
	serve_back_unlocked(s);
	if (s->sess)
		region_fd_check(s->sess);
	if (s->pre || s->rx_skip) {
		n = pre_recv(s, c, flags);
		if (n)
			return n;
	}
	if (s->connected_side)
		prove_self(s);
	for (;;) {
		check_switch(s, false);
		check_back(s);
		if (s->rx_back && s->rx_skip) {
			n = pre_recv(s, c, flags);
			if (n)
				return n;
		}
		if (s->rx_mode == DIR_RING) {
			return rx_ring(s, c, flags);
		}
		if (s->rx_mode == DIR_PROOF) {
			proof_read(s, false);
			if (faulted(s->sess))
				return fault_rx(s);
			if (s->rx_mode == DIR_PROOF)
				return -EAGAIN;
			if (s->rx_back)
				/* failed: plain again (its prefix first), or reset */
				return rx_step(s, c, flags);
			continue;
		}
		if (s->rx_mode == DIR_DRAIN) {
			uint64_t left = s->rx_switch_at - s->tcp_rx;

			if (!left) {
				s->rx_mode = DIR_PROOF;
				continue;
			}
			n = kernel_recv(s, c, want < left ? want : left,
					(flags & MSG_PEEK) | MSG_DONTWAIT);
			if (n > 0 && !(flags & MSG_PEEK)) {
				s->tcp_rx += (uint64_t)n;
				wsd_stat_add(s->stat, &s->stat->tcp_rx, (uint64_t)n);
			}
			if (n > 0)
				cur_skip(c, (size_t)n);   /* as the ring's copies do */
			return n;
		}
		/*
		 * TCP: the peer may switch at any moment; bytes past N are its
		 * proof, then bells.
		 */
		n = kernel_recv(s, c, want, (flags & MSG_PEEK) | MSG_DONTWAIT);
		check_switch(s, false);
		if (s->rx_mode != DIR_TCP) {
			uint64_t left = s->rx_switch_at - s->tcp_rx;

			if (n > 0 && (uint64_t)n > left)
				n = (ssize_t)proof_in_read(s, c, (size_t)left, (size_t)n,
							   flags & MSG_PEEK);
			if (faulted(s->sess))
				return n > 0 ? n : fault_rx(s);
			if (n == 0 && !left)
				continue;   /* at the switch point: PROOF looks at what follows */
			if (n == -EAGAIN)
				continue;
		}
		if (n > 0 && !(flags & MSG_PEEK)) {
			s->tcp_rx += (uint64_t)n;
			wsd_stat_add(s->stat, &s->stat->tcp_rx, (uint64_t)n);
		}
		if (n > 0)
			cur_skip(c, (size_t)n);
		return n;
	}
}

/*
 * A thread about to sleep counts itself a sleeper BEFORE its last look at
 * the ring: a doorbell another thread reads is then never one it needed
 * (only a sole sleeper drains, after waking).
 */
static void sleeper_enter(struct wsd_sock *s)
{
	pthread_mutex_lock(&s->mu);
	s->sleepers++;
	pthread_mutex_unlock(&s->mu);
}

static void sleeper_leave(struct wsd_sock *s)
{
	pthread_mutex_lock(&s->mu);
	s->sleepers--;
	pthread_mutex_unlock(&s->mu);
}

/*
 * rx_lock held: make the peer ring when data comes; drop old bells unless
 * another thread sleeps on them.  self: the caller already counts as a sleeper.
 */
static void arm_data(struct wsd_sock *s, bool self)
{
	struct wsd_session *ss = s->sess;

	/*
	 * Drop old bells only while the ring is empty: with data waiting, the
	 * fd's readability is true, and an epoll set holding it (perhaps inside
	 * another set) must keep seeing it.
	 */
	pthread_mutex_lock(&s->mu);
	if (s->sleepers == (self ? 1 : 0) && !(s->rx_mode == DIR_RING && rec_head(ss)))
		drain(s);
	pthread_mutex_unlock(&s->mu);
	/* a sender short of room may be asleep too: give it all we took */
	if (ss->rx_pos != ss->rx_reported)
		report(s, true);
	put_word(ss, W_RX, CW_DATA_ARM,
		 __atomic_add_fetch(&ss->data_gen, 1, __ATOMIC_RELAXED) << 1 | self);
}

/*
 * rx_lock held: a blocking receive that armed with its sleeper bit leaves.
 * The sender may not have rung that arm (the data came before it looked),
 * and a sender that took it for a receiver still asleep would send by
 * read-based zero copy and wait for a reader that is off sending to it.
 */
static void disarm_data(struct wsd_sock *s)
{
	put_word(s->sess, W_RX, CW_DATA_ARM,
		 __atomic_add_fetch(&s->sess->data_gen, 1, __ATOMIC_RELAXED) << 1);
}

/*
 * Sleep until the kernel fd has something: a doorbell, stream data, the
 * end.  recv(MSG_PEEK) keeps SO_RCVTIMEO and SA_RESTART the kernel's.
 * for_rx false: a sender's wait (SO_SNDTIMEO, ticking if no bell can come).
 */
/* SO_SNDTIMEO in ms, or -1 for none. */
static int sndtimeo_ms(struct wsd_sock *s)
{
	struct timeval tv = { 0 };
	socklen_t tl = sizeof(tv);

	if (real.getsockopt(s->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, &tl) || !(tv.tv_sec || tv.tv_usec))
		return -1;
	return (int)(tv.tv_sec * 1000 + (tv.tv_usec + 999) / 1000);
}

/*
 * Sleep until the kernel fd has something: a doorbell, stream data, the
 * end.  A receiver (and a sender without SO_SNDTIMEO, once bells can reach
 * it) blocks in recv(MSG_PEEK), so SO_RCVTIMEO and SA_RESTART stay the
 * kernel's.  A sender with a timeout polls until *deadline (ms clock), and
 * gets -EAGAIN after it, -EINTR on a signal, as the kernel's send does.
 */
static int wait_fd(struct wsd_sock *s, bool for_rx, int64_t *deadline)
{
	bool peek = for_rx;
	int grace = -1;
	char b;
	ssize_t n;
	int e = 0;

	if (!for_rx && s->sess) {
		/* a sender learns here that the peer's bells can reach it */
		pthread_mutex_lock(&s->rx_lock);
		rx_settle(s, false);
		pthread_mutex_unlock(&s->rx_lock);
		if (*deadline == 0) {
			int ms = sndtimeo_ms(s);

			*deadline = ms < 0 ? -1 : wsd_now_ms() + ms;
		}
		peek = s->rx_mode == DIR_RING && *deadline < 0 &&
		       !ctl_get(s->sess, CW_BACK_BELLS);
	}
	/* part of the proof came: the rest is due within PROOF_MS, tick to see */
	if (for_rx && s->rx_mode == DIR_PROOF && s->proof_got)
		peek = false;
	/* announced bells missing: look again when their grace ends */
	pthread_mutex_lock(&s->mu);
	grace = bells_wait_ms(s);
	pthread_mutex_unlock(&s->mu);
	if (grace >= 0)
		peek = false;
	/* the caller entered as a sleeper (sleeper_enter) before its last look */
	wsd_stat_add(s->stat, &s->stat->waits, 1);
	/* its last fd closed: the number may be another file's (sock.c, last_close) */
	if (atomic_load(&s->closed)) {
		sleeper_leave(s);
		return -EBADF;
	}
	if (peek) {
		n = real.recv(s->fd, &b, 1, MSG_PEEK);
		if (n < 0)
			e = errno;
		else if (n == 0 && s->rx_mode == DIR_RING)
			s->tcp_eof = true;
		if (!for_rx && e == EAGAIN)
			e = 0;   /* SO_RCVTIMEO ended a sender's wait: look again */
	} else {
		struct pollfd p = { .fd = s->fd, .events = POLLIN };
		int ms = -1;

		if (deadline && *deadline > 0) {
			int64_t left = *deadline - wsd_now_ms();

			ms = left > 0 ? (int)left : 0;
		}
		if (grace >= 0 && (ms < 0 || ms > grace))
			ms = grace;
		/*
		 * No doorbell can come while the peer still sends by the stream,
		 * and the stream's unread data would wake us at once: tick,
		 * waking early only for a reset.
		 */
		if (s->rx_mode != DIR_RING || (s->sess && ctl_get(s->sess, CW_BACK_BELLS))) {
			p.events = 0;
			if (ms < 0 || ms > TICK_MS)
				ms = TICK_MS;
		}
		n = real.poll(&p, 1, ms);
		if (n < 0)
			e = errno;
		else if (n == 0 && deadline && *deadline > 0 && wsd_now_ms() >= *deadline)
			e = EAGAIN;
	}
	pthread_mutex_lock(&s->mu);
	if (atomic_load(&s->closed)) {
		/* closed while we slept: its doorbells are not ours to read */
		s->sleepers--;
		pthread_mutex_unlock(&s->mu);
		return -EBADF;
	}
	if (s->sleepers == 1)
		drain(s);
	s->sleepers--;
	pthread_mutex_unlock(&s->mu);
	/* the peer's switch reset for a bypass: its word tells (the caller's next look) */
	if (e && e != EINTR && e != EAGAIN && peer_bypass(s->sess))
		return 0;
	if (e == EINTR || e == EAGAIN || e == EWOULDBLOCK)
		return -e;
	if (e) {
		/* the kernel reports a reset once; after it, the end of the stream */
		s->tcp_eof = true;
		return -e;
	}
	return 0;
}

/*
 * Spin in short bursts: a peer on another CPU is seen within a burst.
 * Whether the peer runs elsewhere can't be known from here (our own
 * affinity says nothing about the peer's), so spinning is on whenever
 * WSD_SPIN_US is, within the limits below.
 */
#define SPIN_BURST 16     /* pauses between looks at the clock, well under a microsecond */

static int affinity_cpus(void)
{
	static int cpus;

	if (!cpus) {
		cpu_set_t set;

		cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
	}
	return cpus;
}

/*
 * Spinners in this process: at most half the CPUs it may use (at least
 * one), as its peer spins too.  With four connections' threads at each end,
 * four spinners per process on two CPUs took the CPUs from the threads
 * copying (wsd bench, 4 streams of 256 KiB to 4 MiB: about half of TCP);
 * the rest sleep at once.
 */
static _Atomic int spinners;

/*
 * Threads inside a blocking send or receive on an accelerated socket.
 * When there are more than the process's CPUs, the threads that would spin
 * are better asleep: the others are copying and need the CPUs (the four
 * streams above: 4.6 GB/s with a spinner per process, 15 without).
 */
static _Atomic int in_calls;

static bool spin_start(void)
{
	int n = atomic_load_explicit(&spinners, memory_order_relaxed);
	int most = affinity_cpus() / 2 > 1 ? affinity_cpus() / 2 : 1;

	if (wsd_spin_ns() <= 0 ||
	    atomic_load_explicit(&in_calls, memory_order_relaxed) > affinity_cpus())
		return false;
	do {
		if (n >= most)
			return false;
	} while (!atomic_compare_exchange_weak(&spinners, &n, n + 1));
	return true;
}

static void spin_stop(void)
{
	atomic_fetch_sub(&spinners, 1);
}

/*
 * A process held to one CPU yields between bursts, so a peer pinned to the
 * same CPU runs at once rather than after a time slice; one free to move
 * does not (yielding there cost a busy process with several threads per
 * connection most of its throughput: the stress test, 1.1 GB/s to 0.3).
 */
static void spin_pause(void)
{
	if (affinity_cpus() == 1)
		sched_yield();
}

/*
 * Each thread's spin adapts: a spin that finds the thread was off its CPU
 * for a while (another thread wanted it: more runnable threads than CPUs)
 * ends at once and quarters the next ones; a spin that ends undisturbed
 * doubles them again, up to WSD_SPIN_US.  wsd bench, four streams each way
 * between two processes on two CPUs: 50 us spins gave 0.5-0.7 of TCP,
 * none 2x TCP, while one stream and round trips need the spin.
 */
#define PREEMPTED_NS 20000
static __thread int64_t spin_budget = -1, spin_last;

/*
 * A spin that lost its CPU for a time slice (another program wants the
 * CPU) stops spinning for a while: the thread sleeps at once, as a plain
 * TCP program's does.  The scheduler favours a thread that sleeps, and
 * wakes it ahead of the busy program, while one that spins is busy itself
 * and waits for the next slice: 64-byte round trips with one busy loop
 * beside the two ends, p99 4 ms spinning, 65 us plain TCP.  The pause
 * doubles when the next spin soon loses its CPU again (up to a second) and
 * starts again from the shortest otherwise.  A thread held to one CPU
 * yields in its spin (spin_pause): to a busy program there, a yield gives
 * away a whole slice, the same loss.
 */
#define SLICE_LOST_NS 500000
#define SPIN_OFF_MIN_NS 4000000
#define SPIN_OFF_MAX_NS 1024000000
static __thread int64_t spin_off_until, spin_off_ns;

static void spin_lost_slice(int64_t now)
{
	if (spin_off_ns && now - spin_off_until < 4 * spin_off_ns)
		spin_off_ns = spin_off_ns * 2 < SPIN_OFF_MAX_NS ? spin_off_ns * 2 : SPIN_OFF_MAX_NS;
	else
		spin_off_ns = SPIN_OFF_MIN_NS;
	spin_off_until = now + spin_off_ns;
}

static void spin_grow(void)
{
	int64_t full = wsd_spin_ns();

	spin_budget = spin_budget * 2 < full ? spin_budget * 2 : full;
}

int64_t wsd_spin_until(int64_t max_ns)
{
	int64_t full = wsd_spin_ns(), ns;

	if (full <= 0)
		return 0;
	if (spin_budget < 0 || spin_budget > full)
		spin_budget = full;
	ns = spin_budget < max_ns ? spin_budget : max_ns;
	spin_last = wsd_now_ns();
	if (spin_last < spin_off_until)    /* a pause after a lost slice */
		return 0;
	return ns > 0 ? spin_last + ns : 0;
}

/* Between looks: false when the spin is over (its time is up, or it was preempted). */
static bool spin_tick(int64_t end)
{
	int64_t now;

	spin_pause();
	now = wsd_now_ns();
	if (now - spin_last > PREEMPTED_NS) {
		spin_budget = spin_budget / 4 > 1000 ? spin_budget / 4 : 1000;
		if (now - spin_last > SLICE_LOST_NS)
			spin_lost_slice(now);
		return false;
	}
	spin_last = now;
	if (now < end)
		return true;
	spin_grow();
	return false;
}

bool wsd_spin_burst(int64_t end)
{
	for (int i = 0; i < SPIN_BURST; i++)
		__builtin_ia32_pause();
	return spin_tick(end);
}

/*
 * Spin until ready(s, len, zc) (a hint: no lock), or the spin is over.
 * The condition is looked at between single pauses, the clock between bursts.
 */
static bool spin_until_ready(struct wsd_sock *s, bool (*ready)(struct wsd_sock *, uint32_t, bool),
			     uint32_t len, bool zc)
{
	int64_t end;

	if (!spin_start())
		return false;
	end = wsd_spin_until(INT64_MAX);
	while (end) {
		for (int i = 0; i < SPIN_BURST; i++) {
			if (ready(s, len, zc)) {
				spin_grow();
				spin_stop();
				return true;
			}
			__builtin_ia32_pause();
		}
		if (!spin_tick(end))
			break;
	}
	spin_stop();
	return false;
}

static bool data_ready(struct wsd_sock *s, uint32_t len, bool zc)
{
	(void)len; (void)zc;
	return rec_head(s->sess);
}

static bool room_ready(struct wsd_sock *s, uint32_t len, bool zc)
{
	struct wsd_session *ss = s->sess;

	return zc ? ctl_get(ss, CW_ZC_DONE) >= ss->zc_sent : fits(ss, len, false);
}

/* Poll the ring head for a while before sleeping. */
static bool spin_for_data(struct wsd_sock *s)
{
	return s->rx_mode == DIR_RING && spin_until_ready(s, data_ready, 0, false);
}

/* Poll for room (or our zero-copy records done) for a while before sleeping. */
static bool spin_for_room(struct wsd_sock *s, uint32_t len, bool zc)
{
	return spin_until_ready(s, room_ready, len, zc);
}

/*
 * The zero-copy threshold for this session: by default none where the
 * sender stores into a mapped ring (our own sends: we mapped the peer's
 * region; an offer for the peer's: it mapped ours).
 */
static uint32_t zc_threshold(struct wsd_session *ss, bool as_receiver)
{
	const struct wsd_switch_params *p = wsd_switch_params();

	if (p->zcopy_by_path && (as_receiver ? ctl_get(ss, CW_MAPPED) == 1 : ss->peer_map != NULL))
		return UINT32_MAX;
	return p->zcopy_threshold;
}

/* rx_lock held: worth offering the buffer at c to the sender (write-based zero copy)? */
static bool may_post(struct wsd_sock *s, const struct cursor *c, int flags)
{
	return !(flags & MSG_PEEK) && s->sess && s->rx_mode == DIR_RING && !s->rx_back &&
	       !s->pre && !s->sess->post_active && c->i < c->n &&
	       c->iov[c->i].iov_len - c->off >= zc_threshold(s->sess, true) / 4;
}

/*
 * rx_lock held: a receive leaves with n (bytes or -errno).  An offer still
 * open is withdrawn; if the sender claimed it first, its data is on its
 * way into the buffer, which stays the sender's until its WZC record
 * comes: wait for that, and return its bytes.
 */
static ssize_t post_settle(struct wsd_sock *s, struct cursor *c, int flags, ssize_t n)
{
	struct wsd_session *ss = s->sess;

	if (!ss || !ss->post_active || post_withdraw(s, true) != -EINPROGRESS)
		return n;
	for (int64_t end = wsd_now_ms() + 10000; ss->post_active;) {
		struct pollfd p = { .fd = s->fd, .events = POLLIN };
		ssize_t k = rx_step(s, c, flags);

		if (k > 0)
			return n > 0 ? n + k : k;
		if ((k < 0 && k != -EAGAIN) || k == 0 || wsd_now_ms() > end) {
			/* the sender died or broke: nobody writes there any more */
			post_release(ss);
			break;
		}
		pthread_mutex_unlock(&s->rx_lock);
		real.poll(&p, 1, 1);
		pthread_mutex_lock(&s->rx_lock);
	}
	return n;
}

/*
 * A plain socket's prefix (after BACK): its bytes, 0 when spent, or -errno.
 * A blocking caller waits for a bell still on its way as for data, in the
 * kernel (SO_RCVTIMEO and signals as a plain read).
 */
static ssize_t pre_owed(struct wsd_sock *s, struct cursor *c, int flags, bool nonblock)
{
	for (;;) {
		ssize_t n;
		char b;

		pthread_mutex_lock(&s->rx_lock);
		n = pre_recv(s, c, flags);
		pthread_mutex_unlock(&s->rx_lock);
		if (n != -EAGAIN || nonblock)
			return n;
		if (real.recv(s->fd, &b, 1, MSG_PEEK) < 0)
			return -errno;
	}
}

/* One receive without MSG_WAITALL. */
static ssize_t recv_once(struct wsd_sock *s, struct cursor *c, int flags, bool nonblock)
{
	ssize_t n;
	bool plain, asleep_armed = false;

	pthread_mutex_lock(&s->mu);
	plain = !s->rx_ready_sent || s->detached;
	if (plain)
		s->plain_waiters++;
	pthread_mutex_unlock(&s->mu);
	if (plain) {
		bool was;

		if (s->detached) {
			n = -ECONNRESET;
		} else if (faulted(s->sess)) {
			pthread_mutex_lock(&s->rx_lock);
			n = fault_rx(s);
			pthread_mutex_unlock(&s->rx_lock);
		} else if ((s->pre || s->rx_skip) && (n = pre_owed(s, c, flags, nonblock)) != 0) {
			/* the prefix's bytes, or its error */
		} else {
			n = kernel_recv(s, c, cur_left(c), flags & ~MSG_WAITALL);
			if (n > 0 && !(flags & MSG_PEEK)) {
				s->tcp_rx += (uint64_t)n;
				wsd_stat_add(s->stat, &s->stat->tcp_rx, (uint64_t)n);
			}
			if (n > 0)
				cur_skip(c, (size_t)n);   /* MSG_WAITALL goes on after it */
		}
		pthread_mutex_lock(&s->mu);
		s->plain_waiters--;
		was = s->accel;
		publish_rx_ready(s);
		pthread_mutex_unlock(&s->mu);
		became_accel(s, was);
		return n;
	}
	for (;;) {
		if (atomic_load(&s->closed))
			return -EBADF;   /* closed under us: nothing more on its number */
		pthread_mutex_lock(&s->rx_lock);
		reset_if_shut(s);
		if (s->tcp_err && s->rx_shut) {
			s->tcp_err = false;
			s->tcp_eof = true;
			pthread_mutex_unlock(&s->rx_lock);
			return -s->tcp_errno;
		}
		n = rx_step(s, c, flags);
		/* after SHUT_RD what is there still reads; then the end, never a wait */
		if (s->rx_shut && n == -EAGAIN) {
			pthread_mutex_unlock(&s->rx_lock);
			return 0;
		}
		/* a large buffer is offered before the spin: the sender may write there */
		if (n == -EAGAIN && !nonblock && may_post(s, c, flags)) {
			post_offer(s, c);
			n = rx_step(s, c, flags);
		}
		if (n == -EAGAIN && !nonblock && spin_for_data(s))
			n = rx_step(s, c, flags);
		if (n == -EAGAIN) {
			if (!nonblock)
				sleeper_enter(s);
			arm_data(s, !nonblock);
			asleep_armed = !nonblock;
			n = rx_step(s, c, flags);
			if (n != -EAGAIN && !nonblock)
				sleeper_leave(s);
		}
		if (n != -EAGAIN)
			n = post_settle(s, c, flags, n);
		if (n != -EAGAIN && asleep_armed && s->sess)
			disarm_data(s);
		pthread_mutex_unlock(&s->rx_lock);
		if (n != -EAGAIN)
			return n;
		if (nonblock) {
			atomic_fetch_add(&s->rx_eagain, 1);
			return -EAGAIN;
		}
		n = wait_fd(s, true, NULL);
		if (n < 0) {
			pthread_mutex_lock(&s->rx_lock);
			n = post_settle(s, c, flags, n);
			if (s->sess)
				disarm_data(s);
			pthread_mutex_unlock(&s->rx_lock);
			return n;
		}
	}
}

ssize_t wsd_sock_recv(struct wsd_sock *s, const struct iovec *iov, int iovcnt, int flags)
{
	struct cursor c = { iov, iovcnt, 0, 0 };
	bool nonblock = s->nonblock || (flags & MSG_DONTWAIT);
	size_t want = iov_total(iov, iovcnt), done = 0;
	ssize_t n;

	wsd_upgrade_maybe(s);
	cur_skip(&c, 0);
	if (!want) {
		if (!s->rx_ready_sent) {
			struct msghdr m = { .msg_iov = (struct iovec *)iov, .msg_iovlen = iovcnt };

			n = real.recvmsg(s->fd, &m, flags);
			return n < 0 ? -errno : n;
		}
		return 0;
	}
	if (!nonblock)
		atomic_fetch_add_explicit(&in_calls, 1, memory_order_relaxed);
	for (;;) {
		n = recv_once(s, &c, flags, nonblock);
		if (n <= 0) {
			n = done ? (ssize_t)done : n;
			break;
		}
		done += (size_t)n;
		cur_skip(&c, 0);
		if (!(flags & MSG_WAITALL) || (flags & MSG_PEEK) || done == want || nonblock) {
			n = (ssize_t)done;
			break;
		}
	}
	if (!nonblock)
		atomic_fetch_sub_explicit(&in_calls, 1, memory_order_relaxed);
	return n;
}

/* ---- send ------------------------------------------------------------------------ */

static ssize_t epipe(int flags)
{
	if (!(flags & MSG_NOSIGNAL))
		raise(SIGPIPE);
	return -EPIPE;
}

/*
 * Two programs that both send before they read: each end waits for room in
 * the other's ring, which nobody reads, and they would wait for each other
 * for ever, where TCP's buffers (a few MiB) would have taken both blocks.
 * tx_lock held, no room: the peer waits for room in our ring, which holds
 * data (a hint: a thread here may read it in a moment).
 */
#define STALL_MS 50

static bool mutual_wait(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;

	return s->tx_mode == DIR_RING && s->rx_mode == DIR_RING &&
	       ctl_get(ss, CW_SPACE_ARM) != ss->rung_space &&
	       walk(ss, ss->rx_pos, 0, &(struct wire_rec){ 0 }, false) > 0;   /* no rx_lock */
}

/* tx_lock held: the stall is real: the connection goes back both ways. */
static bool stall_back(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;

	wsd_debug("switch: fd %d: both ends wait for room: back to the stream", s->fd);
	if (!ss->back_asked && !put_word(ss, W_TX, CW_BACK_REQ, 1))
		ss->back_asked = true;
	return go_back(s) == 0;
}

__thread int wsd_recheck_ms = -1;

/*
 * tx_lock held, a sleeper, mutual_wait() true: wait up to STALL_MS for room.
 * If neither end took anything meanwhile, the connection goes back to the
 * stream both ways (we ask the peer, and go), and the kernel's buffers take
 * the rest.  1 when this direction went back, else 0 (look again).
 */
static int stall_wait(struct wsd_sock *s, uint32_t len)
{
	struct wsd_session *ss = s->sess;
	uint64_t rx0 = __atomic_load_n(&ss->rx_pos, __ATOMIC_RELAXED);
	uint64_t c0 = ctl_get(ss, CW_CONSUMED);
	int64_t end = wsd_now_ms() + STALL_MS, left;

	for (;;) {
		/* a peer gone back to the stream rings no more: tick */
		struct pollfd p = { .fd = s->fd, .events = ctl_get(ss, CW_BACK_BELLS) ? 0 : POLLIN };

		/* fits() under tx_lock: the peer's consumed is judged against our tx_pos */
		if (fits(ss, len, false) || (left = end - wsd_now_ms()) <= 0)
			break;
		pthread_mutex_unlock(&s->tx_lock);
		if (real.poll(&p, 1, p.events ? (int)left : TICK_MS) > 0) {
			pthread_mutex_lock(&s->tx_lock);
			break;
		}
		pthread_mutex_lock(&s->tx_lock);
	}
	pthread_mutex_unlock(&s->tx_lock);
	pthread_mutex_lock(&s->mu);
	if (s->sleepers == 1)
		drain(s);
	s->sleepers--;
	pthread_mutex_unlock(&s->mu);
	pthread_mutex_lock(&s->tx_lock);
	if (wsd_now_ms() < end || fits(ss, len, false) || !mutual_wait(s) ||
	    __atomic_load_n(&ss->rx_pos, __ATOMIC_RELAXED) != rx0 ||
	    ctl_get(ss, CW_CONSUMED) != c0)
		return 0;
	return stall_back(s);
}

/*
 * tx_lock held, mutual_wait() true, for a wait in poll, select or epoll
 * (which look again after wsd_recheck_ms): the same verdict, by the clock.
 */
static bool stall_check(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;
	uint64_t rx = __atomic_load_n(&ss->rx_pos, __ATOMIC_RELAXED), c = ctl_get(ss, CW_CONSUMED);
	int64_t now = wsd_now_ms();

	if (!ss->stall_since || rx != ss->stall_rx || c != ss->stall_c) {
		ss->stall_since = now;
		ss->stall_rx = rx;
		ss->stall_c = c;
	} else if (now - ss->stall_since >= STALL_MS) {
		ss->stall_since = 0;
		return stall_back(s);
	}
	if (wsd_recheck_ms < 0 || wsd_recheck_ms > TICK_MS)
		wsd_recheck_ms = TICK_MS;
	return false;
}

/*
 * tx_lock held on entry and exit (dropped while sleeping): wait for room.
 * 0, 1 when this direction went back to the stream instead, or -errno.
 */
static int wait_room(struct wsd_sock *s, uint32_t len, bool nonblock, bool zc_wait)
{
	struct wsd_session *ss = s->sess;
	int64_t deadline = 0;
	int r;

	for (;;) {
		/* the peer forks or execs: the rest goes by the stream */
		if (serve_back(s) && !zc_wait)
			return 1;
		if (zc_wait ? ctl_get(ss, CW_ZC_DONE) >=
			      ss->zc_sent : fits(ss, len, false))
			return 0;
		if (faulted(ss))
			return -ECONNRESET;
		if (ctl_get(ss, CW_CLOSED) ||
		    s->tcp_eof || s->tcp_err)
			return -EPIPE;
		if (nonblock)
			return -EAGAIN;
		if (spin_for_room(s, len, zc_wait))
			continue;
		sleeper_enter(s);
		/* this write also finds a peer that died without a word */
		if (put_word(ss, W_TX, CW_SPACE_ARM, ++ss->space_gen)) {
			sleeper_leave(s);
			return -EPIPE;
		}
		if (zc_wait ? ctl_get(ss, CW_ZC_DONE) >=
			      ss->zc_sent : fits(ss, len, false)) {
			sleeper_leave(s);
			return 0;
		}
		if (!zc_wait && mutual_wait(s)) {
			if (stall_wait(s, len))
				return 1;
			continue;
		}
		pthread_mutex_unlock(&s->tx_lock);
		r = wait_fd(s, false, zc_wait ? &(int64_t){ -1 } : &deadline);
		if (r == -EBADF && zc_wait)
			real.poll(NULL, 0, TICK_MS);   /* closed: no bell to wait on */
		pthread_mutex_lock(&s->tx_lock);
		/* a zero-copy sender can't leave: the peer reads our memory */
		if (r < 0 && !zc_wait)
			return r;
	}
}

static ssize_t send_zc(struct wsd_sock *s, const void *buf, size_t len)
{
	struct wsd_session *ss = s->sess;
	WSPPROC_TABLE *t = wsd_spi();
	struct wsd_zc z = { .len = len };
	uint32_t dlen = sizeof(z.desc);
	int err, r;

	if (t->lpWSPRegisterRdmaMemory(ss->ws, (void *)buf, (uint32_t)len, MEM_READ, z.desc,
				       &dlen, &err))
		return -wsa_errno(err);
	r = wait_room(s, sizeof(z), false, false);
	if (r == 1) {
		/* back to the stream: the caller sends it there */
		t->lpWSPDeregisterRdmaMemory(ss->ws, z.desc, dlen, &err);
		return 0;
	}
	if (!r)
		r = write_record(s, REC_ZC, NULL, sizeof(z), &z);
	if (!r) {
		ss->zc_sent++;
		ring_data(s);
		r = wait_room(s, 0, false, true);
	}
	t->lpWSPDeregisterRdmaMemory(ss->ws, z.desc, dlen, &err);
	if (r)
		return r;
	wsd_stat_add(s->stat, &s->stat->zcopy_tx, len);
	return (ssize_t)len;
}

/* The receiver armed from a blocking receive (sleeper bit) and we have not rung it yet. */
static bool receiver_asleep(struct wsd_session *ss)
{
	uint64_t v = ctl_get(ss, CW_DATA_ARM);

	return (v & 1) && v != ss->rung_data;
}

static ssize_t send_ring(struct wsd_sock *s, struct cursor *c, int flags, bool nonblock)
{
	struct wsd_session *ss = s->sess;
	size_t want = cur_left(c), done = 0;
	int r = 0;

	region_fd_check(ss);
	if (s->tx_shut)
		return epipe(flags);
	switch (ctl_get(ss, CW_CLOSED)) {
	case 0:
		break;
	case 1:
		/*
		 * The peer closed cleanly: the kernel takes this send and the
		 * peer's answer is a reset, seen afterwards (POLLERR, EPIPE).
		 */
		if (!s->sent_after_close) {
			s->sent_after_close = true;
			s->tcp_err = true;
			s->tcp_errno = ECONNRESET;
			return (ssize_t)want;
		}
		/* fall through */
	default:
		if (s->tcp_err) {
			/* the send reports the pending reset: it is spent */
			s->tcp_err = false;
			s->tcp_eof = true;
			s->tx_shut = true;   /* reset: closed both ways, POLLHUP stays */
		}
		return epipe(flags);
	}
	/* the receiver offered its buffer: write straight into it */
	if (want >= 16384) {
		ssize_t k = send_posted(s, c);

		if (k < 0)
			return k;
		done = (size_t)k;
		if (done == want)
			return (ssize_t)done;
	}
	/*
	 * Read-based zero copy returns only once the receiver has read it all,
	 * so only when the receiver sleeps waiting for our data (armed, not yet
	 * rung): one that is busy, or sending to us itself, gets a copy it can
	 * take later, as from TCP's buffer, and two programs that both send
	 * before they read do not wait for each other for ever.
	 */
	if (!done && !nonblock && want >= zc_threshold(ss, false) && c->n - c->i == 1 &&
	    want <= (1u << 30) && receiver_asleep(ss)) {
		ssize_t n = send_zc(s, (const uint8_t *)c->iov[c->i].iov_base + c->off, want);

		if (n > 0)
			cur_skip(c, (size_t)n);
		return n == -EPIPE ? epipe(flags) : n;
	}
	while (done < want) {
		uint32_t len = max_payload(ss);

		if (len > want - done)
			len = (uint32_t)(want - done);
		/* take what fits when it is at least a quarter of a record */
		while (!fits(ss, len, false) && len > 4096)
			len /= 2;
		/*
		 * Like the kernel's send buffer, a ring that ran full takes new
		 * data (and polls writable) only when a quarter of it is free.
		 */
		if (!done && ss->tx_full && !fits(ss, ss->peer_ring / 4, false)) {
			r = nonblock ? -EAGAIN : wait_room(s, ss->peer_ring / 4, false, false);
			if (r)
				break;
		}
		ss->tx_full = false;
		/* a blocking send takes everything, as the kernel's does */
		r = wait_room(s, len, nonblock, false);
		if (r)
			break;
		r = write_record(s, REC_DATA, c, len, NULL);
		if (r)
			break;
		done += len;
		wsd_stat_add(s->stat, &s->stat->copy_tx, len);
		ring_data(s);
	}
	if (done || r == 1)
		return (ssize_t)done;
	if (r == -EAGAIN) {
		ss->tx_full = true;
		atomic_fetch_add(&s->tx_eagain, 1);
	}
	if (r == -EPIPE)
		return epipe(flags);
	return r;
}

/* tx_lock held: the rest of c by the kernel stream, counted. */
static ssize_t kernel_send(struct wsd_sock *s, struct cursor *c, int flags)
{
	struct iovec v[64];
	struct msghdr m = { .msg_iov = v };
	struct cursor k = *c;
	ssize_t n;

	while (k.i < k.n && m.msg_iovlen < 64) {
		v[m.msg_iovlen].iov_base = (uint8_t *)k.iov[k.i].iov_base + k.off;
		v[m.msg_iovlen++].iov_len = k.iov[k.i].iov_len - k.off;
		k.i++;
		k.off = 0;
	}
	n = real.sendmsg(s->fd, &m, flags);
	if (n < 0)
		return -errno;
	s->tcp_tx += (uint64_t)n;
	wsd_stat_add(s->stat, &s->stat->tcp_tx, (uint64_t)n);
	return n;
}

ssize_t wsd_sock_send(struct wsd_sock *s, const struct iovec *iov, int iovcnt, int flags)
{
	struct cursor c = { iov, iovcnt, 0, 0 };
	bool nonblock = s->nonblock || (flags & MSG_DONTWAIT);
	ssize_t n;

	wsd_upgrade_maybe(s);
	cur_skip(&c, 0);
	if (!nonblock)
		atomic_fetch_add_explicit(&in_calls, 1, memory_order_relaxed);
	pthread_mutex_lock(&s->tx_lock);
	serve_back(s);
	if (!s->connected_side && s->sess && !atomic_load(&s->proven) && s->tx_mode != DIR_RING &&
	    !pthread_mutex_trylock(&s->rx_lock)) {
		/* a listening side may send by ring once the peer's proof is read */
		rx_settle(s, true);
		pthread_mutex_unlock(&s->rx_lock);
	}
	if (s->detached) {
		n = -ECONNRESET;
	} else if (peer_bypass(s->sess)) {
		/* the reset once, as the kernel reports one, then EPIPE */
		if (s->tcp_err) {
			s->tcp_err = false;
			s->tcp_eof = true;
			n = -ECONNRESET;
		} else {
			n = epipe(flags);
		}
	} else if (s->tx_mode == DIR_RING || tx_switch(s)) {
		n = send_ring(s, &c, flags, nonblock);
		if (n >= 0 && s->tx_back && cur_left(&c)) {
			/* went back to the stream part way: the rest goes there */
			ssize_t k = kernel_send(s, &c, flags);

			n = k < 0 ? (n ? n : k) : n + k;
		}
	} else {
		n = kernel_send(s, &c, flags);
	}
	pthread_mutex_unlock(&s->tx_lock);
	if (!nonblock)
		atomic_fetch_sub_explicit(&in_calls, 1, memory_order_relaxed);
	return n;
}

/* ---- readiness ------------------------------------------------------------------ */

/*
 * rx_lock held.  Data reaching a socket shut both ways: the kernel would
 * answer with a reset (ECONNRESET here, EPIPE at the sender); so do we.
 */
static void reset_if_shut(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;
	struct wire_rec r;
	int k;

	if (!s->rx_shut || !s->tx_shut || s->rx_mode != DIR_RING || s->tcp_err || s->tcp_eof)
		return;
	k = walk(ss, ss->rx_pos, WIRE_SKIP(REC_PAD), &r, true);
	if (k >= 0 && !ss->rx_off)
		ss->rx_pos = r.pos;     /* the pads passed */
	if (k <= 0 || (r.type != REC_DATA && r.type != REC_ZC))
		return;
	s->tcp_err = true;
	s->tcp_errno = ECONNRESET;
	pthread_mutex_lock(&s->tx_lock);
	put_word(ss, W_TX, CW_CLOSED, 2);
	pthread_mutex_unlock(&s->tx_lock);
}

static bool rx_readable(struct wsd_sock *s, short kernel)
{
	struct wsd_session *ss = s->sess;

	serve_back_unlocked(s);         /* the bell that asked may be why we look */
	reset_if_shut(s);

	if (s->rx_shut || s->peer_fin || s->tcp_eof || s->tcp_err ||
	    wsd_prefix_has_data(s->pre))
		return true;
	rx_settle(s, false);
	check_back(s);
	if (s->rx_back) {
		/* bells not yet skipped make the fd readable with nothing to read */
		struct pollfd p = { .fd = s->fd, .events = POLLIN };

		if (s->rx_skip && skip_bells(s, &s->rx_skip, s->rx_skip_end))
			return false;
		return real.poll(&p, 1, 0) == 1;
	}
	if (s->rx_mode == DIR_PROOF)
		return false;   /* the stream's next bytes are the proof, not data */
	if (s->rx_mode != DIR_RING)
		return kernel & (POLLIN | POLLHUP | POLLERR);
	if (ss->rx_off)
		return true;    /* a record partly read */
	for (;;) {
		struct wire_rec r;
		struct wsd_wzc w;
		const char *why;
		uint64_t got;
		int k = walk(ss, ss->rx_pos, WIRE_SKIP(REC_PAD), &r, true);

		if (k < 0)
			return true;            /* the reset, to be read */
		ss->rx_pos = r.pos;         /* pads: nothing to read */
		if (!k)
			return false;
		if (r.type != REC_WZC)
			return true;
		memcpy(&w, r.payload, sizeof(w));
		if (wsd_wire_wzc_check(&w, ss->post_gen, ss->post_active, ss->post_len, &got, &why)) {
			protocol_fail(ss, why);
			return true;
		}
		if (ss->post_active && w.gen == ss->post_gen)
			return true;
		consume(s, &r);   /* the answer to an offer let go: nothing to read */
	}
}

/* The peer's FIN record waits in the ring (behind data, perhaps). */
static bool fin_pending(struct wsd_sock *s)
{
	struct wire_rec r;

	/* callers may not hold rx_lock: a walk that does not judge */
	return s->rx_mode == DIR_RING &&
	       walk(s->sess, s->sess->rx_pos, ~WIRE_SKIP(REC_FIN), &r, false) > 0;
}

short wsd_sock_revents(struct wsd_sock *s, short events, short kernel, bool arm)
{
	short r = 0;
	bool in;

	if (!s->sess || (s->rx_back && s->tx_back)) {
		/* plain again (BACK), with a prefix to count */
		r = kernel;
		if (wsd_prefix_has_data(s->pre))
			r |= POLLIN;
		if (events & POLLOUT) {
			struct pollfd p = { .fd = s->fd, .events = POLLOUT };

			if (real.poll(&p, 1, 0) == 1)
				r |= p.revents & (POLLOUT | POLLERR | POLLHUP);
		}
		return r & (events | POLLHUP | POLLERR);
	}
	if (peer_bypass(s->sess))
		/* reset: as tcp_poll says of a connection the peer reset */
		return (POLLIN | POLLOUT | POLLRDHUP | POLLERR | POLLHUP) & (events | POLLHUP | POLLERR);
	pthread_mutex_lock(&s->rx_lock);
	in = rx_readable(s, kernel);
	if (!in && arm && (events & POLLIN) && s->rx_ready_sent) {
		arm_data(s, false);
		in = rx_readable(s, kernel);
	}
	pthread_mutex_unlock(&s->rx_lock);
	if (in)
		r |= POLLIN;
	if (s->tcp_eof || s->peer_fin || s->rx_shut || fin_pending(s))
		r |= POLLRDHUP;
	if (s->rx_mode == DIR_TCP)
		r |= kernel & POLLRDHUP;   /* the peer shut its stream before switching */
	if (s->tcp_err)
		r |= POLLERR;
	if (ctl_get(s->sess, CW_CLOSED) == 2 && !s->tcp_eof)
		/* the peer reset (its kernel sent RST): readable, error, hang-up */
		r |= POLLIN | POLLRDHUP | POLLERR;
	if ((events & POLLOUT) && pthread_mutex_trylock(&s->tx_lock)) {
		/* a sender is busy in the stream: ask the kernel */
		struct pollfd p = { .fd = s->fd, .events = POLLOUT };

		if (s->tx_mode != DIR_RING && real.poll(&p, 1, 0) == 1)
			r |= p.revents & (POLLOUT | POLLERR | POLLHUP);
	} else if (events & POLLOUT) {
		if (s->tx_mode != DIR_RING) {
			struct pollfd p = { .fd = s->fd, .events = POLLOUT };

			if (real.poll(&p, 1, 0) == 1)
				r |= p.revents & (POLLOUT | POLLERR | POLLHUP);
		} else if (s->tx_shut || fits(s->sess, s->sess->peer_ring / 4, false) ||
			   ctl_get(s->sess, CW_CLOSED) || s->tcp_eof) {
			r |= POLLOUT;
		} else if (arm) {
			struct wsd_session *ss = s->sess;

			put_word(ss, W_TX, CW_SPACE_ARM, ++ss->space_gen);
			if (fits(ss, ss->peer_ring / 4, false)) {
				r |= POLLOUT;
			} else if (mutual_wait(s) && stall_check(s)) {
				struct pollfd p = { .fd = s->fd, .events = POLLOUT };

				if (real.poll(&p, 1, 0) == 1)
					r |= p.revents & (POLLOUT | POLLERR | POLLHUP);
			}
		}
		pthread_mutex_unlock(&s->tx_lock);
	}
	/* as tcp_poll: both directions shut here, or the connection reset */
	if (((s->tcp_eof || s->peer_fin || s->rx_shut || fin_pending(s)) && s->tx_shut) ||
	    s->tcp_err || ctl_get(s->sess, CW_CLOSED) == 2)
		r |= POLLHUP;
	return r & (events | POLLHUP | POLLERR);
}

uint64_t wsd_sock_rx_mark(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;
	struct wire_rec r;

	if (!ss || s->rx_mode != DIR_RING)
		return 0;
	/* without rx_lock: a walk that does not judge */
	walk(ss, ss->rx_pos, ~0u, &r, false);
	return r.pos;
}

void wsd_sock_arm(struct wsd_sock *s, short events)
{
	struct wsd_session *ss = s->sess;

	if (!ss)
		return;
	if ((events & POLLIN) && s->rx_ready_sent) {
		pthread_mutex_lock(&s->rx_lock);
		arm_data(s, false);
		pthread_mutex_unlock(&s->rx_lock);
	}
	if ((events & POLLOUT) && s->tx_mode == DIR_RING) {
		pthread_mutex_lock(&s->tx_lock);
		put_word(ss, W_TX, CW_SPACE_ARM, ++ss->space_gen);
		pthread_mutex_unlock(&s->tx_lock);
	}
}

/* Bytes a receive could return now (FIONREAD), or -1 to ask the kernel. */
long wsd_sock_nread(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;
	long n = 0;
	int k = 0;

	if (wsd_prefix_has_data(s->pre) && (!ss || !s->rx_ready_sent)) {
		int k = 0;

		real.ioctl(s->fd, FIONREAD, &k);
		wsd_prefix_lock(s->pre);
		n = (long)(s->pre->len - s->pre->off) + k - (long)s->pre->skip;
		wsd_prefix_unlock(s->pre);
		return n;
	}
	if (!ss || !s->rx_ready_sent)
		return -1;
	if (faulted(ss))
		return 0;
	pthread_mutex_lock(&s->rx_lock);
	rx_settle(s, false);
	if ((s->rx_mode == DIR_TCP || s->rx_mode == DIR_DRAIN) &&
	    real.ioctl(s->fd, FIONREAD, &k) == 0) {
		n = k;
		if (s->rx_mode == DIR_DRAIN && (uint64_t)n > s->rx_switch_at - s->tcp_rx)
			n = (long)(s->rx_switch_at - s->tcp_rx);
	}
	if (s->rx_mode != DIR_TCP && atomic_load(&s->proven)) {
		uint64_t pos = ss->rx_pos;
		uint32_t off = ss->rx_off;
		struct wire_rec r;

		while (walk(ss, pos, WIRE_SKIP(REC_PAD), &r, true) > 0 && r.type != REC_FIN) {
			uint64_t plen = r.type == REC_DATA ? r.len : 0;
			const char *why;

			if (r.type == REC_ZC) {
				struct wsd_zc z;

				memcpy(&z, r.payload, sizeof(z));
				if (wsd_wire_zc_check(&z, &why)) {
					protocol_fail(ss, why);
					break;
				}
				plen = z.len;
			}
			if (plen > off)
				n += (long)(plen - off);
			pos = r.next;
			off = 0;
		}
	}
	pthread_mutex_unlock(&s->rx_lock);
	return n;
}

/* ---- shutdown, close ------------------------------------------------------------- */

/*
 * Both directions carried their FIN by ring: no doorbell is needed any more,
 * so end the kernel stream too, and the kernel's socket states (getpeername's
 * ENOTCONN, POLLHUP) follow as they would have.
 */
static void finish_kernel(struct wsd_sock *s)
{
	pthread_mutex_lock(&s->mu);
	if (!s->kernel_fin && s->tx_shut && s->tx_mode == DIR_RING &&
	    (s->peer_fin || fin_pending(s))) {
		s->kernel_fin = true;
		real.shutdown(s->fd, SHUT_WR);
	}
	pthread_mutex_unlock(&s->mu);
}

int wsd_sock_shutdown(struct wsd_sock *s, int how)
{
	int r = 0;

	if (how == SHUT_RD || how == SHUT_RDWR) {
		pthread_mutex_lock(&s->rx_lock);
		s->rx_shut = true;
		pthread_mutex_unlock(&s->rx_lock);
		if (!s->rx_ready_sent && real.shutdown(s->fd, SHUT_RD))
			return -errno;
	}
	if (how == SHUT_WR || how == SHUT_RDWR) {
		pthread_mutex_lock(&s->tx_lock);
		if (s->tx_shut && s->kernel_fin) {
			/* both ends finished: the kernel's socket answers (ENOTCONN) */
			if (real.shutdown(s->fd, how))
				r = -errno;
		} else if (!s->tx_shut) {
			if (s->tx_mode == DIR_RING && bells_tx_check(s)) {
				/* reset instead: the peer's next call says so */
			} else if (s->tx_mode == DIR_RING) {
				if (fits(s->sess, 0, true))
					r = write_record(s, REC_FIN, NULL, 0, NULL);
				ring_data(s);
			} else if (real.shutdown(s->fd, SHUT_WR)) {
				r = -errno;
			}
			s->tx_shut = r == 0;
		}
		pthread_mutex_unlock(&s->tx_lock);
		finish_kernel(s);
	}
	return r;
}

/* SO_LINGER with a time: wait (that long at most) for the peer to take our data. */
static void linger(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;
	struct linger l = { 0 };
	socklen_t len = sizeof(l);
	int64_t end;

	if (s->tx_mode != DIR_RING || real.getsockopt(s->fd, SOL_SOCKET, SO_LINGER, &l, &len) ||
	    !l.l_onoff || l.l_linger <= 0)
		return;
	end = wsd_now_ms() + (int64_t)l.l_linger * 1000;
	while (ctl_get(ss, CW_CONSUMED) < ss->tx_pos &&
	       !ctl_get(ss, CW_CLOSED) && wsd_now_ms() < end) {
		struct pollfd p = { .fd = s->fd };

		real.poll(&p, 1, TICK_MS);
		if (p.revents & (POLLERR | POLLHUP))
			break;
	}
}

void wsd_sock_closed(struct wsd_sock *s)
{
	struct wsd_session *ss = s->sess;

	struct linger l = { 0 };
	socklen_t len = sizeof(l);

	if (ss && !s->detached && !faulted(ss)) {
		/* the peer's proof left unread on the stream would make close a reset */
		pthread_mutex_lock(&s->rx_lock);
		rx_settle(s, false);
		pthread_mutex_unlock(&s->rx_lock);
	}
	/* after a violation the kernel's close ends what protocol_fail shut */
	if (!ss || s->detached || s->tx_back || faulted(ss))
		return;
	real.getsockopt(s->fd, SOL_SOCKET, SO_LINGER, &l, &len);
	if ((l.l_onoff && l.l_linger == 0) || (s->rx_ready_sent && wsd_sock_nread(s) > 0)) {
		/* SO_LINGER {1, 0} or unread data: the kernel resets, and so must we */
		l = (struct linger){ 1, 0 };
		real.setsockopt(s->fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
		pthread_mutex_lock(&s->tx_lock);
		s->tx_shut = true;
		put_word(ss, W_TX, CW_CLOSED, 2);
		pthread_mutex_unlock(&s->tx_lock);
		return;
	}
	/* doorbells left unread would make the kernel's close a reset */
	pthread_mutex_lock(&s->mu);
	drain(s);
	pthread_mutex_unlock(&s->mu);
	pthread_mutex_lock(&s->tx_lock);
	if (!s->tx_shut && bells_tx_check(s)) {
		pthread_mutex_unlock(&s->tx_lock);
		return;     /* reset: the kernel's close ends it */
	}
	if (s->tx_mode == DIR_RING && !s->tx_shut && fits(ss, 0, true))
		write_record(s, REC_FIN, NULL, 0, NULL);
	s->tx_shut = true;
	if (s->tx_mode == DIR_RING)
		ring_data(s);
	linger(s);
	put_word(ss, W_TX, CW_CLOSED, 1);
	pthread_mutex_unlock(&s->tx_lock);
}

/* ---- fork and exec: back to the stream ------------------------------------------ */

/* rx_lock held: what is left to deliver first (len bytes) becomes the (shared) prefix. */
static int set_prefix(struct wsd_sock *s, const uint8_t *data, size_t len)
{
	struct wsd_prefix *p;
	int fd;

	if (!len && !s->rx_skip) {
		if (s->pre && atomic_load(&s->pre->done)) {
			wsd_prefix_close(s->pre);
			real.close(s->pre_fd);
			s->pre = NULL;
			s->pre_fd = -1;
		}
		return 0;
	}
	p = wsd_prefix_new(data, len, s->rx_skip, &fd);
	if (!p)
		return -ENOMEM;
	p->bells_end = (uint32_t)s->rx_skip_end;
	if (s->pre) {
		wsd_prefix_close(s->pre);
		real.close(s->pre_fd);
	}
	s->pre = p;
	s->pre_fd = fd;
	s->rx_skip = 0;
	return 0;
}

int wsd_sock_share_skip(struct wsd_sock *s)
{
	int r;

	pthread_mutex_lock(&s->rx_lock);
	r = s->rx_skip && !s->pre ? set_prefix(s, NULL, 0) : 0;
	pthread_mutex_unlock(&s->rx_lock);
	return r;
}

/*
 * The program will read the kernel socket by a path the switch does not
 * see (io_uring): once the socket went back to the stream, nothing of ours
 * may stand before the stream's bytes.  The peer's doorbells still on
 * their way are read now (ms at most).  Bytes that arrived by ring unread
 * (the prefix) cannot be put back in front of the stream, so then, and
 * when the socket did not go back at all (the peer's switch did not
 * answer), the connection is reset: the program's next call fails,
 * loudly, rather than read a stream with a hole in it.
 */
int wsd_sock_bare(struct wsd_sock *s, enum wsd_reason why, int ms)
{
	int64_t end = wsd_now_ms() + ms;
	struct wsd_session *ss = s->sess;
	const char *bad = NULL;

	if (!ss || s->detached)
		return 0;
	pthread_mutex_lock(&s->rx_lock);
	if (!faulted(ss)) {
		while (s->rx_back && s->rx_skip && skip_bells(s, &s->rx_skip, s->rx_skip_end) == -EAGAIN &&
		       wsd_now_ms() < end) {
			struct pollfd p = { .fd = s->fd, .events = POLLIN };

			real.poll(&p, 1, TICK_MS);
		}
		if (!(s->rx_back && s->tx_back))
			bad = "its peer's switch did not move back to the stream in time";
		else if (s->rx_skip || (s->pre && s->pre->skip))
			bad = "the peer's doorbells did not arrive in time";
		else if (wsd_prefix_has_data(s->pre))
			bad = "data that came by ring is still unread";
	}
	pthread_mutex_unlock(&s->rx_lock);
	if (!bad)
		return 0;
	session_fail(ss, why, bad);
	return -ECONNRESET;
}

int wsd_sock_downgrade(struct wsd_sock *s, int ms)
{
	struct wsd_session *ss = s->sess;
	int64_t end = wsd_now_ms() + ms;
	char *kept = NULL;
	size_t kept_len = 0;
	FILE *st;
	uint8_t *tmp;
	int r = 0;
	bool belled = false;

	if (!ss || s->detached)
		return -EINVAL;
	if (faulted(ss))
		return -ECONNRESET;
	if (!(tmp = malloc(65536)))
		return -ENOMEM;
	/* what the peer sent before its BACK, kept in a growing buffer */
	if (!(st = open_memstream(&kept, &kept_len))) {
		free(tmp);
		return -ENOMEM;
	}
	pthread_mutex_lock(&s->rx_lock);
	if (!s->rx_ready_sent) {
		/* the peer never sends by ring unless we say we are ready */
		set_back(s, true);
	} else if (!s->rx_back && !ss->back_asked) {
		pthread_mutex_lock(&s->tx_lock);
		if (!put_word(ss, W_TX, CW_BACK_REQ, 1)) {
			ss->back_asked = true;
			/* wake the peer's switch: a bell, which only a ring sender may send */
			if (tx_switch(s) && !s->tx_back) {
				force_bell(s);
				belled = true;
			}
		}
		pthread_mutex_unlock(&s->tx_lock);
	}
	/* everything the peer sent before its BACK, into the stash */
	while (!s->rx_back) {
		struct iovec v = { tmp, 65536 };
		struct cursor c = { &v, 1, 0, 0 };
		/* (rx_step serves the peer's own request: it may be downgrading too) */
		ssize_t n = rx_step(s, &c, 0);

		if (n > 0) {
			if (fwrite(tmp, 1, (size_t)n, st) != (size_t)n) {
				r = -ENOMEM;
				break;
			}
			continue;
		}
		if (n < 0 && n != -EAGAIN) {
			r = (int)n;
			break;
		}
		if (s->rx_back)
			break;
		if (wsd_now_ms() >= end) {
			r = -ETIMEDOUT;
			break;
		}
		/*
		 * The listening side may ring only once the peer's proof is read,
		 * which this loop may just have done (fdopen right after accept):
		 * a peer asleep in a receive wakes only for a bell.
		 */
		if (ss->back_asked && !belled && !s->tx_back && atomic_load(&s->proven)) {
			pthread_mutex_lock(&s->tx_lock);
			if (tx_switch(s) && !s->tx_back) {
				force_bell(s);
				belled = true;
			}
			pthread_mutex_unlock(&s->tx_lock);
		}
		/* nothing now (or the peer's FIN, its BACK to follow): wait a little */
		arm_data(s, false);
		{
			struct pollfd p = { .fd = s->fd, .events = POLLIN };

			if (real.poll(&p, 1, 1) > 0)
				sched_yield();   /* bells another sleeper owns, perhaps */
		}
	}
	/* then our direction */
	pthread_mutex_lock(&s->tx_lock);
	while (!r && !s->tx_back && (r = go_back(s)) == -EAGAIN && wsd_now_ms() < end) {
		pthread_mutex_unlock(&s->tx_lock);
		report(s, true);
		real.poll(NULL, 0, 1);
		pthread_mutex_lock(&s->tx_lock);
		r = 0;
	}
	/* our zero-copy sends (other threads') read before the pages go */
	while (!r && ctl_get(ss, CW_ZC_DONE) < ss->zc_sent && wsd_now_ms() < end) {
		pthread_mutex_unlock(&s->tx_lock);
		real.poll(NULL, 0, 1);
		pthread_mutex_lock(&s->tx_lock);
	}
	pthread_mutex_unlock(&s->tx_lock);
	/* the peer's bells before its BACK are on their way, or here */
	while (!r && s->rx_skip && skip_bells(s, &s->rx_skip, s->rx_skip_end) == -EAGAIN &&
	       wsd_now_ms() < end) {
		struct pollfd p = { .fd = s->fd, .events = POLLIN };

		real.poll(&p, 1, 1);
	}
	if (fclose(st) && !r)
		r = -ENOMEM;
	if (set_prefix(s, (const uint8_t *)kept, kept_len) && kept_len)
		r = -ENOMEM;    /* data we cannot keep: the connection cannot go on */
	pthread_mutex_unlock(&s->rx_lock);
	if (!r && (!s->rx_back || !s->tx_back))
		r = -ETIMEDOUT;
	if (!r)
		plain_again(s, R_BACK);         /* with the prefix just made */
	free(kept);
	free(tmp);
	wsd_debug("switch: fd %d downgrade: %d (%zu bytes kept)", s->fd, r, kept_len);
	return r;
}

const char *wsd_switch_path(int fd)
{
	struct wsd_sock *s = wsd_fd_get(fd);
	const char *p;

	if (!s)
		return NULL;
	if (wsd_sock_accel(s) && (s->tx_mode == DIR_RING || s->rx_mode == DIR_RING))
		p = s->sess->path == PATH_VERBS ? "verbs" : "shm";
	else
		p = "tcp";
	wsd_sock_put(s);
	return p;
}

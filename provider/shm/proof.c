/* SPDX-License-Identifier: MIT */
/*
 * The mutual proof of shm set-up: before any descriptor is handed over or
 * any region mapped, each side shows that it may read the other's memory,
 * which is what the data path later relies on (process_vm_readv/writev,
 * a shared mapping): the peer is then as trusted as a debugger of us.
 *
 * Each side puts 16 fresh random bytes in its own memory and names their
 * address; the other reads them with process_vm_readv, from the pid that
 * SO_PEERCRED gives for the socket (not a pid the peer claims), and echoes
 * them.  Only a process allowed to read ours can know the bytes.  A uid
 * check on SO_PEERCRED comes first on both sides, so a process of another
 * user learns nothing, not even an address.  Between users where both
 * sides take other users, shm_prove_copy replaces the proof: nothing is
 * read, and the data path then uses the shared rings alone.
 *
 * The nonce lies in a page of its own at a random address, so naming it
 * tells a peer that has not proven anything yet nothing about where our
 * libraries, heap or stack are.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "provider/shm/shm.h"

#define PAGE 4096ul
/* Random pages are picked below 2^38: inside every 39-bit and larger user space. */
#define RANDOM_SPAN (1ull << 38)

static void random_bytes(void *p, size_t n)
{
	size_t got = 0;

	while (got < n) {
		ssize_t r = getrandom((uint8_t *)p + got, n - got, 0);

		if (r > 0)
			got += (size_t)r;
	}
}

/*
 * The peer runs as our effective user, or other_ok; its pid and uid as the
 * kernel saw them.  0 or -EACCES.  A pid of 0 (a process of a pid namespace
 * we cannot see) only where no_pid_ok: nothing is then done by pid.
 */
int shm_peer_uid_ok(int sock, pid_t *pid, uid_t *uid, bool other_ok, bool no_pid_ok)
{
	struct ucred cr;
	socklen_t len = sizeof(cr);

	if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0)
		return -errno;
	if ((cr.uid != geteuid() && !other_ok) || cr.pid < 0 || (cr.pid == 0 && !no_pid_ok))
		return -EACCES;
	*pid = cr.pid;
	*uid = cr.uid;
	return 0;
}

int shm_nonce_new(struct shm_nonce *n)
{
	void *p = MAP_FAILED;

	for (int i = 0; i < 8 && p == MAP_FAILED; i++) {
		uint64_t r;

		random_bytes(&r, sizeof(r));
		r = (1ull << 32) + (r % (RANDOM_SPAN - (1ull << 32)));
		p = mmap((void *)(uintptr_t)(r & ~(PAGE - 1)), PAGE, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
		if (p != MAP_FAILED && (uint64_t)(uintptr_t)p != (r & ~(PAGE - 1))) {
			/* a kernel without MAP_FIXED_NOREPLACE took it as a hint */
			munmap(p, PAGE);
			p = MAP_FAILED;
		}
	}
	if (p == MAP_FAILED)
		p = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return -errno;
	n->page = p;
	{
		uint16_t off;

		random_bytes(&off, sizeof(off));
		n->at = n->page + (off % (PAGE / SHM_NONCE)) * SHM_NONCE;
	}
	random_bytes(n->at, SHM_NONCE);
	return 0;
}

void shm_nonce_free(struct shm_nonce *n)
{
	if (n->page)
		munmap(n->page, PAGE);
	n->page = n->at = NULL;
}

/* Read the peer's nonce from its memory: 0, or -EACCES if we may not. */
int shm_nonce_read(pid_t pid, uint64_t addr, uint8_t out[SHM_NONCE])
{
	struct iovec l = { .iov_base = out, .iov_len = SHM_NONCE };
	struct iovec r = { .iov_base = (void *)(uintptr_t)addr, .iov_len = SHM_NONCE };

	return process_vm_readv(pid, &l, 1, &r, 1, 0) == SHM_NONCE ? 0 : -EACCES;
}

/* Does the echo match?  In constant time, as it is compared with a secret. */
int shm_nonce_match(const struct shm_nonce *n, const uint8_t echo[SHM_NONCE])
{
	uint8_t d = 0;

	for (int i = 0; i < SHM_NONCE; i++)
		d |= (uint8_t)(n->at[i] ^ echo[i]);
	return d == 0;
}

/* The next message, of type or a REJECT (its reason as -errno); with fd, a descriptor it carries. */
static int expect_fd(int sock, struct shm_ctl *m, uint16_t type, int *fd, int timeout_ms)
{
	int ret = shm_recv_ctl(sock, m, fd, fd ? 1 : 0, timeout_ms);

	/*
	 * A listener that closed with our message unread (it turned us away)
	 * makes the kernel report a reset first: its REJECT may still wait
	 * behind it.
	 */
	if (ret == -ECONNRESET && shm_recv_ctl(sock, m, fd, fd ? 1 : 0, 0) == 0)
		ret = 0;

	if (ret < 0)
		return ret;
	if (m->type == SHM_REJECT)
		return m->reason == ND_ACCESS_DENIED ? -EACCES :
		       m->reason == ND_NO_MORE_ENTRIES ? -EBUSY : -ECONNREFUSED;
	return m->type == type ? 0 : -EPROTO;
}

static int expect(int sock, struct shm_ctl *m, uint16_t type, int timeout_ms)
{
	return expect_fd(sock, m, type, NULL, timeout_ms);
}

/*
 * The connector's half, on a socket whose peer's uid is already checked;
 * pid is the listener's.  With owner (not NULL) the listener must also
 * hold the TCP listener it names for the address dialled (owner.c), checked before
 * its nonce is read, so a pid that changed hands in between fails the
 * read.  0 once every check passed; -EACCES when one failed (the listener
 * is told), or another -errno.
 */
int shm_prove_connector(int sock, pid_t pid, const struct shm_owner *owner, int timeout_ms)
{
	int64_t deadline = timeout_ms < 0 ? -1 : wsd_now_ms() + timeout_ms;
	struct shm_ctl m = { .magic = SHM_MAGIC, .version = SHM_VERSION, .type = SHM_PROVE };
	struct shm_nonce mine = { 0 };
	uint8_t theirs[SHM_NONCE];
	int ret;

	ret = shm_nonce_new(&mine);
	if (ret < 0)
		return ret;
	m.probe_addr = (uintptr_t)mine.at;
	ret = shm_send_ctl(sock, &m, NULL, 0);
	if (ret == 0) {
		ret = expect(sock, &m, SHM_PROVE_ACK, wsd_ms_left(deadline));
	} else {
		/* a listener that turned us away at once: its REJECT waits in the socket */
		int why = expect(sock, &m, SHM_PROVE_ACK, 0);

		if (why == -EACCES || why == -EBUSY || why == -ECONNREFUSED)
			ret = why;
	}
	if (ret == 0 && !shm_nonce_match(&mine, m.nonce))
		ret = -EACCES;    /* the listener could not read us */
	if (ret == 0 && owner)
		ret = shm_owner_check(pid, m.tcp_fd, owner);
	if (ret == 0)
		ret = shm_nonce_read(pid, m.probe_addr, theirs);
	shm_nonce_free(&mine);
	if (ret == -EACCES) {
		shm_reject(sock, SHM_REJECT, ND_ACCESS_DENIED);
		return ret;
	}
	if (ret < 0)
		return ret;
	m = (struct shm_ctl){ .magic = SHM_MAGIC, .version = SHM_VERSION, .type = SHM_ECHO };
	memcpy(m.nonce, theirs, SHM_NONCE);
	ret = shm_send_ctl(sock, &m, NULL, 0);
	if (ret < 0)
		return ret;
	return expect(sock, &m, SHM_PROVED, wsd_ms_left(deadline));
}

/*
 * The connector's half between two users (SHM_FEAT_COPY): no nonces, as
 * neither may read the other; with owner, the listener must hand over a
 * TCP listener of our network namespace for the address dialled, which
 * only a process holding it can.  0, -EACCES (the listener is told), or
 * another -errno.
 */
int shm_prove_copy(int sock, const struct shm_owner *owner, int timeout_ms)
{
	int64_t deadline = timeout_ms < 0 ? -1 : wsd_now_ms() + timeout_ms;
	struct shm_ctl m = { .magic = SHM_MAGIC, .version = SHM_VERSION, .type = SHM_PROVE,
			     .features = SHM_FEAT_COPY };
	int fd = -1, ret = shm_send_ctl(sock, &m, NULL, 0);

	/* turned away at once, the REJECT waits in the socket */
	ret = expect_fd(sock, &m, SHM_PROVE_ACK, &fd, ret ? 0 : wsd_ms_left(deadline));
	if (ret == 0 && !(m.features & SHM_FEAT_COPY))
		ret = -EPROTO;
	if (ret == 0 && owner)
		ret = fd < 0 ? -EACCES : shm_owner_check_fd(fd, owner);
	if (fd >= 0)
		close(fd);
	if (ret == -EACCES) {
		shm_reject(sock, SHM_REJECT, ND_ACCESS_DENIED);
		return ret;
	}
	if (ret < 0)
		return ret;
	m = (struct shm_ctl){ .magic = SHM_MAGIC, .version = SHM_VERSION, .type = SHM_ECHO,
			      .features = SHM_FEAT_COPY };
	ret = shm_send_ctl(sock, &m, NULL, 0);
	if (ret < 0)
		return ret;
	return expect(sock, &m, SHM_PROVED, wsd_ms_left(deadline));
}

/*
 * A peer's doorbell must be an eventfd: a pipe or socket we write to could
 * fill and block us.  (An eventfd the peer fills to its limit still could;
 * a peer that passed the proof may also simply stop or trace us.)
 */
int shm_check_eventfd(int fd)
{
	char path[64], link[64];
	ssize_t n;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	n = readlink(path, link, sizeof(link) - 1);
	if (n < 0)
		return errno == ENOENT ? 0 : -errno;   /* no /proc: cannot tell */
	link[n] = 0;
	return strcmp(link, "anon_inode:[eventfd]") ? -EPROTO : 0;
}

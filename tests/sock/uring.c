/* SPDX-License-Identifier: MIT */
/*
 * A program that makes an io_uring of its own can send and receive on a
 * socket with no call the switch sees.  So its accelerated connections go
 * back to TCP at an exact byte, and none upgrades any more: every byte it
 * moves by the ring arrives, in order, at a peer that uses plain calls.
 *
 * Two rounds, each a server process with its own peer: one makes its ring
 * with liburing (interposed), one with an inline system call (found by the
 * switch's look at the process's descriptors before the next upgrade, at
 * most every 100 ms).
 * Under wsd run each checks the paths and `wsd stat`'s reason (io-uring).
 */
#define _GNU_SOURCE
#include <liburing.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "tests/sock/common.h"

#define TO_PEER 200000
#define FROM_PEER 150000

static int port;

/* All len bytes at buf sent, or received, through the ring (short ones go on). */
static void ring_all(struct io_uring *ring, int fd, char *buf, size_t len, bool send)
{
	size_t done = 0;

	while (done < len) {
		struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
		struct io_uring_cqe *cqe;
		int r;

		if (send)
			io_uring_prep_send(sqe, fd, buf + done, len - done, 0);
		else
			io_uring_prep_recv(sqe, fd, buf + done, len - done, 0);
		MUST(io_uring_submit(ring));
		MUST(io_uring_wait_cqe(ring, &cqe));
		r = cqe->res;
		io_uring_cqe_seen(ring, cqe);
		if (r == -EINTR || r == -EAGAIN)
			continue;
		if (r <= 0)
			die("io_uring %s: %d after %zu bytes", send ? "send" : "recv", r, done);
		done += (size_t)r;
	}
}

/* Exactly len bytes of pattern(seed) received through the ring. */
static void ring_recv_exactly(struct io_uring *ring, int fd, size_t len, uint32_t seed)
{
	char *got = malloc(len), *want = malloc(len);

	if (!got || !want)
		die("no memory");
	ring_all(ring, fd, got, len, false);
	pattern(want, len, seed, 0);
	CHECK(!memcmp(got, want, len), "io_uring recv: the bytes differ from the peer's");
	say("io_uring recv %zu bytes: as sent", len);
	free(got);
	free(want);
}

/*
 * The peer: plain calls only.  A thread of its own waits in recv on the
 * first connection throughout, so the peer's switch is there to answer
 * when the server's moves that connection back to the stream (a switch
 * answers from inside the program's calls on the socket).
 */
static void *peer_reader(void *arg)
{
	int fd = *(int *)arg;
	char go = 0;

	drain_exactly(fd, TO_PEER, 9);
	recv_all(fd, &go, 1);
	return (void *)(intptr_t)(go == 'g');
}

static void peer(struct peer *self, void *arg)
{
	char *buf = malloc(FROM_PEER);
	pthread_t reader;
	int a, b, pl, pport;
	void *ok;
	char c;

	(void)arg;
	a = t_connect(AF_INET, port);
	warmup(a, true);
	if (pthread_create(&reader, NULL, peer_reader, &a))
		die("pthread_create");
	pl = t_listen(AF_INET, &pport);
	ctl_send(self, pport);
	ctl_recv(self);                       /* the server made its ring, sent its part */
	pattern(buf, FROM_PEER, 10, 0);
	send_all(a, buf, FROM_PEER);

	/* a connection made after the ring: plain TCP from its start */
	b = t_accept(pl);
	warmup_bulk(b, false);
	sleep_ms(20);
	warmup_tail(b, false);
	ctl_send(self, 1);
	ctl_recv(self);
	/* (its reason is the server's answer, io-uring, unless the set-up failed first) */
	expect_path_now(b, "tcp");

	ctl_recv(self);                       /* the server sent the last byte on the first */
	pthread_join(reader, &ok);
	CHECK(ok, "the last byte on the first connection is not the server's");
	say("recv %d bytes and the last byte on the first connection: as sent", TO_PEER);
	expect_path_now(a, "tcp");
	EXPECT(0, "recv: the server closed the first", recv(a, &c, 1, 0));
	EXPECT(0, "recv: the server closed the second", recv(b, &c, 1, 0));
	EXPECT(0, "close", close(a));
	EXPECT(0, "close", close(b));
	EXPECT(0, "close the listener", close(pl));
	free(buf);
}

/* io_uring_setup by an inline system call: no C library, no liburing. */
static int raw_ring(void)
{
#if defined(__x86_64__)
	struct io_uring_params p;
	long r;

	memset(&p, 0, sizeof(p));
	__asm__ volatile("syscall" : "=a"(r) : "a"((long)__NR_io_uring_setup), "D"(8L), "S"(&p)
			 : "rcx", "r11", "memory");
	if (r < 0) {
		errno = (int)-r;
		return -1;
	}
	return (int)r;
#else
	errno = ENOSYS;
	return -1;
#endif
}

static void server(struct peer *self, void *arg)
{
	bool by_liburing = arg != NULL;
	char *buf = malloc(TO_PEER);
	struct io_uring ring;
	struct peer c;
	int lfd, a, b, pport, rfd = -1;

	(void)self;
	lfd = t_listen(AF_INET, &port);
	peer_start(&c, "peer", peer, NULL);
	a = t_accept(lfd);
	warmup(a, false);
	pport = ctl_recv(&c);                 /* the peer waits in recv on it */
	sleep_ms(50);

	pattern(buf, TO_PEER, 9, 0);
	if (by_liburing) {
		EXPECT(0, "io_uring_queue_init", io_uring_queue_init(8, &ring, 0));
		/* back to TCP before the call returned, on both ends */
		expect_path_now(a, "tcp");
		expect_reason(a, "io-uring");
		ring_all(&ring, a, buf, TO_PEER, true);
		say("io_uring send %d bytes", TO_PEER);
		ctl_send(&c, 1);
		ring_recv_exactly(&ring, a, FROM_PEER, 10);
	} else {
		rfd = raw_ring();
		CHECK(rfd >= 0, "io_uring_setup by a system call: %s", ename(errno));
		say("io_uring_setup by a system call: a ring");
		/* the switch has not looked yet: plain calls still go through it */
		send_all(a, buf, TO_PEER);
		say("send %d bytes", TO_PEER);
		ctl_send(&c, 1);
		drain_exactly(a, FROM_PEER, 10);
		say("recv %d bytes: as sent", FROM_PEER);
		/* the switch looks at most every 100 ms: the next upgrade's look is after the ring */
		sleep_ms(150);
	}

	/*
	 * The second connection is ours to upgrade: the switch looks for rings
	 * in this process before it asks (without the peer's answer in it).
	 */
	b = t_connect(AF_INET, pport);
	warmup_bulk(b, true);
	sleep_ms(20);
	warmup_tail(b, true);
	ctl_recv(&c);
	/* the second never upgraded; the look before its upgrade took the first back */
	expect_path_now(b, "tcp");
	expect_reason(b, "io-uring");
	expect_path_now(a, "tcp");
	ctl_send(&c, 1);
	send_all(a, "g", 1);
	ctl_send(&c, 1);

	EXPECT(0, "close the first", close(a));
	EXPECT(0, "close the second", close(b));
	EXPECT(0, "close the listener", close(lfd));
	peer_end(&c);
	if (by_liburing)
		io_uring_queue_exit(&ring);
	else if (rfd >= 0)
		close(rfd);
	free(buf);
}

int main(int argc, char **argv)
{
	struct peer s;

	t_init(argc, argv);
	peer_start(&s, "liburing", server, (void *)1);
	peer_end(&s);
	peer_start(&s, "syscall", server, NULL);
	peer_end(&s);
	t_exit();
}

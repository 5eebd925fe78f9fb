/* SPDX-License-Identifier: MIT */
/*
 * A readable report means a receive will not wait: after select, poll or
 * epoll_wait said a blocking socket is readable, recv(MSG_DONTWAIT) takes
 * a byte, never EAGAIN (with one reader the kernel's TCP never gives it).
 * Under the switch the kernel socket of an upgraded connection carries
 * doorbells too, for a receiver waiting for data and for a sender waiting
 * for room, so its own readability is not the socket's.
 *
 * Answers: the client asks (by the control pipe, which the switch never
 * sees) and the server answers with one byte on the connection, the client
 * waiting for it in select, poll or epoll_wait and then reading it without
 * waiting; 300 rounds each, the answer at once or a little later, as
 * iperf3's control connection goes (single state bytes, select, then a
 * blocking read).  With bulk: meanwhile another thread of the client
 * streams 32 MiB to the server on the same connection, so that its sending
 * side waits for room and the server rings for that on the same stream.
 *
 * Turns: single bytes both ways on 20 new connections each, every one
 * upgraded and switched between them, each side waiting before it reads
 * (the server in poll where the client uses epoll_wait).
 *
 * After the peer forks: the server forks a child that exits at once (the
 * switch first moves the connection back to TCP, both ways: wsd-protocol(7),
 * Back to the stream) while the client waits; the server's byte comes
 * 300 ms later.  The wait must end with that byte readable, and one more
 * wait of 200 ms must find nothing.  (The peer's doorbells before its BACK
 * made the wait report the socket readable with nothing to read.)
 */
#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/sock/common.h"

enum mode { M_SELECT, M_POLL, M_EPOLL, M_N };
static const char *const mode_name[M_N] = { "select", "poll", "epoll_wait" };

#define ROUNDS 300
#define BULK_CHUNK (64 << 10)
#define BULK_CHUNKS 512          /* 32 MiB */

enum { ASK_ANSWER = 1, ASK_BULK, ASK_FORK, ASK_DONE, ASK_TURNS };

#define TURN_CONNS 20
#define TURNS 50

static int port;

/* Wait up to ms for fd to be readable (ep: its epoll set): 1, 0 on timeout, -1. */
static int wait_readable(int fd, int ep, enum mode m, int ms)
{
	struct timeval tv = { ms / 1000, ms % 1000 * 1000 };
	struct pollfd p = { .fd = fd, .events = POLLIN };
	struct epoll_event ev;
	fd_set rd;
	int n;

	switch (m) {
	case M_SELECT:
		FD_ZERO(&rd);
		FD_SET(fd, &rd);
		n = select(fd + 1, &rd, NULL, NULL, &tv);
		return n < 0 ? -1 : n == 1 && FD_ISSET(fd, &rd);
	case M_POLL:
		n = poll(&p, 1, ms);
		return n < 0 ? -1 : n == 1 && (p.revents & POLLIN);
	default:
		n = epoll_wait(ep, &ev, 1, ms);
		return n < 0 ? -1 : n == 1 && (ev.events & EPOLLIN);
	}
}

/* ---- the server ------------------------------------------------------------- */

struct bulk {
	int fd;
	pthread_t t;
};

static void *bulk_recv(void *arg)
{
	struct bulk *b = arg;
	char *buf = malloc(BULK_CHUNK);

	if (!buf)
		die("out of memory");
	for (int i = 0; i < BULK_CHUNKS; i++) {
		recv_all(b->fd, buf, BULK_CHUNK);
		expect_pattern(buf, BULK_CHUNK, 7, (uint64_t)i * BULK_CHUNK, "bulk");
	}
	free(buf);
	return NULL;
}

static void server(struct peer *self, void *arg)
{
	int lfd = *(int *)arg, fd = -1;
	struct bulk b = { .fd = -1 };

	(void)self;
	for (;;) {
		int ask = ctl_recv(self);
		char c;

		switch (ask) {
		case ASK_ANSWER:
			/* the round's number says whether the answer comes at once */
			c = (char)ctl_recv(self);
			if (c % 3 == 1)
				usleep(200);
			else if (c % 3 == 2)
				sleep_ms(2);
			send_all(fd, &c, 1);
			break;
		case ASK_BULK:
			b.fd = fd;
			if (pthread_create(&b.t, NULL, bulk_recv, &b))
				die("pthread_create");
			break;
		case ASK_FORK: {
			pid_t pid = MUST(fork());

			if (!pid)
				_exit(0);
			MUST(waitpid(pid, NULL, 0));
			sleep_ms(300);
			c = 'f';
			send_all(fd, &c, 1);
			break;
		}
		case ASK_TURNS: {
			enum mode m = (enum mode)ctl_recv(self);
			int cfd = t_accept(lfd), early = 0;

			for (int i = 0; i < TURNS; i++) {
				int r = wait_readable(cfd, -1, m == M_EPOLL ? M_POLL : m, 10000);

				if (r != 1)
					die("turns, server: turn %d: the wait returned %d (%s)", i, r,
					    ename(errno));
				if (recv(cfd, &c, 1, MSG_DONTWAIT) != 1) {
					early++;
					recv_all(cfd, &c, 1);
				}
				if (i % 3 == 1)
					usleep(200);
				send_all(cfd, &c, 1);
			}
			ctl_send(self, early);
			EXPECT(0, "close", close(cfd));
			break;
		}
		case ASK_DONE:
			if (b.fd >= 0) {
				pthread_join(b.t, NULL);
				b.fd = -1;
			}
			EXPECT(0, "close", close(fd));
			fd = -1;
			break;
		case 0:
			/* a new connection */
			if (lfd < 0) {
				lfd = t_listen(AF_INET, &port);
				ctl_send(self, port);
			}
			fd = t_accept(lfd);
			warmup(fd, false);
			ctl_send(self, 1);
			break;
		default:
			EXPECT(0, "close the listener", close(lfd));
			return;
		}
	}
}

/* ---- the client ------------------------------------------------------------- */

static void *bulk_send(void *arg)
{
	struct bulk *b = arg;
	char *buf = malloc(BULK_CHUNK);

	if (!buf)
		die("out of memory");
	for (int i = 0; i < BULK_CHUNKS; i++) {
		pattern(buf, BULK_CHUNK, 7, (uint64_t)i * BULK_CHUNK);
		send_all(b->fd, buf, BULK_CHUNK);
	}
	free(buf);
	return NULL;
}

static int conn_new(struct peer *srv, int *ep)
{
	struct epoll_event ev = { .events = EPOLLIN };
	int fd;

	ctl_send(srv, 0);
	if (!port)
		port = ctl_recv(srv);
	fd = t_connect(AF_INET, port);
	warmup(fd, true);
	ctl_recv(srv);
	*ep = MUST(epoll_create1(0));
	ev.data.fd = fd;
	MUST(epoll_ctl(*ep, EPOLL_CTL_ADD, fd, &ev));
	return fd;
}

static void conn_end(struct peer *srv, int fd, int ep)
{
	ctl_send(srv, ASK_DONE);
	EXPECT(0, "close the epoll set", close(ep));
	EXPECT(0, "close", close(fd));
}

static void answers(struct peer *srv, enum mode m, bool bulk)
{
	int ep, fd = conn_new(srv, &ep), early = 0, wrong = 0;
	struct bulk b = { .fd = fd };

	if (bulk) {
		ctl_send(srv, ASK_BULK);
		if (pthread_create(&b.t, NULL, bulk_send, &b))
			die("pthread_create");
	}
	for (int i = 0; i < ROUNDS; i++) {
		char c = 0;
		int r;
		ssize_t n;

		ctl_send(srv, ASK_ANSWER);
		ctl_send(srv, i & 0x7f);
		r = wait_readable(fd, ep, m, 10000);
		if (r != 1)
			die("%s: round %d: the wait returned %d (%s)", mode_name[m], i, r, ename(errno));
		n = recv(fd, &c, 1, MSG_DONTWAIT);
		if (n < 0 && errno == EAGAIN) {
			/* reported readable with nothing to read: take it after all */
			early++;
			n = recv(fd, &c, 1, 0);
		}
		if (n != 1)
			die("%s: round %d: recv -> %zd (%s)", mode_name[m], i, n, ename(errno));
		wrong += c != (char)(i & 0x7f);
	}
	if (bulk)
		pthread_join(b.t, NULL);
	say("%s%s: %d rounds, readable reported early %d times, %d answers wrong",
	    mode_name[m], bulk ? ", 32 MiB sent meanwhile" : "", ROUNDS, early, wrong);
	CHECK(!early, "%s%s: readable reported with nothing to read (%d of %d rounds)",
	      mode_name[m], bulk ? " with bulk" : "", early, ROUNDS);
	conn_end(srv, fd, ep);
}

/*
 * Single bytes both ways on new connections, each upgraded and switched
 * between them (as iperf3's control connection is), each side waiting in
 * select, poll or epoll_wait (poll, the server) before it reads.
 */
static void turns(struct peer *srv, enum mode m)
{
	int early = 0, server_early = 0;

	for (int k = 0; k < TURN_CONNS; k++) {
		struct epoll_event ev = { .events = EPOLLIN };
		int fd, ep, r;

		ctl_send(srv, ASK_TURNS);
		ctl_send(srv, m);
		fd = t_connect(AF_INET, port);
		ep = MUST(epoll_create1(0));
		MUST(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev));
		for (int i = 0; i < TURNS; i++) {
			char c = (char)i, d;

			send_all(fd, &c, 1);
			r = wait_readable(fd, ep, m, 10000);
			if (r != 1)
				die("turns, %s: connection %d, turn %d: the wait returned %d (%s)",
				    mode_name[m], k, i, r, ename(errno));
			if (recv(fd, &d, 1, MSG_DONTWAIT) != 1) {
				early++;
				recv_all(fd, &d, 1);
			}
			CHECK(d == c, "turns: the answer is not the byte sent");
		}
		server_early += ctl_recv(srv);
		close(ep);
		close(fd);
	}
	say("%s on new connections: %d x %d turns, readable reported early %d times here, "
	    "%d at the server", mode_name[m], TURN_CONNS, TURNS, early, server_early);
	CHECK(!early && !server_early, "%s: readable reported with nothing to read", mode_name[m]);
}

static void after_fork(struct peer *srv, enum mode m)
{
	int ep, fd = conn_new(srv, &ep), r, e;
	char c = 0;

	ctl_send(srv, ASK_FORK);
	r = wait_readable(fd, ep, m, 10000);
	say("%s while the server forks -> %d", mode_name[m], r);
	errno = 0;
	r = (int)recv(fd, &c, 1, MSG_DONTWAIT);
	e = errno;
	t_expect("recv, without waiting", r, e, 1, 0);
	if (r < 0 && e == EAGAIN)
		r = (int)recv(fd, &c, 1, 0);     /* then the byte, when it comes */
	CHECK(r == 1 && c == 'f', "%s: not the server's byte after its fork", mode_name[m]);
	r = wait_readable(fd, ep, m, 200);
	say("%s, 200 ms more -> %d", mode_name[m], r);
	conn_end(srv, fd, ep);
}

int main(int argc, char **argv)
{
	struct peer srv;
	int lfd = -1;

	t_init(argc, argv);
	t_watchdog(120);
	/* the server listens itself: a fork of the client's would inherit its sockets */
	peer_start(&srv, "server", server, &lfd);
	for (int m = 0; m < M_N; m++) {
		answers(&srv, (enum mode)m, false);
		answers(&srv, (enum mode)m, true);
	}
	for (int m = 0; m < M_N; m++)
		turns(&srv, (enum mode)m);
	for (int m = 0; m < M_N; m++)
		after_fork(&srv, (enum mode)m);
	ctl_send(&srv, 99);
	peer_end(&srv);
	t_exit();
}

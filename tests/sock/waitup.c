/* SPDX-License-Identifier: MIT */
/*
 * A wait that began on a plain socket, and the socket upgraded while it
 * slept.  The server reads the client's first byte, then waits for the
 * next in select, pselect, poll, ppoll or epoll_wait (one client process
 * each, so each connection makes its own channel).  Meanwhile the client's
 * switch upgrades the connection and switches its sending side: its switch
 * point and proof go on the TCP stream, which wakes the kernel's wait.
 * They are not data: the wait must go on until the client's next byte,
 * which it sends 300 ms later, and a non-blocking receive then finds it.
 * (iperf3's server took such a wake on its control connection for a
 * message and blocked in its read for the whole test, reading none of the
 * data.)
 *
 * The upgrade is the client's, at a receive 300 ms after it connected
 * (WSD_UPGRADE_US 200 ms): never before the server's wait began.  Under
 * wsd run the client waits for its path to be shm before it sends, and the
 * server checks its path: tcp as its wait begins, shm as it ends.
 */
#define _GNU_SOURCE
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/sock/common.h"

enum mode { M_SELECT, M_PSELECT, M_POLL, M_PPOLL, M_EPOLL, M_N };
static const char *const mode_name[M_N] = { "select", "pselect", "poll", "ppoll", "epoll_wait" };

static int port;

/*
 * The server's wait for fd to be readable, 10 s at most: what the call
 * returned.  epoll_wait's set is made before the wait, the socket in it
 * still plain.
 */
static int wait_readable(int fd, enum mode m)
{
	struct timeval tv = { 10, 0 };
	struct timespec ts = { 10, 0 };
	struct pollfd p = { .fd = fd, .events = POLLIN };
	fd_set rd;

	FD_ZERO(&rd);
	FD_SET(fd, &rd);
	switch (m) {
	case M_SELECT:
		return select(fd + 1, &rd, NULL, NULL, &tv) == 1 && FD_ISSET(fd, &rd) ? 1 : -1;
	case M_PSELECT:
		return pselect(fd + 1, &rd, NULL, NULL, &ts, NULL) == 1 && FD_ISSET(fd, &rd) ? 1 : -1;
	case M_POLL:
		return poll(&p, 1, 10000) == 1 && (p.revents & POLLIN) ? 1 : -1;
	case M_PPOLL:
		return ppoll(&p, 1, &ts, NULL) == 1 && (p.revents & POLLIN) ? 1 : -1;
	default: {
		struct epoll_event ev = { .events = EPOLLIN };
		int ep = MUST(epoll_create1(0)), r;

		MUST(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev));
		r = epoll_wait(ep, &ev, 1, 10000) == 1 && (ev.events & EPOLLIN) ? 1 : -1;
		MUST(close(ep));
		return r;
	}
	}
}

static void client(struct peer *self, void *arg)
{
	enum mode m = (enum mode)(intptr_t)arg;
	char c = 'a', got;
	int fd;

	port = t_peer_port(self, port);
	ctl_recv(self);                       /* our turn */
	fd = t_connect(AF_INET, port);
	send_all(fd, &c, 1);
	ctl_recv(self);                       /* the server is about to wait */
	sleep_ms(300);
	/* past WSD_UPGRADE_US: this receive asks for the upgrade */
	EXPECT_ERR(EAGAIN, "recv (nothing yet)", recv(fd, &got, 1, MSG_DONTWAIT));
	if (getenv("WSD_EXPECT_PATH")) {
		const char *want = getenv("WSD_EXPECT_PATH");
		const char *p = NULL;

		/* each look a receive too: one on the ring sends our switch point */
		for (int i = 0; i < 500 && (!(p = path_now(fd)) || strcmp(p, want)); i++) {
			sleep_ms(10);
			(void)recv(fd, &got, 1, MSG_DONTWAIT);
		}
		(void)recv(fd, &got, 1, MSG_DONTWAIT);
		if (!p || strcmp(p, want))
			die("%s: the connection did not take path %s (%s)", mode_name[m], want,
			    p ? p : "none");
	}
	sleep_ms(300);                        /* the server's wait must not have ended */
	c = 'b';
	send_all(fd, &c, 1);
	recv_all(fd, &got, 1);
	CHECK(got == 'c', "the server's answer");
	EXPECT(0, "close", close(fd));
	say("sent 'b' 300 ms after the upgrade, got the answer");
}

int main(int argc, char **argv)
{
	struct peer c[M_N];
	int lfd;

	setenv("WSD_UPGRADE_US", "200000", 1);
	setenv("WSD_UPGRADE_BYTES", "1000000000000", 1);
	t_init(argc, argv);
	t_watchdog(60);
	/* all forked before any upgrade: none inherits a channel */
	if (T_FORK_FIRST)
		for (int m = 0; m < M_N; m++)
			peer_start(&c[m], mode_name[m], client, (void *)(intptr_t)m);
	lfd = t_listen(AF_INET, &port);
	for (int m = 0; m < M_N; m++) {
		if (T_FORK_FIRST)
			ctl_send(&c[m], port);
		else
			peer_start(&c[m], mode_name[m], client, (void *)(intptr_t)m);
	}
	for (int m = 0; m < M_N; m++) {
		char b;
		int fd, n;

		ctl_send(&c[m], 1);
		fd = t_accept(lfd);
		recv_all(fd, &b, 1);
		/* the wait begins plain (the kernel's alone) and ends on an upgraded socket */
		expect_path_now(fd, "tcp");
		ctl_send(&c[m], 1);
		n = wait_readable(fd, (enum mode)m);
		say("%s on a connection upgraded meanwhile -> %d", mode_name[m], n);
		if (getenv("WSD_EXPECT_PATH"))
			expect_path_now(fd, getenv("WSD_EXPECT_PATH"));
		errno = 0;
		n = (int)recv(fd, &b, 1, MSG_DONTWAIT);
		t_expect("recv, without waiting", n, errno, 1, 0);
		CHECK(b == 'b', "%s: the byte after the wait is not the client's", mode_name[m]);
		b = 'c';
		send_all(fd, &b, 1);
		CHECK(recv(fd, &b, 1, 0) == 0, "recv: the client did not close");
		EXPECT(0, "close", close(fd));
		peer_end(&c[m]);
	}
	EXPECT(0, "close the listener", close(lfd));
	t_exit();
}

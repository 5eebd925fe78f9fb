/* SPDX-License-Identifier: MIT */
/*
 * An idle connection costs no CPU: a program blocked for a second in recv,
 * poll, epoll_wait, or in a send waiting for the peer to make room, uses
 * well under a tenth of that second of CPU time, all its threads counted
 * (the switch spins only briefly before it sleeps).  The bound is loose on
 * purpose: it tells sleeping from spinning, not fast from slow.
 */
#define _GNU_SOURCE
#include <poll.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/sock/common.h"

#define IDLE_MS 1000
#define CPU_LIMIT_MS 100

static int port;

static double cpu_ms(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_utime.tv_sec * 1e3 + ru.ru_utime.tv_usec / 1e3 +
	       ru.ru_stime.tv_sec * 1e3 + ru.ru_stime.tv_usec / 1e3;
}

/* The peer: after each go, wait a second, then answer (or drain). */
static void peer(struct peer *self, void *arg)
{
	char b[64] = "x";
	int fd, n;

	(void)arg;
	port = t_peer_port(self, port);
	fd = t_connect(AF_INET, port);
	warmup(fd, true);
	for (int i = 0; i < 3; i++) {
		ctl_recv(self);
		sleep_ms(IDLE_MS);
		send_all(fd, b, 1);
	}
	n = ctl_recv(self);          /* the other end fills its send path */
	sleep_ms(IDLE_MS);
	drain_exactly(fd, n, 7);
	EXPECT(0, "recv: the other end shut its side", recv(fd, b, 1, 0));
	EXPECT(0, "close", close(fd));
}

static void judge(const char *what, double before)
{
	double used = cpu_ms() - before;

	if (used > CPU_LIMIT_MS)
		fail("%s: %.0f ms of CPU in a %d ms wait", what, used, IDLE_MS);
	else
		say("%s: under %d ms of CPU: ok", what, CPU_LIMIT_MS);
}

int main(int argc, char **argv)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.u64 = 42 };
	struct pollfd p;
	struct peer c;
	int lfd, fd, ep, n;
	double t;
	char b;

	t_init(argc, argv);
	lfd = t_listen_peer(&c, "peer", peer, NULL, &port, T_FORK_FIRST);
	fd = t_accept(lfd);
	warmup(fd, false);

	ctl_send(&c, 1);
	t = cpu_ms();
	EXPECT(1, "recv, a second before the peer sends", recv(fd, &b, 1, 0));
	judge("blocked in recv", t);

	ctl_send(&c, 1);
	t = cpu_ms();
	p = (struct pollfd){ .fd = fd, .events = POLLIN };
	EXPECT(1, "poll for POLLIN", poll(&p, 1, 10000));
	judge("blocked in poll", t);
	EXPECT(1, "recv", recv(fd, &b, 1, 0));

	ctl_send(&c, 1);
	ep = MUST(epoll_create1(0));
	MUST(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev));
	t = cpu_ms();
	EXPECT(1, "epoll_wait for EPOLLIN", epoll_wait(ep, &ev, 1, 10000));
	judge("blocked in epoll_wait", t);
	EXPECT(1, "recv", recv(fd, &b, 1, 0));
	MUST(close(ep));

	/* fill what the peer takes without reading, then one more blocking send */
	n = fill_until_eagain(fd, 7);
	ctl_send(&c, n + 65536);
	t = cpu_ms();
	{
		static char more[65536];

		pattern(more, sizeof(more), 7, (uint64_t)n);
		send_all(fd, more, sizeof(more));
	}
	judge("blocked in send, the peer reading a second later", t);
	EXPECT(0, "shutdown SHUT_WR", shutdown(fd, SHUT_WR));

	EXPECT(0, "recv: the peer closed", recv(fd, &b, 1, 0));
	EXPECT(0, "close", close(fd));
	EXPECT(0, "close the listener", close(lfd));
	peer_end(&c);
	t_exit();
}

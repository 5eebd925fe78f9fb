/* SPDX-License-Identifier: MIT */
/*
 * poll, ppoll, select and pselect on connected sockets, over 127.0.0.1 and
 * ::1: nothing readable until the peer writes, writable at once, a blocked
 * wait woken by data that arrives later, POLLRDHUP after the peer's
 * shutdown, POLLHUP once both directions are shut, POLLERR|POLLHUP after a
 * reset.
 *
 * A readiness state is printed only from a zero-timeout call made after
 * the state has settled (wait_events): what a blocking call returns at the
 * instant it wakes is not printed, it may see a state half-updated by the
 * kernel.
 */
#define _GNU_SOURCE
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/sock/common.h"

#define ALL (POLLIN | POLLOUT | POLLRDHUP)

static void show_poll(int fd, short events, const char *what)
{
	struct pollfd pfd = { .fd = fd, .events = events };
	int r;

	errno = 0;
	r = poll(&pfd, 1, 0);
	t_expect(what, r, errno, pfd.revents ? 1 : 0, 0);
	say("  revents %s", pollstr(pfd.revents));
}

static void show_ppoll(int fd, short events, const char *what)
{
	struct pollfd pfd = { .fd = fd, .events = events };
	struct timespec ts = { 0, 0 };
	sigset_t mask;
	int r;

	sigemptyset(&mask);
	errno = 0;
	r = ppoll(&pfd, 1, &ts, &mask);
	t_expect(what, r, errno, pfd.revents ? 1 : 0, 0);
	say("  revents %s", pollstr(pfd.revents));
}

/* select and pselect with the fd in all three sets, no waiting */
static void show_select(int fd, bool use_pselect, const char *what)
{
	fd_set r, w, e;
	struct timeval tv = { 0, 0 };
	struct timespec ts = { 0, 0 };
	sigset_t mask;
	int n;

	FD_ZERO(&r);
	FD_ZERO(&w);
	FD_ZERO(&e);
	FD_SET(fd, &r);
	FD_SET(fd, &w);
	FD_SET(fd, &e);
	sigemptyset(&mask);
	errno = 0;
	n = use_pselect ? pselect(fd + 1, &r, &w, &e, &ts, &mask)
			: select(fd + 1, &r, &w, &e, &tv);
	t_expect(what, n, errno, FD_ISSET(fd, &r) + FD_ISSET(fd, &w) + FD_ISSET(fd, &e), 0);
	say("  read %d write %d except %d", FD_ISSET(fd, &r), FD_ISSET(fd, &w), FD_ISSET(fd, &e));
}

static void show_all(int fd, const char *when)
{
	char what[128];

	snprintf(what, sizeof(what), "poll %s", when);
	show_poll(fd, ALL, what);
	snprintf(what, sizeof(what), "ppoll %s", when);
	show_ppoll(fd, ALL, what);
	snprintf(what, sizeof(what), "select %s", when);
	show_select(fd, false, what);
	snprintf(what, sizeof(what), "pselect %s", when);
	show_select(fd, true, what);
}

static void read_servant(int fd, size_t n)
{
	recv_servant_data(fd, n);
	say("read %zu bytes", n);
}

/* Each blocking form waits for data the servant sends 30 ms later. */
static void blocking_waits(struct servant *s, int fd)
{
	struct pollfd pfd = { .fd = fd, .events = POLLIN };
	sigset_t mask;
	fd_set r;

	sigemptyset(&mask);
	servant_do(s, 0, S_SEND_LATER, 11);
	EXPECT(1, "poll POLLIN, no timeout, data arrives later", poll(&pfd, 1, -1));
	read_servant(fd, 11);

	pfd.revents = 0;
	servant_do(s, 0, S_SEND_LATER, 12);
	EXPECT(1, "poll POLLIN, 5 s timeout, data arrives later", poll(&pfd, 1, 5000));
	read_servant(fd, 12);

	pfd.revents = 0;
	servant_do(s, 0, S_SEND_LATER, 13);
	EXPECT(1, "ppoll POLLIN, no timeout, data arrives later", ppoll(&pfd, 1, NULL, &mask));
	read_servant(fd, 13);

	FD_ZERO(&r);
	FD_SET(fd, &r);
	servant_do(s, 0, S_SEND_LATER, 14);
	EXPECT(1, "select read, no timeout, data arrives later",
	       select(fd + 1, &r, NULL, NULL, NULL));
	CHECK(FD_ISSET(fd, &r), "select did not mark the fd");
	read_servant(fd, 14);

	FD_ZERO(&r);
	FD_SET(fd, &r);
	servant_do(s, 0, S_SEND_LATER, 15);
	EXPECT(1, "pselect read, no timeout, data arrives later",
	       pselect(fd + 1, &r, NULL, NULL, NULL, &mask));
	CHECK(FD_ISSET(fd, &r), "pselect did not mark the fd");
	read_servant(fd, 15);
}

static void run(int family)
{
	struct servant s;
	int fd;
	char buf[64];
	struct pollfd pfd = { .events = POLLIN };
	double t0;

	say("== %s", famname(family));
	servant_start(&s, family);
	fd = servant_connect(&s);

	show_all(fd, "idle");
	t0 = now_ms();
	pfd.fd = fd;
	EXPECT(0, "poll POLLIN, 50 ms timeout, nothing comes", poll(&pfd, 1, 50));
	CHECK(now_ms() - t0 >= 45, "poll returned before its timeout");

	servant_do(&s, 0, S_SEND, 10);
	wait_events(fd, POLLIN);
	show_all(fd, "after the peer wrote 10");
	read_servant(fd, 10);
	show_all(fd, "after reading them");

	blocking_waits(&s, fd);
	show_all(fd, "after the waits");

	/* the peer's half-close: readable (EOF), RDHUP, still writable */
	servant_do(&s, 0, S_SHUT_WR, 0);
	wait_events(fd, POLLRDHUP);
	show_all(fd, "after the peer's SHUT_WR");
	EXPECT(0, "recv at EOF", recv(fd, buf, sizeof(buf), 0));
	show_all(fd, "after reading EOF");
	client_data(buf, 20);
	EXPECT(20, "send 20 to the half-closed peer", send(fd, buf, 20, 0));
	servant_do(&s, 0, S_RECV, 20);
	servant_do(&s, 0, S_POLL, 0);

	/* both directions shut: POLLHUP on both ends */
	EXPECT(0, "shutdown SHUT_WR", shutdown(fd, SHUT_WR));
	show_all(fd, "after both SHUT_WR");
	servant_do(&s, 0, S_RECV_EOF, 0);
	servant_do(&s, 0, S_POLL, 0);
	servant_do(&s, 0, S_CLOSE, 0);
	EXPECT(0, "close", close(fd));

	/* the peer closes outright; our write draws a reset: ERR|HUP */
	fd = servant_connect(&s);
	servant_do(&s, 1, S_CLOSE, 0);
	wait_events(fd, POLLRDHUP);
	show_all(fd, "after the peer's close");
	EXPECT(5, "send 5 to the closed peer", send(fd, "hello", 5, MSG_NOSIGNAL));
	wait_events(fd, POLLERR);
	show_all(fd, "after the reset");
	EXPECT(0, "recv after the reset (the FIN came first)", recv(fd, buf, sizeof(buf), 0));
	EXPECT_ERR(EPIPE, "send after the reset", send(fd, "x", 1, MSG_NOSIGNAL));
	show_all(fd, "after the error was read");
	EXPECT(0, "close", close(fd));

	/* a reset without a FIN first: the error comes with the first read */
	fd = servant_connect(&s);
	servant_do(&s, 2, S_RESET, 0);
	wait_events(fd, POLLERR);
	show_all(fd, "after the peer's reset");
	EXPECT_ERR(ECONNRESET, "recv after the reset", recv(fd, buf, sizeof(buf), 0));
	show_all(fd, "after the error was read");
	EXPECT(0, "recv again", recv(fd, buf, sizeof(buf), 0));
	EXPECT(0, "close", close(fd));

	servant_end(&s);
}

int main(int argc, char **argv)
{
	t_init(argc, argv);
	run(AF_INET);
	run(AF_INET6);
	t_exit();
}

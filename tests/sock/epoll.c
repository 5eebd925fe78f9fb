/* SPDX-License-Identifier: MIT */
/*
 * epoll on connected sockets: level- and edge-triggered, data.u64 handed
 * back unchanged, an epoll set inside another, EPOLL_CTL_MOD switching the
 * interest and the cookie, a registration that outlives the fd it was made
 * with (the kernel ties it to the open file, not the number), one set
 * shared by threads, and sockets idle while their set slept.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/sock/common.h"

/* cookies with every byte distinct, so a truncated or swapped one shows */
#define U_LT     0x1122334455667788ull
#define U_ET     0xfedcba9876543210ull
#define U_ETIO   0x8877665544332211ull
#define U_INNER  0x0123456789abcdefull
#define U_OUTER  0xa5a5a5a5deadbeefull
#define U_MOD_A  0x0000000100000002ull
#define U_MOD_B  0xffffffff00000000ull
#define U_MOD_C  0x00000000ffffffffull
#define U_MOD_D  0x8000000000000001ull
#define U_DUP    0x5555aaaa5555aaaaull
#define U_T1     0x1000000000000001ull
#define U_T2     0x2000000000000002ull
#define U_LATE   0x3000000000000003ull

static struct servant s;

/* epoll_wait with timeout ms; prints the result and each event */
static int show_wait(int ep, int ms, int want, const char *what)
{
	struct epoll_event ev[8];
	sigset_t mask;
	int n;

	memset(ev, 0, sizeof(ev));
	sigemptyset(&mask);
	errno = 0;
	/* every other call through epoll_pwait, so both are covered */
	n = (ms & 1) ? epoll_wait(ep, ev, 8, ms) : epoll_pwait(ep, ev, 8, ms, &mask);
	t_expect(what, n, errno, want, 0);
	for (int i = 0; i < n; i++)
		say("  events %s data.u64 %016" PRIx64, epollstr(ev[i].events), ev[i].data.u64);
	return n;
}

static int ep_ctl(int ep, int op, int fd, uint32_t events, uint64_t u64)
{
	struct epoll_event ev = { .events = events, .data.u64 = u64 };

	return epoll_ctl(ep, op, fd, &ev);
}

static void wait_readable(int fd)
{
	struct pollfd pfd = { .fd = fd, .events = POLLIN };

	if (poll(&pfd, 1, -1) != 1)
		die("poll: %s", ename(errno));
}

static void level_triggered(void)
{
	int fd = servant_connect(&s), ep = MUST(epoll_create1(EPOLL_CLOEXEC));

	say("-- level-triggered");
	EXPECT(0, "epoll_ctl ADD IN", ep_ctl(ep, EPOLL_CTL_ADD, fd, EPOLLIN, U_LT));
	show_wait(ep, 0, 0, "epoll_wait idle");
	servant_do(&s, 0, S_SEND, 10);
	show_wait(ep, -1, 1, "epoll_wait, the peer wrote");
	show_wait(ep, 0, 1, "epoll_wait again, still unread");
	recv_servant_data(fd, 10);
	show_wait(ep, 0, 0, "epoll_wait after reading");
	EXPECT(0, "epoll_ctl MOD IN|OUT", ep_ctl(ep, EPOLL_CTL_MOD, fd, EPOLLIN | EPOLLOUT, U_LT));
	show_wait(ep, 0, 1, "epoll_wait for IN|OUT");
	show_wait(ep, 1, 1, "epoll_wait for IN|OUT again");
	/* the peer's half-close */
	EXPECT(0, "epoll_ctl MOD IN|RDHUP",
	       ep_ctl(ep, EPOLL_CTL_MOD, fd, EPOLLIN | EPOLLRDHUP, U_LT));
	servant_do(&s, 0, S_SHUT_WR, 0);
	show_wait(ep, -1, 1, "epoll_wait, the peer shut down");
	EXPECT(0, "close", close(fd));
	EXPECT(0, "close epoll", close(ep));
}

static void edge_triggered(void)
{
	int fd = servant_connect(&s), ep = MUST(epoll_create1(0));
	char buf[64];

	say("-- edge-triggered");
	set_nonblock(fd, true);
	EXPECT(0, "epoll_ctl ADD IN|ET", ep_ctl(ep, EPOLL_CTL_ADD, fd, EPOLLIN | EPOLLET, U_ET));
	show_wait(ep, 0, 0, "epoll_wait idle");
	servant_do(&s, 1, S_SEND, 10);
	show_wait(ep, -1, 1, "epoll_wait, the peer wrote");
	show_wait(ep, 0, 0, "epoll_wait again: the edge is spent");
	EXPECT(4, "recv 4 of 10", recv(fd, buf, 4, 0));
	show_wait(ep, 0, 0, "epoll_wait after a partial read: no new edge");
	servant_do(&s, 1, S_SEND, 10);
	show_wait(ep, -1, 1, "epoll_wait, the peer wrote more");
	EXPECT(16, "recv the rest", recv(fd, buf, sizeof(buf), 0));
	EXPECT_ERR(EAGAIN, "recv until EAGAIN", recv(fd, buf, sizeof(buf), 0));
	show_wait(ep, 0, 0, "epoll_wait drained");

	/* IN|OUT edge-triggered: writable at once, then each arrival reports both */
	EXPECT(0, "epoll_ctl MOD IN|OUT|ET", ep_ctl(ep, EPOLL_CTL_MOD, fd,
						    EPOLLIN | EPOLLOUT | EPOLLET, U_ETIO));
	show_wait(ep, 0, 1, "epoll_wait after MOD");
	show_wait(ep, 0, 0, "epoll_wait again");
	servant_do(&s, 1, S_SEND, 7);
	show_wait(ep, -1, 1, "epoll_wait, the peer wrote");
	EXPECT(7, "recv 7", recv(fd, buf, sizeof(buf), 0));
	show_wait(ep, 0, 0, "epoll_wait after reading");
	EXPECT(0, "close", close(fd));
	EXPECT(0, "close epoll", close(ep));
}

static void nested(void)
{
	int fd = servant_connect(&s);
	int inner = MUST(epoll_create1(0)), outer = MUST(epoll_create1(0));
	struct pollfd pfd = { .fd = inner, .events = POLLIN };

	say("-- nested");
	EXPECT(0, "epoll_ctl inner ADD socket", ep_ctl(inner, EPOLL_CTL_ADD, fd, EPOLLIN, U_INNER));
	EXPECT(0, "epoll_ctl outer ADD inner",
	       ep_ctl(outer, EPOLL_CTL_ADD, inner, EPOLLIN, U_OUTER));
	show_wait(outer, 0, 0, "epoll_wait outer idle");
	EXPECT(0, "poll the inner set idle", poll(&pfd, 1, 0));
	servant_do(&s, 2, S_SEND, 10);
	show_wait(outer, -1, 1, "epoll_wait outer, the peer wrote");
	EXPECT(1, "poll the inner set", poll(&pfd, 1, 0));
	say("  revents %s", pollstr(pfd.revents));
	show_wait(inner, 0, 1, "epoll_wait inner");
	recv_servant_data(fd, 10);
	show_wait(outer, 0, 0, "epoll_wait outer after reading");
	show_wait(inner, 0, 0, "epoll_wait inner after reading");
	/* an arrival while the waiter sleeps on the outer set */
	servant_do(&s, 2, S_SEND_LATER, 12);
	show_wait(outer, 5000, 1, "epoll_wait outer, data comes later");
	recv_servant_data(fd, 12);
	EXPECT_ERR(EINVAL, "epoll_ctl ADD a set to itself",
	           ep_ctl(outer, EPOLL_CTL_ADD, outer, EPOLLIN, 0));
	EXPECT(0, "close", close(fd));
	EXPECT(0, "close inner", close(inner));
	EXPECT(0, "close outer", close(outer));
}

static void modify(void)
{
	int fd = servant_connect(&s), ep = MUST(epoll_create1(0));

	say("-- EPOLL_CTL_MOD");
	EXPECT(0, "epoll_ctl ADD IN", ep_ctl(ep, EPOLL_CTL_ADD, fd, EPOLLIN, U_MOD_A));
	show_wait(ep, 0, 0, "epoll_wait for IN");
	EXPECT(0, "epoll_ctl MOD OUT", ep_ctl(ep, EPOLL_CTL_MOD, fd, EPOLLOUT, U_MOD_B));
	show_wait(ep, 0, 1, "epoll_wait for OUT");
	EXPECT(0, "epoll_ctl MOD IN", ep_ctl(ep, EPOLL_CTL_MOD, fd, EPOLLIN, U_MOD_C));
	show_wait(ep, 0, 0, "epoll_wait for IN again");
	servant_do(&s, 3, S_SEND, 10);
	show_wait(ep, -1, 1, "epoll_wait, the peer wrote");
	EXPECT(0, "epoll_ctl MOD IN|OUT",
	       ep_ctl(ep, EPOLL_CTL_MOD, fd, EPOLLIN | EPOLLOUT, U_MOD_D));
	show_wait(ep, 0, 1, "epoll_wait for IN|OUT");
	EXPECT(0, "epoll_ctl MOD 0 (disabled)", ep_ctl(ep, EPOLL_CTL_MOD, fd, 0, U_MOD_D));
	show_wait(ep, 0, 0, "epoll_wait with no interest");
	recv_servant_data(fd, 10);
	EXPECT_ERR(EEXIST, "epoll_ctl ADD again", ep_ctl(ep, EPOLL_CTL_ADD, fd, EPOLLIN, 0));
	EXPECT(0, "epoll_ctl DEL", ep_ctl(ep, EPOLL_CTL_DEL, fd, 0, 0));
	EXPECT_ERR(ENOENT, "epoll_ctl DEL again", ep_ctl(ep, EPOLL_CTL_DEL, fd, 0, 0));
	EXPECT_ERR(ENOENT, "epoll_ctl MOD after DEL", ep_ctl(ep, EPOLL_CTL_MOD, fd, EPOLLIN, 0));
	servant_do(&s, 3, S_SEND, 10);
	wait_readable(fd);
	show_wait(ep, 0, 0, "epoll_wait after DEL, data unread");
	recv_servant_data(fd, 10);

	/* the registration belongs to the open file: it outlives this fd number */
	int d = MUST(dup(fd));

	EXPECT(0, "epoll_ctl ADD IN", ep_ctl(ep, EPOLL_CTL_ADD, fd, EPOLLIN, U_DUP));
	EXPECT(0, "close the registered fd (a dup remains)", close(fd));
	servant_do(&s, 3, S_SEND, 10);
	show_wait(ep, -1, 1, "epoll_wait: still reported through the old registration");
	EXPECT_ERR(EBADF, "epoll_ctl DEL by the closed number",
	           ep_ctl(ep, EPOLL_CTL_DEL, fd, 0, 0));
	EXPECT_ERR(ENOENT, "epoll_ctl DEL by the dup's number", ep_ctl(ep, EPOLL_CTL_DEL, d, 0, 0));
	recv_servant_data(d, 10);
	show_wait(ep, 0, 0, "epoll_wait after reading");
	EXPECT(0, "close the dup", close(d));
	EXPECT(0, "close epoll", close(ep));
}

struct waiter {
	int ep;
	int fds[2];         /* the sockets behind U_T1 and U_T2 */
	uint64_t got;
	int n;
	bool data_ok;
	pthread_t th;
};

/* One event from the shared set, then read what it announced. */
static void *waiter_main(void *arg)
{
	struct waiter *w = arg;
	struct epoll_event ev;
	char buf[32], want[32];
	int n;

	do
		n = epoll_wait(w->ep, &ev, 1, -1);
	while (n < 0 && errno == EINTR);
	w->n = n;
	if (n != 1)
		return NULL;
	w->got = ev.data.u64;
	n = ev.data.u64 == U_T1 ? 10 : ev.data.u64 == U_T2 ? 20 :
	    ev.data.u64 == U_LATE ? 5 : 0;
	if (!n)
		return NULL;
	int fd = ev.data.u64 == U_T2 ? w->fds[1] : w->fds[0];

	if (recv(fd, buf, n, MSG_WAITALL) != n)
		return NULL;
	servant_data(want, n);
	w->data_ok = !memcmp(buf, want, n);
	return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = ((const struct waiter *)a)->got, y = ((const struct waiter *)b)->got;

	return x < y ? -1 : x > y;
}

static void shared_by_threads(void)
{
	int a = servant_connect(&s), b = servant_connect(&s), ep = MUST(epoll_create1(0));
	struct waiter w[2];

	say("-- one set, two threads");
	EXPECT(0, "epoll_ctl ADD a IN|ONESHOT",
	       ep_ctl(ep, EPOLL_CTL_ADD, a, EPOLLIN | EPOLLONESHOT, U_T1));
	EXPECT(0, "epoll_ctl ADD b IN|ONESHOT",
	       ep_ctl(ep, EPOLL_CTL_ADD, b, EPOLLIN | EPOLLONESHOT, U_T2));
	for (int i = 0; i < 2; i++) {
		w[i] = (struct waiter){ .ep = ep, .fds = { a, b } };
		pthread_create(&w[i].th, NULL, waiter_main, &w[i]);
	}
	sleep_ms(50);   /* both asleep in epoll_wait, most likely */
	servant_do(&s, 4, S_SEND, 10);
	servant_do(&s, 5, S_SEND, 20);
	for (int i = 0; i < 2; i++)
		pthread_join(w[i].th, NULL);
	/* which thread got which is up to the scheduler: print them in order */
	qsort(w, 2, sizeof(w[0]), cmp_u64);
	for (int i = 0; i < 2; i++)
		say("a thread got %d event, data.u64 %016" PRIx64 ", data %s", w[i].n, w[i].got,
		    w[i].data_ok ? "ok" : "WRONG");
	show_wait(ep, 0, 0, "epoll_wait: both one-shots spent");
	EXPECT(0, "epoll_ctl DEL a", ep_ctl(ep, EPOLL_CTL_DEL, a, 0, 0));
	EXPECT(0, "epoll_ctl DEL b", ep_ctl(ep, EPOLL_CTL_DEL, b, 0, 0));

	/* a thread asleep on the set wakes for a ready socket another thread adds */
	servant_do(&s, 4, S_SEND, 5);
	wait_readable(a);
	w[0] = (struct waiter){ .ep = ep, .fds = { a, b } };
	pthread_create(&w[0].th, NULL, waiter_main, &w[0]);
	sleep_ms(50);
	EXPECT(0, "epoll_ctl ADD a (readable) while a thread waits",
	       ep_ctl(ep, EPOLL_CTL_ADD, a, EPOLLIN | EPOLLONESHOT, U_LATE));
	pthread_join(w[0].th, NULL);
	say("the waiting thread got %d event, data.u64 %016" PRIx64 ", data %s", w[0].n, w[0].got,
	    w[0].data_ok ? "ok" : "WRONG");
	EXPECT(0, "close a", close(a));
	EXPECT(0, "close b", close(b));
	EXPECT(0, "close epoll", close(ep));
}

/*
 * A socket idle while its set slept, then data: while the set sleeps,
 * between two waits, and after it slept idle once more; and a set whose fd
 * alone is polled (inside no other set) hears of its socket's data.
 */
static void idle_then_data(void)
{
	int fd = servant_connect(&s), ep = MUST(epoll_create1(0));
	struct pollfd pfd = { .fd = ep, .events = POLLIN };

	say("-- idle, then data");
	EXPECT(0, "epoll_ctl ADD IN", ep_ctl(ep, EPOLL_CTL_ADD, fd, EPOLLIN, U_LATE));
	show_wait(ep, 21, 0, "epoll_wait sleeps, idle");
	servant_do(&s, 6, S_SEND_LATER, 9);
	show_wait(ep, 5001, 1, "epoll_wait, data comes while it sleeps");
	recv_servant_data(fd, 9);
	show_wait(ep, 0, 0, "epoll_wait after reading");
	servant_do(&s, 6, S_SEND, 5);
	show_wait(ep, 5000, 1, "epoll_wait, data came between waits");
	recv_servant_data(fd, 5);
	show_wait(ep, 20, 0, "epoll_wait sleeps, idle again");
	show_wait(ep, 21, 0, "and again");
	servant_do(&s, 6, S_SEND, 6);
	show_wait(ep, 5000, 1, "epoll_wait, data came after it slept idle");
	show_wait(ep, 20, 1, "epoll_wait, still unread");
	recv_servant_data(fd, 6);
	EXPECT(0, "poll the set idle", poll(&pfd, 1, 0));
	EXPECT(0, "poll the set, nothing comes", poll(&pfd, 1, 30));
	servant_do(&s, 6, S_SEND_LATER, 4);
	EXPECT(1, "poll the set, data comes while it sleeps", poll(&pfd, 1, 5000));
	show_wait(ep, 0, 1, "epoll_wait, the data polled");
	recv_servant_data(fd, 4);
	EXPECT(0, "poll the set after reading", poll(&pfd, 1, 0));
	EXPECT(0, "close", close(fd));
	EXPECT(0, "close epoll", close(ep));
}

int main(int argc, char **argv)
{
	t_init(argc, argv);
	servant_start(&s, AF_INET);
	level_triggered();
	edge_triggered();
	nested();
	modify();
	shared_by_threads();
	idle_then_data();
	servant_end(&s);
	t_exit();
}

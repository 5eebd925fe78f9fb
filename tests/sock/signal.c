/* SPDX-License-Identifier: MIT */
/*
 * Signals during blocking calls, and the socket timeouts.
 *
 * A handler without SA_RESTART interrupts a blocked recv or send: -1 EINTR.
 * With SA_RESTART they go on and return the data that comes later; but a
 * recv with SO_RCVTIMEO set, poll, select and epoll_wait are never
 * restarted (signal(7)).  SO_RCVTIMEO and SO_SNDTIMEO end a wait with
 * -1 EAGAIN no sooner than the timeout.
 */
#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "tests/sock/common.h"

#define TIMEOUT_MS 200
/* the kernel counts socket timeouts in jiffies and may wake up to one early */
#define JIFFY_SLACK_MS 10

static struct servant s;
static volatile sig_atomic_t hits;
static pthread_t main_thread;

static void on_usr1(int sig)
{
	(void)sig;
	hits++;
}

static void handler(bool restart)
{
	struct sigaction sa = { .sa_handler = on_usr1, .sa_flags = restart ? SA_RESTART : 0 };

	sigaction(SIGUSR1, &sa, NULL);
}

struct poke {
	pthread_t th;
	int conn;           /* then the servant does on this connection ... */
	int cmd, arg;       /* ... this (S_QUIT: nothing) */
	atomic_bool done;   /* the main thread's call returned */
};

/*
 * 50 ms on (the main thread is asleep in its call by then), signal the main
 * thread; 50 ms later let the call complete.  A call that only a signal
 * ends gets another every 200 ms: on a loaded machine the first may come
 * before the call blocked, and the test must not hang for it.
 */
static void *poke_main(void *arg)
{
	struct poke *p = arg;

	sleep_ms(50);
	pthread_kill(main_thread, SIGUSR1);
	if (p->cmd != S_QUIT) {
		sleep_ms(50);
		servant_do(&s, p->conn, p->cmd, p->arg);
		return NULL;
	}
	for (;;) {
		sleep_ms(200);
		if (atomic_load(&p->done))
			break;
		pthread_kill(main_thread, SIGUSR1);
	}
	return NULL;
}

static void poke(struct poke *p, int conn, int cmd, int arg)
{
	hits = 0;
	p->conn = conn;
	p->cmd = cmd;
	p->arg = arg;
	atomic_init(&p->done, false);
	pthread_create(&p->th, NULL, poke_main, p);
}

/* After the call: join the thread, and say whether the handler ran. */
static void unpoke(struct poke *p)
{
	atomic_store(&p->done, true);
	pthread_join(p->th, NULL);
	CHECK(hits > 0, "the handler never ran");
	say("  the handler ran");
}

static void interrupted_recv(int fd)
{
	struct poke p;
	char buf[64];

	say("-- EINTR in recv");
	handler(false);
	poke(&p, 0, S_QUIT, 0);
	EXPECT_ERR(EINTR, "recv, a handler without SA_RESTART runs", recv(fd, buf, sizeof(buf), 0));
	unpoke(&p);
	servant_do(&s, 0, S_SEND, 10);
	EXPECT(10, "recv after the EINTR: nothing was lost", recv(fd, buf, 10, MSG_WAITALL));

	handler(true);
	poke(&p, 0, S_SEND, 12);
	EXPECT(12, "recv, a handler with SA_RESTART runs, data comes later",
	       recv(fd, buf, sizeof(buf), 0));
	unpoke(&p);
	poke(&p, 0, S_SEND, 13);
	EXPECT(13, "read, SA_RESTART", read(fd, buf, sizeof(buf)));
	unpoke(&p);
}

static void never_restarted(int fd)
{
	struct poke p;
	struct pollfd pfd = { .fd = fd, .events = POLLIN };
	struct epoll_event ev = { .events = EPOLLIN };
	struct timeval tv = { 5, 0 };
	fd_set r;
	int ep = MUST(epoll_create1(0));
	char buf[64];

	say("-- never restarted, even with SA_RESTART");
	handler(true);
	MUST(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev));
	poke(&p, 0, S_QUIT, 0);
	EXPECT_ERR(EINTR, "poll", poll(&pfd, 1, -1));
	unpoke(&p);
	poke(&p, 0, S_QUIT, 0);
	EXPECT_ERR(EINTR, "epoll_wait", epoll_wait(ep, &ev, 1, -1));
	unpoke(&p);
	FD_ZERO(&r);
	FD_SET(fd, &r);
	poke(&p, 0, S_QUIT, 0);
	EXPECT_ERR(EINTR, "select", select(fd + 1, &r, NULL, NULL, &tv));
	unpoke(&p);
	/* a receive timeout makes a blocked recv unrestartable (sock_intr_errno) */
	tv = (struct timeval){ 5, 0 };
	MUST(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)));
	poke(&p, 0, S_QUIT, 0);
	EXPECT_ERR(EINTR, "recv with SO_RCVTIMEO 5 s", recv(fd, buf, sizeof(buf), 0));
	unpoke(&p);
	tv = (struct timeval){ 0, 0 };
	MUST(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)));
	close(ep);
}

static void interrupted_send(int fd)
{
	struct poke p;
	int total;

	say("-- EINTR in send");
	/* full: a blocking send waits for room the servant will not make yet */
	total = fill_until_eagain(fd, 56);
	handler(false);
	poke(&p, 0, S_QUIT, 0);
	EXPECT_ERR(EINTR, "send 1 into a full socket, a handler without SA_RESTART runs",
		   send(fd, "", 1, 0));
	unpoke(&p);

	/* with SA_RESTART it goes on until the servant drains */
	char b;

	pattern(&b, 1, 56, total);
	handler(true);
	poke(&p, 0, S_DRAIN, total + 1);
	EXPECT(1, "send 1 into a full socket, SA_RESTART, then the peer drains",
	       send(fd, &b, 1, 0));
	unpoke(&p);
}

static double timed_ms;

static void timeouts(int fd)
{
	struct timeval tv = { 0, TIMEOUT_MS * 1000 }, got;
	socklen_t len = sizeof(got);
	char buf[64];
	double t0;
	int total;

	say("-- SO_RCVTIMEO");
	EXPECT(0, "setsockopt SO_RCVTIMEO 200 ms",
	       setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)));
	EXPECT(0, "getsockopt SO_RCVTIMEO", getsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &got, &len));
	say("  %ld.%06ld s", (long)got.tv_sec, (long)got.tv_usec);
	t0 = now_ms();
	EXPECT_ERR(EAGAIN, "recv, nothing comes", recv(fd, buf, sizeof(buf), 0));
	timed_ms = now_ms() - t0;
	CHECK(timed_ms >= TIMEOUT_MS - JIFFY_SLACK_MS, "recv timed out after %.1f ms", timed_ms);
	say("  waited at least the timeout");
	t0 = now_ms();
	EXPECT_ERR(EAGAIN, "read, nothing comes", read(fd, buf, sizeof(buf)));
	timed_ms = now_ms() - t0;
	CHECK(timed_ms >= TIMEOUT_MS - JIFFY_SLACK_MS, "read timed out after %.1f ms", timed_ms);
	servant_do(&s, 1, S_SEND_LATER, 10);
	EXPECT(10, "recv, data comes within the timeout", recv(fd, buf, sizeof(buf), 0));
	servant_do(&s, 1, S_SEND, 3);
	EXPECT(3, "recv MSG_WAITALL 10, 3 come, then the timeout",
	       recv(fd, buf, 10, MSG_WAITALL));

	say("-- SO_SNDTIMEO");
	total = fill_until_eagain(fd, 56);
	EXPECT(0, "setsockopt SO_SNDTIMEO 200 ms",
	       setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)));
	len = sizeof(got);
	EXPECT(0, "getsockopt SO_SNDTIMEO", getsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &got, &len));
	say("  %ld.%06ld s", (long)got.tv_sec, (long)got.tv_usec);
	t0 = now_ms();
	EXPECT_ERR(EAGAIN, "send 1 into a full socket", send(fd, "", 1, 0));
	timed_ms = now_ms() - t0;
	CHECK(timed_ms >= TIMEOUT_MS - JIFFY_SLACK_MS, "send timed out after %.1f ms", timed_ms);
	say("  waited at least the timeout");
	servant_do(&s, 1, S_DRAIN, total);
	servant_do(&s, 1, S_EMPTY, 0);
}

int main(int argc, char **argv)
{
	int fd0, fd1;

	t_init(argc, argv);
	main_thread = pthread_self();
	servant_start(&s, AF_INET);
	fd0 = servant_connect(&s);
	fd1 = servant_connect(&s);
	interrupted_recv(fd0);
	never_restarted(fd0);
	interrupted_send(fd0);
	timeouts(fd1);
	EXPECT(0, "close", close(fd0));
	EXPECT(0, "close", close(fd1));
	servant_end(&s);
	t_exit();
}

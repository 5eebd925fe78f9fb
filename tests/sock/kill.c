/* SPDX-License-Identifier: MIT */
/*
 * A peer killed with SIGKILL in the middle of a transfer.  The survivor
 * holds two connections, each to its own peer process: the victim streams
 * data on the first and is killed while it sends; the survivor then reads
 * the end of that stream (EOF or ECONNRESET, whichever the kernel gives: the
 * transcript says only that it ended, and never hangs), sees a send fail,
 * and goes on exchanging data with the other peer as before.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/sock/common.h"

#define CHUNK (64 << 10)

/*
 * The peers are forked before anything else, as a program with the
 * switch's threads running should not fork while they may hold a lock
 * (the sanitizer build's allocator deadlocks in such a child); they learn
 * the port from the control channel.
 */

/* The victim: connect, warm up, then stream until killed. */
static void victim(struct peer *self, void *arg)
{
	static char buf[CHUNK];
	int fd = t_connect(AF_INET, ctl_recv(self));

	(void)arg;
	warmup(fd, false);
	pattern(buf, sizeof(buf), 9, 0);
	ctl_send(self, 1);
	for (;;)
		send_all(fd, buf, sizeof(buf));
}

/* The other peer: connect, warm up, answer requests until the end. */
static void other(struct peer *self, void *arg)
{
	int fd = t_connect(AF_INET, ctl_recv(self));

	(void)arg;
	warmup(fd, false);
	say("served %d requests", echo_serve(fd));
	EXPECT(0, "close", close(fd));
	t_exit();
}

int main(int argc, char **argv)
{
	static char buf[CHUNK];
	struct peer v, o;
	int lfd, a, b, port, ended = 0, failed = 0;
	ssize_t n;

	t_init(argc, argv);
	signal(SIGPIPE, SIG_IGN);
	peer_start(&v, "victim", victim, NULL);
	peer_start(&o, "other", other, NULL);
	lfd = t_listen(AF_INET, &port);
	ctl_send(&v, port);
	a = t_accept(lfd);
	warmup(a, true);
	ctl_send(&o, port);
	b = t_accept(lfd);
	warmup(b, true);

	/* the victim streams; take some of it, then kill it mid-transfer */
	ctl_recv(&v);
	recv_all(a, buf, sizeof(buf));
	kill(v.pid, SIGKILL);
	say("killed the sender mid-transfer");
	for (;;) {
		n = recv(a, buf, sizeof(buf), 0);
		if (n > 0)
			continue;
		if (n == 0 || errno == ECONNRESET)
			ended = 1;
		else
			fail("recv after the kill: %s", ename(errno));
		break;
	}
	say("the dead peer's stream ended: %s", ended ? "yes (EOF or ECONNRESET)" : "no");
	for (int i = 0; i < 100 && !failed; i++) {
		n = send(a, buf, sizeof(buf), MSG_NOSIGNAL);
		if (n < 0) {
			failed = errno == EPIPE || errno == ECONNRESET;
			if (!failed)
				fail("send to the dead peer: %s", ename(errno));
			break;
		}
	}
	say("a send to the dead peer fails: %s", failed ? "yes (EPIPE or ECONNRESET)" : "no");
	EXPECT(0, "close the dead peer's connection", close(a));
	{
		int st = 0;

		waitpid(v.pid, &st, 0);   /* not peer_end: it did not exit 0, on purpose */
		say("the victim was killed by signal %d",
		    WIFSIGNALED(st) ? WTERMSIG(st) : 0);
	}
	if (!ended || !failed)
		t_failed = true;

	/* the other connection does not notice */
	for (int i = 0; i < 3; i++)
		echo_call(b, 1000 + i, 40 + i);
	say("the other connection still works: 3 requests answered");
	EXPECT(0, "close", close(b));
	peer_end(&o);
	EXPECT(0, "close listener", close(lfd));
	t_exit();
}

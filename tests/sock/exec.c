/* SPDX-License-Identifier: MIT */
/*
 * exec with accelerated connections.  The program execs itself: in the new
 * image a close-on-exec socket is gone (EBADF), one without the flag keeps
 * working, including a response that had already arrived before the exec
 * (as an inetd-style handler finds the client's first bytes waiting), and
 * a new connection made in the new image is accelerated again; the peer
 * of the close-on-exec socket reads the end of the stream (not a reset).
 * First two execs that fail, after which both sockets still work.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/sock/common.h"

#define MARK "--after-exec"
#define INFLIGHT_LEN 5000
#define INFLIGHT_SEED 777

static struct echo e;

static void after_exec(char **argv)
{
	int c1 = atoi(argv[2]), c2 = atoi(argv[3]), c3;

	e.family = AF_INET;
	e.port = atoi(argv[4]);
	e.nconn = 3;
	e.p = (struct peer){ .pid = atoi(argv[5]), .name = "echo", .ctl_r = atoi(argv[6]),
			     .ctl_w = atoi(argv[7]), .log = atoi(argv[8]) };
	say("-- the new image");
	EXPECT_ERR(EBADF, "fcntl F_GETFD of the close-on-exec socket", fcntl(c1, F_GETFD));
	EXPECT(0, "fcntl F_GETFD of the inherited socket", fcntl(c2, F_GETFD));
	echo_response(c2, INFLIGHT_LEN, INFLIGHT_SEED);
	say("the response that arrived before exec: ok");
	echo_calls(c2, 10, 20);
	say("10 calls on the inherited connection: ok");
	c3 = echo_connect(&e);
	echo_calls(c3, 10, 30);
	say("10 calls on a new connection: ok");
	EXPECT(0, "close the new connection", close(c3));
	EXPECT(0, "close the inherited connection", close(c2));
	echo_end(&e);
}

int main(int argc, char **argv)
{
	char a[8][16];
	int c1, c2;

	t_init(argc, argv);
	if (argc == 9 && !strcmp(argv[1], MARK)) {
		after_exec(argv);
		t_exit();
	}

	echo_start(&e, AF_INET, 3);
	{
		/* close-on-exec from the start: SOCK_CLOEXEC */
		struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(e.port),
					   .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };

		int s = MUST(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));

		/*
		 * a high number: after exec the lowest free numbers may go to
		 * a preloaded library's own files, and the EBADF check must be
		 * about this socket, not about whoever got its number
		 */
		c1 = MUST(dup3(s, 700, O_CLOEXEC));
		MUST(close(s));
		MUST(connect(c1, (struct sockaddr *)&sin, sizeof(sin)));
		warmup(c1, true);
	}
	c2 = echo_connect(&e);
	echo_calls(c1, 5, 1);
	echo_calls(c2, 5, 2);
	say("5 calls on each connection: ok");
	EXPECT(FD_CLOEXEC, "fcntl F_GETFD (SOCK_CLOEXEC)", fcntl(c1, F_GETFD));
	EXPECT(0, "fcntl F_GETFD", fcntl(c2, F_GETFD));

	/*
	 * An exec that fails changes nothing for either socket, the one the
	 * new image would have kept and the close-on-exec one (under wsd both
	 * went back to TCP first: they must stay usable).
	 */
	for (int i = 0; i < 2; i++)   /* the second finds them on TCP already */
		EXPECT_ERR(ENOENT, "execl of a program that is not there",
			   execl("/nonexistent/wsd-exec-test", "x", (char *)NULL));
	echo_calls(c2, 5, 3);
	say("5 calls on the inherited connection after the failed execs: ok");
	echo_calls(c1, 5, 4);
	say("5 calls on the close-on-exec connection after the failed execs: ok");

	/* a response waiting unread across the exec */
	echo_request(c2, INFLIGHT_LEN, INFLIGHT_SEED);
	wait_events(c2, POLLIN);

	snprintf(a[0], sizeof(a[0]), "%d", c1);
	snprintf(a[1], sizeof(a[1]), "%d", c2);
	snprintf(a[2], sizeof(a[2]), "%d", e.port);
	snprintf(a[3], sizeof(a[3]), "%d", (int)e.p.pid);
	snprintf(a[4], sizeof(a[4]), "%d", e.p.ctl_r);
	snprintf(a[5], sizeof(a[5]), "%d", e.p.ctl_w);
	snprintf(a[6], sizeof(a[6]), "%d", e.p.log);
	say("exec");
	fflush(stdout);
	execl("/proc/self/exe", argv[0], MARK, a[0], a[1], a[2], a[3], a[4], a[5], a[6],
	      (char *)NULL);
	die("exec: %s", ename(errno));
}

/* SPDX-License-Identifier: MIT */
/*
 * A server that accepts, forks a handler for the connection and closes
 * its own copy, keeping the listener (PostgreSQL's postmaster, inetd,
 * Python's ForkingMixIn): once before any byte came, once after the
 * first byte was there (peeked, as a server that looks at the request
 * before it picks a handler).  Every byte is checked at both ends, and
 * under WSD_EXPECT_PATH the handler's connection must take that path.
 *
 * A known gap (XFAIL_TESTS): fork marks every inherited socket
 * no_upgrade, so both connections stay on TCP (doc/fork-servers.md has
 * the plan).  Plain, the program passes; under wsd run the path check
 * fails, until the handler can take the connection over.
 */
#define _GNU_SOURCE
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/sock/common.h"

#define CALLS 20

static void reap(pid_t pid, const char *what)
{
	int st;

	MUST(waitpid(pid, &st, 0));
	if (!WIFEXITED(st) || WEXITSTATUS(st))
		die("%s failed (status 0x%x)", what, st);
}

static void accept_fork(bool after_first)
{
	int port, lfd = t_listen(AF_INET, &port), fd;
	pid_t client, handler;
	char b;

	say("-- accept, fork a handler, close the copy %s", after_first ?
	    "once the first byte is there" : "before any byte");
	client = MUST(fork());
	if (!client) {
		close(lfd);
		fd = t_connect(AF_INET, port);
		warmup(fd, true);
		echo_calls(fd, CALLS, after_first ? 11 : 10);
		EXPECT(0, "shutdown SHUT_WR", shutdown(fd, SHUT_WR));
		EXPECT(0, "recv: the handler closed", recv(fd, &b, 1, 0));
		MUST(close(fd));
		_exit(0);
	}
	fd = t_accept(lfd);
	if (after_first)
		CHECK(recv(fd, &b, 1, MSG_PEEK) == 1, "no first byte to peek");
	handler = MUST(fork());
	if (!handler) {
		close(lfd);
		warmup(fd, false);
		CHECK(echo_serve(fd) == CALLS, "the handler did not answer %d calls", CALLS);
		MUST(close(fd));
		_exit(0);
	}
	MUST(close(fd));
	reap(handler, "the handler");
	reap(client, "the client");
	say("%d calls through the handler: ok", CALLS);
	MUST(close(lfd));
}

int main(int argc, char **argv)
{
	t_skip_server_forks();
	t_init(argc, argv);
	t_watchdog(60);
	accept_fork(false);
	accept_fork(true);
	t_exit();
}

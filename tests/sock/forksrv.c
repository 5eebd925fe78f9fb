/* SPDX-License-Identifier: MIT */
/*
 * Servers whose connections are accepted in a process they forked.
 *
 * A daemon: the process that listens forks the server and exits, so the
 * server's listener is inherited and no switch in it ever saw listen().
 * Under wsd run its connection must still be accelerated: the registry
 * went with the process that exited (a fork child keeps no copy of it),
 * and the server's switch makes its own at its first accept.
 *
 * Pre-fork: the parent keeps the listener and a child accepts.  The
 * parent's registry cannot know the child's connections, so it refuses a
 * request for one at once (wsd stat says "shared"), rather than keeping it
 * for the application's accept, and the connection carries on over TCP.
 *
 * Every byte is checked at both ends, plain and under wsd run.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/sock/common.h"

#define CALLS 20

/*
 * The server's side of one connection: warm-up (accelerated: path
 * checked), calls.  ready (or -1): told once the process `starter`, which
 * forked us, is gone and we are in accept.
 */
static void serve_one(int lfd, bool accelerated, int ready, pid_t starter)
{
	int fd;

	if (ready >= 0) {
		/* a daemon's server starts once the process that listened is gone */
		while (getppid() == starter)
			sleep_ms(1);
		/* an event loop's first look: nothing yet (the switch registers here) */
		set_nonblock(lfd, true);
		EXPECT_ERR(EAGAIN, "accept before any connection", accept(lfd, NULL, NULL));
		set_nonblock(lfd, false);
		CHECK(write(ready, "r", 1) == 1, "could not say ready");
		close(ready);
	}
	fd = t_accept(lfd);

	if (accelerated) {
		warmup(fd, false);
	} else {
		warmup_bulk(fd, false);
		warmup_tail(fd, false);
	}
	CHECK(echo_serve(fd) == CALLS, "the server did not answer %d calls", CALLS);
	MUST(close(fd));
}

/* A child of ours, or one that became ours (PR_SET_CHILD_SUBREAPER), exited 0. */
static void reap(pid_t pid, const char *what)
{
	int st;

	MUST(waitpid(pid, &st, 0));
	if (!WIFEXITED(st) || WEXITSTATUS(st))
		die("%s failed (status 0x%x)", what, st);
}

/* Under wsd run: fd's reason in wsd stat is want within 5 s. */
static void wait_reason(int fd, const char *want)
{
	if (!getenv("WSD_EXPECT_PATH") || !getenv("WSD_BIN"))
		return;
	for (double t0 = now_ms(); now_ms() - t0 < 5000; sleep_ms(20)) {
		const char *out = stat_now();

		if (out && stat_reason(out, fd, want))
			return;
	}
	expect_reason(fd, want);   /* says what wsd stat says, and fails */
}

static void daemon_case(void)
{
	int up[2], rd[2], port = 0, fd;
	pid_t starter, server = 0;

	say("-- a server that forks and exits: its child accepts");
	MUST(pipe(up));
	MUST(pipe(rd));
	starter = MUST(fork());
	if (!starter) {
		int lfd = t_listen(AF_INET, &port);
		pid_t me = getpid();   /* before the fork: the child may find us gone already */

		server = MUST(fork());
		if (!server) {
			close(up[0]);
			close(up[1]);
			close(rd[0]);
			serve_one(lfd, true, rd[1], me);
			_exit(0);
		}
		/* the listener and its registry go with this process */
		if (write(up[1], &port, sizeof(port)) != sizeof(port) ||
		    write(up[1], &server, sizeof(server)) != sizeof(server))
			_exit(1);
		_exit(0);
	}
	close(up[1]);
	close(rd[1]);
	CHECK(read(up[0], &port, sizeof(port)) == sizeof(port), "no port from the starter");
	CHECK(read(up[0], &server, sizeof(server)) == sizeof(server), "no pid from the starter");
	reap(starter, "the process that listened");
	close(up[0]);
	CHECK(read(rd[0], &(char){ 0 }, 1) == 1, "the server did not say ready");
	close(rd[0]);
	fd = t_connect(AF_INET, port);
	warmup(fd, true);
	echo_calls(fd, CALLS, 7);
	say("%d calls to the forked server: ok", CALLS);
	EXPECT(0, "close", close(fd));
	reap(server, "the forked server");
}

static void prefork_case(void)
{
	int port, lfd = t_listen(AF_INET, &port), fd;
	pid_t child;

	say("-- the parent keeps the listener, a child accepts");
	child = MUST(fork());
	if (!child) {
		serve_one(lfd, false, -1, 0);
		_exit(0);
	}
	fd = t_connect(AF_INET, port);
	warmup_bulk(fd, true);
	warmup_tail(fd, true);
	/* asked of the parent's registry, which refuses at once */
	wait_reason(fd, "shared");
	expect_path_now(fd, "tcp");
	echo_calls(fd, CALLS, 9);
	say("%d calls to the child: ok", CALLS);
	EXPECT(0, "close", close(fd));
	reap(child, "the child");
	EXPECT(0, "close the listener", close(lfd));
}

int main(int argc, char **argv)
{
	t_init(argc, argv);
	t_watchdog(60);
	MUST(prctl(PR_SET_CHILD_SUBREAPER, 1));
	daemon_case();
	prefork_case();
	t_exit();
}

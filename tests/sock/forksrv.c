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
 * Pre-fork (nginx, Apache's prefork): the parent keeps the listener and
 * its children accept.  Each child opens a registry of its own at its
 * first accept and notes there the connections it accepts; the parent's
 * registry sends a request for one of those on to it (its refusal
 * "moved"), or, for one not noted yet, answers "shared" and the peer asks
 * again.  The second child here accepts only a while after its connection
 * was made, so that its peer asks before it has it.  Both connections
 * must be accelerated.  A child that is the first to accept, and late to,
 * must have its connection accelerated too (the parent's registry kept
 * the request for its own accept until the peer gave up).  Then one child
 * holds MANY connections at once (a
 * worker with many clients): every one of them must be accelerated too
 * (the children's notes once overwrote each other: 35 of 200 stayed on
 * TCP), and after the first they ask the child's registry at once, where
 * the first went, not the parent's first (each cost a registry connection
 * to the parent, one at a time: 1,000 clients of nginx took 3.5 s to
 * upgrade).
 *
 * Every byte is checked at both ends, plain and under wsd run; with
 * FORKSRV_CHILD_UID the children serve as another user (child_user).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/sock/common.h"

#define CALLS 20
#define MANY 300

/*
 * The server's side of one connection: warm-up (accelerated: path
 * checked), calls.  ready (or -1): told once the process `starter`, which
 * forked us, is gone and we are in accept.
 */
/*
 * FORKSRV_CHILD_UID=N (run as root): the children that accept serve as
 * user N, as nginx's workers run as www-data under a root master; their
 * connections then join two users (libwsd(7), "Across users").
 */
static void child_user(void)
{
	const char *u = getenv("FORKSRV_CHILD_UID");

	if (u && *u)
		CHECK(setgid((gid_t)atoi(u)) == 0 && setuid((uid_t)atoi(u)) == 0,
		      "cannot become uid %s", u);
}

static void serve_one(int lfd, bool accelerated, int ready, pid_t starter)
{
	int fd;

	child_user();
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
	int port, lfd = t_listen(AF_INET, &port), fd[2], go[2];
	pid_t child[2];
	const char *out;

	say("-- the parent keeps the listener, its children accept");
	MUST(pipe(go));
	for (int i = 0; i < 2; i++) {
		child[i] = MUST(fork());
		if (!child[i]) {
			close(go[1]);
			if (i == 1) {
				/* told once its connection is made, and then slow to accept it */
				CHECK(read(go[0], &(char){ 0 }, 1) == 1, "no word from the parent");
				sleep_ms(100);
			}
			serve_one(lfd, true, -1, 0);
			_exit(0);
		}
	}
	close(go[0]);
	for (int i = 0; i < 2; i++) {
		fd[i] = t_connect(AF_INET, port);
		if (i == 1)
			CHECK(write(go[1], "g", 1) == 1, "could not tell the second child");
		warmup(fd[i], true);
		echo_calls(fd[i], CALLS, 9 + i);
		say("%d calls to child %d: ok", CALLS, i + 1);
		EXPECT(0, "close", close(fd[i]));
		reap(child[i], "a child");
	}
	close(go[1]);
	/* the listener's registry (this process's) sent them on */
	if ((out = stat_now()))
		CHECK(strstr(out, "\"moved\":"), "no request was moved: %s", out);
	EXPECT(0, "close the listener", close(lfd));
}

/*
 * A child that is the first to accept, and late to: its peer's request
 * reaches the parent's registry while the listener is still the parent's
 * alone, and is kept there for an accept that will never come in this
 * process.  The child's first accept makes the listener shared; the
 * parent's registry must then send the request on (moved), not leave the
 * peer waiting until it gives up (no-match, its connection on TCP).
 */
static void prefork_late_case(void)
{
	int port, lfd = t_listen(AF_INET, &port), fd, go[2];
	pid_t child;

	say("-- the only child accepts late: its peer asked the parent first");
	MUST(pipe(go));
	child = MUST(fork());
	if (!child) {
		close(go[1]);
		CHECK(read(go[0], &(char){ 0 }, 1) == 1, "no word from the parent");
		sleep_ms(400);
		serve_one(lfd, true, -1, 0);
		_exit(0);
	}
	close(go[0]);
	fd = t_connect(AF_INET, port);
	CHECK(write(go[1], "g", 1) == 1, "could not tell the child");
	warmup(fd, true);
	echo_calls(fd, CALLS, 11);
	say("%d calls to the late child: ok", CALLS);
	EXPECT(0, "close", close(fd));
	reap(child, "the child");
	close(go[1]);
	EXPECT(0, "close the listener", close(lfd));
}

static void prefork_many_case(void)
{
	int port, lfd = t_listen(AF_INET, &port), *fd = calloc(MANY, sizeof(int));
	const char *out;
	pid_t child;

	CHECK(fd != NULL, "no memory");
	say("-- a child of the listener's process holds %d connections", MANY);
	child = MUST(fork());
	if (!child) {
		child_user();
		/* all accepted first, in the order they were made, then served */
		for (int i = 0; i < MANY; i++)
			fd[i] = t_accept(lfd);
		for (int i = 0; i < MANY; i++) {
			settle(fd[i], false);
			expect_path(fd[i]);
			CHECK(echo_serve(fd[i]) == 2, "connection %d: not 2 calls", i);
			MUST(close(fd[i]));
		}
		_exit(0);
	}
	for (int i = 0; i < MANY; i++)
		fd[i] = t_connect(AF_INET, port);
	for (int i = 0; i < MANY; i++) {
		settle(fd[i], true);
		expect_path(fd[i]);
		echo_calls(fd[i], 2, 100 + (uint32_t)i);
		EXPECT(0, "close", close(fd[i]));
	}
	say("%d connections, 2 calls each: ok", MANY);
	/*
	 * After the first, the connections asked the child's registry at
	 * once, where the first had gone, not the parent's (this process's)
	 * registry first: it sent on a few, not one per connection.
	 */
	if ((out = stat_now())) {
		const char *r = strstr(out, "\"refused\":{"), *m = r ? strstr(r, "\"moved\":") : NULL;
		unsigned long moved = m ? strtoul(m + 8, NULL, 10) : 0;

		CHECK(moved < MANY / 10, "the parent's registry sent on %lu of %d connections "
		      "(later ones should ask the child at once): %s", moved, MANY, out);
	}
	reap(child, "the child");
	EXPECT(0, "close the listener", close(lfd));
	free(fd);
}

int main(int argc, char **argv)
{
	t_skip_server_forks();
	t_init(argc, argv);
	t_watchdog(60);
	MUST(prctl(PR_SET_CHILD_SUBREAPER, 1));
	daemon_case();
	prefork_case();
	prefork_late_case();
	prefork_many_case();
	t_exit();
}

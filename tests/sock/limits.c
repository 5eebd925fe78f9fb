/* SPDX-License-Identifier: MIT */
/*
 * The switch never spends the program's limits: with RLIMIT_NOFILE just
 * above what the program needs plain (as `ulimit -n` would set it), every
 * accept, open and socket of the program succeeds under wsd run as it does
 * plain.  The switch stays on TCP instead (wsd stat: resources).
 *
 * Each end counts its open descriptors before its first socket and sets
 * its own limit to that, plus what it will open, plus SPARE.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/sock/common.h"

#define CONNS 6
#define FILES 4
#define SPARE 3
#define PLUMBING 5      /* what peer_start keeps open: two pipe ends and the log, with room */

static int port;

/* The limit: what is open now, what this end opens next, and SPARE. */
static void tight_limit(int more)
{
	struct rlimit rl;

	MUST(getrlimit(RLIMIT_NOFILE, &rl));
	rl.rlim_cur = (rlim_t)(open_fds() + more + SPARE);
	MUST(setrlimit(RLIMIT_NOFILE, &rl));
}

/* Traffic enough that the switch would upgrade the connection. */
static void exchange(int fd, bool first)
{
	warmup_bulk(fd, first);
	sleep_ms(20);
	warmup_tail(fd, first);
}

static void peer(struct peer *self, void *arg)
{
	int fd[CONNS], files[FILES];
	char c;

	(void)arg;
	port = t_peer_port(self, port);
	tight_limit(CONNS + FILES);
	for (int i = 0; i < CONNS; i++) {
		fd[i] = t_connect(AF_INET, port);
		exchange(fd[i], true);
		say("client: connection %d: warmed up", i);
	}
	sleep_ms(200);   /* an upgrade would have finished by now */
	for (int i = 0; i < FILES; i++) {
		files[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
		CHECK(files[i] >= 0, "open /dev/null: %s", ename(errno));
	}
	say("client: %d files open", FILES);
	for (int i = 0; i < CONNS; i++) {
		expect_path_now(fd[i], "tcp");
		expect_reason(fd[i], "resources");
	}
	ctl_send(self, 1);
	for (int i = 0; i < CONNS; i++) {
		EXPECT(0, "recv: the server closed", recv(fd[i], &c, 1, 0));
		EXPECT(0, "close", close(fd[i]));
	}
	for (int i = 0; i < FILES; i++)
		close(files[i]);
}

int main(int argc, char **argv)
{
	int lfd, fd[CONNS], files[FILES];
	struct peer c;

	t_init(argc, argv);
	/* before the first socket, as `ulimit -n` would be: the listener, the peer's pipes and log */
	tight_limit(1 + PLUMBING + CONNS + FILES);
	lfd = t_listen_peer(&c, "peer", peer, NULL, &port, T_FORK_FIRST);
	for (int i = 0; i < CONNS; i++) {
		fd[i] = t_accept(lfd);
		CHECK(fd[i] >= 0, "accept: %s", ename(errno));
		exchange(fd[i], false);
		say("server: connection %d: warmed up", i);
	}
	sleep_ms(200);
	for (int i = 0; i < FILES; i++) {
		files[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
		CHECK(files[i] >= 0, "open /dev/null: %s", ename(errno));
	}
	say("server: %d files open", FILES);
	ctl_recv(&c);
	for (int i = 0; i < CONNS; i++)
		EXPECT(0, "close", close(fd[i]));
	for (int i = 0; i < FILES; i++)
		close(files[i]);
	EXPECT(0, "close the listener", close(lfd));
	peer_end(&c);
	t_exit();
}

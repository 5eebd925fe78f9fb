/* SPDX-License-Identifier: MIT */
/*
 * A server that accepts, forks a handler for the connection and closes
 * its own copy, keeping the listener (PostgreSQL's postmaster, inetd,
 * Python's ForkingMixIn): once before any byte came, once after the
 * first byte was there (peeked, as a server that looks at the request
 * before it picks a handler).  Under WSD_EXPECT_PATH the handler's
 * connection must take that path: the handler takes it over at its first
 * data call (switch/registry.c, wsd_upgrade_handoff).
 *
 * Then a parent that keeps its copy while the handler serves, and a
 * handler that forks a server of its own and keeps its copy: two
 * processes hold the connection, so it must stay on TCP (either could
 * read the peer's bytes).  Every byte is checked at both ends, always.
 *
 * First of all, in a process that has forked no handler yet: a
 * close-on-exec connection (as every socket of Python's is) that its
 * peer's data calls attached to a channel in the parent before the fork,
 * the peer then asleep in a receive.  It must go back to the stream at
 * the fork, never stay the parent's and reset the handler's copy.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/sock/common.h"

#define CALLS 20
#define MOVED (256 << 10)
#define MOVED_MAX (MOVED + 200 * MOVED_BLOCK)
#define MOVED_BLOCK 16384

struct conn {
	int lfd, port, fd, moved;
	bool after_first, parent_keeps, grandchild;
};

/*
 * The close-on-exec case: 256 KiB out, past the switch's upgrade
 * threshold, which upgrades it: the server's answer, from the parent,
 * attaches it there.  The word to fork once it has, then calls.
 */
static void moved_client(struct peer *self, void *arg)
{
	const char *want = getenv("WSD_EXPECT_PATH");
	struct conn *c = arg;
	char blk[MOVED_BLOCK], b;
	bool moved = false;
	int fd, sent = 0;

	close(c->lfd);
	fd = t_connect(AF_INET, c->port);
	/* (the popen of wsd stat below would move a socket it inherits back to the stream) */
	MUST(fcntl(fd, F_SETFD, FD_CLOEXEC));
	/*
	 * Blocks past the upgrade threshold, the next data call asks (a look
	 * at wsd stat between blocks): until attached to a channel at both
	 * ends (the server's answer came), 10 s at most
	 */
	for (int i = 0; !moved && sent < MOVED_MAX; i++) {
		pattern(blk, MOVED_BLOCK, 15, (uint64_t)sent);
		send_all(fd, blk, MOVED_BLOCK);
		sent += MOVED_BLOCK;
		if (!want || !*want) {
			moved = sent >= MOVED;
		} else if (sent >= MOVED) {
			const char *out = stat_now();

			moved = out && stat_field(out, fd, "channel") != 0;
			if (!moved)
				sleep_ms(50);
		}
	}
	ctl_send(self, moved ? sent : 0);
	echo_calls(fd, CALLS, 14);
	expect_path_now(fd, "tcp");
	EXPECT(0, "shutdown SHUT_WR", shutdown(fd, SHUT_WR));
	EXPECT(0, "recv: the handler closed", recv(fd, &b, 1, 0));
	MUST(close(fd));
}

static void moved_handler(struct peer *self, void *arg)
{
	struct conn *c = arg;
	char blk[MOVED_BLOCK];

	(void)self;
	close(c->lfd);
	for (int got = 0; got < c->moved; got += MOVED_BLOCK) {
		recv_all(c->fd, blk, MOVED_BLOCK);
		expect_pattern(blk, MOVED_BLOCK, 15, (uint64_t)got, "the first blocks");
	}
	CHECK(echo_serve(c->fd) == CALLS, "the handler did not answer %d calls", CALLS);
	expect_path_now(c->fd, "tcp");
	MUST(close(c->fd));
}

static void moved_before_fork(void)
{
	struct conn c = { 0 };
	struct peer cl, h;

	say("-- accept close-on-exec, the connection moved before the handler's fork");
	c.lfd = t_listen(AF_INET, &c.port);
	peer_start(&cl, "client", moved_client, &c);
	do
		c.fd = accept4(c.lfd, NULL, NULL, SOCK_CLOEXEC);
	while (c.fd < 0 && errno == EINTR);
	if (c.fd < 0)
		die("accept4: %s", ename(errno));
	c.moved = ctl_recv(&cl);
	CHECK(c.moved, "the connection has no channel before the fork");
	peer_start(&h, "handler", moved_handler, &c);
	MUST(close(c.fd));
	peer_end(&h);
	peer_end(&cl);
	say("%d calls through the handler: ok", CALLS);
	MUST(close(c.lfd));
}

static void client(struct peer *self, void *arg)
{
	struct conn *c = arg;
	int fd;
	char b;

	(void)self;
	close(c->lfd);
	fd = t_connect(AF_INET, c->port);
	bool tcp = c->parent_keeps || c->grandchild;

	if (tcp) {
		warmup_bulk(fd, true);
		warmup_tail(fd, true);
	} else {
		warmup(fd, true);
	}
	echo_calls(fd, CALLS, c->after_first ? 11 : c->parent_keeps ? 12 : c->grandchild ? 13 : 10);
	if (tcp)
		expect_path_now(fd, "tcp");
	EXPECT(0, "shutdown SHUT_WR", shutdown(fd, SHUT_WR));
	EXPECT(0, "recv: the handler closed", recv(fd, &b, 1, 0));
	MUST(close(fd));
}

static void serve(struct conn *c, bool tcp)
{
	if (tcp) {
		warmup_bulk(c->fd, false);
		warmup_tail(c->fd, false);
	} else {
		warmup(c->fd, false);
	}
	CHECK(echo_serve(c->fd) == CALLS, "the handler did not answer %d calls", CALLS);
	if (tcp)
		expect_path_now(c->fd, "tcp");
	MUST(close(c->fd));
}

static void grandchild(struct peer *self, void *arg)
{
	(void)self;
	serve(arg, true);
}

static void handler(struct peer *self, void *arg)
{
	struct conn *c = arg;
	struct peer g;

	(void)self;
	close(c->lfd);
	if (c->grandchild) {
		peer_start(&g, "server", grandchild, c);
		peer_end(&g);
		MUST(close(c->fd));
		return;
	}
	serve(c, c->parent_keeps);
}

static void accept_fork(bool after_first, bool parent_keeps, bool grand)
{
	struct conn c = { .after_first = after_first, .parent_keeps = parent_keeps,
			  .grandchild = grand };
	struct peer cl, h;
	char b;

	if (parent_keeps)
		say("-- accept, fork a handler, keep the copy until it is done");
	else if (grand)
		say("-- accept, fork a handler that forks a server and keeps its copy");
	else
		say("-- accept, fork a handler, close the copy %s", after_first ?
		    "once the first byte is there" : "before any byte");
	c.lfd = t_listen(AF_INET, &c.port);
	peer_start(&cl, "client", client, &c);
	c.fd = t_accept(c.lfd);
	if (after_first)
		CHECK(recv(c.fd, &b, 1, MSG_PEEK) == 1, "no first byte to peek");
	peer_start(&h, "handler", handler, &c);
	if (!parent_keeps)
		MUST(close(c.fd));
	peer_end(&h);
	if (parent_keeps)
		MUST(close(c.fd));
	peer_end(&cl);
	say("%d calls through the handler: ok", CALLS);
	MUST(close(c.lfd));
}

int main(int argc, char **argv)
{
	t_skip_server_forks();
	t_init(argc, argv);
	t_watchdog(60);
	moved_before_fork();   /* first: no handler forked yet */
	accept_fork(false, false, false);
	accept_fork(true, false, false);
	accept_fork(false, true, false);
	accept_fork(false, false, true);
	t_exit();
}

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
 */
#define _GNU_SOURCE
#include <sys/socket.h>
#include <unistd.h>

#include "tests/sock/common.h"

#define CALLS 20

struct conn {
	int lfd, port, fd;
	bool after_first, parent_keeps, grandchild;
};

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
	accept_fork(false, false, false);
	accept_fork(true, false, false);
	accept_fork(false, true, false);
	accept_fork(false, false, true);
	t_exit();
}

/* SPDX-License-Identifier: MIT */
/*
 * fork with accelerated connections.  The child opens a new connection
 * and uses it while the parent goes on with its own; a child uses the
 * inherited connection and the parent takes it back after the child
 * exits; and the classic accept-fork server, whose handler child does the
 * I/O while the parent closes its copy at once.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/sock/common.h"

static struct echo e;

static void child_new_connection(struct peer *self, void *arg)
{
	int inherited = *(int *)arg, fd;

	(void)self;
	EXPECT(0, "close the inherited connection", close(inherited));
	fd = echo_connect(&e);
	echo_calls(fd, 20, 1000);
	say("20 calls on a new connection: ok");
	EXPECT(0, "close", close(fd));
}

static void child_inherited(struct peer *self, void *arg)
{
	int fd = *(int *)arg;

	(void)self;
	echo_calls(fd, 20, 2000);
	say("20 calls on the inherited connection: ok");
	/* exits without closing: the parent's copy keeps it open */
}

static void parent_and_child(void)
{
	struct peer c;
	int fd;

	say("-- the child connects anew, the parent goes on");
	echo_start(&e, AF_INET, 2);
	fd = echo_connect(&e);
	echo_calls(fd, 10, 1);
	say("10 calls before fork: ok");
	peer_start(&c, "child", child_new_connection, &fd);
	echo_calls(fd, 50, 100);
	say("50 calls while the child runs: ok");
	peer_end(&c);
	echo_calls(fd, 10, 200);
	say("10 calls after the child exited: ok");

	say("-- the child uses the inherited connection, then the parent");
	peer_start(&c, "child", child_inherited, &fd);
	peer_end(&c);
	echo_calls(fd, 20, 300);
	say("20 calls after the child exited: ok");
	EXPECT(0, "close", close(fd));
	echo_end(&e);
}

static void client(struct peer *self, void *arg)
{
	int port = *(int *)arg;
	char b;

	(void)self;
	for (int i = 0; i < 2; i++) {
		int fd = t_connect(AF_INET, port);

		warmup(fd, true);
		echo_calls(fd, 20, 3000 + i);
		say("connection %d: 20 calls ok", i);
		EXPECT(0, "shutdown SHUT_WR", shutdown(fd, SHUT_WR));
		EXPECT(0, "recv: the handler closed", recv(fd, &b, 1, 0));
		EXPECT(0, "close", close(fd));
	}
}

struct conn_fds {
	int lfd, fd;
};

static void handler(struct peer *self, void *arg)
{
	struct conn_fds *c = arg;

	(void)self;
	/* the classic handler lets go of the listener first: the parent's stays */
	EXPECT(0, "close the inherited listener", close(c->lfd));
	say("served %d requests, then EOF", echo_serve(c->fd));
	EXPECT(0, "close", close(c->fd));
}

static void accept_fork_server(void)
{
	struct peer cl, h[2];
	struct conn_fds c;
	int lfd, port, fd;

	say("-- accept, fork, the child serves, the parent closes its copy");
	lfd = t_listen(AF_INET, &port);
	peer_start(&cl, "client", client, &port);
	for (int i = 0; i < 2; i++) {
		fd = t_accept(lfd);
		warmup(fd, false);
		c = (struct conn_fds){ .lfd = lfd, .fd = fd };
		peer_start(&h[i], i ? "handler 1" : "handler 0", handler, &c);
		EXPECT(0, "the parent closes its copy", close(fd));
	}
	close(lfd);
	peer_end(&cl);
	peer_end(&h[0]);
	peer_end(&h[1]);
}

int main(int argc, char **argv)
{
	t_skip_server_forks();
	t_init(argc, argv);
	parent_and_child();
	accept_fork_server();
	t_exit();
}

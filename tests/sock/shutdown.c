/* SPDX-License-Identifier: MIT */
/*
 * shutdown in each direction.  SHUT_WR: the peer reads what was sent, then
 * EOF, while the other direction goes on; our sends fail with EPIPE.
 * SHUT_RD: reads return EOF, writes go on.  SHUT_RDWR.  What the kernel
 * says about the connection afterwards (a second shutdown, getpeername
 * once both FINs have crossed) must not change either.
 */
#define _GNU_SOURCE
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/sock/common.h"

static struct servant s;

static void show_poll(int fd, const char *what)
{
	struct pollfd pfd = { .fd = fd, .events = POLLIN | POLLOUT | POLLRDHUP };

	EXPECT(1, what, poll(&pfd, 1, 0));
	say("  revents %s", pollstr(pfd.revents));
}

static void show_peer(int fd, const char *what)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);

	errno = 0;
	int r = getpeername(fd, (struct sockaddr *)&ss, &len);

	t_expect(what, r, errno, r, r ? errno : 0);
}

static void shut_wr(void)
{
	int fd = servant_connect(&s);
	char buf[100];
	size_t big = 1u << 20;

	say("-- SHUT_WR");
	client_data(buf, 100);
	EXPECT(100, "send 100", send(fd, buf, 100, 0));
	EXPECT(0, "shutdown SHUT_WR", shutdown(fd, SHUT_WR));
	servant_do(&s, 0, S_RECV, 100);
	servant_do(&s, 0, S_RECV_EOF, 0);
	servant_do(&s, 0, S_RECV_EOF, 0);
	servant_do(&s, 0, S_POLL, 0);
	/* the other direction keeps working, large and small */
	servant_do(&s, 0, S_SEND, 50);
	recv_servant_data(fd, 50);
	servant_go(&s, 0, S_SEND, big);
	recv_servant_data(fd, big);
	servant_wait(&s);
	say("received 50 bytes and 1 MiB after SHUT_WR");
	show_poll(fd, "poll after our SHUT_WR");
	EXPECT_ERR(EPIPE, "send after SHUT_WR", send(fd, "x", 1, MSG_NOSIGNAL));
	EXPECT_ERR(EPIPE, "write after SHUT_WR (SIGPIPE ignored)", write(fd, "x", 1));
	EXPECT(0, "shutdown SHUT_WR again", shutdown(fd, SHUT_WR));
	{
		int err = -1;
		socklen_t len = sizeof(err);

		EXPECT(0, "getsockopt SO_ERROR", getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len));
		say("  SO_ERROR %d", err);
	}
	show_peer(fd, "getpeername while the peer's side is open");
	/* the peer shuts too: both FINs have crossed, the socket is closed */
	servant_do(&s, 0, S_SHUT_WR, 0);
	EXPECT(0, "recv: EOF", recv(fd, buf, sizeof(buf), 0));
	show_poll(fd, "poll after both SHUT_WR");
	show_peer(fd, "getpeername after both FINs");
	EXPECT_ERR(ENOTCONN, "shutdown SHUT_RDWR after both FINs", shutdown(fd, SHUT_RDWR));
	servant_do(&s, 0, S_CLOSE, 0);
	EXPECT(0, "close", close(fd));
}

static void shut_rd(void)
{
	int fd = servant_connect(&s);
	char buf[100];

	say("-- SHUT_RD");
	EXPECT(0, "shutdown SHUT_RD", shutdown(fd, SHUT_RD));
	EXPECT(0, "recv after SHUT_RD: EOF at once", recv(fd, buf, sizeof(buf), 0));
	show_poll(fd, "poll after SHUT_RD");
	client_data(buf, 30);
	EXPECT(30, "send 30 after SHUT_RD", send(fd, buf, 30, 0));
	servant_do(&s, 1, S_RECV, 30);
	servant_do(&s, 1, S_POLL, 0);
	/* Linux still queues what arrives after SHUT_RD, and a read returns it */
	servant_do(&s, 1, S_SEND, 20);
	wait_events(fd, POLLIN);
	EXPECT(20, "recv what came after SHUT_RD", recv(fd, buf, sizeof(buf), 0));
	EXPECT(0, "recv again: EOF", recv(fd, buf, sizeof(buf), 0));
	EXPECT(0, "shutdown SHUT_WR as well", shutdown(fd, SHUT_WR));
	servant_do(&s, 1, S_RECV_EOF, 0);
	show_poll(fd, "poll after SHUT_RD and SHUT_WR");
	servant_do(&s, 1, S_CLOSE, 0);
	EXPECT(0, "close", close(fd));
}

static void shut_rdwr(void)
{
	int fd = servant_connect(&s);
	char buf[100];

	say("-- SHUT_RDWR");
	EXPECT(0, "shutdown SHUT_RDWR", shutdown(fd, SHUT_RDWR));
	servant_do(&s, 2, S_RECV_EOF, 0);
	EXPECT(0, "recv after SHUT_RDWR", recv(fd, buf, sizeof(buf), 0));
	EXPECT_ERR(EPIPE, "send after SHUT_RDWR", send(fd, "x", 1, MSG_NOSIGNAL));
	show_poll(fd, "poll after SHUT_RDWR");
	/* data arriving for a reader that is gone draws a reset (RFC 1122) */
	servant_do(&s, 2, S_SEND, 5);
	wait_events(fd, POLLERR);
	show_poll(fd, "poll after the peer sent anyway");
	errno = 0;
	{
		long r = recv(fd, buf, sizeof(buf), 0);

		t_expect("recv after the reset", r, errno, r, r < 0 ? errno : 0);
	}
	servant_do(&s, 2, S_POLL, 0);
	servant_do(&s, 2, S_SEND_ERR, EPIPE);
	servant_do(&s, 2, S_CLOSE, 0);
	EXPECT(0, "close", close(fd));
}

static void bad_calls(void)
{
	int fd = MUST(socket(AF_INET, SOCK_STREAM, 0)), c = servant_connect(&s);

	say("-- errors");
	EXPECT_ERR(ENOTCONN, "shutdown an unconnected socket", shutdown(fd, SHUT_WR));
	EXPECT_ERR(EINVAL, "shutdown how=7", shutdown(c, 7));
	EXPECT_ERR(ENOTSOCK, "shutdown a pipe", shutdown(s.p.ctl_w, SHUT_WR));
	EXPECT(0, "close", close(fd));
	EXPECT(0, "close", close(c));
	EXPECT_ERR(EBADF, "shutdown a closed fd", shutdown(c, SHUT_WR));
	servant_do(&s, 3, S_RECV_EOF, 0);
}

int main(int argc, char **argv)
{
	t_init(argc, argv);
	signal(SIGPIPE, SIG_IGN);
	servant_start(&s, AF_INET);
	shut_wr();
	shut_rd();
	shut_rdwr();
	bad_calls();
	servant_end(&s);
	t_exit();
}

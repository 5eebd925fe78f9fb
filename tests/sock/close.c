/* SPDX-License-Identifier: MIT */
/*
 * close with data in flight: 4 MiB written and closed at once arrive whole,
 * then EOF, each way.  SO_LINGER: {1, 0} resets, {1, 5} waits until the
 * data is taken.  Closing with unread data resets the connection (RFC
 * 2525).  And the fd is gone: EBADF.
 */
#define _GNU_SOURCE
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/sock/common.h"

#define FOUR_MIB (4u << 20)

static struct servant s;

int main(int argc, char **argv)
{
	struct linger l;
	char *big = malloc(FOUR_MIB), buf[64];
	int fd, conn = 0;

	t_init(argc, argv);
	servant_start(&s, AF_INET);

	say("-- 4 MiB, then close at once");
	fd = servant_connect(&s);
	client_data(big, FOUR_MIB);
	servant_go(&s, conn, S_RECV, FOUR_MIB);
	EXPECT(FOUR_MIB, "send 4 MiB", send(fd, big, FOUR_MIB, 0));
	EXPECT(0, "close", close(fd));
	servant_wait(&s);
	servant_do(&s, conn, S_RECV_EOF, 0);
	servant_do(&s, conn++, S_CLOSE, 0);

	say("-- the peer sends 4 MiB and closes at once");
	fd = servant_connect(&s);
	servant_go(&s, conn, S_SEND, FOUR_MIB);
	servant_go(&s, conn, S_CLOSE, 0);
	recv_servant_data(fd, FOUR_MIB);
	say("received 4 MiB, data ok");
	EXPECT(0, "recv: EOF", recv(fd, buf, sizeof(buf), 0));
	servant_wait(&s);
	servant_wait(&s);
	EXPECT(0, "close", close(fd));
	conn++;

	say("-- SO_LINGER {1, 0}: a reset");
	fd = servant_connect(&s);
	client_data(big, 1000);
	EXPECT(1000, "send 1000", send(fd, big, 1000, 0));
	servant_do(&s, conn, S_RECV, 1000);
	l = (struct linger){ 1, 0 };
	EXPECT(0, "setsockopt SO_LINGER {1, 0}",
	       setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l)));
	EXPECT(0, "close", close(fd));
	servant_do(&s, conn, S_RECV_EOF, ECONNRESET);
	servant_do(&s, conn, S_RECV_EOF, 0);
	servant_do(&s, conn++, S_CLOSE, 0);

	say("-- SO_LINGER {1, 5}: close waits until the data is taken");
	fd = servant_connect(&s);
	l = (struct linger){ 1, 5 };
	EXPECT(0, "setsockopt SO_LINGER {1, 5}",
	       setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l)));
	{
		socklen_t len = sizeof(l);

		EXPECT(0, "getsockopt SO_LINGER", getsockopt(fd, SOL_SOCKET, SO_LINGER, &l, &len));
		say("  {%d, %d}", l.l_onoff, l.l_linger);
	}
	client_data(big, FOUR_MIB);
	servant_go(&s, conn, S_RECV, FOUR_MIB);
	send_all(fd, big, FOUR_MIB);
	EXPECT(0, "close with 4 MiB maybe still in flight", close(fd));
	servant_wait(&s);
	servant_do(&s, conn, S_RECV_EOF, 0);
	servant_do(&s, conn++, S_CLOSE, 0);

	say("-- SO_LINGER {1, 1}, the peer not reading: close waits the second out");
	fd = servant_connect(&s);
	{
		int total = fill_until_eagain(fd, 56);
		double t0, waited;

		l = (struct linger){ 1, 1 };
		EXPECT(0, "setsockopt SO_LINGER {1, 1}",
		       setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l)));
		t0 = now_ms();
		EXPECT(0, "close, the buffers full", close(fd));
		waited = now_ms() - t0;
		CHECK(waited >= 990, "close returned after %.0f ms, not the 1 s linger", waited);
		say("  close waited the linger time");
		/* the data still goes out after close returned */
		servant_do(&s, conn, S_DRAIN, total);
		servant_do(&s, conn, S_RECV_EOF, 0);
		servant_do(&s, conn++, S_CLOSE, 0);
	}

	say("-- close with unread data: a reset, not a FIN");
	fd = servant_connect(&s);
	servant_do(&s, conn, S_SEND, 100);
	wait_events(fd, POLLIN);
	EXPECT(0, "close, 100 bytes unread", close(fd));
	servant_do(&s, conn, S_RECV_EOF, ECONNRESET);
	servant_do(&s, conn++, S_CLOSE, 0);

	say("-- the fd is gone");
	fd = servant_connect(&s);
	EXPECT(0, "close", close(fd));
	EXPECT_ERR(EBADF, "close again", close(fd));
	EXPECT_ERR(EBADF, "recv on the closed fd", recv(fd, buf, sizeof(buf), 0));
	EXPECT_ERR(EBADF, "send on the closed fd", send(fd, "x", 1, 0));
	servant_do(&s, conn, S_RECV_EOF, 0);
	servant_do(&s, conn++, S_CLOSE, 0);

	servant_end(&s);
	free(big);
	t_exit();
}

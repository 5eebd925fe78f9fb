/* SPDX-License-Identifier: MIT */
/*
 * Non-blocking sockets: connect in progress, accept4 with nothing queued,
 * EAGAIN from every receive call on an empty socket, a short read, a
 * partial send, and each end filling the other until EAGAIN, then the
 * reader taking exactly what went in (the count depends on buffer sizes,
 * so only that EAGAIN happened and that the bytes match is printed).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "tests/sock/common.h"

static struct servant s;

/* A connection made by a non-blocking connect, then warmed up. */
static int connect_nonblocking(void)
{
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(s.port),
				   .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct pollfd pfd = { .events = POLLOUT };
	int fd, err = -1;
	socklen_t len = sizeof(err);

	fd = MUST(socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0));
	servant_go(&s, s.nconn, S_ACCEPT, 0);
	/* the handshake needs the peer's answer: never complete on return */
	EXPECT_ERR(EINPROGRESS, "connect non-blocking",
		   connect(fd, (struct sockaddr *)&sin, sizeof(sin)));
	pfd.fd = fd;
	EXPECT(1, "poll POLLOUT until connected", poll(&pfd, 1, 10000));
	say("  revents %s", pollstr(pfd.revents));
	EXPECT(0, "getsockopt SO_ERROR", getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len));
	say("  SO_ERROR %d", err);
	/* Linux: the next connect reports the outcome (0), only then EISCONN */
	EXPECT(0, "connect again", connect(fd, (struct sockaddr *)&sin, sizeof(sin)));
	EXPECT_ERR(EISCONN, "connect a third time",
	           connect(fd, (struct sockaddr *)&sin, sizeof(sin)));
	set_nonblock(fd, false);
	warmup(fd, true);
	servant_wait(&s);
	s.nconn++;
	set_nonblock(fd, true);
	return fd;
}

static void empty_reads(int fd)
{
	char buf[16];
	struct iovec iov = { buf, sizeof(buf) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };

	EXPECT_ERR(EAGAIN, "recv empty", recv(fd, buf, sizeof(buf), 0));
	EXPECT_ERR(EAGAIN, "read empty", read(fd, buf, sizeof(buf)));
	EXPECT_ERR(EAGAIN, "readv empty", readv(fd, &iov, 1));
	EXPECT_ERR(EAGAIN, "recvmsg empty", recvmsg(fd, &mh, 0));
	EXPECT_ERR(EAGAIN, "recvfrom empty", recvfrom(fd, buf, sizeof(buf), 0, NULL, NULL));
	EXPECT_ERR(EAGAIN, "recv MSG_PEEK empty", recv(fd, buf, sizeof(buf), MSG_PEEK));
	EXPECT_ERR(EAGAIN, "recv MSG_WAITALL empty", recv(fd, buf, sizeof(buf), MSG_WAITALL));
}

int main(int argc, char **argv)
{
	int lfd, port, fd, fd2, total;
	char buf[100];
	struct pollfd pfd = { .events = POLLOUT };

	t_init(argc, argv);

	lfd = t_listen(AF_INET, &port);
	set_nonblock(lfd, true);
	EXPECT_ERR(EAGAIN, "accept on a non-blocking listener, nothing queued",
		   accept(lfd, NULL, NULL));
	EXPECT_ERR(EAGAIN, "accept4 SOCK_NONBLOCK, nothing queued",
		   accept4(lfd, NULL, NULL, SOCK_NONBLOCK));
	close(lfd);

	servant_start(&s, AF_INET);
	fd = connect_nonblocking();
	empty_reads(fd);

	/* fewer bytes there than asked for: a short read, no waiting */
	servant_do(&s, 0, S_SEND, 10);
	pfd.fd = fd;
	pfd.events = POLLIN;
	EXPECT(1, "poll POLLIN", poll(&pfd, 1, -1));
	EXPECT(10, "recv 100 with 10 there", recv(fd, buf, sizeof(buf), 0));
	empty_reads(fd);

	/* we fill the servant's side until EAGAIN; it takes exactly that */
	total = fill_until_eagain(fd, 56);
	say("filled until EAGAIN");
	set_nonblock(fd, true);
	pfd.events = POLLOUT;
	EXPECT(0, "poll POLLOUT when full", poll(&pfd, 1, 0));
	EXPECT_ERR(EAGAIN, "send 1 when full", send(fd, "x", 1, 0));
	EXPECT_ERR(EAGAIN, "write 1 when full", write(fd, "x", 1));
	servant_do(&s, 0, S_DRAIN, total);
	servant_do(&s, 0, S_EMPTY, 0);
	EXPECT(1, "poll POLLOUT after the peer drained", poll(&pfd, 1, 10000));
	say("  revents %s", pollstr(pfd.revents));

	/* the servant fills us; we take exactly that, then EAGAIN */
	total = servant_do(&s, 0, S_FILL, 0);
	drain_exactly(fd, total, 55);
	say("drained what the peer wrote, data ok");
	EXPECT_ERR(EAGAIN, "recv after draining", recv(fd, buf, 1, 0));

	/* one send larger than the buffers: it takes what fits, not all, not -1 */
	fd2 = servant_connect(&s);
	set_nonblock(fd2, true);
	{
		size_t len = 64u << 20;
		char *big = malloc(len);
		ssize_t n;

		pattern(big, len, 56, 0);
		n = send(fd2, big, len, 0);
		CHECK(n > 0 && (size_t)n < len,
		      "send of 64 MiB returned %zd (%s)", n, ename(errno));
		say("send 64 MiB non-blocking -> partial");
		servant_do(&s, 1, S_DRAIN, (int)n);
		servant_do(&s, 1, S_EMPTY, 0);
		free(big);
	}

	EXPECT(0, "close", close(fd));
	EXPECT(0, "close", close(fd2));
	servant_end(&s);
	t_exit();
}

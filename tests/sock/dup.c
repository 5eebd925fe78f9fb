/* SPDX-License-Identifier: MIT */
/*
 * Duplicated socket fds: dup, dup2, dup3 and fcntl F_DUPFD/F_DUPFD_CLOEXEC.
 * Every duplicate carries the same connection; the close-on-exec flag is
 * per fd while O_NONBLOCK is shared; closing the original (or any but the
 * last) leaves the connection up; dup2 onto another socket's number closes
 * that one; a shutdown through one fd is seen through all.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/sock/common.h"

static struct servant s;

/* The first number >= from that is not open here (fixed numbers print
 * the same with and without wsd; the preload's own files sit low). */
static int free_fd(int from)
{
	while (fcntl(from, F_GETFD) >= 0)
		from++;
	return from;
}

static void show_fd(int fd, const char *name)
{
	char what[96];
	int fl;

	snprintf(what, sizeof(what), "fcntl F_GETFD %s", name);
	errno = 0;
	fl = fcntl(fd, F_GETFD);
	t_expect(what, fl, errno, fl, fl < 0 ? errno : 0);
	snprintf(what, sizeof(what), "fcntl F_GETFL %s", name);
	errno = 0;
	fl = fcntl(fd, F_GETFL);
	if (fl < 0)
		t_expect(what, fl, errno, 0, 0);
	else
		say("%s -> %s%s", what, (fl & O_ACCMODE) == O_RDWR ? "O_RDWR" : "?",
		    fl & O_NONBLOCK ? "|O_NONBLOCK" : "");
}

static bool same_peer(int a, int b)
{
	struct sockaddr_storage x, y;
	socklen_t lx = sizeof(x), ly = sizeof(y);

	return !getpeername(a, (struct sockaddr *)&x, &lx) &&
	       !getpeername(b, (struct sockaddr *)&y, &ly) && lx == ly && !memcmp(&x, &y, lx);
}

static void send_via(int fd, int n, const char *name)
{
	char buf[64], what[64];

	client_data(buf, n);
	snprintf(what, sizeof(what), "send %d via %s", n, name);
	EXPECT(n, what, send(fd, buf, n, 0));
}

static void duplicates(void)
{
	int fd = servant_connect(&s), d1, d2, d3, d4, d5, t2, t3;
	char buf[64];

	say("-- duplicates of one connection");
	d1 = dup(fd);
	CHECK(d1 >= 0, "dup: %s", ename(errno));
	say("dup -> a new fd");
	t2 = free_fd(600);
	d2 = EXPECT(t2, "dup2 to 600", dup2(fd, t2));
	t3 = free_fd(610);
	d3 = EXPECT(t3, "dup3 O_CLOEXEC to 610", dup3(fd, t3, O_CLOEXEC));
	d4 = fcntl(fd, F_DUPFD_CLOEXEC, 620);
	CHECK(d4 >= 620, "F_DUPFD_CLOEXEC gave %d (%s)", d4, ename(errno));
	say("fcntl F_DUPFD_CLOEXEC 620 -> a new fd >= 620");
	d5 = fcntl(fd, F_DUPFD, 630);
	CHECK(d5 >= 630, "F_DUPFD gave %d (%s)", d5, ename(errno));
	say("fcntl F_DUPFD 630 -> a new fd >= 630");
	show_fd(fd, "original");
	show_fd(d1, "dup");
	show_fd(d2, "dup2");
	show_fd(d3, "dup3 O_CLOEXEC");
	show_fd(d4, "F_DUPFD_CLOEXEC");
	show_fd(d5, "F_DUPFD");
	CHECK(same_peer(fd, d1) && same_peer(fd, d2) && same_peer(fd, d3) && same_peer(fd, d4) &&
	      same_peer(fd, d5), "a duplicate names another peer");
	say("getpeername: the same peer through every fd");

	/* FD_CLOEXEC is the fd's own; O_NONBLOCK belongs to the open file */
	EXPECT(0, "fcntl F_SETFD FD_CLOEXEC on the dup", fcntl(d1, F_SETFD, FD_CLOEXEC));
	show_fd(d1, "dup");
	show_fd(fd, "original");
	EXPECT(0, "fcntl F_SETFD 0 on the dup3", fcntl(d3, F_SETFD, 0));
	show_fd(d3, "dup3");
	EXPECT(0, "fcntl F_SETFL O_NONBLOCK on the dup2", fcntl(d2, F_SETFL, O_NONBLOCK));
	show_fd(fd, "original");
	EXPECT_ERR(EAGAIN, "recv on the original: non-blocking now", recv(fd, buf, 1, 0));
	EXPECT(0, "fcntl F_SETFL 0 on the original", fcntl(fd, F_SETFL, 0));
	show_fd(d2, "dup2");

	/* I/O through each */
	servant_do(&s, 0, S_SEND, 10);
	recv_servant_data(d1, 10);
	say("received 10 via the dup");
	send_via(d2, 20, "dup2");
	servant_do(&s, 0, S_RECV, 20);
	servant_do(&s, 0, S_SEND, 11);
	recv_servant_data(d3, 11);
	say("received 11 via dup3");
	send_via(d4, 21, "F_DUPFD_CLOEXEC");
	servant_do(&s, 0, S_RECV, 21);
	servant_do(&s, 0, S_SEND, 12);
	recv_servant_data(d5, 12);
	say("received 12 via F_DUPFD");

	/* the original goes; the rest carry on and the peer sees no EOF */
	EXPECT(0, "close the original", close(fd));
	servant_do(&s, 0, S_POLL, 0);
	send_via(d1, 22, "dup");
	servant_do(&s, 0, S_RECV, 22);
	EXPECT(0, "close dup", close(d1));
	EXPECT(0, "close dup2", close(d2));
	EXPECT(0, "close dup3", close(d3));
	EXPECT(0, "close F_DUPFD", close(d5));
	servant_do(&s, 0, S_POLL, 0);
	servant_do(&s, 0, S_SEND, 13);
	recv_servant_data(d4, 13);
	say("received 13 via the last fd");
	EXPECT(0, "close the last fd", close(d4));
	servant_do(&s, 0, S_RECV_EOF, 0);
	servant_do(&s, 0, S_CLOSE, 0);
}

static void dup_over_socket(void)
{
	int a = servant_connect(&s), b = servant_connect(&s), c;
	char buf[16];

	say("-- dup2 onto another socket's number");
	CHECK(dup2(a, b) == b, "dup2 a onto b: %s", ename(errno));
	say("dup2 a onto b -> b");
	/* b's connection lost its only fd: closed */
	servant_do(&s, 2, S_RECV_EOF, 0);
	send_via(b, 10, "b (now a)");
	servant_do(&s, 1, S_RECV, 10);
	EXPECT_ERR(EINVAL, "dup3 onto itself", dup3(a, a, 0));
	CHECK(dup2(a, a) == a, "dup2 onto itself: %s", ename(errno));
	say("dup2 onto itself -> the same fd");
	EXPECT_ERR(EINVAL, "dup3 with a bad flag", dup3(a, free_fd(640), 0x1234));
	EXPECT_ERR(EBADF, "dup2 to -1", dup2(a, -1));
	EXPECT_ERR(EBADF, "dup of a closed fd", dup(free_fd(650)));

	/* a shutdown through one fd is the connection's */
	c = MUST(dup(a));
	EXPECT(0, "shutdown SHUT_WR through a dup", shutdown(c, SHUT_WR));
	servant_do(&s, 1, S_RECV_EOF, 0);
	EXPECT_ERR(EPIPE, "send through the original", send(a, "x", 1, MSG_NOSIGNAL));
	servant_do(&s, 1, S_SEND, 9);
	EXPECT(9, "recv through b", recv(b, buf, 9, MSG_WAITALL));
	EXPECT(0, "close a", close(a));
	EXPECT(0, "close b", close(b));
	EXPECT(0, "close the dup", close(c));
	servant_do(&s, 1, S_CLOSE, 0);
	servant_do(&s, 2, S_CLOSE, 0);
}

int main(int argc, char **argv)
{
	t_init(argc, argv);
	servant_start(&s, AF_INET);
	duplicates();
	dup_over_socket();
	servant_end(&s);
	t_exit();
}

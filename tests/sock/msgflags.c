/* SPDX-License-Identifier: MIT */
/*
 * The MSG_* flags on a blocking socket: MSG_PEEK (the data stays), MSG_WAITALL
 * (waits across several sends; stops short at EOF), MSG_DONTWAIT (no waiting
 * on a blocking fd), MSG_NOSIGNAL (EPIPE and no SIGPIPE), and SIGPIPE as a
 * handler and as a pending signal when it is blocked.
 */
#define _GNU_SOURCE
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "tests/sock/common.h"

static struct servant s;
static volatile sig_atomic_t sigpipes;

static void on_sigpipe(int sig)
{
	(void)sig;
	sigpipes++;
}

static void wait_readable(int fd)
{
	struct pollfd pfd = { .fd = fd, .events = POLLIN };

	if (poll(&pfd, 1, -1) != 1)
		die("poll: %s", ename(errno));
}

static void check_bytes(const char *buf, size_t off, size_t n, const char *what)
{
	char want[256];

	servant_data(want, off + n);
	CHECK(!memcmp(buf, want + off, n), "%s: the bytes differ", what);
}

static void peek(int fd)
{
	char buf[64];

	say("-- MSG_PEEK");
	servant_do(&s, 0, S_SEND, 11);
	wait_readable(fd);
	EXPECT(5, "recv MSG_PEEK 5", recv(fd, buf, 5, MSG_PEEK));
	check_bytes(buf, 0, 5, "peek 5");
	EXPECT(11, "recv MSG_PEEK 64", recv(fd, buf, sizeof(buf), MSG_PEEK));
	check_bytes(buf, 0, 11, "peek 64");
	EXPECT(11, "recv MSG_PEEK|MSG_DONTWAIT 64",
	       recv(fd, buf, sizeof(buf), MSG_PEEK | MSG_DONTWAIT));
	EXPECT(3, "recv 3", recv(fd, buf, 3, 0));
	check_bytes(buf, 0, 3, "recv 3");
	EXPECT(8, "recv MSG_PEEK 64 after reading 3", recv(fd, buf, sizeof(buf), MSG_PEEK));
	check_bytes(buf, 3, 8, "peek the rest");
	EXPECT(8, "recv 64", recv(fd, buf, sizeof(buf), 0));
	check_bytes(buf, 3, 8, "recv the rest");
	EXPECT_ERR(EAGAIN, "recv MSG_PEEK|MSG_DONTWAIT empty",
		   recv(fd, buf, sizeof(buf), MSG_PEEK | MSG_DONTWAIT));
	/* a blocking peek waits for data like a read, and still leaves it */
	servant_do(&s, 0, S_SEND_LATER, 9);
	EXPECT(9, "recv MSG_PEEK blocking, data comes later", recv(fd, buf, sizeof(buf), MSG_PEEK));
	EXPECT(9, "recv 64", recv(fd, buf, sizeof(buf), 0));
	check_bytes(buf, 0, 9, "after the blocking peek");
}

static void waitall(int fd)
{
	char buf[256];

	say("-- MSG_WAITALL");
	/* four sends 30 ms apart: one recv gets all four */
	for (int i = 0; i < 4; i++)
		servant_go(&s, 0, S_SEND_LATER, 50);
	EXPECT(200, "recv MSG_WAITALL 200 over four sends", recv(fd, buf, 200, MSG_WAITALL));
	for (int i = 0; i < 4; i++) {
		servant_wait(&s);
		check_bytes(buf + 50 * i, 0, 50, "waitall");
	}
	/* recvmsg honours it too, across iovecs */
	for (int i = 0; i < 3; i++)
		servant_go(&s, 0, S_SEND_LATER, 40);
	{
		struct iovec iov[3] = { { buf, 7 }, { buf + 7, 100 }, { buf + 107, 13 } };
		struct msghdr mh = { .msg_iov = iov, .msg_iovlen = 3 };

		EXPECT(120, "recvmsg MSG_WAITALL 120 over three sends",
		       recvmsg(fd, &mh, MSG_WAITALL));
		say("  msg_flags 0x%x", mh.msg_flags);
	}
	for (int i = 0; i < 3; i++) {
		servant_wait(&s);
		check_bytes(buf + 40 * i, 0, 40, "recvmsg waitall");
	}
}

static void dontwait(int fd)
{
	char buf[64];
	static char chunk[64 << 10];
	int total = 0;
	ssize_t n;

	say("-- MSG_DONTWAIT on a blocking socket");
	EXPECT_ERR(EAGAIN, "recv MSG_DONTWAIT empty", recv(fd, buf, sizeof(buf), MSG_DONTWAIT));
	servant_do(&s, 1, S_SEND, 10);
	wait_readable(fd);
	EXPECT(10, "recv MSG_DONTWAIT with 10 there", recv(fd, buf, sizeof(buf), MSG_DONTWAIT));
	/* fill with MSG_DONTWAIT: EAGAIN, never a blocked send */
	for (;;) {
		pattern(chunk, sizeof(chunk), 56, total);
		n = send(fd, chunk, sizeof(chunk), MSG_DONTWAIT);
		if (n < 0)
			break;
		total += n;
	}
	t_expect("send MSG_DONTWAIT until it fails", -1, errno, -1, EAGAIN);
	servant_do(&s, 1, S_DRAIN, total);
	servant_do(&s, 1, S_EMPTY, 0);
}

/* Send until the reset from a closed peer turns into an error. */
static void send_until_error(int fd, int flags, const char *what)
{
	ssize_t n;
	int i;

	for (i = 0; i < 1000; i++) {
		n = send(fd, "data", 4, flags);
		if (n < 0)
			break;
		sleep_ms(1);
	}
	t_expect(what, n, errno, -1, EPIPE);
}

static void epipe(void)
{
	struct sigaction sa = { .sa_handler = on_sigpipe };
	struct iovec iov = { "data", 4 };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	sigset_t set, pending;
	int fd, sig;
	char b;

	say("-- MSG_NOSIGNAL and SIGPIPE");
	sigaction(SIGPIPE, &sa, NULL);

	fd = servant_connect(&s);
	servant_do(&s, 2, S_CLOSE, 0);
	EXPECT(0, "recv: the peer closed", recv(fd, &b, 1, 0));
	send_until_error(fd, MSG_NOSIGNAL, "send MSG_NOSIGNAL until it fails");
	say("  SIGPIPE count %d", (int)sigpipes);
	EXPECT_ERR(EPIPE, "send MSG_NOSIGNAL again", send(fd, "x", 1, MSG_NOSIGNAL));
	say("  SIGPIPE count %d", (int)sigpipes);
	close(fd);

	fd = servant_connect(&s);
	servant_do(&s, 3, S_CLOSE, 0);
	EXPECT(0, "recv: the peer closed", recv(fd, &b, 1, 0));
	send_until_error(fd, 0, "send until it fails");
	say("  SIGPIPE count %d", (int)sigpipes);
	EXPECT_ERR(EPIPE, "write", write(fd, "x", 1));
	say("  SIGPIPE count %d", (int)sigpipes);
	EXPECT_ERR(EPIPE, "writev", writev(fd, &iov, 1));
	say("  SIGPIPE count %d", (int)sigpipes);
	EXPECT_ERR(EPIPE, "sendmsg", sendmsg(fd, &mh, 0));
	say("  SIGPIPE count %d", (int)sigpipes);
	EXPECT_ERR(EPIPE, "sendmsg MSG_NOSIGNAL", sendmsg(fd, &mh, MSG_NOSIGNAL));
	say("  SIGPIPE count %d", (int)sigpipes);
	EXPECT_ERR(EPIPE, "sendto", sendto(fd, "x", 1, 0, NULL, 0));
	say("  SIGPIPE count %d", (int)sigpipes);

	/* blocked, it stays pending for this thread */
	sigemptyset(&set);
	sigaddset(&set, SIGPIPE);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	EXPECT_ERR(EPIPE, "send with SIGPIPE blocked", send(fd, "x", 1, 0));
	sigpending(&pending);
	say("  SIGPIPE pending %d", sigismember(&pending, SIGPIPE));
	EXPECT(0, "sigwait", sigwait(&set, &sig));
	say("  SIGPIPE count %d", (int)sigpipes);
	pthread_sigmask(SIG_UNBLOCK, &set, NULL);
	close(fd);
}

int main(int argc, char **argv)
{
	int fd, fd1;
	char buf[256];

	t_init(argc, argv);
	servant_start(&s, AF_INET);
	fd = servant_connect(&s);
	fd1 = servant_connect(&s);
	peek(fd);
	waitall(fd);
	dontwait(fd1);
	epipe();

	say("-- MSG_WAITALL cut short by EOF");
	servant_do(&s, 0, S_SEND, 30);
	servant_do(&s, 0, S_SHUT_WR, 0);
	EXPECT(30, "recv MSG_WAITALL 100, the peer sent 30 and shut down",
	       recv(fd, buf, 100, MSG_WAITALL));
	check_bytes(buf, 0, 30, "waitall at EOF");
	EXPECT(0, "recv MSG_WAITALL at EOF", recv(fd, buf, 100, MSG_WAITALL));
	EXPECT(0, "close", close(fd));
	EXPECT(0, "close", close(fd1));
	servant_end(&s);
	t_exit();
}

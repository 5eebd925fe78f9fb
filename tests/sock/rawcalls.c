/* SPDX-License-Identifier: MIT */
/*
 * syscall() itself on an accelerated connection: the numbers that read,
 * write, send and receive move exactly the bytes the named calls would;
 * dup, dup3, fcntl F_DUPFD_CLOEXEC, close and close_range through syscall()
 * keep the connection's fds working; other numbers pass through, and a
 * failure is -1 with errno.  Last, io_uring_setup: under the switch the
 * connection goes back to TCP, and carries on; fork by number before it:
 * the C library's fork under the switch, the connection on the stream.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <dlfcn.h>
#include <unistd.h>

#include "tests/sock/common.h"

#define FILE_LEN 1000

/* 37 bytes of pattern 90, each call a different system call */
static void raw_sends(int fd)
{
	char b[37];
	struct iovec iov[2] = { { b + 10, 3 }, { b + 13, 4 } };
	struct iovec mv[3] = { { b + 22, 6 }, { b + 28, 2 }, { b + 30, 3 } };
	struct msghdr mh = { .msg_iov = &mv[0], .msg_iovlen = 1 };
	struct mmsghdr mm[2] = { { { .msg_iov = &mv[1], .msg_iovlen = 1 }, 0 },
				 { { .msg_iov = &mv[2], .msg_iovlen = 1 }, 0 } };
	struct iovec pv = { b + 33, 4 };

	say("-- syscall(): write, writev, sendto, sendmsg, sendmmsg, pwritev2");
	pattern(b, sizeof(b), 90, 0);
	EXPECT(10, "SYS_write 10", syscall(SYS_write, fd, b, 10));
	EXPECT(7, "SYS_writev 3+4", syscall(SYS_writev, fd, iov, 2));
	EXPECT(5, "SYS_sendto 5", syscall(SYS_sendto, fd, b + 17, 5, 0, NULL, 0));
	EXPECT(6, "SYS_sendmsg 6", syscall(SYS_sendmsg, fd, &mh, 0));
	EXPECT(2, "SYS_sendmmsg 2 messages", syscall(SYS_sendmmsg, fd, mm, 2, 0));
	say("  msg_len %u %u", mm[0].msg_len, mm[1].msg_len);
	EXPECT(4, "SYS_pwritev2 offset -1", syscall(SYS_pwritev2, fd, &pv, 1, -1L, 0L, 0));
	EXPECT_ERR(ESPIPE, "SYS_pwrite64 offset 0", syscall(SYS_pwrite64, fd, b, 1, 0L));
	EXPECT_ERR(ESPIPE, "SYS_pwritev offset 0", syscall(SYS_pwritev, fd, &pv, 1, 0L, 0L));
	expect_path(fd);
}

static void raw_recvs(int fd)
{
	char b[64], want[37];
	struct iovec iov[2] = { { b + 8, 4 }, { b + 12, 4 } };
	struct iovec mv[3] = { { b + 21, 6 }, { b + 27, 2 }, { b + 29, 2 } };
	struct msghdr mh = { .msg_iov = &mv[0], .msg_iovlen = 1 };
	struct mmsghdr mm[2] = { { { .msg_iov = &mv[1], .msg_iovlen = 1 }, 0 },
				 { { .msg_iov = &mv[2], .msg_iovlen = 1 }, 0 } };
	struct iovec pv = { b + 31, 4 };

	say("-- syscall(): read, readv, recvfrom, recvmsg, recvmmsg, preadv2");
	wait_queued(fd, 37);
	EXPECT(8, "SYS_read 8", syscall(SYS_read, fd, b, 8));
	EXPECT(8, "SYS_readv 4+4", syscall(SYS_readv, fd, iov, 2));
	EXPECT(3, "SYS_recvfrom MSG_PEEK 3", syscall(SYS_recvfrom, fd, b + 16, 3, MSG_PEEK,
						       NULL, NULL));
	EXPECT(5, "SYS_recvfrom 5", syscall(SYS_recvfrom, fd, b + 16, 5, 0, NULL, NULL));
	EXPECT(6, "SYS_recvmsg 6", syscall(SYS_recvmsg, fd, &mh, 0));
	EXPECT(2, "SYS_recvmmsg 2 x 2", syscall(SYS_recvmmsg, fd, mm, 2, 0, NULL));
	say("  msg_len %u %u", mm[0].msg_len, mm[1].msg_len);
	EXPECT(4, "SYS_preadv2 offset -1", syscall(SYS_preadv2, fd, &pv, 1, -1L, 0L, 0));
	EXPECT_ERR(ESPIPE, "SYS_pread64 offset 0", syscall(SYS_pread64, fd, b, 1, 0L));
	EXPECT_ERR(ESPIPE, "SYS_preadv offset 0", syscall(SYS_preadv, fd, &pv, 1, 0L, 0L));
	EXPECT(2, "SYS_read 10, 2 left", syscall(SYS_read, fd, b + 35, 10));
	EXPECT_ERR(EAGAIN, "SYS_recvfrom MSG_DONTWAIT, nothing left",
		   syscall(SYS_recvfrom, fd, b, 10, MSG_DONTWAIT, NULL, NULL));
	pattern(want, sizeof(want), 90, 0);
	CHECK(!memcmp(b, want, sizeof(want)), "the raw calls' bytes differ");
	expect_path(fd);
}

static int temp_file(void)
{
	char path[] = "/tmp/wsd-sock-raw-XXXXXX";
	int fd = MUST(mkstemp(path));
	char buf[FILE_LEN];

	unlink(path);
	pattern(buf, FILE_LEN, 91, 0);
	if (write(fd, buf, FILE_LEN) != FILE_LEN)
		die("temp file: %s", ename(errno));
	return fd;
}

static void raw_fds(int fd)
{
	char b[12];
	struct iovec v = { b + 9, 3 };
	long d;

	say("-- syscall(): dup, fcntl F_DUPFD_CLOEXEC, dup3, close, close_range");
	pattern(b, sizeof(b), 92, 0);
	d = syscall(SYS_dup, fd);
	CHECK(d >= 0, "SYS_dup: %s", ename(errno));
	EXPECT(3, "write through the SYS_dup fd", write((int)d, b, 3));
	EXPECT(0, "SYS_close the dup", syscall(SYS_close, d));
	EXPECT_ERR(EBADF, "fcntl F_GETFD on it", fcntl((int)d, F_GETFD));
	d = syscall(SYS_fcntl, fd, F_DUPFD_CLOEXEC, 100);
	CHECK(d >= 100, "SYS_fcntl F_DUPFD_CLOEXEC: %ld %s", d, ename(errno));
	EXPECT(FD_CLOEXEC, "fcntl F_GETFD on the F_DUPFD_CLOEXEC fd", fcntl((int)d, F_GETFD));
	EXPECT(3, "SYS_write through it", syscall(SYS_write, d, b + 3, 3));
	EXPECT(0, "SYS_close it", syscall(SYS_close, d));
	EXPECT(150, "SYS_dup3 to 150 O_CLOEXEC", syscall(SYS_dup3, fd, 150, O_CLOEXEC));
	EXPECT(3, "SYS_write through 150", syscall(SYS_write, 150, b + 6, 3));
	EXPECT(3, "SYS_writev through 150", syscall(SYS_writev, 150, &v, 1));
	EXPECT(0, "SYS_close 150", syscall(SYS_close, 150));
	EXPECT_ERR(EBADF, "fcntl F_GETFD on 150", fcntl(150, F_GETFD));
	EXPECT_ERR(EBADF, "SYS_write to a closed fd", syscall(SYS_write, 150, b, 1));
	{
		int p[2];

		MUST(pipe2(p, O_CLOEXEC));
		MUST(dup2(p[0], 160));
		MUST(dup2(p[1], 161));
		EXPECT(0, "SYS_close_range 160 161 (a pipe)", syscall(SYS_close_range, 160, 161, 0));
		EXPECT_ERR(EBADF, "fcntl F_GETFD on 161", fcntl(161, F_GETFD));
		close(p[0]);
		close(p[1]);
	}
	CHECK(syscall(SYS_getpid) == getpid(), "SYS_getpid differs from getpid()");
	{
		int v = -1;
		socklen_t vl = sizeof(v);

		/* what the program set, not what the switch may have set for itself */
		EXPECT(0, "SYS_getsockopt TCP_NODELAY",
		       syscall(SYS_getsockopt, fd, IPPROTO_TCP, TCP_NODELAY, &v, &vl));
		say("  TCP_NODELAY %d", v);
	}
	/* O_NONBLOCK set by number is the socket's: a receive then does not wait */
	EXPECT(0, "SYS_fcntl F_SETFL O_NONBLOCK", syscall(SYS_fcntl, fd, F_SETFL, O_RDWR | O_NONBLOCK));
	EXPECT_ERR(EAGAIN, "read, nothing there", read(fd, b, 1));
	EXPECT(0, "SYS_ioctl FIONBIO 0", syscall(SYS_ioctl, fd, FIONBIO, &(int){ 0 }));
	EXPECT(0, "SYS_ioctl FIONBIO 1", syscall(SYS_ioctl, fd, FIONBIO, &(int){ 1 }));
	EXPECT_ERR(EAGAIN, "recv, nothing there", recv(fd, b, 1, 0));
	EXPECT(0, "SYS_fcntl F_SETFL 0", syscall(SYS_fcntl, fd, F_SETFL, O_RDWR));
	EXPECT(O_RDWR, "fcntl F_GETFL", fcntl(fd, F_GETFL) & (O_ACCMODE | O_NONBLOCK));
	EXPECT_ERR(EINVAL, "SYS_fcntl bad command", syscall(SYS_fcntl, fd, 99999, 0));
	expect_path(fd);
}

static void peer_main(struct peer *ctl, void *arg)
{
	int lfd, port, fd, p[2];
	char b[FILE_LEN], want[FILE_LEN];
	size_t got = 0;

	(void)arg;
	lfd = t_listen(AF_INET, &port);
	ctl_send(ctl, port);
	fd = t_accept(lfd);
	warmup(fd, false);

	raw_recvs(fd);
	ctl_send(ctl, 0);
	raw_sends(fd);

	/* SYS_sendfile's bytes, through SYS_splice into a pipe */
	MUST(pipe(p));
	while (got < FILE_LEN - 3) {
		long n = syscall(SYS_splice, fd, NULL, p[1], NULL, FILE_LEN - 3 - got, 0);

		if (n <= 0)
			die("SYS_splice: %s", n ? ename(errno) : "EOF");
		if (read(p[0], b + got, n) != n)
			die("read from the pipe: %s", ename(errno));
		got += n;
	}
	pattern(want, FILE_LEN, 91, 3);
	CHECK(!memcmp(b, want, FILE_LEN - 3), "SYS_sendfile: the data differ");
	say("SYS_splice took what SYS_sendfile sent: ok");
	close(p[0]);
	close(p[1]);
	expect_path(fd);

	recv_all(fd, b, 12);
	pattern(want, 12, 92, 0);
	CHECK(!memcmp(b, want, 12), "the dup fds' bytes differ");
	say("received through the dup fds: ok");
	ctl_send(ctl, 0);

	/* the far end's child by SYS_fork, then after its io_uring_setup */
	recv_all(fd, b, 5);
	CHECK(!memcmp(b, "child", 5), "from the child by SYS_fork: the data differ");
	recv_all(fd, b, 5);
	CHECK(!memcmp(b, "after", 5), "after io_uring_setup: the data differ");
	EXPECT(5, "send after io_uring_setup", send(fd, "again", 5, 0));
	EXPECT(0, "recv EOF", recv(fd, b, 1, 0));
	EXPECT(0, "close", close(fd));
	close(lfd);
}

int main(int argc, char **argv)
{
	struct peer b;
	int fd, file;
	char buf[8];

	t_init(argc, argv);
	peer_start(&b, "peer", peer_main, NULL);
	fd = t_connect(AF_INET, ctl_recv(&b));
	warmup(fd, true);

	raw_sends(fd);
	ctl_recv(&b);
	raw_recvs(fd);

	say("-- syscall(): sendfile (the peer: splice)");
	file = temp_file();
	{
		off_t off = 3;

		EXPECT(FILE_LEN - 3, "SYS_sendfile from offset 3",
		       syscall(SYS_sendfile, fd, file, &off, FILE_LEN - 3));
		say("  offset now %lld", (long long)off);
	}
	close(file);
	expect_path(fd);
	raw_fds(fd);
	ctl_recv(&b);

	say("-- syscall(): fork");
	{
		/*
		 * Under the switch it is the C library's fork, whose handlers
		 * move the connection both processes now hold to the stream:
		 * the child's bytes and the parent's that follow arrive in order.
		 */
		pid_t c = (pid_t)syscall(SYS_fork);
		int st;

		if (c == 0)
			_exit(send(fd, "child", 5, MSG_NOSIGNAL) == 5 ? 0 : 4);
		CHECK(c > 0, "SYS_fork: %s", ename(errno));
		CHECK(waitpid(c, &st, 0) == c && WIFEXITED(st) && WEXITSTATUS(st) == 0,
		      "the child by SYS_fork did not send");
		expect_path_now(fd, "tcp");
		say("a child by SYS_fork sent on the connection: ok");
	}

	say("-- syscall(): io_uring_setup");
	{
		char params[120] = { 0 };   /* struct io_uring_params, zeroed */
		long r = syscall(SYS_io_uring_setup, 4, params);

		/* plain runs may not be allowed one (containers): the same line either way */
		say("io_uring_setup: done");
		if (r >= 0) {
			close((int)r);
			expect_path_now(fd, "tcp");
		}
	}
	EXPECT(5, "send after io_uring_setup", send(fd, "after", 5, 0));
	recv_all(fd, buf, 5);
	CHECK(!memcmp(buf, "again", 5), "after io_uring_setup: the data differ");
	EXPECT(0, "close", close(fd));
	peer_end(&b);
	t_exit();
}

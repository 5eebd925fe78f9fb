/* SPDX-License-Identifier: MIT */
/*
 * The receive and send flags beyond msgflags.pair's, on an accelerated
 * connection: MSG_OOB both ways (no urgent data is EINVAL; urgent data
 * sent on an accelerated connection arrives out of band, the rest in
 * order; a connection that carried urgent data before the upgrade never
 * upgrades), MSG_ERRQUEUE, MSG_TRUNC (discards, with or without a
 * buffer), MSG_ZEROCOPY without SO_ZEROCOPY.  Then the copy calls on a
 * non-blocking socket whose send buffer is full: sendfile and splice
 * pipe -> socket fail EAGAIN at once and take nothing; splice socket ->
 * pipe into a pipe with no free slot is EAGAIN and takes nothing.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "tests/sock/common.h"

#define FILE_LEN 200003

enum { C_GO = 1 };

/* The urgent byte, once it arrived (recv MSG_OOB is EINVAL until then). */
static void recv_urgent(int fd, char want)
{
	double t0 = now_ms();
	char b = 0;
	ssize_t n;

	while ((n = recv(fd, &b, 1, MSG_OOB | MSG_DONTWAIT)) < 0 &&
	       (errno == EINVAL || errno == EAGAIN || errno == EINTR)) {
		if (now_ms() - t0 > 5000)
			die("no urgent data came: %s", ename(errno));
		sleep_ms(1);
	}
	t_expect("recv MSG_OOB, once the urgent byte came", n, errno, 1, 0);
	CHECK(b == want, "urgent byte '%c', want '%c'", b, want);
}

static int temp_file(void)
{
	char path[] = "/tmp/wsd-sock-flags2-XXXXXX";
	int fd = MUST(mkstemp(path));
	char *buf = malloc(FILE_LEN);

	unlink(path);
	pattern(buf, FILE_LEN, 83, 0);
	if (write(fd, buf, FILE_LEN) != FILE_LEN)
		die("temp file: %s", ename(errno));
	MUST(lseek(fd, 0, SEEK_SET));
	free(buf);
	return fd;
}

/* ---- the peer ---------------------------------------------------------------------- */

static void peer_main(struct peer *ctl, void *arg)
{
	int lfd, port, fd;
	char b[64], *big;

	(void)arg;
	lfd = t_listen(AF_INET, &port);
	ctl_send(ctl, port);

	/* 1: the receive flags at the other end; 20 bytes to receive with MSG_TRUNC */
	fd = t_accept(lfd);
	warmup(fd, false);
	ctl_recv(ctl);
	pattern(b, 20, 80, 0);
	send_all(fd, b, 20);
	ctl_recv(ctl);
	/* MSG_ZEROCOPY's bytes among others */
	recv_all(fd, b, 8);
	CHECK(!memcmp(b, "abcdefgh", 8), "around MSG_ZEROCOPY: the data differ");
	say("received around MSG_ZEROCOPY: abcdefgh");
	EXPECT(0, "close", close(fd));

	/* 2: urgent data on an accelerated connection */
	fd = t_accept(lfd);
	warmup(fd, false);
	ctl_send(ctl, 0);
	ctl_recv(ctl);
	/*
	 * In a receive meanwhile: the switch here answers the way back to TCP.
	 * Reading past the mark first would lose the urgent byte (Linux).
	 */
	recv_all(fd, b, 3);
	recv_urgent(fd, 'U');
	recv_all(fd, b + 3, 3);
	CHECK(!memcmp(b, "abcdef", 6), "around the urgent byte: the data differ");
	say("received around the urgent byte: abcdef");
	EXPECT(3, "send after it", send(fd, "xyz", 3, 0));
	EXPECT(0, "close", close(fd));

	/* 3: urgent data both ways before the upgrade */
	fd = t_accept(lfd);
	recv_urgent(fd, 'C');
	EXPECT(1, "send MSG_OOB before the upgrade", send(fd, "S", 1, MSG_OOB));
	warmup_bulk(fd, false);
	sleep_ms(100);
	warmup_tail(fd, false);
	ctl_send(ctl, 0);
	ctl_recv(ctl);
	expect_path_now(fd, "tcp");
	EXPECT(0, "close", close(fd));

	/* 4: the far end of the copy calls to a full socket */
	fd = t_accept(lfd);
	warmup(fd, false);
	{
		int filled = ctl_recv(ctl);

		drain_exactly(fd, filled, 81);
		say("drained what was sent before sendfile, data ok");
		ctl_send(ctl, 0);
		big = malloc(FILE_LEN);
		recv_all(fd, big, FILE_LEN);
		{
			char *want = malloc(FILE_LEN);

			pattern(want, FILE_LEN, 83, 0);
			CHECK(!memcmp(big, want, FILE_LEN), "sendfile: the data differ");
			free(want);
		}
		say("received the file: ok");
		free(big);
		filled = ctl_recv(ctl);
		drain_exactly(fd, filled, 82);
		say("drained what was sent before splice, data ok");
		ctl_send(ctl, 0);
		recv_all(fd, b, 64);
		{
			char want[64];

			pattern(want, 64, 84, 0);
			CHECK(!memcmp(b, want, 64), "splice pipe -> socket: the data differ");
		}
		say("received what splice sent: ok");
		/* splice socket -> pipe at the other end: 64 bytes, then 10000 */
		pattern(b, 64, 85, 0);
		send_all(fd, b, 64);
		ctl_send(ctl, 0);
		ctl_recv(ctl);
		big = malloc(10000);
		pattern(big, 10000, 86, 0);
		send_all(fd, big, 10000);
		free(big);
		ctl_send(ctl, 0);
	}
	EXPECT(0, "recv EOF", recv(fd, b, 1, 0));
	EXPECT(0, "close", close(fd));

	/* 5: closed at once, for EPIPE and SIGPIPE from sendfile and splice */
	fd = t_accept(lfd);
	warmup(fd, false);
	EXPECT(0, "close", close(fd));
	close(lfd);
}

/* ---- this end ---------------------------------------------------------------------- */

static void recv_flags(struct peer *p, int port)
{
	int fd = t_connect(AF_INET, port);
	char b[64], want[20];
	struct msghdr mh = { 0 };
	struct iovec v = { b, sizeof(b) };

	warmup(fd, true);
	say("-- MSG_OOB, MSG_ERRQUEUE, MSG_TRUNC on receive");
	EXPECT_ERR(EINVAL, "recv MSG_OOB, no urgent data", recv(fd, b, 1, MSG_OOB));
	EXPECT_ERR(EAGAIN, "recv MSG_ERRQUEUE, nothing queued",
		   recv(fd, b, sizeof(b), MSG_ERRQUEUE));
	mh.msg_iov = &v;
	mh.msg_iovlen = 1;
	EXPECT_ERR(EAGAIN, "recvmsg MSG_ERRQUEUE, nothing queued",
		   recvmsg(fd, &mh, MSG_ERRQUEUE));
	expect_path_now(fd, "shm");   /* none of them moves a stream byte */

	ctl_send(p, C_GO);
	wait_queued(fd, 20);
	pattern(want, 20, 80, 0);
	EXPECT(5, "recv NULL 5 MSG_TRUNC (discards)", recv(fd, NULL, 5, MSG_TRUNC));
	memset(b, 'z', sizeof(b));
	EXPECT(3, "recv 3 MSG_TRUNC|MSG_PEEK", recv(fd, b, 3, MSG_TRUNC | MSG_PEEK));
	say("  the buffer: %s", b[0] == 'z' && b[2] == 'z' ? "untouched" : "written");
	EXPECT(3, "recv 3 MSG_TRUNC", recv(fd, b, 3, MSG_TRUNC));
	say("  the buffer: %s", b[0] == 'z' && b[2] == 'z' ? "untouched" : "written");
	EXPECT(12, "recv 64, 12 left", recv(fd, b, sizeof(b), 0));
	CHECK(!memcmp(b, want + 8, 12), "after MSG_TRUNC: the data differ");
	EXPECT_ERR(EAGAIN, "recv NULL 10 MSG_TRUNC|MSG_DONTWAIT, nothing left",
		   recv(fd, NULL, 10, MSG_TRUNC | MSG_DONTWAIT));
	expect_path_now(fd, "shm");

	say("-- MSG_ZEROCOPY without SO_ZEROCOPY");
	ctl_send(p, C_GO);   /* the peer receives meanwhile */
	EXPECT(3, "send abc", send(fd, "abc", 3, 0));
	EXPECT(2, "send de MSG_ZEROCOPY", send(fd, "de", 2, MSG_ZEROCOPY));
	EXPECT(3, "send fgh", send(fd, "fgh", 3, 0));
	expect_path_now(fd, "tcp");
	EXPECT(0, "close", close(fd));
}

static void send_oob(struct peer *p, int port)
{
	int fd = t_connect(AF_INET, port);
	char b[4];

	warmup(fd, true);
	ctl_recv(p);
	say("-- MSG_OOB on an accelerated connection");
	ctl_send(p, C_GO);   /* the peer receives meanwhile */
	/* the last byte is the urgent one */
	EXPECT(4, "send abcU MSG_OOB", send(fd, "abcU", 4, MSG_OOB));
	EXPECT(3, "send def", send(fd, "def", 3, 0));
	expect_path_now(fd, "tcp");
	recv_all(fd, b, 3);
	CHECK(!memcmp(b, "xyz", 3), "after the urgent byte: the data differ");
	EXPECT(0, "close", close(fd));

	say("-- MSG_OOB both ways before the upgrade");
	fd = t_connect(AF_INET, port);
	EXPECT(1, "send MSG_OOB before the upgrade", send(fd, "C", 1, MSG_OOB));
	recv_urgent(fd, 'S');
	warmup_bulk(fd, true);
	sleep_ms(100);
	warmup_tail(fd, true);
	ctl_recv(p);
	expect_path_now(fd, "tcp");
	ctl_send(p, C_GO);
	EXPECT(0, "close", close(fd));
}

static void copy_calls(struct peer *p, int port)
{
	int fd = t_connect(AF_INET, port), file = temp_file(), filled, q[2];
	off_t off = 0;
	size_t total = 0;
	double t0;
	char b[64];

	warmup(fd, true);
	say("-- sendfile to a full non-blocking socket");
	filled = fill_until_eagain(fd, 81);
	set_nonblock(fd, true);
	t0 = now_ms();
	EXPECT_ERR(EAGAIN, "sendfile 65536 with an offset", sendfile(fd, file, &off, 65536));
	say("  offset %lld", (long long)off);
	EXPECT_ERR(EAGAIN, "sendfile 65536 from the position", sendfile(fd, file, NULL, 65536));
	say("  position %lld", (long long)lseek(file, 0, SEEK_CUR));
	CHECK(now_ms() - t0 < 1000, "sendfile to a full socket took %.0f ms", now_ms() - t0);
	ctl_send(p, filled);
	ctl_recv(p);
	/* the whole file, each short count taking exactly what went */
	while (total < FILE_LEN) {
		ssize_t n = sendfile(fd, file, &off, FILE_LEN - total);

		if (n < 0 && errno == EAGAIN) {
			struct pollfd pfd = { .fd = fd, .events = POLLOUT };

			poll(&pfd, 1, 1000);
			continue;
		}
		if (n <= 0)
			die("sendfile: %s", n ? ename(errno) : "nothing sent");
		total += n;
		CHECK((size_t)off == total, "sendfile: offset %lld after %zu bytes", (long long)off,
		      total);
	}
	say("sendfile: the whole file went, offset %lld", (long long)off);
	close(file);
	/* the kernel reads only files here: nothing is taken from these */
	MUST(pipe(q));
	MUST(write(q[1], "abc", 3));
	EXPECT_ERR(EINVAL, "sendfile from a pipe", sendfile(fd, q[0], NULL, 3));
	EXPECT_ERR(ESPIPE, "sendfile from a pipe, with an offset", sendfile(fd, q[0], &off, 3));
	EXPECT_ERR(EINVAL, "sendfile from the socket itself", sendfile(fd, fd, NULL, 3));
	EXPECT_ERR(EINVAL, "splice the socket into itself", splice(fd, NULL, fd, NULL, 3, 0));
	{
		int f = temp_file();

		EXPECT_ERR(EINVAL, "splice a file into the socket", splice(f, NULL, fd, NULL, 3, 0));
		close(f);
	}
	EXPECT(3, "read the pipe", read(q[0], b, sizeof(b)));
	close(q[0]);
	close(q[1]);

	say("-- splice pipe -> full non-blocking socket");
	set_nonblock(fd, false);
	filled = fill_until_eagain(fd, 82);
	set_nonblock(fd, true);
	MUST(pipe(q));
	pattern(b, 64, 84, 0);
	MUST(write(q[1], b, 64));
	t0 = now_ms();
	EXPECT_ERR(EAGAIN, "splice 64 from the pipe", splice(q[0], NULL, fd, NULL, 64, 0));
	CHECK(now_ms() - t0 < 1000, "splice to a full socket took %.0f ms", now_ms() - t0);
	{
		int inpipe = 0;

		MUST(ioctl(q[0], FIONREAD, &inpipe));
		say("  bytes still in the pipe: %d", inpipe);
	}
	ctl_send(p, filled);
	ctl_recv(p);
	for (total = 0; total < 64;) {
		ssize_t n = splice(q[0], NULL, fd, NULL, 64 - total, 0);

		if (n < 0 && errno == EAGAIN) {
			struct pollfd pfd = { .fd = fd, .events = POLLOUT };

			poll(&pfd, 1, 1000);
			continue;
		}
		if (n <= 0)
			die("splice: %s", n ? ename(errno) : "nothing");
		total += n;
	}
	say("splice pipe -> socket: 64 bytes");
	close(q[0]);
	close(q[1]);

	say("-- splice socket -> a pipe with no free slot");
	MUST(pipe(q));
	MUST(fcntl(q[1], F_SETPIPE_SZ, 4096));
	{
		int f = temp_file();
		loff_t at = 0;

		/* a spliced page is a slot of its own: nothing merges into it */
		EXPECT(1, "splice 1 byte file -> pipe", splice(f, &at, q[1], NULL, 1, 0));
		close(f);
	}
	MUST(fcntl(q[1], F_SETFL, O_NONBLOCK));
	ctl_recv(p);
	wait_queued(fd, 64);
	EXPECT_ERR(EAGAIN, "splice socket -> full pipe (O_NONBLOCK)",
		   splice(fd, NULL, q[1], NULL, 64, 0));
	MUST(fcntl(q[1], F_SETFL, 0));
	EXPECT_ERR(EAGAIN, "splice socket -> full pipe, SPLICE_F_NONBLOCK",
		   splice(fd, NULL, q[1], NULL, 64, SPLICE_F_NONBLOCK));
	EXPECT(1, "read the pipe's byte", read(q[0], b, 1));
	EXPECT(64, "splice socket -> pipe", splice(fd, NULL, q[1], NULL, 64, 0));
	EXPECT(64, "read the pipe", read(q[0], b, 64));
	{
		char want[64];

		pattern(want, 64, 85, 0);
		CHECK(!memcmp(b, want, 64), "splice socket -> pipe: the data differ");
	}
	close(q[0]);
	close(q[1]);

	say("-- splice socket -> a blocking pipe with one free slot");
	MUST(pipe(q));
	MUST(fcntl(q[1], F_SETPIPE_SZ, 8192));
	{
		int f = temp_file();
		loff_t at = 0;
		char *got = malloc(10001), *want = malloc(10000);
		size_t total = 0;
		ssize_t n;

		EXPECT(1, "splice 1 byte file -> pipe", splice(f, &at, q[1], NULL, 1, 0));
		close(f);
		ctl_send(p, 0);
		ctl_recv(p);
		wait_queued(fd, 10000);
		/* the kernel fills the free slot and returns: no wait for more room */
		n = splice(fd, NULL, q[1], NULL, 10000, 0);
		say("splice 10000 took at most one page: %s", n > 0 && n <= 4096 ? "yes" : "no");
		if (n <= 0)
			die("splice: %s", ename(errno));
		MUST(read(q[0], got, 1));
		for (total = 0;;) {
			ssize_t k = read(q[0], got + total, n);

			if (k != n)
				die("read the pipe: %zd of %zd", k, n);
			total += n;
			if (total == 10000)
				break;
			n = splice(fd, NULL, q[1], NULL, 10000 - total, 0);
			if (n <= 0)
				die("splice: %s", n ? ename(errno) : "EOF");
		}
		pattern(want, 10000, 86, 0);
		CHECK(!memcmp(got, want, 10000), "splice into a small pipe: the data differ");
		say("spliced 10000 bytes through it: ok");
		free(got);
		free(want);
	}
	close(q[0]);
	close(q[1]);
	set_nonblock(fd, false);
	EXPECT(0, "shutdown SHUT_WR", shutdown(fd, SHUT_WR));
	EXPECT(0, "close", close(fd));
}

static volatile sig_atomic_t sigpipes;

static void on_sigpipe(int sig)
{
	(void)sig;
	sigpipes++;
}

/* The kernel's sendfile and splice raise SIGPIPE on a broken connection. */
static void copy_epipe(int port)
{
	struct sigaction sa = { .sa_handler = on_sigpipe };
	int fd = t_connect(AF_INET, port), file = temp_file(), q[2];
	ssize_t n = 0;
	char b;

	warmup(fd, true);
	say("-- sendfile and splice to a closed peer");
	sigaction(SIGPIPE, &sa, NULL);
	EXPECT(0, "recv: the peer closed", recv(fd, &b, 1, 0));
	/* the first sends may still go: the reset comes back after one */
	for (int i = 0; i < 1000; i++) {
		off_t off = 0;

		n = sendfile(fd, file, &off, 100);
		if (n < 0)
			break;
		sleep_ms(1);
	}
	t_expect("sendfile until it fails", n, errno, -1, EPIPE);
	say("  SIGPIPE seen: %s", sigpipes ? "yes" : "no");
	sigpipes = 0;
	MUST(pipe(q));
	MUST(write(q[1], "abc", 3));
	EXPECT_ERR(EPIPE, "splice pipe -> socket", splice(q[0], NULL, fd, NULL, 3, 0));
	say("  SIGPIPE seen: %s", sigpipes ? "yes" : "no");
	close(q[0]);
	close(q[1]);
	close(file);
	EXPECT(0, "close", close(fd));
}

int main(int argc, char **argv)
{
	struct peer b;
	int port;

	t_init(argc, argv);
	peer_start(&b, "peer", peer_main, NULL);
	port = ctl_recv(&b);
	recv_flags(&b, port);
	send_oob(&b, port);
	copy_calls(&b, port);
	copy_epipe(port);
	peer_end(&b);
	t_exit();
}

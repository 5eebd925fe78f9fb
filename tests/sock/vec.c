/* SPDX-License-Identifier: MIT */
/*
 * The other data calls: readv/writev and sendmsg/recvmsg with iovecs of
 * odd sizes (each way), what recvmsg writes back into msghdr, sendfile
 * from a temp file (with an offset and with the file position), splice
 * socket -> pipe -> socket, and the _FORTIFY_SOURCE entry points
 * (__recv_chk, __read_chk, __recvfrom_chk) that fortified programs call.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "tests/sock/common.h"

/* What fortified headers turn recv/read/recvfrom into (glibc exports them). */
extern ssize_t __recv_chk(int fd, void *buf, size_t len, size_t buflen, int flags);
extern ssize_t __read_chk(int fd, void *buf, size_t len, size_t buflen);
extern ssize_t __recvfrom_chk(int fd, void *buf, size_t len, size_t buflen, int flags,
			      struct sockaddr *addr, socklen_t *alen);

#define FILE_LEN ((1u << 20) + 123)
#define SPLICE_LEN ((256u << 10) + 7)

static const size_t wsizes[] = { 1, 7, 0, 13, 4099, 65537, 5 };
static const size_t rsizes[] = { 3, 11, 1000, 70001 };
static const size_t msizes[] = { 17, 1, 33333, 2 };

static size_t sum(const size_t *v, int n)
{
	size_t t = 0;

	for (int i = 0; i < n; i++)
		t += v[i];
	return t;
}

/* iovecs of the given sizes over one buffer */
static int carve(struct iovec *iov, const size_t *sizes, int n, char *buf)
{
	for (int i = 0; i < n; i++) {
		iov[i].iov_base = buf;
		iov[i].iov_len = sizes[i];
		buf += sizes[i];
	}
	return n;
}

static void do_writev(int fd, uint32_t seed)
{
	struct iovec iov[8];
	size_t total = sum(wsizes, 7);
	char *buf = malloc(total);

	pattern(buf, total, seed, 0);
	carve(iov, wsizes, 7, buf);
	EXPECT(total, "writev 7 iovecs (1, 7, 0, 13, 4099, 65537, 5)", writev(fd, iov, 7));
	free(buf);
}

static void do_readv(int fd, uint32_t seed)
{
	struct iovec iov[4];
	size_t total = sum(wsizes, 7), cap = sum(rsizes, 4);
	char *buf = malloc(cap), *want = malloc(total);

	wait_queued(fd, total);
	carve(iov, rsizes, 4, buf);
	EXPECT(total, "readv 4 iovecs (3, 11, 1000, 70001), all queued", readv(fd, iov, 4));
	pattern(want, total, seed, 0);
	CHECK(!memcmp(buf, want, total), "readv: the data differ");
	free(buf);
	free(want);
}

static void do_sendmsg(int fd, uint32_t seed)
{
	struct iovec iov[4];
	size_t total = sum(msizes, 4);
	char *buf = malloc(total);
	struct msghdr mh = { .msg_iov = iov, .msg_iovlen = 4 };

	pattern(buf, total, seed, 0);
	carve(iov, msizes, 4, buf);
	EXPECT(total, "sendmsg 4 iovecs (17, 1, 33333, 2)", sendmsg(fd, &mh, 0));
	free(buf);
}

static void do_recvmsg(int fd, uint32_t seed)
{
	size_t total = sum(msizes, 4);
	char *buf = malloc(total), *want = malloc(total), ctrl[64];
	struct iovec iov[2] = { { buf, 2 }, { buf + 2, total - 2 } };
	struct sockaddr_storage ss;
	struct msghdr mh = { .msg_name = &ss, .msg_namelen = sizeof(ss), .msg_iov = iov,
			     .msg_iovlen = 2, .msg_control = ctrl, .msg_controllen = sizeof(ctrl),
			     .msg_flags = -1 };

	EXPECT(total, "recvmsg MSG_WAITALL 2 iovecs", recvmsg(fd, &mh, MSG_WAITALL));
	/* a stream has no source address and no control data here */
	say("  msg_namelen %u msg_controllen %zu msg_flags 0x%x", (unsigned)mh.msg_namelen,
	    (size_t)mh.msg_controllen, mh.msg_flags);
	pattern(want, total, seed, 0);
	CHECK(!memcmp(buf, want, total), "recvmsg: the data differ");
	free(buf);
	free(want);
}

struct splice_sender {
	int fd;
	pthread_t th;
};

static void *splice_send_main(void *arg)
{
	struct splice_sender *ss = arg;
	char *buf = malloc(SPLICE_LEN);

	pattern(buf, SPLICE_LEN, 58, 0);
	send_all(ss->fd, buf, SPLICE_LEN);
	free(buf);
	return NULL;
}

/* The peer: the same calls the other way round, sendfile's and splice's far ends. */
static void peer_main(struct peer *ctl, void *arg)
{
	int lfd, port, fd, p[2];
	char buf[64];

	(void)arg;
	lfd = t_listen(AF_INET, &port);
	ctl_send(ctl, port);
	fd = t_accept(lfd);
	warmup(fd, false);

	/* one call at a time: readv must find only writev's bytes queued */
	do_readv(fd, 60);
	ctl_send(ctl, 0);
	do_recvmsg(fd, 61);
	ctl_recv(ctl);
	do_writev(fd, 62);
	ctl_recv(ctl);
	do_sendmsg(fd, 63);

	/* sendfile's bytes: with an offset, then with the file position */
	{
		char *got = malloc(FILE_LEN + 5000), *want = malloc(FILE_LEN);

		recv_all(fd, got, FILE_LEN + 5000);
		pattern(want, FILE_LEN, 57, 0);
		CHECK(!memcmp(got, want, FILE_LEN), "sendfile with an offset: the data differ");
		CHECK(!memcmp(got + FILE_LEN, want, 5000),
		      "sendfile from the position: data differ");
		say("received what sendfile sent: ok");
		free(got);
		free(want);
	}

	/* splice: socket -> pipe -> the same socket, back to the sender */
	MUST(pipe(p));
	ctl_recv(ctl);
	/* the socket's own O_NONBLOCK decides (SPLICE_F_NONBLOCK is the pipe's) */
	set_nonblock(fd, true);
	EXPECT_ERR(EAGAIN, "splice from an empty non-blocking socket",
		   splice(fd, NULL, p[1], NULL, 4096, SPLICE_F_MOVE));
	set_nonblock(fd, false);
	ctl_send(ctl, 0);
	{
		size_t moved = 0;

		while (moved < SPLICE_LEN) {
			/* no more than the pipe holds: nobody drains it meanwhile */
			size_t chunk = SPLICE_LEN - moved < 16384 ? SPLICE_LEN - moved : 16384;
			ssize_t in = splice(fd, NULL, p[1], NULL, chunk, SPLICE_F_MOVE);

			if (in <= 0)
				die("splice socket -> pipe: %s", in ? ename(errno) : "EOF");
			for (ssize_t out = 0; out < in;) {
				ssize_t n = splice(p[0], NULL, fd, NULL, in - out, SPLICE_F_MOVE);

				if (n <= 0)
					die("splice pipe -> socket: %s", ename(errno));
				out += n;
			}
			moved += in;
		}
		say("spliced %zu bytes back", moved);
	}
	close(p[0]);
	close(p[1]);

	/* for the _chk calls */
	pattern(buf, 30, 59, 0);
	for (int i = 0; i < 3; i++) {
		ctl_recv(ctl);
		send_all(fd, buf + 10 * i, 10);
	}
	EXPECT(0, "recv at EOF", recv(fd, buf, sizeof(buf), 0));
	EXPECT(0, "close", close(fd));
	close(lfd);
}

static int temp_file(void)
{
	char path[] = "/tmp/wsd-sock-vec-XXXXXX";
	int fd = MUST(mkstemp(path));
	char *buf = malloc(FILE_LEN);

	unlink(path);
	pattern(buf, FILE_LEN, 57, 0);
	if (write(fd, buf, FILE_LEN) != FILE_LEN)
		die("temp file: %s", ename(errno));
	free(buf);
	return fd;
}

int main(int argc, char **argv)
{
	struct peer b;
	int fd, file;
	char buf[64], want[64];

	t_init(argc, argv);
	peer_start(&b, "peer", peer_main, NULL);
	fd = t_connect(AF_INET, ctl_recv(&b));
	warmup(fd, true);

	say("-- writev, sendmsg; the peer: readv, recvmsg");
	do_writev(fd, 60);
	ctl_recv(&b);
	do_sendmsg(fd, 61);
	say("-- the peer: writev, sendmsg; readv, recvmsg");
	ctl_send(&b, 0);
	do_readv(fd, 62);
	ctl_send(&b, 0);
	do_recvmsg(fd, 63);

	say("-- sendfile");
	file = temp_file();
	{
		off_t off = 0;
		size_t total = 0;

		while (total < FILE_LEN) {
			ssize_t n = sendfile(fd, file, &off, FILE_LEN - total);

			if (n <= 0)
				die("sendfile: %s", n ? ename(errno) : "nothing sent");
			total += n;
		}
		say("sendfile with an offset: %zu bytes, offset now %lld", total, (long long)off);
		EXPECT(FILE_LEN, "lseek: the file position did not move", lseek(file, 0, SEEK_CUR));
		MUST(lseek(file, 0, SEEK_SET));
		total = 0;
		while (total < 5000) {
			ssize_t n = sendfile(fd, file, NULL, 5000 - total);

			if (n <= 0)
				die("sendfile: %s", n ? ename(errno) : "nothing sent");
			total += n;
		}
		say("sendfile from the position: %zu bytes", total);
		EXPECT(5000, "lseek: the position moved", lseek(file, 0, SEEK_CUR));
	}
	close(file);

	say("-- splice (the peer echoes through a pipe)");
	ctl_send(&b, 0);
	ctl_recv(&b);
	{
		struct splice_sender ss = { .fd = fd };
		char *got = malloc(SPLICE_LEN), *exp = malloc(SPLICE_LEN);

		pthread_create(&ss.th, NULL, splice_send_main, &ss);
		recv_all(fd, got, SPLICE_LEN);
		pthread_join(ss.th, NULL);
		pattern(exp, SPLICE_LEN, 58, 0);
		CHECK(!memcmp(got, exp, SPLICE_LEN), "splice: the echo differs");
		say("the spliced echo: %u bytes, ok", SPLICE_LEN);
		free(got);
		free(exp);
	}

	say("-- the _chk entry points");
	ctl_send(&b, 0);
	pattern(want, 30, 59, 0);
	EXPECT(10, "__recv_chk", __recv_chk(fd, buf, 10, sizeof(buf), MSG_WAITALL));
	CHECK(!memcmp(buf, want, 10), "__recv_chk: the data differ");
	ctl_send(&b, 0);
	wait_queued(fd, 10);
	EXPECT(10, "__read_chk", __read_chk(fd, buf, 10, sizeof(buf)));
	CHECK(!memcmp(buf, want + 10, 10), "__read_chk: the data differ");
	ctl_send(&b, 0);
	{
		struct sockaddr_storage ss;
		socklen_t len = sizeof(ss);

		EXPECT(10, "__recvfrom_chk", __recvfrom_chk(fd, buf, 10, sizeof(buf), MSG_WAITALL,
							     (struct sockaddr *)&ss, &len));
		say("  address length %u", (unsigned)len);
		CHECK(!memcmp(buf, want + 20, 10), "__recvfrom_chk: the data differ");
	}
	EXPECT(0, "close", close(fd));
	peer_end(&b);
	t_exit();
}

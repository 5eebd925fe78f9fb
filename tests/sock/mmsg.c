/* SPDX-License-Identifier: MIT */
/*
 * The data calls beyond read/write/sendmsg, on an accelerated connection:
 * sendmmsg/recvmmsg (per-message msg_len, MSG_WAITFORONE, the timeout
 * checked between messages, EOF), preadv/pwritev and their v2 and 64-bit
 * names (offset -1 reads and writes the stream, RWF_* flags, an explicit
 * offset is ESPIPE), __pread_chk, dprintf/vdprintf and their _chk names,
 * sendfile64.  Every call must move exactly its bytes through the switch.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "tests/sock/common.h"

/* What fortified headers turn these into (glibc exports them). */
extern ssize_t __pread_chk(int fd, void *buf, size_t len, off_t off, size_t buflen);
extern ssize_t __pread64_chk(int fd, void *buf, size_t len, off64_t off, size_t buflen);
extern int __dprintf_chk(int fd, int flag, const char *fmt, ...);
extern int __vdprintf_chk(int fd, int flag, const char *fmt, va_list ap);

#ifndef RWF_HIPRI
#define RWF_HIPRI 0x01
#define RWF_DSYNC 0x02
#define RWF_SYNC 0x04
#define RWF_NOWAIT 0x08
#define RWF_APPEND 0x10
#endif

#define FILE_LEN 100003

/* n bytes of the stream seed from off, in one buffer */
static void check(const char *buf, size_t n, uint32_t seed, uint64_t off, const char *what)
{
	char *want = malloc(n + 1);

	pattern(want, n, seed, off);
	CHECK(!memcmp(buf, want, n), "%s: the data differ", what);
	free(want);
}

/* ---- sendmmsg / recvmmsg ---------------------------------------------------- */

static const size_t mlens[3][2] = { { 5, 0 }, { 7, 4 }, { 9, 0 } };

static void send_mmsg(int fd, uint32_t seed)
{
	char buf[25];
	struct iovec iov[4];
	struct mmsghdr mm[3];
	char *p = buf;
	int k = 0;

	pattern(buf, sizeof(buf), seed, 0);
	memset(mm, 0, sizeof(mm));
	for (int i = 0; i < 3; i++) {
		mm[i].msg_hdr.msg_iov = &iov[k];
		for (int j = 0; j < 2 && mlens[i][j]; j++) {
			iov[k].iov_base = p;
			iov[k++].iov_len = mlens[i][j];
			p += mlens[i][j];
			mm[i].msg_hdr.msg_iovlen++;
		}
		mm[i].msg_len = 99;
	}
	EXPECT(3, "sendmmsg 3 messages (5, 7+4, 9)", sendmmsg(fd, mm, 3, 0));
	say("  msg_len %u %u %u", mm[0].msg_len, mm[1].msg_len, mm[2].msg_len);
}

/* vlen messages of 10 bytes each over buf */
static void carve10(struct mmsghdr *mm, struct iovec *iov, int vlen, char *buf)
{
	memset(mm, 0, sizeof(*mm) * vlen);
	for (int i = 0; i < vlen; i++) {
		iov[i].iov_base = buf + 10 * i;
		iov[i].iov_len = 10;
		mm[i].msg_hdr.msg_iov = &iov[i];
		mm[i].msg_hdr.msg_iovlen = 1;
		mm[i].msg_hdr.msg_flags = -1;
		mm[i].msg_len = 99;
	}
}

static void recv_mmsg(int fd, struct peer *ctl)
{
	struct mmsghdr mm[4];
	struct iovec iov[4];
	char buf[40];
	struct timespec ts;

	say("-- recvmmsg");
	wait_queued(fd, 25);
	carve10(mm, iov, 4, buf);
	EXPECT(3, "recvmmsg 4 x 10 MSG_WAITFORONE, 25 queued", recvmmsg(fd, mm, 4, MSG_WAITFORONE,
									   NULL));
	say("  msg_len %u %u %u %u, msg_flags 0x%x", mm[0].msg_len, mm[1].msg_len, mm[2].msg_len,
	    mm[3].msg_len, mm[0].msg_hdr.msg_flags);
	check(buf, 25, 70, 0, "recvmmsg WAITFORONE");
	EXPECT_ERR(EAGAIN, "recvmmsg MSG_DONTWAIT, nothing queued",
		   recvmmsg(fd, mm, 4, MSG_DONTWAIT, NULL));
	EXPECT(0, "recvmmsg vlen 0", recvmmsg(fd, mm, 0, 0, NULL));
	ts = (struct timespec){ 0, 2000000000L };
	EXPECT_ERR(EINVAL, "recvmmsg, tv_nsec 2e9", recvmmsg(fd, mm, 4, 0, &ts));
	ctl_send(ctl, 0);

	/* the same 25 bytes again: two messages with a long timeout, then one with none left */
	wait_queued(fd, 25);
	carve10(mm, iov, 2, buf);
	ts = (struct timespec){ 10, 0 };
	EXPECT(2, "recvmmsg 2 x 10, timeout 10 s, 25 queued", recvmmsg(fd, mm, 2, 0, &ts));
	say("  msg_len %u %u, timeout left > 0: %d", mm[0].msg_len, mm[1].msg_len,
	    ts.tv_sec > 0 || ts.tv_nsec > 0);
	carve10(mm, iov, 3, buf + 20);
	ts = (struct timespec){ 0, 0 };
	EXPECT(1, "recvmmsg 3 x 10, timeout 0 (checked after a message)",
	       recvmmsg(fd, mm, 3, 0, &ts));
	say("  msg_len %u %u", mm[0].msg_len, mm[1].msg_len);
	check(buf, 25, 70, 0, "recvmmsg timeout");
	expect_path(fd);
}

/* ---- preadv / pwritev ----------------------------------------------------------- */

static void do_pwrite(int fd)
{
	char buf[64];
	struct iovec iov[2] = { { buf, 3 }, { buf + 3, 9 } };

	say("-- pwritev, pwritev2 and the 64-bit names");
	pattern(buf, sizeof(buf), 71, 0);
	EXPECT(12, "pwritev2 offset -1", pwritev2(fd, iov, 2, -1, 0));
	iov[0].iov_base = buf + 12;
	iov[1].iov_base = buf + 15;
	EXPECT(12, "pwritev2 offset -1 RWF_DSYNC|RWF_HIPRI|RWF_SYNC",
	       pwritev2(fd, iov, 2, -1, RWF_DSYNC | RWF_HIPRI | RWF_SYNC));
	iov[0].iov_base = buf + 24;
	iov[1].iov_base = buf + 27;
	EXPECT(12, "pwritev64v2 offset -1 RWF_NOWAIT", pwritev64v2(fd, iov, 2, -1, RWF_NOWAIT));
	iov[0].iov_base = buf + 36;
	iov[1].iov_base = buf + 39;
	EXPECT(12, "pwritev2 offset -1 RWF_APPEND", pwritev2(fd, iov, 2, -1, RWF_APPEND));
	EXPECT_ERR(ESPIPE, "pwritev2 offset 0", pwritev2(fd, iov, 2, 0, 0));
	EXPECT_ERR(ESPIPE, "pwritev offset 0", pwritev(fd, iov, 2, 0));
	EXPECT_ERR(EINVAL, "pwritev offset -1", pwritev(fd, iov, 2, -1));
	EXPECT_ERR(ESPIPE, "pwritev64 offset 3", pwritev64(fd, iov, 2, 3));
	EXPECT_ERR(ESPIPE, "pwrite offset 0", pwrite(fd, buf, 1, 0));
	expect_path(fd);
}

static void do_pread(int fd)
{
	char buf[64];
	struct iovec iov[2] = { { buf, 5 }, { buf + 5, 19 } };

	say("-- preadv, preadv2 and the 64-bit names");
	wait_queued(fd, 48);
	EXPECT(24, "preadv2 offset -1", preadv2(fd, iov, 2, -1, 0));
	iov[0].iov_base = buf + 24;
	iov[1].iov_base = buf + 29;
	iov[1].iov_len = 7;
	EXPECT(12, "preadv64v2 offset -1 RWF_NOWAIT", preadv64v2(fd, iov, 2, -1, RWF_NOWAIT));
	iov[0].iov_base = buf + 36;
	iov[1].iov_base = buf + 41;
	iov[1].iov_len = 30;
	EXPECT(12, "preadv2 offset -1 RWF_HIPRI", preadv2(fd, iov, 2, -1, RWF_HIPRI));
	check(buf, 48, 71, 0, "preadv2");
	EXPECT_ERR(EAGAIN, "preadv2 offset -1 RWF_NOWAIT, nothing queued",
		   preadv2(fd, iov, 2, -1, RWF_NOWAIT));
	EXPECT_ERR(ESPIPE, "preadv2 offset 0", preadv2(fd, iov, 2, 0, 0));
	EXPECT_ERR(ESPIPE, "preadv offset 0", preadv(fd, iov, 2, 0));
	EXPECT_ERR(EINVAL, "preadv offset -1", preadv(fd, iov, 2, -1));
	EXPECT_ERR(EINVAL, "preadv2 offset -2", preadv2(fd, iov, 2, -2, 0));
	EXPECT_ERR(ESPIPE, "preadv64 offset 3", preadv64(fd, iov, 2, 3));
	EXPECT_ERR(ESPIPE, "pread offset 0", pread(fd, buf, 1, 0));
	EXPECT_ERR(ESPIPE, "__pread_chk offset 0", __pread_chk(fd, buf, 1, 0, sizeof(buf)));
	EXPECT_ERR(ESPIPE, "__pread64_chk offset 0", __pread64_chk(fd, buf, 1, 0, sizeof(buf)));
	expect_path(fd);
}

/* ---- dprintf ------------------------------------------------------------------ */

static int my_vdprintf(int fd, bool chk, const char *fmt, ...)
{
	va_list ap;
	int r;

	va_start(ap, fmt);
	r = chk ? __vdprintf_chk(fd, 1, fmt, ap) : vdprintf(fd, fmt, ap);
	va_end(ap);
	return r;
}

static const char dtext[] = "dprintf 42 forty-two\nvdprintf 7\n__dprintf_chk x\n__vdprintf_chk -1\n";

static void do_dprintf(int fd)
{
	say("-- dprintf, vdprintf, __dprintf_chk, __vdprintf_chk");
	EXPECT(21, "dprintf", dprintf(fd, "dprintf %d %s\n", 42, "forty-two"));
	EXPECT(11, "vdprintf", my_vdprintf(fd, false, "vdprintf %d\n", 7));
	EXPECT(16, "__dprintf_chk", __dprintf_chk(fd, 1, "__dprintf_chk %c\n", 'x'));
	EXPECT(18, "__vdprintf_chk", my_vdprintf(fd, true, "__vdprintf_chk %d\n", -1));
	EXPECT(0, "dprintf of nothing", dprintf(fd, "%s", ""));
	expect_path(fd);
}

static void read_dprintf(int fd)
{
	char buf[sizeof(dtext)];

	recv_all(fd, buf, sizeof(dtext) - 1);
	CHECK(!memcmp(buf, dtext, sizeof(dtext) - 1), "dprintf: the text differs");
	say("received the dprintf text: ok");
}

/* ---- sendfile64 ---------------------------------------------------------------- */

static int temp_file(void)
{
	char path[] = "/tmp/wsd-sock-mmsg-XXXXXX";
	int fd = MUST(mkstemp(path));
	char *buf = malloc(FILE_LEN);

	unlink(path);
	pattern(buf, FILE_LEN, 72, 0);
	if (write(fd, buf, FILE_LEN) != FILE_LEN)
		die("temp file: %s", ename(errno));
	free(buf);
	return fd;
}

static void do_sendfile64(int fd)
{
	int file = temp_file();
	off64_t off = 3;
	size_t total = 0;

	say("-- sendfile64");
	while (total < FILE_LEN - 3) {
		ssize_t n = sendfile64(fd, file, &off, FILE_LEN - 3 - total);

		if (n <= 0)
			die("sendfile64: %s", n ? ename(errno) : "nothing sent");
		total += n;
	}
	say("sendfile64 from offset 3: %zu bytes, offset now %lld", total, (long long)off);
	close(file);
	expect_path(fd);
}

/* ---- the peer ------------------------------------------------------------------- */

static void peer_main(struct peer *ctl, void *arg)
{
	int lfd, port, fd;
	struct mmsghdr mm[3];
	struct iovec iov[3];
	char *buf = malloc(FILE_LEN), buf2[30];

	(void)arg;
	lfd = t_listen(AF_INET, &port);
	ctl_send(ctl, port);
	fd = t_accept(lfd);
	warmup(fd, false);

	recv_mmsg(fd, ctl);
	ctl_send(ctl, 0);
	do_pread(fd);
	ctl_send(ctl, 0);
	read_dprintf(fd);
	ctl_send(ctl, 0);
	recv_all(fd, buf, FILE_LEN - 3);
	check(buf, FILE_LEN - 3, 72, 3, "sendfile64");
	say("received what sendfile64 sent: ok");
	ctl_send(ctl, 0);

	/* the peer's send calls, our recvmmsg at the end of the stream */
	ctl_recv(ctl);
	carve10(mm, iov, 3, buf2);
	EXPECT(3, "recvmmsg 3 x 10 at EOF", recvmmsg(fd, mm, 3, 0, NULL));
	say("  msg_len %u %u %u", mm[0].msg_len, mm[1].msg_len, mm[2].msg_len);
	EXPECT(0, "close", close(fd));
	close(lfd);
	free(buf);
}

int main(int argc, char **argv)
{
	struct peer b;
	int fd;

	t_init(argc, argv);
	peer_start(&b, "peer", peer_main, NULL);
	fd = t_connect(AF_INET, ctl_recv(&b));
	warmup(fd, true);

	say("-- sendmmsg");
	send_mmsg(fd, 70);
	ctl_recv(&b);
	send_mmsg(fd, 70);
	expect_path(fd);
	ctl_recv(&b);

	do_pwrite(fd);
	ctl_recv(&b);
	do_dprintf(fd);
	ctl_recv(&b);
	do_sendfile64(fd);
	ctl_recv(&b);

	EXPECT(0, "sendmmsg vlen 0", sendmmsg(fd, NULL, 0, 0));
	ctl_send(&b, 0);
	/*
	 * A flag the switch does not know is the kernel's to judge, on a
	 * connection back on TCP (the peer waits in recvmmsg meanwhile).
	 */
	{
		struct iovec v = { "x", 1 };

		EXPECT_ERR(EOPNOTSUPP, "pwritev2 offset -1, an unknown RWF flag",
			   pwritev2(fd, &v, 1, -1, 0x40000000));
	}
	EXPECT(0, "shutdown SHUT_WR", shutdown(fd, SHUT_WR));
	EXPECT(0, "close", close(fd));
	peer_end(&b);
	t_exit();
}

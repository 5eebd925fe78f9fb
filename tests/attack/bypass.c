/* SPDX-License-Identifier: MIT */
/*
 * The program of bypass_check.sh: bytes that move on an upgraded
 * connection's kernel socket by calls the switch cannot see, made here with
 * the syscall instruction itself (not the C library's syscall(), which a
 * switch may interpose).  Both ends run under wsd run.
 *
 *   bypass server PORTFILE RESULT STOPFILE
 *   bypass client PORT MODE RESULT READYFILE GOFILE STOPFILE
 *
 * The client and the server first exchange 64-byte messages until the
 * client's switch says the connection is on shm (wsd_switch_path), writes
 * its local port to READYFILE and waits for GOFILE (the script checks the server's side in
 * wsd stat meanwhile).  Then, by MODE:
 *
 *   write  the client announces it ('W') and writes 1000 bytes by a raw
 *          write(2): the server must never receive one of them as data,
 *          and both ends must see the connection reset (ECONNRESET or
 *          EIO), never a clean end;
 *   close  the same, and the client then closes the socket: the server
 *          must still see a reset, never a clean (short) end;
 *   read   the client announces it ('R'); the server waits in poll(2)
 *          (which arms a doorbell), the client sends a 64-byte message, and
 *          the server takes the doorbell from the kernel socket by a raw
 *          recvfrom(2), then reads the message (all of it, exact) and goes
 *          on reading: both ends must see the connection reset.
 *
 * Each writes "ok ..." or "FAIL ..." to RESULT, then waits for STOPFILE (so
 * that wsd stat can still see its socket) and exits 0 when ok.  Exits 77 on
 * a machine without the x86-64 syscall instruction.  Every wait is bounded.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MSG 64
#define RAW 1000

static FILE *result;

static void report(int ok, const char *fmt, const char *what, long v)
{
	fprintf(result, "%s ", ok ? "ok" : "FAIL");
	fprintf(result, fmt, what, v);
	fputc('\n', result);
	fflush(result);
	fprintf(stderr, "%s ", ok ? "ok" : "FAIL");
	fprintf(stderr, fmt, what, v);
	fputc('\n', stderr);
}

static void die(const char *what)
{
	report(0, "%s: errno %ld", what, errno);
	exit(1);
}

#if defined(__x86_64__)
/* The kernel, straight: no C library entry a preloaded library could replace. */
static long raw6(long nr, long a, long b, long c, long d, long e, long f)
{
	long ret;
	register long r10 __asm__("r10") = d;
	register long r8 __asm__("r8") = e;
	register long r9 __asm__("r9") = f;

	__asm__ volatile("syscall"
			 : "=a"(ret)
			 : "0"(nr), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
			 : "rcx", "r11", "memory");
	return ret;
}
#define HAVE_RAW 1
#else
static long raw6(long nr, long a, long b, long c, long d, long e, long f)
{
	(void)nr; (void)a; (void)b; (void)c; (void)d; (void)e; (void)f;
	return -ENOSYS;
}
#define HAVE_RAW 0
#endif

static void wait_file(const char *path, int secs)
{
	struct stat st;

	for (int i = 0; i < secs * 100 && stat(path, &st); i++)
		usleep(10000);
}

static void write_port(const char *path, int fd)
{
	struct sockaddr_in a;
	socklen_t al = sizeof(a);
	char tmp[4096];
	FILE *f;

	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	f = fopen(tmp, "w");
	if (!f || getsockname(fd, (struct sockaddr *)&a, &al))
		die("client: ready file");
	fprintf(f, "%d\n", ntohs(a.sin_port));
	fclose(f);
	rename(tmp, path);
}

/* All of len, retrying EINTR: 0, or -errno. */
static int send_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len) {
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EIO;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* All of len: len, 0..len-1 at the end, or -errno. */
static ssize_t recv_all(int fd, void *buf, size_t len)
{
	char *p = buf;
	size_t got = 0;

	while (got < len) {
		ssize_t n = recv(fd, p + got, len - got, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			break;
		got += (size_t)n;
	}
	return (ssize_t)got;
}

static void timeouts(int fd, int secs)
{
	struct timeval tv = { secs, 0 };

	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

/*
 * Read until the connection ends: it must end with a reset, and nothing
 * may come first but up to max bytes of c, which the peer sent by the
 * switch before its raw bytes (the peer sends nothing more that is data).
 */
static int expect_reset_after(int fd, const char *who, char c, long max)
{
	char buf[4096];
	long got = 0, early = 0;

	for (;;) {
		ssize_t n = recv(fd, buf, sizeof(buf), 0);

		if (n < 0 && errno == EINTR)
			continue;
		for (ssize_t i = 0; i < n; i++, got++)
			if (got == early && early < max && buf[i] == c)
				early++;
		if (n > 0)
			continue;
		if (got > early) {
			report(0, "%s: %ld bytes the peer never sent by the switch came as data",
			       who, got - early);
			return 0;
		}
		if (n == 0) {
			report(0, "%s: a clean end of the stream (%ld), not a reset", who, 0);
			return 0;
		}
		if (errno == ECONNRESET || errno == EIO) {
			report(1, "%s: the connection was reset (errno %ld)", who, errno);
			return 1;
		}
		report(0, "%s: recv failed with errno %ld, not a reset", who, errno);
		return 0;
	}
}

static int expect_reset(int fd, const char *who)
{
	return expect_reset_after(fd, who, 0, 0);
}

static const char *path_of(int fd)
{
	const char *(*path)(int) = (const char *(*)(int))dlsym(RTLD_DEFAULT, "wsd_switch_path");

	return path ? path(fd) : NULL;
}

static int server(const char *portfile, const char *stopfile)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t al = sizeof(a);
	int l = socket(AF_INET, SOCK_STREAM, 0), fd, ok = 0;
	char m[MSG], d[MSG];
	FILE *f;

	if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof(a)) || listen(l, 1) ||
	    getsockname(l, (struct sockaddr *)&a, &al))
		die("server: listen");
	f = fopen(portfile, "w");
	if (!f)
		die("server: port file");
	fprintf(f, "%d\n", ntohs(a.sin_port));
	fclose(f);
	while ((fd = accept(l, NULL, NULL)) < 0 && errno == EINTR)
		;
	if (fd < 0)
		die("server: accept");
	timeouts(fd, 20);
	for (;;) {
		ssize_t n = recv_all(fd, m, MSG);

		if (n != MSG) {
			report(0, "server: warm-up message: %s %ld", n < 0 ? "errno" : "length",
			       n < 0 ? -n : n);
			goto out;
		}
		if (m[0] != 'P')
			break;
		for (int i = 0; i < MSG; i++)
			m[i] ^= 0x5a;
		if (send_all(fd, m, MSG))
			die("server: echo");
	}
	if (m[0] == 'W') {
		/* busy a while: the client's raw bytes (and its close) come before we look */
		usleep(300000);
		ok = expect_reset(fd, "server");
	} else if (m[0] == 'R') {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int r;
		long k;
		char bell;

		/* the switch arms the connection: the client's next message rings */
		while ((r = poll(&p, 1, 10000)) < 0 && errno == EINTR)
			;
		if (r != 1) {
			report(0, "server: poll for the message: %s %ld", "result", r);
			goto out;
		}
		/* the doorbell, from the kernel socket behind the switch's back */
		p.revents = 0;
		k = raw6(SYS_poll, (long)&p, 1, 5000, 0, 0, 0);
		if (k == 1)
			k = raw6(SYS_recvfrom, fd, (long)&bell, 1, MSG_DONTWAIT, 0, 0);
		if (k != 1) {
			report(0, "server: no doorbell to take from the kernel socket (%s %ld)",
			       "result", k);
			goto out;
		}
		memset(d, 'D', sizeof(d));
		if (recv_all(fd, m, MSG) != MSG || memcmp(m, d, MSG)) {
			report(0, "server: the message did not come whole after the %s (%ld)",
			       "theft", 0);
			goto out;
		}
		ok = expect_reset(fd, "server");
	} else if (m[0] == 'F') {
		/*
		 * A second connection beside this one (a channel joins us): its
		 * first bytes went into our grant, then raw bytes on its stream,
		 * where its proof should be.  The raw ones may never come as data;
		 * the first bytes, sent before them, may (our switch saw the
		 * peer's socket, and reads its ring from its answer on), and only
		 * ahead of the reset.
		 */
		int fd2;

		while ((fd2 = accept(l, NULL, NULL)) < 0 && errno == EINTR)
			;
		if (fd2 < 0)
			die("server: accept the second connection");
		timeouts(fd2, 20);
		ok = expect_reset_after(fd2, "server", 'G', MSG);
	} else {
		report(0, "server: unknown command %s%ld", "", m[0]);
	}
out:
	wait_file(stopfile, 30);
	return ok ? 0 : 1;
}

static int client(int port, const char *mode, const char *ready, const char *go,
		  const char *stopfile)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int fd = socket(AF_INET, SOCK_STREAM, 0), ok = 0, shm = 0;
	char m[MSG], e[MSG];
	const char *path;

	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)))
		die("client: connect");
	timeouts(fd, 20);
	/* until both directions have moved: a few round trips past "shm" */
	for (int i = 0; i < 2000 && shm < 20; i++) {
		memset(m, 'P', MSG);
		m[1] = (char)i;
		if (send_all(fd, m, MSG))
			die("client: send");
		if (recv_all(fd, e, MSG) != MSG)
			die("client: echo");
		for (int j = 0; j < MSG; j++)
			if ((char)(e[j] ^ 0x5a) != m[j]) {
				report(0, "client: a wrong echo in round %s%ld", "", i);
				return 1;
			}
		path = path_of(fd);
		if (path && !strcmp(path, "shm"))
			shm++;
		else
			usleep(1000);
	}
	path = path_of(fd);
	if (!path || strcmp(path, "shm")) {
		report(0, "client: the connection is on path %s (%ld), not shm",
		       path ? path : "none (no switch)", 0);
		return 1;
	}
	write_port(ready, fd);
	wait_file(go, 30);
	if (!strcmp(mode, "write") || !strcmp(mode, "close")) {
		char raw[RAW];
		long k;

		memset(m, 'W', MSG);
		if (send_all(fd, m, MSG))
			die("client: send W");
		usleep(100000);   /* the server's receive is asleep on the ring */
		memset(raw, 'X', sizeof(raw));
		k = raw6(SYS_write, fd, (long)raw, RAW, 0, 0, 0);
		if (k != RAW) {
			report(0, "client: the raw write wrote %s%ld bytes", "", k);
			return 1;
		}
		if (!strcmp(mode, "close")) {
			/* nothing to read after this: the server's end must say it */
			ok = close(fd) == 0;
			report(ok, "client: %s (%ld)", ok ? "closed" : "close failed", errno);
		} else {
			ok = expect_reset(fd, "client");
		}
	} else if (!strcmp(mode, "first")) {
		char raw[RAW];
		long k;
		int fd2 = socket(AF_INET, SOCK_STREAM, 0);

		memset(m, 'F', MSG);
		if (send_all(fd, m, MSG))
			die("client: send F");
		if (fd2 < 0 || connect(fd2, (struct sockaddr *)&a, sizeof(a)))
			die("client: connect the second connection");
		timeouts(fd2, 20);
		/* into the server's grant, before its answer: nothing on the stream yet */
		memset(m, 'G', MSG);
		if (send_all(fd2, m, MSG))
			die("client: send G");
		/*
		 * The server answers meanwhile (it waits in accept): the raw
		 * bytes come where our proof would.  Before an answer (a server
		 * that has not accepted yet, and then does not answer), they
		 * would reach a plain server ahead of G: see wsd-protocol(7).
		 */
		usleep(50000);
		memset(raw, 'X', sizeof(raw));
		k = raw6(SYS_write, fd2, (long)raw, RAW, 0, 0, 0);
		if (k != RAW) {
			report(0, "client: the raw write wrote %s%ld bytes", "", k);
			return 1;
		}
		ok = expect_reset(fd2, "client");
	} else {
		memset(m, 'R', MSG);
		if (send_all(fd, m, MSG))
			die("client: send R");
		usleep(300000);   /* the server waits in poll, armed */
		memset(m, 'D', MSG);
		if (send_all(fd, m, MSG))
			die("client: send D");
		ok = expect_reset(fd, "client");
	}
	wait_file(stopfile, 30);
	return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
	setvbuf(stderr, NULL, _IONBF, 0);
	if (!HAVE_RAW) {
		fprintf(stderr, "SKIP: no x86-64 syscall instruction here\n");
		return 77;
	}
	if (argc == 5 && !strcmp(argv[1], "server")) {
		result = fopen(argv[3], "w");
		if (!result)
			return 2;
		return server(argv[2], argv[4]);
	}
	if (argc == 8 && !strcmp(argv[1], "client")) {
		result = fopen(argv[4], "w");
		if (!result)
			return 2;
		return client(atoi(argv[2]), argv[3], argv[5], argv[6], argv[7]);
	}
	fprintf(stderr, "usage: bypass server PORTFILE RESULT STOPFILE\n"
			"       bypass client PORT write|close|read RESULT READYFILE GOFILE STOPFILE\n");
	return 2;
}

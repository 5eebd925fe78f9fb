/* SPDX-License-Identifier: MIT */
/*
 * Descriptors the switch must follow though they do not close or move by
 * close() and dup*() of the socket: a stream (fdopen, then fclose),
 * close_range (and its CLOSE_RANGE_CLOEXEC), closefrom.  After each, a
 * file given the same number reads and writes as a file.  A socket given
 * a stdio stream, or made the program's stdout or stdin (dup2, an accept
 * that returns 0), carries what glibc writes and reads for it whole.  And
 * a socket closed while another thread sleeps in recv on it: the number's
 * next owner keeps every byte written to it.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/close_range.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/sock/common.h"

#define NCONN 5

static struct echo e;

/* The first number >= from that is not open here. */
static int free_fd(int from)
{
	while (fcntl(from, F_GETFD) >= 0)
		from++;
	return from;
}

/*
 * A file that has the number fd (closed just now; F_DUPFD gives the lowest
 * free number from fd on).  It must write and read back as a file, not as
 * a socket.
 */
static void file_on(int fd)
{
	int m = MUST(memfd_create("fds", 0)), f;
	char buf[16] = { 0 };

	if (m == fd) {
		f = m;
	} else {
		f = fcntl(m, F_DUPFD, fd);
		close(m);
	}
	if (f != fd) {
		fail("F_DUPFD to %d gave %d", fd, f);
		if (f >= 0)
			close(f);
		return;
	}
	EXPECT(9, "  a file with the same number: write", write(f, "file data", 9));
	EXPECT(0, "  lseek", lseek(f, 0, SEEK_SET));
	EXPECT(9, "  read", read(f, buf, sizeof(buf)));
	CHECK(!memcmp(buf, "file data", 9), "the file read back something else");
	EXPECT(0, "  close", close(f));
}

/* What an echo call sends, through a stdio stream; the answer read through it. */
static void stream_call(FILE *f, uint32_t len, uint32_t seed)
{
	uint8_t *req = malloc(len), *resp = malloc(len);

	pattern(req, len, seed, 0);
	CHECK(fwrite(&len, sizeof(len), 1, f) == 1 && fwrite(req, 1, len, f) == len &&
	      fflush(f) == 0, "fwrite to the socket's stream failed");
	CHECK(fread(resp, 1, len, f) == len, "fread from the socket's stream: %s",
	      ferror(f) ? "an error" : "early EOF");
	for (uint32_t i = 0; i < len; i++)
		if (resp[i] != (req[i] ^ 0x5a)) {
			fail("the stream's answer differs at byte %u", i);
			break;
		}
	free(req);
	free(resp);
}

static void closed_behind(void)
{
	FILE *f;
	int fd, hi;

	say("-- fdopen: the stream carries whole calls, fclose lets go of the number");
	fd = echo_connect(&e);
	echo_calls(fd, 5, 1);
	f = fdopen(fd, "r+");
	CHECK(f != NULL, "fdopen: %s", ename(errno));
	for (uint32_t i = 0; f && i < 20; i++)
		stream_call(f, 1 + i * 3001, 10 + i);
	say("20 calls through the stream: ok");
	EXPECT(0, "fclose", fclose(f));
	file_on(fd);

	say("-- freopen of a socket's stream onto a file");
	fd = echo_connect(&e);
	echo_calls(fd, 5, 5);
	{
		char path[] = "/tmp/wsd-fds-XXXXXX";
		int t = MUST(mkstemp(path)), n;

		close(t);
		f = fdopen(fd, "r+");
		CHECK(f != NULL, "fdopen: %s", ename(errno));
		f = f ? freopen(path, "w+", f) : NULL;
		CHECK(f != NULL, "freopen: %s", ename(errno));
		if (f) {
			n = fileno(f);
			EXPECT(9, "  write to the new file's fd", write(n, "file data", 9));
			EXPECT(0, "  fclose", fclose(f));
		}
		unlink(path);
	}

	say("-- close_range of the socket alone");
	fd = echo_connect(&e);
	echo_calls(fd, 5, 2);
	EXPECT(0, "close_range", close_range(fd, fd, 0));
	file_on(fd);

	say("-- close_range CLOSE_RANGE_CLOEXEC leaves it open");
	fd = echo_connect(&e);
	EXPECT(0, "close_range CLOEXEC", close_range(fd, fd, CLOSE_RANGE_CLOEXEC));
	EXPECT(FD_CLOEXEC, "fcntl F_GETFD", fcntl(fd, F_GETFD));
	echo_calls(fd, 10, 3);
	say("10 calls after it: ok");
	EXPECT(0, "close", close(fd));

	say("-- closefrom above the program's other files");
	fd = echo_connect(&e);
	hi = free_fd(900);
	EXPECT(hi, "dup2 to 900", dup2(fd, hi));
	EXPECT(0, "close the first number", close(fd));
	echo_calls(hi, 5, 4);
	closefrom(hi);
	say("closefrom");
	EXPECT_ERR(EBADF, "fcntl F_GETFD", fcntl(hi, F_GETFD));
	file_on(hi);
}

/* ---- stdout and stdin ----------------------------------------------------------- */

#define LINES 2000

static void stdio_server(struct peer *self, void *arg)
{
	int lfd, fd, port;
	char line[64];

	(void)arg;
	/* the listener is the server's own: its switch answers the upgrades */
	lfd = t_listen(AF_INET, &port);
	ctl_send(self, port);
	fd = t_accept(lfd);
	warmup(fd, false);
	EXPECT(1, "dup2 onto stdout", dup2(fd, 1));
	EXPECT(0, "dup2 onto stdin", dup2(fd, 0));
	EXPECT(0, "close the first number", close(fd));
	for (int i = 0; i < LINES; i++)
		printf("line %d of the server's stdout\n", i);
	CHECK(fflush(stdout) == 0, "fflush(stdout): %s", ename(errno));
	for (int i = 0; i < LINES; i++) {
		if (!fgets(line, sizeof(line), stdin)) {
			fail("stdin ended after %d lines", i);
			break;
		}
		if (atoi(line) != i) {
			fail("stdin line %d reads %s", i, line);
			break;
		}
	}
	say("%d lines read from stdin: ok", LINES);

	/* inetd's way: the connection is accepted onto number 0 */
	EXPECT(0, "close stdin", close(0));
	EXPECT(0, "accept onto 0", accept(lfd, NULL, NULL));
	warmup_bulk(0, false);
	for (int i = 0; i < LINES; i++) {
		if (!fgets(line, sizeof(line), stdin)) {
			fail("stdin ended after %d lines", i);
			break;
		}
		if (atoi(line) != i) {
			fail("stdin line %d reads %s", i, line);
			break;
		}
	}
	say("%d lines read from the accepted stdin: ok", LINES);
	fclose(stdout);
	fclose(stdin);
	close(lfd);
}

static void stdio_client(int port)
{
	char want[64], got[64];
	int fd, fd2;

	fd = t_connect(AF_INET, port);
	warmup(fd, true);
	for (int i = 0; i < LINES; i++) {
		int n = snprintf(want, sizeof(want), "line %d of the server's stdout\n", i);

		recv_all(fd, got, (size_t)n);
		if (memcmp(want, got, (size_t)n)) {
			fail("the server's stdout line %d differs", i);
			break;
		}
	}
	say("%d lines of the server's stdout: ok", LINES);
	for (int i = 0; i < LINES; i++) {
		int n = snprintf(want, sizeof(want), "%d\n", i);

		send_all(fd, want, (size_t)n);
	}
	fd2 = t_connect(AF_INET, port);
	warmup_bulk(fd2, true);
	for (int i = 0; i < LINES; i++) {
		int n = snprintf(want, sizeof(want), "%d\n", i);

		send_all(fd2, want, (size_t)n);
	}
	EXPECT(0, "recv: EOF", recv(fd, got, 1, 0));
	EXPECT(0, "recv: EOF", recv(fd2, got, 1, 0));
	close(fd);
	close(fd2);
}

static void stdio_sockets(void)
{
	struct peer p;

	say("-- a socket as stdout and stdin: what printf and fgets move");
	peer_start(&p, "server", stdio_server, NULL);
	stdio_client(ctl_recv(&p));
	peer_end(&p);
}

/* ---- close while another thread sleeps in recv ---------------------------------- */

static struct servant s;

struct sleeper {
	int fd;
	ssize_t r;
	int err;
};

static void *sleep_in_recv(void *arg)
{
	struct sleeper *sl = arg;
	char buf[64];

	sl->r = recv(sl->fd, buf, sizeof(buf), 0);
	sl->err = errno;
	return NULL;
}

static void close_under_sleeper(void)
{
	struct sleeper sl;
	pthread_t th;
	int fd, sp[2], extra[64], n = 0, owner = -1, other = -1;
	char buf[200];

	say("-- close while another thread sleeps in recv");
	servant_start(&s, AF_INET);
	fd = servant_connect(&s);
	sl = (struct sleeper){ .fd = fd };
	pthread_create(&th, NULL, sleep_in_recv, &sl);
	sleep_ms(100);   /* asleep by now (if not, it finds the fd gone) */
	EXPECT(0, "close", close(fd));
	/* the number's next owner: a socket pair end, with bytes of its own waiting */
	while (n < 64) {
		MUST(socketpair(AF_UNIX, SOCK_STREAM, 0, sp));
		if (sp[0] == fd || sp[1] == fd) {
			owner = fd;
			other = sp[0] == fd ? sp[1] : sp[0];
			break;
		}
		extra[n++] = sp[0];
		extra[n++] = sp[1];
	}
	while (n--)
		close(extra[n]);
	if (owner < 0)
		die("no socket pair got number %d", fd);
	memset(buf, 'u', 100);
	EXPECT(100, "100 bytes to the number's new owner", write(other, buf, 100));
	/* the old connection's peer sends: the sleeper wakes */
	servant_do(&s, 0, S_SEND, 100);
	pthread_join(th, NULL);
	/* the kernel gives the sleeper the data; the switch says EBADF: both honest */
	CHECK(sl.r == 64 || (sl.r < 0 && sl.err == EBADF), "the sleeper's recv -> %zd %s",
	      sl.r, sl.r < 0 ? ename(sl.err) : "");
	say("the sleeper returned");
	EXPECT(100, "the new owner reads its 100 bytes",
	       recv(owner, buf, sizeof(buf), MSG_DONTWAIT));
	CHECK(buf[0] == 'u' && buf[99] == 'u', "the new owner read other bytes");
	close(owner);
	close(other);
	servant_do(&s, 0, S_CLOSE, 0);
	servant_end(&s);
}

/* ---- fdopen right after accept ---------------------------------------------------- */

#define EARLY (64 << 10)

/* Under WSD_EXPECT_PATH: whether fd takes that path now. */
static bool moved_now(int fd)
{
	const char *want = getenv("WSD_EXPECT_PATH");
	const char *got = path_now(fd);

	return want && *want && got && !strcmp(got, want);
}

static void accept_fdopen_server(struct peer *self, void *arg)
{
	uint8_t *want = malloc(2 * EARLY), *got = malloc(2 * EARLY);
	int lfd, fd, port;
	size_t n;
	FILE *f;

	(void)arg;
	lfd = t_listen(AF_INET, &port);
	ctl_send(self, port);
	ctl_recv(self);   /* the client sent, and asked to upgrade */
	sleep_ms(50);     /* its request waits for the accept (it may come later) */
	fd = t_accept(lfd);   /* the upgrade is attached inside it */
	ctl_recv(self);       /* the client sent the rest */
	f = fdopen(fd, "r");
	if (!f)
		die("fdopen: %s", ename(errno));
	say("fdopen right after accept");
	pattern(want, 2 * EARLY, 77, 0);
	n = fread(got, 1, 2 * EARLY, f);
	CHECK(n == 2 * EARLY && !memcmp(got, want, n), "fread: %zu bytes, or other bytes", n);
	say("fread: all %d bytes, in order", 2 * EARLY);
	EXPECT(1, "write the answer", write(fd, "k", 1));
	EXPECT(0, "fread: EOF", fread(got, 1, 1, f));
	EXPECT(0, "fclose", fclose(f));
	close(lfd);
	free(want);
	free(got);
}

static void accept_fdopen(void)
{
	uint8_t *buf = malloc(2 * EARLY);
	struct peer p;
	int fd;
	char k;

	say("-- fdopen right after accept, the upgrade attached inside it");
	peer_start(&p, "server", accept_fdopen_server, NULL);
	fd = t_connect(AF_INET, ctl_recv(&p));
	pattern(buf, 2 * EARLY, 77, 0);
	/* the switch looks at a connection's age and bytes when a call starts */
	send_all(fd, buf, EARLY / 2);
	sleep_ms(5);
	send_all(fd, buf + EARLY / 2, EARLY / 2);
	/* the upgrade is on its way: the server's switch holds it for the accept */
	ctl_send(&p, 1);
	sleep_ms(100);
	/*
	 * Still by the stream: the server's switch tells ours it may move only
	 * at its program's first read or write (wsd-protocol(7), Handover),
	 * and the fdopen before it keeps the connection on the stream for good.
	 */
	send_all(fd, buf + EARLY, EARLY);
	if (moved_now(fd))
		die("the connection moved before the server's program read");
	ctl_send(&p, 2);
	EXPECT(1, "recv the answer", recv(fd, &k, 1, 0));
	expect_path_now(fd, "tcp");
	EXPECT(0, "close", close(fd));
	peer_end(&p);
	free(buf);
}

/* ---- inetd's way: accept, the socket onto 0 and 1, exec the handler ------------------ */

#define HANDLER "--handler"

/* The handler image: the request on 0 (read(2), not stdin's stream), the answer on 1. */
static void handler(void)
{
	uint8_t *want = malloc(2 * EARLY), *got = malloc(2 * EARLY);
	size_t n = 0;

	alarm(20);
	pattern(want, 2 * EARLY, 78, 0);
	while (n < 2 * EARLY) {
		ssize_t k = read(0, got + n, 2 * EARLY - n);

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			exit(2);
		n += (size_t)k;
	}
	if (memcmp(got, want, n))
		exit(3);
	if (write(1, "k", 1) != 1)
		exit(4);
	exit(0);
}

static void inetd_server(struct peer *self, void *arg)
{
	int lfd, fd, port;

	(void)arg;
	lfd = t_listen(AF_INET, &port);
	ctl_send(self, port);
	ctl_recv(self);
	sleep_ms(50);
	fd = t_accept(lfd);
	ctl_recv(self);   /* the client sent the rest */
	EXPECT(0, "dup2 onto 0", dup2(fd, 0));
	EXPECT(1, "dup2 onto 1", dup2(fd, 1));
	EXPECT(0, "close the first number", close(fd));
	close(lfd);
	say("exec the handler");
	fflush(tr);
	execl("/proc/self/exe", t_argv0, HANDLER, (char *)NULL);
	die("exec: %s", ename(errno));
}

static void inetd(void)
{
	uint8_t *buf = malloc(2 * EARLY);
	struct peer p;
	int fd;
	char k;

	say("-- accept, the socket onto 0 and 1, exec: the handler reads every byte");
	peer_start(&p, "server", inetd_server, NULL);
	fd = t_connect(AF_INET, ctl_recv(&p));
	pattern(buf, 2 * EARLY, 78, 0);
	send_all(fd, buf, EARLY / 2);
	sleep_ms(5);
	send_all(fd, buf + EARLY / 2, EARLY / 2);
	ctl_send(&p, 1);
	sleep_ms(100);
	/* by the stream: the server's program neither read nor wrote before its exec */
	send_all(fd, buf + EARLY, EARLY);
	if (moved_now(fd))
		die("the connection moved before the server's program read");
	ctl_send(&p, 2);
	EXPECT(1, "recv the handler's answer", recv(fd, &k, 1, 0));
	expect_path_now(fd, "tcp");
	EXPECT(0, "close", close(fd));
	peer_end(&p);
	free(buf);
}

int main(int argc, char **argv)
{
	if (argc == 2 && !strcmp(argv[1], HANDLER))
		handler();
	t_init(argc, argv);
	echo_start(&e, AF_INET, NCONN);
	closed_behind();
	echo_end(&e);
	accept_fdopen();
	inetd();
	stdio_sockets();
	close_under_sleeper();
	t_exit();
}

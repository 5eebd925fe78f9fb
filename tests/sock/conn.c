/* SPDX-License-Identifier: MIT */
/* Sockets over loopback, the warm-up and the path check: see common.h. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/sock/common.h"

/* ---- sockets ------------------------------------------------------------- */

const char *famname(int family)
{
	return family == AF_INET6 ? "AF_INET6" : family == AF_INET ? "AF_INET" : "AF_?";
}

/*
 * The loopback address of family, or WSD_TEST_ADDR when set (the VM rig
 * puts both ends on two devices joined by a wire): an address of family.
 */
static socklen_t loopback(int family, int port, struct sockaddr_storage *ss)
{
	const char *a = getenv("WSD_TEST_ADDR");

	memset(ss, 0, sizeof(*ss));
	if (family == AF_INET6) {
		struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;

		s6->sin6_family = AF_INET6;
		s6->sin6_addr = in6addr_loopback;
		if (a && *a && inet_pton(AF_INET6, a, &s6->sin6_addr) != 1)
			die("WSD_TEST_ADDR=%s is not an IPv6 address", a);
		s6->sin6_port = htons(port);
		return sizeof(*s6);
	}
	struct sockaddr_in *s4 = (struct sockaddr_in *)ss;

	s4->sin_family = AF_INET;
	s4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (a && *a && inet_pton(AF_INET, a, &s4->sin_addr) != 1)
		die("WSD_TEST_ADDR=%s is not an IPv4 address", a);
	s4->sin_port = htons(port);
	return sizeof(*s4);
}

int t_listen(int family, int *port)
{
	struct sockaddr_storage ss;
	socklen_t len = loopback(family, 0, &ss);
	int fd = MUST(socket(family, SOCK_STREAM, 0));

	MUST(bind(fd, (struct sockaddr *)&ss, len));
	MUST(listen(fd, 1024));
	len = sizeof(ss);
	MUST(getsockname(fd, (struct sockaddr *)&ss, &len));
	*port = ntohs(family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
					 : ((struct sockaddr_in *)&ss)->sin_port);
	return fd;
}

int t_connect(int family, int port)
{
	struct sockaddr_storage ss;
	socklen_t len = loopback(family, port, &ss);
	int fd = MUST(socket(family, SOCK_STREAM, 0));

	MUST(connect(fd, (struct sockaddr *)&ss, len));
	return fd;
}

int t_accept(int lfd)
{
	int fd;

	do
		fd = accept(lfd, NULL, NULL);
	while (fd < 0 && errno == EINTR);
	if (fd < 0)
		die("accept: %s", ename(errno));
	return fd;
}

void set_nonblock(int fd, bool on)
{
	int fl = MUST(fcntl(fd, F_GETFL));

	MUST(fcntl(fd, F_SETFL, on ? fl | O_NONBLOCK : fl & ~O_NONBLOCK));
}

void wait_events(int fd, short mask)
{
	struct pollfd pfd = { .fd = fd, .events = mask };
	double t0 = now_ms();

	for (;;) {
		pfd.revents = 0;
		if (poll(&pfd, 1, 0) < 0 && errno != EINTR)
			die("wait_events: poll: %s", ename(errno));
		if ((pfd.revents & mask) == mask)
			break;
		if (now_ms() - t0 > 5000)
			die("wait_events: no %s after 5 s (have %s)", pollstr(mask),
			    pollstr(pfd.revents));
		sleep_ms(1);
	}
	sleep_ms(10);
}

void send_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len) {
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			die("send_all: %s", ename(errno));
		p += n;
		len -= n;
	}
}

void recv_all(int fd, void *buf, size_t len)
{
	char *p = buf;

	while (len) {
		ssize_t n = recv(fd, p, len, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			die("recv_all: %s", ename(errno));
		if (n == 0)
			die("recv_all: EOF with %zu bytes to go", len);
		p += n;
		len -= n;
	}
}

/*
 * The warm-up's blocks, made once: programs warm up many connections.
 * 256 KiB each way, then 64 KiB: past the switch's default upgrade
 * threshold, then through the upgraded path.  WSD_TEST_WARM_BYTES=N makes
 * them N and N/4 bytes, for a run that upgrades at the first byte anyway
 * (WSD_UPGRADE_BYTES=1) and warms up many connections where moving data
 * is slow: the VM rig's 1,000 connections over verbs moved 640 MB one
 * connection after another, three and a half minutes under TCG.
 */
static char *warm_block[4];
static size_t warm_len[4] = { 256 << 10, 256 << 10, 64 << 10, 64 << 10 };
static pthread_once_t warm_once = PTHREAD_ONCE_INIT;

static void warm_init(void)
{
	const char *e = getenv("WSD_TEST_WARM_BYTES");
	long v = e ? atol(e) : 0;

	if (v > 0 && v <= 256 << 10)
		for (int i = 0; i < 4; i++)
			warm_len[i] = i < 2 ? (size_t)v : (size_t)(v / 4 ? v / 4 : 1);
	for (int i = 0; i < 4; i++) {
		size_t len = warm_len[i];

		warm_block[i] = malloc(len);
		if (!warm_block[i])
			abort();
		pattern(warm_block[i], len, 101 + i, 0);
	}
}

/* One direction of the warm-up: a patterned block, checked on arrival. */
static void warm_xfer(int fd, bool sending, int block)
{
	size_t len;
	char *buf;

	pthread_once(&warm_once, warm_init);
	len = warm_len[block];
	if (sending) {
		send_all(fd, warm_block[block], len);
		return;
	}
	buf = malloc(len);
	if (!buf)
		die("warm-up: out of memory");
	recv_all(fd, buf, len);
	if (memcmp(buf, warm_block[block], len))
		die("warm-up: the data arrived changed");
	free(buf);
}

void warmup_bulk(int fd, bool first)
{
	warm_xfer(fd, first, 0);
	warm_xfer(fd, !first, 1);
}

void warmup_tail(int fd, bool first)
{
	warm_xfer(fd, first, 2);
	warm_xfer(fd, !first, 3);
}

static const char *(*path_fn(void))(int)
{
	return (const char *(*)(int))dlsym(RTLD_DEFAULT, "wsd_switch_path");
}

const char *path_now(int fd)
{
	const char *(*path_of)(int) = path_fn();

	return path_of ? path_of(fd) : NULL;
}

/*
 * Under WSD_EXPECT_PATH, give the switch time to finish: it upgrades in the
 * background, and a loaded machine (make -j) may need more than the warm-up.
 * Both ends swap a byte saying whether their side has moved, up to 5 s; a
 * plain run (no WSD_EXPECT_PATH on either end) swaps nothing.
 */
void settle(int fd, bool first)
{
	const char *want = getenv("WSD_EXPECT_PATH");
	const char *(*path_of)(int) = path_fn();

	if (!want || !*want || !path_of)
		return;
	for (int round = 0; round < 500; round++) {
		const char *got = path_of(fd);
		char mine = got && !strcmp(got, want), theirs;

		if (first) {
			send_all(fd, &mine, 1);
			recv_all(fd, &theirs, 1);
		} else {
			recv_all(fd, &theirs, 1);
			send_all(fd, &mine, 1);
		}
		if (mine && theirs)
			return;
		sleep_ms(10);
	}
}

void warmup(int fd, bool first)
{
	warmup_bulk(fd, first);
	sleep_ms(20);
	warmup_tail(fd, first);
	settle(fd, first);
	expect_path(fd);
}

/* `wsd stat --json` for this process into out; false when not under wsd run. */
static bool stat_json(char *out, size_t size)
{
	const char *wsd = getenv("WSD_BIN");
	char cmd[512];
	size_t n;
	FILE *f;

	if (!getenv("WSD_EXPECT_PATH") || !wsd)
		return false;
	snprintf(cmd, sizeof(cmd), "%s stat --json %d", wsd, (int)getpid());
	if (!(f = popen(cmd, "r")))
		die("popen %s", cmd);
	n = fread(out, 1, size - 1, f);
	pclose(f);
	out[n] = 0;
	return true;
}

/* fd takes path want now, or exit 1 (stderr only). */
static void check_path(int fd, const char *want)
{
	const char *(*path_of)(int) = path_fn();
	const char *got;

	if (!path_of) {
		fprintf(stderr, "%s[%d]: wsd_switch_path not found: not running under the switch\n",
			t_argv0 ? t_argv0 : "test", (int)getpid());
		fflush(tr);
		_exit(1);
	}
	got = path_of(fd);
	if (!got || strcmp(got, want)) {
		char out[65536], key[32], *p, *end;

		fprintf(stderr, "%s[%d]: fd %d takes path %s, the test wants %s\n",
			t_argv0 ? t_argv0 : "test", (int)getpid(), fd, got ? got : "(none)", want);
		/* why, as wsd stat says it: the reason a failure in CI is read by */
		snprintf(key, sizeof(key), "\"fd\":%d,", fd);
		if (stat_json(out, sizeof(out)) && (p = strstr(out, key))) {
			if ((end = strchr(p, '}')))
				end[1] = 0;
			fprintf(stderr, "  wsd stat: {%s\n", p);
		}
		fflush(tr);
		_exit(1);
	}
}

void expect_path(int fd)
{
	const char *want = getenv("WSD_EXPECT_PATH");

	if (want && *want)
		check_path(fd, want);
}

void expect_path_now(int fd, const char *want)
{
	const char *env = getenv("WSD_EXPECT_PATH");

	if (env && *env)
		check_path(fd, want);
}

void wait_queued(int fd, int n)
{
	double t0 = now_ms();
	int q = 0;

	while (ioctl(fd, FIONREAD, &q) == 0 && q < n) {
		if (now_ms() - t0 > 5000)
			die("only %d of %d bytes arrived", q, n);
		sleep_ms(1);
	}
	sleep_ms(5);
	MUST(ioctl(fd, FIONREAD, &q));
	CHECK(q == n, "FIONREAD %d, want %d", q, n);
}

int fill_until_eagain(int fd, uint32_t seed)
{
	static char buf[64 << 10];
	int fl = MUST(fcntl(fd, F_GETFL));
	size_t chunk = sizeof(buf);
	uint64_t off = 0;

	MUST(fcntl(fd, F_SETFL, fl | O_NONBLOCK));
	/*
	 * Full means a single byte does not go in, and still does not after
	 * 200 ms: what is in flight may yet move to the peer's receive buffer
	 * (on a busy machine ACKs come late) and free room here, less than a
	 * large send or POLLOUT needs but enough for the one byte a test then
	 * expects EAGAIN (or a wait) for.
	 */
	for (;;) {
		ssize_t n;

		pattern(buf, chunk, seed, off);
		n = send(fd, buf, chunk, MSG_NOSIGNAL);
		if (n > 0) {
			off += n;
			if (off > (1u << 30))
				die("fill: 1 GiB went in and no EAGAIN");
			continue;
		}
		if (n == 0 || errno != EAGAIN)
			die("fill: send: %s", ename(errno));
		if (chunk > 1) {
			chunk /= 2;
			continue;
		}
		usleep(200000);
		pattern(buf, 1, seed, off);
		n = send(fd, buf, 1, MSG_NOSIGNAL);
		if (n < 0 && errno == EAGAIN)
			break;
		if (n != 1)
			die("fill: send: %s", ename(errno));
		off += 1;
		chunk = sizeof(buf);   /* room came: fill it */
	}
	MUST(fcntl(fd, F_SETFL, fl));
	return (int)off;
}

void drain_exactly(int fd, int len, uint32_t seed)
{
	static char buf[64 << 10], want[64 << 10];
	int fl = MUST(fcntl(fd, F_GETFL));
	uint64_t off = 0;

	/* blocking reads: the data may still be on its way */
	MUST(fcntl(fd, F_SETFL, fl & ~O_NONBLOCK));
	while (off < (uint64_t)len) {
		size_t want_n = len - off < sizeof(buf) ? len - off : sizeof(buf);
		ssize_t n = recv(fd, buf, want_n, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			die("drain: recv: %s", n ? ename(errno) : "EOF");
		pattern(want, n, seed, off);
		if (memcmp(buf, want, n))
			die("drain: the data at offset %llu arrived changed",
			    (unsigned long long)off);
		off += n;
	}
	MUST(fcntl(fd, F_SETFL, fl));
}

/* Under wsd run: bytes went by zero copy on fd (wsd stat --json). */
bool stat_reason(const char *out, int fd, const char *reason)
{
	char key[32], want[64];
	const char *p, *end;

	snprintf(key, sizeof(key), "\"fd\":%d,", fd);
	snprintf(want, sizeof(want), "\"reason\":\"%s\"", reason);
	p = strstr(out, key);
	end = p ? strchr(p, '}') : NULL;
	return p && (p = strstr(p, want)) && (!end || p < end);
}

void expect_reason(int fd, const char *reason)
{
	char out[65536];

	if (!stat_json(out, sizeof(out)))
		return;
	if (!stat_reason(out, fd, reason)) {
		fprintf(stderr, "reason: wsd stat says: %s\n", out);
		die("fd %d: no reason %s in wsd stat", fd, reason);
	}
}

/* The value of "name": in wsd stat's JSON object of fd (out), or 0. */
unsigned long long stat_field(const char *out, int fd, const char *name)
{
	char key[32], want[48];
	const char *p, *end;

	snprintf(key, sizeof(key), "\"fd\":%d,", fd);
	snprintf(want, sizeof(want), "\"%s\":", name);
	if (!(p = strstr(out, key)))
		return 0;
	end = strchr(p, '}');
	if (!(p = strstr(p, want)) || (end && p > end))
		return 0;
	return strtoull(p + strlen(want), NULL, 10);
}

const char *stat_now(void)
{
	static char out[262144];

	return stat_json(out, sizeof(out)) ? out : NULL;
}

void stat_bytes(const char *json, int fd, unsigned long long *tcp, unsigned long long *ring)
{
	*tcp = stat_field(json, fd, "tcp_tx") + stat_field(json, fd, "tcp_rx");
	*ring = stat_field(json, fd, "copy_tx") + stat_field(json, fd, "copy_rx") +
		stat_field(json, fd, "zcopy_tx") + stat_field(json, fd, "zcopy_rx");
}

void expect_zcopy(int fd)
{
	char key[32], out[65536], *p;
	unsigned long long tx = 0, rx = 0;

	if (!stat_json(out, sizeof(out)))
		return;
	snprintf(key, sizeof(key), "\"fd\":%d,", fd);
	/* the requests or the responses, whichever found the other end waiting */
	if ((p = strstr(out, key)) && (p = strstr(p, "\"zcopy_tx\":"))) {
		tx = strtoull(p + strlen("\"zcopy_tx\":"), &p, 10);
		if (!strncmp(p, ",\"zcopy_rx\":", strlen(",\"zcopy_rx\":")))
			rx = strtoull(p + strlen(",\"zcopy_rx\":"), NULL, 10);
	}
	fprintf(stderr, "zcopy: fd %d: %llu bytes sent and %llu received by zero copy\n", fd,
		tx, rx);
	if (tx + rx == 0) {
		fprintf(stderr, "zcopy: wsd stat says: %s\n", out);
		die("no zero copy under wsd run");
	}
}

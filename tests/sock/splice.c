/* SPDX-License-Identifier: MIT */
/*
 * splice and sendfile moving megabytes, every byte in place, on an
 * accelerated connection.  The peer echoes what it receives through a pipe
 * of its own with splice (socket -> pipe -> socket) while this end sends
 * and receives at once:
 *   - blocking, a 1 MiB pipe, asking for more than it holds, drained whole;
 *   - blocking, a 64 KiB pipe kept part full (0 to 6 bytes left behind
 *     each round): the pipe takes less than asked, a page at a time when
 *     its slots are few;
 *   - non-blocking socket, SPLICE_F_NONBLOCK, driven by poll, this end
 *     reading slowly, so that the socket takes part of what is offered.
 * Then sendfile of a 5 MiB file from the peer, blocking and non-blocking,
 * with an offset and from the file position: the offset and the position
 * must end exactly at what went.  Edge cases (full pipes and sockets,
 * EPIPE) are flags2's.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/sock/common.h"

#define FILE_LEN ((5u << 20) + 4321)

enum mode { M_BIG, M_PART, M_NB, M_N };

static const struct echo_mode {
	const char *name;
	size_t len;             /* bytes this end sends */
	int pipe_size;
	size_t ask;             /* what each splice from the socket asks for */
	bool part_full;         /* 0 to 6 bytes stay in the pipe after each round */
} modes[M_N] = {
	[M_BIG] = { "blocking, 1 MiB pipe", 24u << 20, 1 << 20, 3u << 20, false },
	[M_PART] = { "blocking, 64 KiB pipe kept part full", 3u << 20, 64 << 10, 1u << 20, true },
	[M_NB] = { "non-blocking, 256 KiB pipe", 12u << 20, 256 << 10, 1u << 20, false },
};

/* splice n bytes out of the pipe into fd, waiting (poll) where fd is non-blocking */
static void pipe_out(int in, int fd, size_t n, unsigned flags)
{
	while (n) {
		ssize_t k = splice(in, NULL, fd, NULL, n, flags);

		if (k < 0 && errno == EAGAIN) {
			struct pollfd p = { .fd = fd, .events = POLLOUT };

			poll(&p, 1, 1000);
			continue;
		}
		if (k <= 0)
			die("splice pipe -> socket: %s", k ? ename(errno) : "nothing");
		n -= (size_t)k;
	}
}

/*
 * The peer: socket -> pipe -> socket until the end, every splice from the
 * socket checked against what was asked and what the pipe had room for.
 * The peer alone reads the pipe: a splice that took more than fits would
 * wait for room for ever (the watchdog's failure).
 */
static void echo(int fd, const struct echo_mode *m, bool nb)
{
	unsigned flags = nb ? SPLICE_F_NONBLOCK : 0;
	size_t queued = 0, total = 0, over = 0;
	int p[2], round = 0;

	MUST(pipe(p));
	MUST(fcntl(p[1], F_SETPIPE_SZ, m->pipe_size));
	set_nonblock(fd, nb);
	for (;;) {
		ssize_t n = splice(fd, NULL, p[1], NULL, m->ask, flags);
		size_t keep = m->part_full ? (size_t)(round++ % 7) : 0;

		if (n < 0 && errno == EAGAIN) {
			struct pollfd q = { .fd = fd, .events = POLLIN };

			CHECK(nb, "splice socket -> pipe: EAGAIN from a blocking socket");
			poll(&q, 1, 1000);
			continue;
		}
		if (n < 0)
			die("splice socket -> pipe: %s", ename(errno));
		if (n == 0)
			break;
		/* never more than asked, nor than the pipe held room for */
		if ((size_t)n > m->ask || queued + (size_t)n > (size_t)m->pipe_size)
			over++;
		queued += (size_t)n;
		total += (size_t)n;
		if (queued > keep) {
			pipe_out(p[0], fd, queued - keep, flags);
			queued = keep;
		}
	}
	pipe_out(p[0], fd, queued, flags);
	say("echoed %zu bytes, %zu splices past their bound", total, over);
	close(p[0]);
	close(p[1]);
	expect_path_now(fd, "shm");
	set_nonblock(fd, false);
	MUST(shutdown(fd, SHUT_WR));
}

/* sendfile until total reaches end, waiting (poll) where fd is non-blocking */
static void send_file_to(int fd, int file, off_t *off, size_t *total, size_t end)
{
	while (*total < end) {
		ssize_t n = sendfile(fd, file, off, end - *total);

		if (n < 0 && errno == EAGAIN) {
			struct pollfd q = { .fd = fd, .events = POLLOUT };

			poll(&q, 1, 1000);
			continue;
		}
		if (n <= 0)
			die("sendfile: %s", n ? ename(errno) : "nothing sent");
		*total += (size_t)n;
	}
}

/*
 * The peer: FILE_LEN from the file, its first half at an offset (the file
 * position stays where it was), the rest from the position.
 */
static void send_file(int fd, int file, bool nb)
{
	off_t off = 0;
	size_t total = 0;

	set_nonblock(fd, nb);
	MUST(lseek(file, 7, SEEK_SET));
	send_file_to(fd, file, &off, &total, FILE_LEN / 2);
	say("sendfile (%s) at an offset: %zu bytes, offset %lld, position %lld",
	    nb ? "non-blocking" : "blocking", total, (long long)off,
	    (long long)lseek(file, 0, SEEK_CUR));
	MUST(lseek(file, off, SEEK_SET));
	send_file_to(fd, file, NULL, &total, FILE_LEN);
	say("sendfile from the position: %zu bytes in all, position %lld", total,
	    (long long)lseek(file, 0, SEEK_CUR));
	set_nonblock(fd, false);
}

static int temp_file(void)
{
	char path[] = "/tmp/wsd-sock-splice-XXXXXX";
	int fd = MUST(mkstemp(path));
	char *buf = malloc(FILE_LEN);

	unlink(path);
	pattern(buf, FILE_LEN, 71, 0);
	if (write(fd, buf, FILE_LEN) != FILE_LEN)
		die("temp file: %s", ename(errno));
	free(buf);
	return fd;
}

static void peer_main(struct peer *ctl, void *arg)
{
	int lfd, port, fd, file = temp_file();

	(void)arg;
	lfd = t_listen(AF_INET, &port);
	ctl_send(ctl, port);
	for (int i = 0; i < M_N; i++) {
		fd = t_accept(lfd);
		warmup(fd, false);
		echo(fd, &modes[i], i == M_NB);
		ctl_recv(ctl);
		EXPECT(0, "close", close(fd));
	}
	fd = t_accept(lfd);
	warmup(fd, false);
	send_file(fd, file, false);
	ctl_recv(ctl);
	send_file(fd, file, true);
	ctl_recv(ctl);
	EXPECT(0, "close", close(fd));
	close(file);
	close(lfd);
}

/* ---- this end ---------------------------------------------------------------------- */

struct sender {
	int fd;
	size_t len;
	uint32_t seed;
	pthread_t th;
};

/* pieces of varied sizes, none a multiple of a page */
static void *send_main(void *arg)
{
	static const size_t sizes[] = { 1000003, 4099, 1, 262147, 65537, 77 };
	struct sender *s = arg;
	char *buf = malloc(1000003);
	size_t done = 0;

	for (int i = 0; done < s->len; i++) {
		size_t n = sizes[i % 6] < s->len - done ? sizes[i % 6] : s->len - done;

		pattern(buf, n, s->seed, done);
		send_all(s->fd, buf, n);
		done += n;
	}
	MUST(shutdown(s->fd, SHUT_WR));
	free(buf);
	return NULL;
}

/* Receive until the end, checking every byte; slowly (a pause each 256 KiB) when asked. */
static size_t recv_check(int fd, uint32_t seed, bool slow, const char *what)
{
	char *buf = malloc(300007);
	size_t got = 0, paused = 0;
	ssize_t n;

	while ((n = recv(fd, buf, 300007, 0)) > 0) {
		expect_pattern(buf, (size_t)n, seed, got, what);
		got += (size_t)n;
		if (slow && got - paused >= (256u << 10)) {
			paused = got;
			sleep_ms(2);
		}
	}
	if (n < 0)
		die("%s: recv: %s", what, ename(errno));
	free(buf);
	return got;
}

static void echo_through(struct peer *b, int port, enum mode i)
{
	struct sender s = { .fd = t_connect(AF_INET, port), .len = modes[i].len, .seed = 72 + i };
	size_t got;

	warmup(s.fd, true);
	say("-- splice echo, %s: %zu bytes", modes[i].name, modes[i].len);
	if (pthread_create(&s.th, NULL, send_main, &s))
		die("thread");
	got = recv_check(s.fd, s.seed, i == M_NB, modes[i].name);
	pthread_join(s.th, NULL);
	CHECK(got == s.len, "%s: %zu bytes came back of %zu", modes[i].name, got, s.len);
	say("the echo: %zu bytes, every one in place", got);
	ctl_send(b, 0);
	EXPECT(0, "close", close(s.fd));
}

int main(int argc, char **argv)
{
	struct peer b;
	int port, fd;
	char *buf;

	t_init(argc, argv);
	peer_start(&b, "peer", peer_main, NULL);
	port = ctl_recv(&b);
	for (int i = 0; i < M_N; i++)
		echo_through(&b, port, (enum mode)i);

	fd = t_connect(AF_INET, port);
	warmup(fd, true);
	buf = malloc(FILE_LEN);
	for (int nb = 0; nb < 2; nb++) {
		size_t got = 0, paused = 0;

		say("-- sendfile, %s, %u bytes", nb ? "non-blocking" : "blocking", FILE_LEN);
		while (got < FILE_LEN) {
			ssize_t n = recv(fd, buf + got, FILE_LEN - got, 0);

			if (n <= 0)
				die("recv: %s", n ? ename(errno) : "EOF");
			got += (size_t)n;
			/* slowly: the non-blocking socket then takes part of what is offered */
			if (nb && got - paused >= (256u << 10)) {
				paused = got;
				sleep_ms(2);
			}
		}
		expect_pattern(buf, FILE_LEN, 71, 0, "sendfile");
		say("received what sendfile sent: every byte in place");
		ctl_send(&b, 0);
	}
	EXPECT(0, "recv: the end", recv(fd, buf, 1, 0));
	free(buf);
	EXPECT(0, "close", close(fd));
	peer_end(&b);
	t_exit();
}

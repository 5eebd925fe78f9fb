/* SPDX-License-Identifier: MIT */
/*
 * First bytes by channel (wsd-protocol(7), "The mailbox"): with one
 * connection between the two processes held and accelerated (so a channel
 * joins them), short connections one after another, each sending a
 * request first and reading the same bytes back before it closes.  The
 * requests: small ones, which go into the peer's grant before its answer;
 * one of exactly the 8192 bytes that may go so, and one past them; a large
 * one; two sends before the first receive; and a connection on which the
 * server speaks first.  Every byte is checked at both ends.
 *
 * Under wsd run, at least one of the small connections must have carried
 * none of its bytes on the stream (wsd stat: tcp_tx and tcp_rx 0, its 64
 * bytes each way by ring): a loaded machine may leave some on TCP (the
 * server's accept came too late), never all.  The client holds them open
 * until one wsd stat has looked (a spawn from a process with a channel
 * ends the channel: one in the middle would leave the rest on TCP).
 * FIRST_MIN_RING asks for more of them than one (tests/fault/hold_check.sh).
 *
 * The client is forked after the server listens, so over verbs it is a
 * child that inherited its parent's devices (wsd-verbs(7), Devices).
 * FIRST_FORK_EARLY=1 forks it first instead, the port sent by the control
 * channel, as the sanitizer build always does (T_FORK_FIRST, common.h): its
 * allocator can deadlock in a child forked while the switch's threads run.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/sock/common.h"

#define SMALL 24                     /* 64-byte connections */

static int port;

struct one {
	const char *what;
	size_t len;                  /* request, and its answer */
	int sends;                   /* the request in this many sends */
	bool server_first;           /* the server sends len bytes first, then echoes */
};

static const struct one cases[] = {
	{ "1 byte", 1, 1, false },
	{ "8192 bytes", 8192, 1, false },
	{ "8193 bytes", 8193, 1, false },
	{ "100000 bytes", 100000, 1, false },
	{ "2 sends of 100 bytes", 200, 2, false },
	{ "the server first, 64 bytes", 64, 1, true },
};
#define NCASES (sizeof(cases) / sizeof(cases[0]))

static void check(const char *buf, size_t len, uint32_t seed, const char *what)
{
	char *want = malloc(len);

	pattern(want, len, seed, 0);
	CHECK(!memcmp(buf, want, len), "%s: the bytes differ", what);
	free(want);
}

/* The client's side of one connection: request, then the answer; its fd, or -1 when closed. */
static int client_one(const struct one *c, uint32_t seed, bool hold)
{
	int fd = t_connect(AF_INET, port);
	char *buf = malloc(c->len), *got = malloc(c->len);
	size_t half = c->len / c->sends;

	if (c->server_first) {
		recv_all(fd, got, c->len);
		check(got, c->len, seed + 1, c->what);
	}
	pattern(buf, c->len, seed, 0);
	send_all(fd, buf, half);
	if (c->sends > 1)
		send_all(fd, buf + half, c->len - half);
	recv_all(fd, got, c->len);
	check(got, c->len, seed, c->what);
	free(buf);
	free(got);
	if (hold)
		return fd;
	EXPECT(0, "close", close(fd));
	return -1;
}

static void client(struct peer *self, void *arg)
{
	int keep, small[SMALL], ring = 0;
	const char *json;

	(void)arg;
	if (!port)
		port = ctl_recv(self);   /* forked before the listener (FIRST_FORK_EARLY) */
	keep = t_connect(AF_INET, port);
	warmup(keep, true);
	settle(keep, true);
	ctl_recv(self);
	for (size_t i = 0; i < NCASES; i++) {
		client_one(&cases[i], 100 + (uint32_t)i, false);
		say("%s: data ok", cases[i].what);
	}
	for (int i = 0; i < SMALL; i++)
		small[i] = client_one(&(struct one){ "64 bytes", 64, 1, false }, (uint32_t)i, true);
	say("%d connections of 64 bytes each way: data ok", SMALL);
	json = stat_now();
	for (int i = 0; json && i < SMALL; i++) {
		unsigned long long tcp, by;

		stat_bytes(json, small[i], &tcp, &by);
		if (getenv("FIRST_DEBUG"))
			fprintf(stderr, "fd %d tcp %llu ring %llu\n", small[i], tcp, by);
		ring += tcp == 0 && by == 128;
	}
	if (json) {
		const char *min = getenv("FIRST_MIN_RING");
		int want = min ? atoi(min) : 1;

		fprintf(stderr, "first: %d of %d small connections carried no byte on the stream\n",
			ring, SMALL);
		if (ring < want)
			die("%d connections carried their first bytes by ring, not %d", ring, want);
	}
	for (int i = 0; i < SMALL; i++)
		EXPECT(0, "close", close(small[i]));
	EXPECT(0, "close the held connection", close(keep));
}

static void server_one(int lfd, const struct one *c, uint32_t seed, bool wait_end)
{
	int fd = t_accept(lfd);
	char *buf = malloc(c->len);

	if (c->server_first) {
		pattern(buf, c->len, seed + 1, 0);
		send_all(fd, buf, c->len);
	}
	recv_all(fd, buf, c->len);
	check(buf, c->len, seed, c->what);
	send_all(fd, buf, c->len);
	/* the client closes first, or (the small ones) holds them a while */
	if (wait_end)
		EXPECT(0, "recv: the client closed", recv(fd, buf, 1, 0));
	EXPECT(0, "close", close(fd));
	free(buf);
}

int main(int argc, char **argv)
{
	struct peer c;
	int lfd, keep;
	bool early = T_FORK_FIRST ||
		     (getenv("FIRST_FORK_EARLY") && atoi(getenv("FIRST_FORK_EARLY")));

	t_init(argc, argv);
	t_watchdog(120);
	lfd = t_listen_peer(&c, "client", client, NULL, &port, early);
	keep = t_accept(lfd);
	warmup(keep, false);
	settle(keep, false);
	expect_path(keep);
	ctl_send(&c, 1);
	for (size_t i = 0; i < NCASES; i++) {
		server_one(lfd, &cases[i], 100 + (uint32_t)i, true);
		say("%s: data ok", cases[i].what);
	}
	for (int i = 0; i < SMALL; i++)
		server_one(lfd, &(struct one){ "64 bytes", 64, 1, false }, (uint32_t)i, false);
	say("%d connections of 64 bytes each way: data ok", SMALL);
	EXPECT(0, "recv: the held connection closed", recv(keep, &(char){ 0 }, 1, 0));
	EXPECT(0, "close the held connection", close(keep));
	EXPECT(0, "close the listener", close(lfd));
	peer_end(&c);
	t_exit();
}

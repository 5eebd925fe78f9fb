/* SPDX-License-Identifier: MIT */
/*
 * A channel made ahead (wsd-protocol(7), "Channels"): short connections
 * one after another and nothing else (no connection lives long enough to
 * upgrade), each sending 64 bytes and reading them back before it closes.
 * Under wsd run the client's switch makes a channel to the server's as the
 * first ones close, and later connections go by it: every 50 connections
 * one is held open while wsd stat looks, until one is a slot of a channel
 * (10 s at most, else the test fails).  Mostly its bytes went by ring from
 * the first (stderr says whether): a machine too loaded for the peer to
 * take an OPEN from its mailbox in time sends them by TCP, and the
 * connection then moves at its next call.  No connection upgrades of its own (WSD_UPGRADE_US and
 * WSD_UPGRADE_BYTES out of reach): the channel can only be one made ahead.
 * Every byte is checked at both ends.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/sock/common.h"

#define LEN 64
#define PLAIN_COUNT 200              /* without wsd: as many, for the same transcript */
#define LIMIT_MS 10000

static int port;

/* One connection: request (its first byte says go on, 1, or stop, 2), the echo. */
static int client_one(uint32_t seed, char kind, bool hold)
{
	int fd = t_connect(AF_INET, port);
	char buf[LEN], got[LEN];

	pattern(buf, LEN, seed, 0);
	buf[0] = kind;
	send_all(fd, buf, LEN);
	recv_all(fd, got, LEN);
	CHECK(!memcmp(buf, got, LEN), "connection %u: the bytes differ", seed);
	if (hold)
		return fd;
	/* (checked quietly: the count differs with and without wsd, the transcript may not) */
	CHECK(close(fd) == 0, "close");
	return -1;
}

static void client(struct peer *self, void *arg)
{
	const char *json;
	double end;
	bool ahead = false, first = false;
	uint32_t i;

	(void)arg;
	port = t_peer_port(self, port);
	json = stat_now();   /* NULL without wsd */
	end = now_ms() + LIMIT_MS;
	for (i = 1; json ? !ahead && now_ms() < end : i <= PLAIN_COUNT; i++) {
		unsigned long long tcp, ring;
		int fd;

		if (!json || i % 50) {
			client_one(i, 1, false);
			continue;
		}
		fd = client_one(i, 1, true);
		if ((json = stat_now())) {
			stat_bytes(json, fd, &tcp, &ring);
			first = tcp == 0 && ring == 2 * LEN;
			ahead = stat_field(json, fd, "channel") != 0;
		}
		CHECK(close(fd) == 0, "close");
	}
	if (json) {
		fprintf(stderr, "ahead: %u connections, %s\n", i - 1,
			!ahead ? "none went by channel" : first ?
			"the last went by channel and carried no byte on the stream" :
			"the last went by channel, its first bytes by TCP");
		if (!ahead) {
			fprintf(stderr, "ahead: wsd stat said last: %.4000s\n", json);
			die("no short connection went by a channel made ahead");
		}
	}
	client_one(0, 2, false);
	say("short connections of 64 bytes each way: data ok");
}

int main(int argc, char **argv)
{
	struct peer c;
	int lfd;

	setenv("WSD_UPGRADE_US", "600000000", 1);
	setenv("WSD_UPGRADE_BYTES", "1000000000000", 1);
	t_init(argc, argv);
	t_watchdog(60);
	lfd = t_listen_peer(&c, "client", client, NULL, &port, T_FORK_FIRST);
	for (bool stop = false; !stop;) {
		int fd = t_accept(lfd);
		char buf[LEN];

		recv_all(fd, buf, LEN);
		stop = buf[0] == 2;
		send_all(fd, buf, LEN);
		CHECK(recv(fd, buf, 1, 0) == 0, "recv: the client did not close");
		CHECK(close(fd) == 0, "close");
	}
	say("short connections of 64 bytes each way: data ok");
	EXPECT(0, "close the listener", close(lfd));
	peer_end(&c);
	t_exit();
}

/* SPDX-License-Identifier: MIT */
/*
 * Large blocking transfers with the switch's defaults: on shm a receive of
 * 1 MiB offers its buffer and a blocking sender moves its 1 MiB into it in
 * two parts at once, half written by the sender and half read by the
 * receiver (wsd-protocol(7), SPLIT), whenever that has been faster than the
 * ring.  Every byte is checked: a stream of 48 MiB sent from a 16 MiB
 * source walked in order (a new buffer each time), received 1 MiB at a
 * time and then 96 KiB at a time (too small to offer), then requests and
 * responses of 1 MiB.
 * Under wsd run (WSD_EXPECT_PATH and WSD_BIN set by run_pair.sh) the
 * program also asks `wsd stat` that bytes did arrive by zero copy.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/sock/common.h"

#define MB (1u << 20)
#define SOURCE (16 * MB)
#define STREAM (48 * MB)
#define CALLS 16

static int port;


static void client(struct peer *self, void *arg)
{
	uint8_t *src = malloc(SOURCE), *buf = malloc(MB);
	int fd;

	(void)arg;
	port = t_peer_port(self, port);
	if (!src || !buf)
		die("no memory");
	pattern(src, SOURCE, 7, 0);
	fd = t_connect(AF_INET, port);
	warmup(fd, true);
	/* twice: received in 1 MiB calls, then in 96 KiB ones */
	for (int pass = 0; pass < 2; pass++)
		for (uint64_t at = 0; at < STREAM; at += MB)
			send_all(fd, src + at % SOURCE, MB);
	for (int i = 0; i < CALLS; i++) {
		pattern(buf, MB, 100 + i, 0);
		send_all(fd, buf, MB);
		recv_all(fd, buf, MB);
		expect_pattern(buf, MB, 200 + i, 0, "a response");
	}
	say("%d calls of 1 MiB each way: ok", CALLS);
	EXPECT(0, "close", close(fd));
	free(src);
	free(buf);
}

int main(int argc, char **argv)
{
	uint8_t *buf = malloc(MB);
	struct peer c;
	int lfd, fd;

	t_init(argc, argv);
	if (!buf)
		die("no memory");
	lfd = t_listen_peer(&c, "client", client, NULL, &port, T_FORK_FIRST);
	fd = t_accept(lfd);
	warmup(fd, false);

	say("-- a 48 MiB stream in blocking sends of 1 MiB, received 1 MiB at a time");
	for (uint64_t at = 0; at < STREAM; at += MB) {
		recv_all(fd, buf, MB);
		expect_pattern(buf, MB, 7, at % SOURCE, "the stream");
	}
	say("every byte: ok");
	say("-- again, received 96 KiB at a time");
	for (uint64_t at = 0; at < STREAM;) {
		size_t n = STREAM - at < 96 * 1024 ? STREAM - at : 96 * 1024;
		uint64_t in = at % SOURCE;

		/* a piece never crosses the source's end: 16 MiB is not a multiple of 96 KiB */
		if (in + n > SOURCE)
			n = SOURCE - in;
		recv_all(fd, buf, n);
		expect_pattern(buf, n, 7, in, "the stream");
		at += n;
	}
	say("every byte: ok");

	say("-- requests and responses of 1 MiB");
	for (int i = 0; i < CALLS; i++) {
		recv_all(fd, buf, MB);
		expect_pattern(buf, MB, 100 + i, 0, "a request");
		pattern(buf, MB, 200 + i, 0);
		send_all(fd, buf, MB);
	}
	say("%d calls answered: ok", CALLS);
	expect_zcopy(fd);

	EXPECT(0, "recv: the client closed", recv(fd, buf, 1, 0));
	EXPECT(0, "close", close(fd));
	EXPECT(0, "close the listener", close(lfd));
	peer_end(&c);
	free(buf);
	t_exit();
}

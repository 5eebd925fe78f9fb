/* SPDX-License-Identifier: MIT */
/*
 * One end under wsd run, the other plain: the plain program must see
 * exactly the bytes it sees when neither runs wsd, and the wsd end must
 * stay on TCP.  tests/sock/mixed_check.sh starts the two ends as separate
 * programs in all four combinations and compares their transcripts.
 *
 *   mixed server PORTFILE   listen on 127.0.0.1, write the port, serve one
 *   mixed client PORT       connect and talk
 *
 * The client sends blocks of growing size (1 B to 1 MiB, past the switch's
 * upgrade and zero-copy thresholds), each answered by a block of the same
 * size; then it half-closes, and the server answers the end of the stream
 * with its own.  Every byte is a known pattern, checked at arrival.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/sock/common.h"

static const size_t sizes[] = { 1, 100, 4096, 16384, 65536, 300000, 1 << 20, 7, 1 << 20 };
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))

static void check(int fd, uint8_t *buf, size_t len, uint32_t seed)
{
	uint8_t *want = malloc(len);

	if (!want)
		die("no memory");
	recv_all(fd, buf, len);
	pattern(want, len, seed, 0);
	if (memcmp(buf, want, len))
		die("a block of %zu bytes arrived changed", len);
	free(want);
}

int main(int argc, char **argv)
{
	uint8_t *buf = malloc(1 << 20);
	int fd, port;

	t_init(argc, argv);
	if (argc != 3 || !buf)
		die("usage: mixed server PORTFILE | mixed client PORT");
	if (!strcmp(argv[1], "server")) {
		int lfd = t_listen(AF_INET, &port);
		FILE *f = fopen(argv[2], "w");

		if (!f || fprintf(f, "%d\n", port) < 0 || fclose(f))
			die("cannot write %s", argv[2]);
		fd = t_accept(lfd);
		for (size_t i = 0; i < NSIZES; i++) {
			check(fd, buf, sizes[i], (uint32_t)(10 + i));
			pattern(buf, sizes[i], (uint32_t)(100 + i), 0);
			send_all(fd, buf, sizes[i]);
		}
		say("answered %zu blocks", NSIZES);
		EXPECT(0, "recv: the client's end of stream", recv(fd, buf, 1, 0));
		EXPECT(0, "shutdown SHUT_WR", shutdown(fd, SHUT_WR));
		expect_path(fd);
		EXPECT(0, "close", close(fd));
		EXPECT(0, "close the listener", close(lfd));
	} else {
		fd = t_connect(AF_INET, atoi(argv[2]));
		sleep_ms(20);   /* old enough for the switch to try its upgrade */
		for (size_t i = 0; i < NSIZES; i++) {
			pattern(buf, sizes[i], (uint32_t)(10 + i), 0);
			send_all(fd, buf, sizes[i]);
			check(fd, buf, sizes[i], (uint32_t)(100 + i));
			say("block of %zu bytes each way: ok", sizes[i]);
		}
		EXPECT(0, "shutdown SHUT_WR", shutdown(fd, SHUT_WR));
		EXPECT(0, "recv: the server's end of stream", recv(fd, buf, 1, 0));
		expect_path(fd);
		EXPECT(0, "close", close(fd));
	}
	free(buf);
	t_exit();
}

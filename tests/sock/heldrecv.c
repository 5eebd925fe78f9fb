/* SPDX-License-Identifier: MIT */
/*
 * A blocking receive that began before the upgrade, on a connection whose
 * peer sends nothing for a while (a proxy's thread for the way back, as
 * the bench's splicing proxy has): it must not hold back the peer's
 * direction.  One thread sleeps in recv from the connect on; the other,
 * 300 ms later (past WSD_UPGRADE_US: the upgrade is asked for then), sends
 * until the connection is upgraded at this end; the peer receives it all,
 * waits until its end is upgraded too, and answers 100000 bytes, which the
 * sleeping recv takes (MSG_WAITALL), every byte checked.
 *
 * Under wsd run the answer must come by ring (no byte received on the
 * stream): the peer switches its direction once this end's switch says it
 * reads its ring (RX_READY, wsd-protocol(7)), which a receive asleep in a
 * kernel read held back until a byte came by the stream.  Meanwhile this
 * end's sends, when the ring was full, had no doorbell to wake them and
 * looked again every 10 ms.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/sock/common.h"

#define ANSWER 100000
#define PIECE (64u << 10)
#define PIECES_MAX 2000         /* 125 MiB: the upgrade comes long before */

static int port;

/* Under wsd run: wait (5 s at most) until fd's end takes the path wanted, or die. */
static void until_upgraded(int fd, const char *who)
{
	const char *want = getenv("WSD_EXPECT_PATH"), *p = NULL;

	if (!want)
		return;
	for (int i = 0; i < 500 && (!(p = path_now(fd)) || strcmp(p, want)); i++)
		sleep_ms(10);
	if (!p || strcmp(p, want))
		die("%s: the connection did not take path %s (%s)", who, want, p ? p : "none");
}

static void peer_main(struct peer *ctl, void *arg)
{
	int lfd = t_listen(AF_INET, &port), fd;
	char *buf = malloc(ANSWER);   /* more than a piece */
	size_t got = 0;

	(void)arg;
	ctl_send(ctl, port);
	fd = t_accept(lfd);
	/* a piece, then whether another follows */
	do {
		recv_all(fd, buf, PIECE);
		expect_pattern(buf, PIECE, 91, got, "the peer's data");
		got += PIECE;
	} while (ctl_recv(ctl));
	say("received the data");
	until_upgraded(fd, "the peer");
	pattern(buf, ANSWER, 92, 0);
	send_all(fd, buf, ANSWER);
	say("answered %d bytes", ANSWER);
	EXPECT(0, "recv: the end", recv(fd, buf, 1, 0));
	EXPECT(0, "close", close(fd));
	close(lfd);
	free(buf);
}

struct reader {
	int fd;
	pthread_t th;
	char *buf;
	ssize_t got;
	int err;
};

static void *read_main(void *arg)
{
	struct reader *r = arg;

	r->got = recv(r->fd, r->buf, ANSWER, MSG_WAITALL);
	r->err = errno;
	return NULL;
}

int main(int argc, char **argv)
{
	struct reader r = { .buf = malloc(ANSWER) };
	char *buf = malloc(PIECE);
	const char *want = getenv("WSD_EXPECT_PATH");
	struct peer b;
	int n = 0;

	setenv("WSD_UPGRADE_US", "200000", 1);
	setenv("WSD_UPGRADE_BYTES", "1000000000000", 1);
	t_init(argc, argv);
	peer_start(&b, "peer", peer_main, NULL);
	r.fd = t_connect(AF_INET, ctl_recv(&b));
	if (pthread_create(&r.th, NULL, read_main, &r))
		die("thread");
	sleep_ms(300);
	/* pieces until this end sends by ring (plain, 64 of them) */
	for (bool more = true; more;) {
		pattern(buf, PIECE, 91, (uint64_t)n * PIECE);
		send_all(r.fd, buf, PIECE);
		more = ++n < PIECES_MAX &&
		       (want ? !path_now(r.fd) || strcmp(path_now(r.fd), want) : n < 64);
		ctl_send(&b, more);
	}
	say("sent the data, a receive asleep since the connect");
	pthread_join(r.th, NULL);
	errno = r.err;
	t_expect("recv MSG_WAITALL, asleep since the connect", (long)r.got, r.err, ANSWER, 0);
	expect_pattern(r.buf, ANSWER, 92, 0, "the answer");
	if (want) {
		const char *json = stat_now();
		unsigned long long tcp = json ? stat_field(json, r.fd, "tcp_rx") : 0;

		fprintf(stderr, "heldrecv: %llu bytes received on the stream\n", tcp);
		if (tcp)
			die("the answer came by the stream: the receive asleep held the peer back");
	}
	EXPECT(0, "shutdown SHUT_WR", shutdown(r.fd, SHUT_WR));
	peer_end(&b);
	EXPECT(0, "close", close(r.fd));
	free(buf);
	free(r.buf);
	t_exit();
}

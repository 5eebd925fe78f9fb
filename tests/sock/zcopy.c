/* SPDX-License-Identifier: MIT */
/*
 * Large transfers, where the switch moves data without the ring's copy: a
 * receiver blocked in a large recv offers its buffer and the sender writes
 * straight into it.  The offer must never show: a recv that ends by
 * SO_RCVTIMEO or by a signal while its buffer is offered returns as the
 * kernel's would and loses nothing, and two programs that each send a
 * large block before reading the other's finish, as TCP's buffers let them,
 * blocking or waiting in poll.
 * Under wsd run (WSD_EXPECT_PATH and WSD_BIN set by run_pair.sh) the
 * program also asks `wsd stat` that bytes did arrive by zero copy.
 */
#define _GNU_SOURCE
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "tests/sock/common.h"

#define MB (1u << 20)
#define CALLS 20

static int port;


/* Non-blocking: send all of buf, waiting in poll for POLLOUT only. */
static void send_polling(int fd, const uint8_t *buf, size_t len)
{
	set_nonblock(fd, true);
	while (len) {
		struct pollfd p = { .fd = fd, .events = POLLOUT };
		ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);

		if (n > 0) {
			buf += n;
			len -= (size_t)n;
		} else if (n < 0 && errno == EAGAIN) {
			if (poll(&p, 1, 20000) != 1)
				die("poll for POLLOUT: %s", ename(errno));
		} else {
			die("send: %s", n ? ename(errno) : "0");
		}
	}
	set_nonblock(fd, false);
}

static void client(struct peer *self, void *arg)
{
	uint8_t *buf = malloc(MB);
	int fd;

	(void)arg;
	port = t_peer_port(self, port);
	if (!buf)
		die("no memory");
	fd = t_connect(AF_INET, port);
	warmup(fd, true);
	for (int i = 0; i < CALLS; i++) {
		pattern(buf, MB, 100 + i, 0);
		send_all(fd, buf, MB);
		recv_all(fd, buf, MB);
		expect_pattern(buf, MB, 200 + i, 0, "a response");
	}
	say("%d calls of 1 MiB each way: ok", CALLS);
	for (int step = 0; step < 2; step++) {
		ctl_recv(self);      /* the other end's recv ended without data */
		pattern(buf, MB, 300 + step, 0);
		send_all(fd, buf, MB);
	}
	ctl_recv(self);
	pattern(buf, MB, 500, 0);
	send_all(fd, buf, MB);
	recv_all(fd, buf, MB);
	expect_pattern(buf, MB, 600, 0, "the block sent before reading");
	say("sent 1 MiB, then read 1 MiB: ok");
	EXPECT(0, "close", close(fd));
	/* a new connection: the last one may have gone back to the stream */
	fd = t_connect(AF_INET, port);
	warmup(fd, true);
	ctl_recv(self);
	pattern(buf, MB, 700, 0);
	send_polling(fd, buf, MB);
	recv_all(fd, buf, MB);
	expect_pattern(buf, MB, 800, 0, "the block sent before reading");
	say("sent 1 MiB waiting in poll, then read 1 MiB: ok");
	EXPECT(0, "close", close(fd));
	free(buf);
}

static void on_alarm(int sig)
{
	(void)sig;
}

int main(int argc, char **argv)
{
	struct sigaction sa = { .sa_handler = on_alarm };   /* no SA_RESTART */
	struct itimerval it = { { 0, 100000 }, { 0, 100000 } };
	struct timeval tv = { 0, 100000 };
	uint8_t *buf = malloc(MB);
	struct peer c;
	int lfd, fd;

	/*
	 * On shm the switch by default leaves zero copy to connections whose
	 * ring is not mapped (it is slower there, see wsd(7)); this program is
	 * about zero copy, so it asks for it, before its first socket.  An
	 * explicit WSD_ZCOPY_THRESHOLD (0 shows the checks can fail) wins.
	 */
	setenv("WSD_ZCOPY_THRESHOLD", "262144", 0);
	t_init(argc, argv);
	if (!buf)
		die("no memory");
	lfd = t_listen_peer(&c, "client", client, NULL, &port, T_FORK_FIRST);
	fd = t_accept(lfd);
	warmup(fd, false);

	say("-- requests and responses of 1 MiB");
	for (int i = 0; i < CALLS; i++) {
		recv_all(fd, buf, MB);
		expect_pattern(buf, MB, 100 + i, 0, "a request");
		pattern(buf, MB, 200 + i, 0);
		send_all(fd, buf, MB);
	}
	say("%d calls answered: ok", CALLS);
	expect_zcopy(fd);

	say("-- a large recv that times out");
	EXPECT(0, "SO_RCVTIMEO 100 ms", setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)));
	EXPECT_ERR(EAGAIN, "recv 1 MiB, nothing sent", recv(fd, buf, MB, 0));
	EXPECT_ERR(EAGAIN, "recv 1 MiB again", recv(fd, buf, MB, 0));
	tv = (struct timeval){ 0, 0 };
	EXPECT(0, "SO_RCVTIMEO off", setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)));
	ctl_send(&c, 1);
	recv_all(fd, buf, MB);
	expect_pattern(buf, MB, 300, 0, "the block after the timeouts");
	say("then 1 MiB: ok");

	say("-- a large recv that a signal interrupts");
	MUST(sigaction(SIGALRM, &sa, NULL));
	/* every 100 ms: one that comes before the recv blocks is followed by another */
	MUST(setitimer(ITIMER_REAL, &it, NULL));
	EXPECT_ERR(EINTR, "recv 1 MiB, nothing sent", recv(fd, buf, MB, 0));
	it = (struct itimerval){ 0 };
	MUST(setitimer(ITIMER_REAL, &it, NULL));
	ctl_send(&c, 1);
	recv_all(fd, buf, MB);
	expect_pattern(buf, MB, 301, 0, "the block after the signal");
	say("then 1 MiB: ok");

	say("-- both ends send 1 MiB before reading");
	ctl_send(&c, 1);
	pattern(buf, MB, 600, 0);
	send_all(fd, buf, MB);
	recv_all(fd, buf, MB);
	expect_pattern(buf, MB, 500, 0, "the block sent before reading");
	say("sent 1 MiB, then read 1 MiB: ok");

	EXPECT(0, "recv: the client closed", recv(fd, buf, 1, 0));
	EXPECT(0, "close", close(fd));

	say("-- the same on a new connection, non-blocking, waiting in poll for POLLOUT alone");
	fd = t_accept(lfd);
	warmup(fd, false);
	ctl_send(&c, 1);
	pattern(buf, MB, 800, 0);
	send_polling(fd, buf, MB);
	recv_all(fd, buf, MB);
	expect_pattern(buf, MB, 700, 0, "the block sent before reading");
	say("sent 1 MiB waiting in poll, then read 1 MiB: ok");

	EXPECT(0, "recv: the client closed", recv(fd, buf, 1, 0));
	EXPECT(0, "close", close(fd));
	EXPECT(0, "close the listener", close(lfd));
	peer_end(&c);
	free(buf);
	t_exit();
}

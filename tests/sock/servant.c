/* SPDX-License-Identifier: MIT */
/* The two ready-made peers, the servant and the echo server: see common.h. */
#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/sock/common.h"

/* ---- the servant --------------------------------------------------------- */

void servant_data(void *buf, size_t len)
{
	pattern(buf, len, 55, 0);
}

void client_data(void *buf, size_t len)
{
	pattern(buf, len, 56, 0);
}

void recv_servant_data(int fd, size_t len)
{
	char *buf = malloc(len + 1), *want = malloc(len + 1);

	if (!buf || !want)
		die("out of memory");
	recv_all(fd, buf, len);
	servant_data(want, len);
	CHECK(!memcmp(buf, want, len), "the servant's %zu bytes arrived changed", len);
	free(buf);
	free(want);
}

static void servant_send(int fd, int len)
{
	char *buf = malloc(len + 1);
	char what[64];

	if (!buf)
		die("out of memory");
	servant_data(buf, len);
	snprintf(what, sizeof(what), "send %d", len);
	EXPECT(len, what, send(fd, buf, len, MSG_NOSIGNAL));
	free(buf);
}

static void servant_main(struct peer *ctl, void *arg)
{
	int family = *(int *)arg, lfd, port, fds[64], n = 0;

	lfd = t_listen(family, &port);
	ctl_send(ctl, port);
	for (;;) {
		int cmd = ctl_recv(ctl), c = ctl_recv(ctl), a = ctl_recv(ctl), fd;
		char what[64];

		if (cmd == S_QUIT)
			break;
		if (cmd == S_ACCEPT) {
			if (n == 64)
				die("servant: too many connections");
			fds[n] = t_accept(lfd);
			warmup(fds[n], false);
			say("conn %d: accepted", n);
			n++;
			ctl_send(ctl, 0);
			continue;
		}
		if (c < 0 || c >= n)
			die("servant: no connection %d", c);
		fd = fds[c];
		switch (cmd) {
		case S_SEND:
			servant_send(fd, a);
			break;
		case S_SEND_LATER:
			ctl_send(ctl, 0);
			sleep_ms(30);
			servant_send(fd, a);
			continue;
		case S_RECV: {
			char *buf = malloc(a + 1), *want = malloc(a + 1);

			recv_all(fd, buf, a);
			client_data(want, a);
			CHECK(!memcmp(buf, want, a), "conn %d: data arrived changed", c);
			say("conn %d: received %d bytes", c, a);
			free(buf);
			free(want);
			break;
		}
		case S_RECV_EOF: {
			char b;

			snprintf(what, sizeof(what), "conn %d: recv", c);
			errno = 0;
			long r = recv(fd, &b, 1, 0);

			t_expect(what, r, errno, a ? -1 : 0, a);
			break;
		}
		case S_SEND_ERR:
			snprintf(what, sizeof(what), "conn %d: send", c);
			EXPECT_ERR(a, what, send(fd, "x", 1, MSG_NOSIGNAL));
			break;
		case S_SHUT_WR:
			snprintf(what, sizeof(what), "conn %d: shutdown SHUT_WR", c);
			EXPECT(0, what, shutdown(fd, SHUT_WR));
			break;
		case S_SHUT_RD:
			snprintf(what, sizeof(what), "conn %d: shutdown SHUT_RD", c);
			EXPECT(0, what, shutdown(fd, SHUT_RD));
			break;
		case S_CLOSE:
			snprintf(what, sizeof(what), "conn %d: close", c);
			EXPECT(0, what, close(fd));
			break;
		case S_RESET: {
			struct linger l = { .l_onoff = 1, .l_linger = 0 };

			snprintf(what, sizeof(what), "conn %d: SO_LINGER {1, 0}", c);
			EXPECT(0, what, setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l)));
			snprintf(what, sizeof(what), "conn %d: close (reset)", c);
			EXPECT(0, what, close(fd));
			break;
		}
		case S_POLL: {
			struct pollfd pfd = { .fd = fd, .events = POLLIN | POLLOUT | POLLRDHUP };

			snprintf(what, sizeof(what), "conn %d: poll", c);
			EXPECT(1, what, poll(&pfd, 1, 0));
			say("  revents %s", pollstr(pfd.revents));
			break;
		}
		case S_FILL: {
			int total = fill_until_eagain(fd, 55);

			say("conn %d: filled until EAGAIN", c);
			ctl_send(ctl, total);
			continue;
		}
		case S_DRAIN:
			drain_exactly(fd, a, 56);
			say("conn %d: drained what was sent, data ok", c);
			break;
		case S_EMPTY: {
			char b;

			snprintf(what, sizeof(what), "conn %d: recv MSG_DONTWAIT", c);
			EXPECT_ERR(EAGAIN, what, recv(fd, &b, 1, MSG_DONTWAIT));
			break;
		}
		default:
			die("servant: unknown command %d", cmd);
		}
		ctl_send(ctl, 0);
	}
	close(lfd);
}

void servant_start(struct servant *s, int family)
{
	s->family = family;
	s->nconn = 0;
	peer_start(&s->p, "servant", servant_main, &s->family);
	s->port = ctl_recv(&s->p);
}

void servant_go(struct servant *s, int conn, enum servant_cmd cmd, int arg)
{
	ctl_send(&s->p, cmd);
	ctl_send(&s->p, conn);
	ctl_send(&s->p, arg);
}

int servant_wait(struct servant *s)
{
	return ctl_recv(&s->p);
}

int servant_do(struct servant *s, int conn, enum servant_cmd cmd, int arg)
{
	servant_go(s, conn, cmd, arg);
	return servant_wait(s);
}

int servant_connect(struct servant *s)
{
	int fd;

	servant_go(s, s->nconn, S_ACCEPT, 0);
	fd = t_connect(s->family, s->port);
	warmup(fd, true);
	servant_wait(s);
	s->nconn++;
	return fd;
}

void servant_end(struct servant *s)
{
	servant_go(s, 0, S_QUIT, 0);
	peer_end(&s->p);
}

/* ---- the echo server ----------------------------------------------------- */

void echo_request(int fd, uint32_t len, uint32_t seed)
{
	char *req = malloc(len + 1);
	uint32_t n = len;

	if (!req)
		die("out of memory");
	pattern(req, len, seed, 0);
	send_all(fd, &n, sizeof(n));
	send_all(fd, req, len);
	free(req);
}

void echo_response(int fd, uint32_t len, uint32_t seed)
{
	char *req = malloc(len + 1), *resp = malloc(len + 1);

	if (!req || !resp)
		die("out of memory");
	pattern(req, len, seed, 0);
	recv_all(fd, resp, len);
	for (uint32_t i = 0; i < len; i++)
		if ((resp[i] ^ 0x5a) != req[i])
			die("echo: byte %u of %u came back wrong", i, len);
	free(req);
	free(resp);
}

void echo_call(int fd, uint32_t len, uint32_t seed)
{
	echo_request(fd, len, seed);
	echo_response(fd, len, seed);
}

void echo_calls(int fd, int n, uint32_t seed)
{
	for (int i = 0; i < n; i++)
		echo_call(fd, 1 + (uint32_t)(i * 7919 + seed) % 100000, seed + i);
}

int echo_serve(int fd)
{
	int served = 0;

	for (;;) {
		uint32_t len;
		ssize_t n = recv(fd, &len, sizeof(len), MSG_WAITALL);
		char *buf;

		if (n == 0)
			return served;
		if (n != sizeof(len) || len > (64u << 20))
			return -1;
		buf = malloc(len + 1);
		if (!buf)
			return -1;
		if (len && recv(fd, buf, len, MSG_WAITALL) != (ssize_t)len) {
			free(buf);
			return -1;
		}
		for (uint32_t i = 0; i < len; i++)
			buf[i] ^= 0x5a;
		if (send(fd, buf, len, MSG_NOSIGNAL) != (ssize_t)len) {
			free(buf);
			return -1;
		}
		free(buf);
		served++;
	}
}

struct echo_conn {
	int fd;
	int served;
	pthread_t th;
};

static void *echo_thread(void *arg)
{
	struct echo_conn *c = arg;

	warmup(c->fd, false);
	c->served = echo_serve(c->fd);
	close(c->fd);
	return NULL;
}

static void echo_main(struct peer *ctl, void *arg)
{
	struct echo *e = arg;
	struct echo_conn *c = calloc(e->nconn, sizeof(*c));
	int lfd, port;

	lfd = t_listen(e->family, &port);
	ctl_send(ctl, port);
	for (int i = 0; i < e->nconn; i++) {
		c[i].fd = t_accept(lfd);
		pthread_create(&c[i].th, NULL, echo_thread, &c[i]);
	}
	for (int i = 0; i < e->nconn; i++) {
		pthread_join(c[i].th, NULL);
		if (c[i].served < 0)
			fail("conn %d: a request went wrong", i);
		else
			say("conn %d: served %d requests, then EOF", i, c[i].served);
	}
	/* open until the end, as servers keep it (basic.c tests a one-shot one) */
	close(lfd);
	free(c);
}

void echo_start(struct echo *e, int family, int nconn)
{
	e->family = family;
	e->nconn = nconn;
	peer_start(&e->p, "echo", echo_main, e);
	e->port = ctl_recv(&e->p);
}

int echo_connect(struct echo *e)
{
	int fd = t_connect(e->family, e->port);

	warmup(fd, true);
	return fd;
}

void echo_end(struct echo *e)
{
	peer_end(&e->p);
}

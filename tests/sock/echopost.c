/* SPDX-License-Identifier: MIT */
/*
 * An HTTP/1.0 POST echoed as it is read, the way CPython's asyncio tests
 * (test_sock_lowlevel's huge content) do it: the server reads the request's
 * header, answers its own header, then echoes the body in 64 KiB pieces as
 * it reads them, and ends with shutdown(SHUT_WR) and close once it read the
 * whole body.  The client is non-blocking and sends the body while it
 * receives, in one select or epoll loop, until the server's end.  Every
 * byte is checked, and no call may fail: plain TCP never resets such a
 * connection, so wsd must not either.
 *
 * The server runs as a thread of the client's own process (as the asyncio
 * test's does) and as a forked process; bodies of 1 MB and 4 MB; several
 * rounds each, since whether the switch's upgrade lands before, during or
 * after the body is timing's.
 */
#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/sock/common.h"

#define ROUNDS 6
#define PIECE  (64 << 10)
#define SEED   31

static const char reply[] = "HTTP/1.0 200 OK\r\nContent-type: text/plain\r\n\r\n";

/* ---- the server: one connection, read the header, echo the body, end ---- */

/* The request's header, byte by byte up to its empty line: the body's length. */
static long read_header(int fd)
{
	char h[256];
	size_t n = 0;
	long len = -1;

	while (n < sizeof(h) - 1) {
		ssize_t r = recv(fd, h + n, 1, 0);

		if (r != 1)
			return -1;
		n++;
		if (n >= 4 && !memcmp(h + n - 4, "\r\n\r\n", 4))
			break;
	}
	h[n] = 0;
	if (sscanf(h, "POST /loop HTTP/1.0\r\nContent-Length: %ld", &len) != 1)
		return -1;
	return len;
}

/* 0, or an errno (a step that failed): the server's whole connection. */
static int serve_one(int fd)
{
	char *buf = malloc(PIECE);
	long left = read_header(fd);
	int e = 0;

	if (left < 0 || !buf) {
		free(buf);
		return EPROTO;
	}
	send_all(fd, reply, sizeof(reply) - 1);
	while (left > 0 && !e) {
		ssize_t r = recv(fd, buf, left < PIECE ? (size_t)left : PIECE, 0);

		if (r <= 0) {
			e = r ? errno : EPIPE;
			break;
		}
		left -= r;
		for (ssize_t off = 0; off < r && !e;) {
			ssize_t w = send(fd, buf + off, (size_t)(r - off), MSG_NOSIGNAL);

			if (w < 0)
				e = errno;
			else
				off += w;
		}
	}
	free(buf);
	if (!e && shutdown(fd, SHUT_WR))
		e = errno;
	close(fd);
	return e;
}

struct srv {
	int lfd;
	int err;
};

static void *srv_thread(void *arg)
{
	struct srv *sv = arg;

	sv->err = serve_one(t_accept(sv->lfd));
	return NULL;
}

/* The forked server: its own listener, its port to the parent. */
static void srv_peer(struct peer *self, void *arg)
{
	int port, lfd = t_listen(AF_INET, &port);

	(void)arg;
	ctl_send(self, port);
	for (int i = 0; i < 2 * 2 * ROUNDS; i++) {
		int e = serve_one(t_accept(lfd));

		if (e)
			fail("server: connection %d: %s", i, ename(e));
	}
	say("served %d connections", 2 * 2 * ROUNDS);
}

/* ---- the client: send and receive at once in an event loop -------------- */

enum loop { L_SELECT, L_EPOLL };

/*
 * Wait for fd: readable always asked, writable while want_out.  Sets *in,
 * *out; false on an error of the wait itself.
 */
static bool wait_fd(enum loop l, int ep, int fd, bool want_out, bool *in, bool *out)
{
	*in = *out = false;
	if (l == L_SELECT) {
		fd_set rd, wr;
		struct timeval tv = { 10, 0 };

		FD_ZERO(&rd);
		FD_ZERO(&wr);
		FD_SET(fd, &rd);
		if (want_out)
			FD_SET(fd, &wr);
		if (select(fd + 1, &rd, &wr, NULL, &tv) <= 0)
			return false;
		*in = FD_ISSET(fd, &rd);
		*out = FD_ISSET(fd, &wr);
		return true;
	}
	struct epoll_event ev = { .events = EPOLLIN | (want_out ? EPOLLOUT : 0) };

	if (epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev))
		return false;
	if (epoll_wait(ep, &ev, 1, 10000) != 1)
		return false;
	*in = ev.events & (EPOLLIN | EPOLLHUP | EPOLLERR);
	*out = ev.events & (EPOLLOUT | EPOLLERR);
	return true;
}

/* Under wsd: what wsd stat says of fd (its path, its reason), on stderr. */
static void say_stat(int fd)
{
	const char *json = getenv("WSD_BIN") ? stat_now() : NULL;
	char key[32];
	const char *p, *e;

	snprintf(key, sizeof(key), "\"fd\":%d,", fd);
	if (json && (p = strstr(json, key)) && (e = strchr(p, '}')))
		fprintf(stderr, "wsd stat: {%.*s}\n", (int)(e - p), p);
}

/* One POST of len bytes, echoed; what went wrong, or NULL. */
static const char *post(int port, enum loop l, long len, int *err)
{
	static char what[128];
	char head[128], *body = malloc((size_t)len), *in = malloc(PIECE);
	int fd = t_connect(AF_INET, port), ep = -1;
	int hn = snprintf(head, sizeof(head), "POST /loop HTTP/1.0\r\nContent-Length: %ld\r\n\r\n",
			  len);
	long sent = 0, got = 0, hgot = 0, hlen = (long)sizeof(reply) - 1;
	const char *bad = NULL;
	bool first = true;

	*err = 0;
	pattern(body, (size_t)len, SEED, 0);
	set_nonblock(fd, true);
	if (l == L_EPOLL) {
		struct epoll_event ev = { .events = EPOLLIN };

		ep = MUST(epoll_create1(0));
		MUST(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev));
	}
	/* the header whole first (it fits any socket buffer), as sock_sendall does */
	for (int off = 0; off < hn;) {
		ssize_t w = send(fd, head + off, (size_t)(hn - off), MSG_NOSIGNAL);

		if (w > 0) {
			off += (int)w;
		} else if (w < 0 && errno == EAGAIN) {
			struct pollfd p = { .fd = fd, .events = POLLOUT };

			poll(&p, 1, 1000);
		} else {
			*err = errno;
			bad = "send (the header)";
			goto out;
		}
	}
	for (;;) {
		bool can_in, can_out;
		ssize_t r;

		if (!wait_fd(l, ep, fd, sent < len, &can_in, &can_out)) {
			*err = errno;
			bad = l == L_SELECT ? "select" : "epoll";
			goto out;
		}
		if (can_out && sent < len) {
			r = send(fd, body + sent, (size_t)(len - sent), MSG_NOSIGNAL);
			if (r > 0) {
				sent += r;
			} else if (errno != EAGAIN) {
				*err = errno;
				bad = "send";
				goto out;
			}
		}
		if (!can_in)
			continue;
		r = recv(fd, in, PIECE, 0);
		if (r < 0 && errno == EAGAIN) {
			continue;
		} else if (r < 0) {
			*err = errno;
			snprintf(what, sizeof(what), "recv (%s, after %ld of the answer, %ld sent)",
				 first ? "the first" : "a later", hgot + got, sent);
			bad = what;
			goto out;
		} else if (r == 0) {
			break;
		}
		first = false;
		ssize_t off = 0;

		for (; off < r && hgot < hlen; off++, hgot++)
			if (in[off] != reply[hgot]) {
				bad = "the answer's header differs";
				goto out;
			}
		if (r > off) {
			if (got + (r - off) > len) {
				bad = "more body than was sent";
				goto out;
			}
			expect_pattern(in + off, (size_t)(r - off), SEED, (uint64_t)got, "the echo");
			got += r - off;
		}
	}
	if (hgot < hlen || got != len || sent != len) {
		snprintf(what, sizeof(what), "the end after %ld of %ld echoed (%ld sent)", got, len,
			 sent);
		bad = what;
	}
out:
	if (bad)
		say_stat(fd);
	if (ep >= 0)
		close(ep);
	close(fd);
	free(body);
	free(in);
	return bad;
}

int main(int argc, char **argv)
{
	static const long sizes[] = { 1000000, 4000000 };
	struct peer p;
	int lfd, port;

	t_init(argc, argv);
	t_watchdog(120);
	/*
	 * Forked before this process has a socket, so before the switch's
	 * threads run (gcc 12's ASan allocator is not fork-safe, common.h).
	 */
	peer_start(&p, "server", srv_peer, NULL);
	for (int forked = 0; forked < 2; forked++) {
		lfd = forked ? -1 : t_listen(AF_INET, &port);
		if (forked)
			port = ctl_recv(&p);
		for (int l = L_SELECT; l <= L_EPOLL; l++) {
			for (size_t z = 0; z < sizeof(sizes) / sizeof(sizes[0]); z++) {
				int ok = 0;

				for (int i = 0; i < ROUNDS; i++) {
					struct srv sv = { .lfd = lfd };
					pthread_t t;
					const char *why;
					int e;

					if (!forked)
						MUST(pthread_create(&t, NULL, srv_thread, &sv) ? -1 : 0);
					why = post(port, (enum loop)l, sizes[z], &e);
					if (!forked)
						pthread_join(t, NULL);
					if (why) {
						fprintf(stderr, "%s server, %s, %ld bytes, round %d: %s%s%s\n",
							forked ? "forked" : "thread",
							l == L_SELECT ? "select" : "epoll", sizes[z], i,
							why, e ? ": " : "", e ? ename(e) : "");
					} else if (sv.err) {
						fprintf(stderr, "thread server, round %d: %s\n", i,
							ename(sv.err));
					} else {
						ok++;
					}
				}
				say("%s server, %s loop, %ld bytes: %d of %d echoed whole",
				    forked ? "forked" : "thread", l == L_SELECT ? "select" : "epoll",
				    sizes[z], ok, ROUNDS);
				CHECK(ok == ROUNDS, "a POST was not echoed whole");
			}
		}
		if (forked)
			peer_end(&p);
		else
			close(lfd);
	}
	t_exit();
}

/* SPDX-License-Identifier: MIT */
/* The SPI test suites' shared helpers (spi.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/spi.h"

void spi_start(struct spi *p)
{
	WSPDATA d;

	memset(&p->procs, 0, sizeof(p->procs));
	p->procs.cbSize = sizeof(p->procs);
	setenv("WSD_TRANSPORT", t_transport(), 1);
	ck_assert_int_eq(WSPStartup(WSP_VERSION, &d, &p->info, NULL, &p->procs), 0);
	p->buf = aligned_alloc(4096, BUF);
	memset(p->buf, 0, BUF);
	p->cleaned = 0;
}

void spi_stop(struct spi *p)
{
	int err;

	(void)WSPCloseSocket(p->s, &err);
	if (!p->cleaned)
		ck_assert_int_eq(WSPCleanup(p->info.provider, &err), 0);
	free(p->buf);
}

in_port_t spi_last_port;

void spi_pair(struct spi *me, spi_peer_fn fn, void *arg)
{
	int to[2], from[2], err = 0;
	struct sockaddr_in sa = t_addr(t_port());
	char c;

	spi_last_port = sa.sin_port;
	ck_assert(pipe(to) == 0 && pipe(from) == 0);
	fflush(NULL);
	me->peer = fork();
	if (me->peer == 0) {
		struct spi p;
		SOCKET l;

		alarm(60);
		t_is_peer = 1;
		close(to[1]);
		close(from[0]);
		p.oob_in = to[0];
		p.oob_out = from[1];
		spi_start(&p);
		l = WSPSocket(AF_INET, SOCK_STREAM, 0, &p.info, 0, 0, &err);
		if (l == INVALID_SOCKET || WSPBind(l, (struct sockaddr *)&sa, sizeof(sa), &err) ||
		    WSPListen(l, 4, &err))
			_exit(90);
		if (write(p.oob_out, "r", 1) != 1)
			_exit(91);
		p.s = WSPAccept(l, NULL, NULL, NULL, 0, &err);
		if (p.s == INVALID_SOCKET)
			_exit(92);
		p.l = l;
		_exit(fn(&p, arg));
	}
	close(to[0]);
	close(from[1]);
	me->oob_out = to[1];
	me->oob_in = from[0];
	ck_assert(read(me->oob_in, &c, 1) == 1);
	spi_start(me);
	me->s = WSPSocket(AF_INET, SOCK_STREAM, 0, &me->info, 0, 0, &err);
	ck_assert(me->s != INVALID_SOCKET);
	ck_assert_msg(WSPConnect(me->s, (struct sockaddr *)&sa, sizeof(sa), NULL, NULL, NULL, NULL,
				 &err) == 0, "connect: %d", err);
}

void xsend(int fd, const void *p, size_t n)
{
	if (write(fd, p, n) != (ssize_t)n)
		_exit(98);
}

void xrecv(int fd, void *p, size_t n)
{
	size_t got = 0;

	while (got < n) {
		ssize_t r = read(fd, (char *)p + got, n - got);

		if (r <= 0)
			_exit(98);
		got += (size_t)r;
	}
}

void sync_fd(int in, int out)
{
	char c = 's';

	xsend(out, &c, 1);
	xrecv(in, &c, 1);
}

int spi_finish(struct spi *me)
{
	int status;

	spi_stop(me);
	close(me->oob_out);
	close(me->oob_in);
	ck_assert(waitpid(me->peer, &status, 0) == me->peer);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

#define PCHECK(c) PEER_CHECK(c)

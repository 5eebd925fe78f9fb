/* SPDX-License-Identifier: MIT */
/* The attackers' peer switch: see peer.h. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tests/attack/peer.h"

WSPPROC_TABLE p_procs;
static WSAPROTOCOL_INFO proto;

int p_start(void)
{
	WSPDATA d;
	WSPUPCALLTABLE up = { sizeof(up), NULL };

	p_procs.cbSize = sizeof(p_procs);
	return WSPStartup(WSP_VERSION, &d, &proto, &up, &p_procs) ? -1 : 0;
}

SOCKET p_request(const char *addr, int port, const struct p_tuple *t)
{
	struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	WSABUF caller = { sizeof(*t), (char *)t };
	SOCKET ws;
	int err;

	if (inet_pton(AF_INET, addr, &to.sin_addr) != 1)
		return INVALID_SOCKET;
	ws = p_procs.lpWSPSocket(AF_INET, SOCK_STREAM, 0, &proto, 0, 0, &err);
	if (ws == INVALID_SOCKET)
		return ws;
	if (p_procs.lpWSPConnect(ws, (struct sockaddr *)&to, sizeof(to), &caller, NULL, NULL,
				 NULL, &err)) {
		p_procs.lpWSPCloseSocket(ws, &err);
		return INVALID_SOCKET;
	}
	return ws;
}

static void addr_of(const struct sockaddr_in *in, struct p_addr *a)
{
	memset(a, 0, sizeof(*a));
	a->family = AF_INET;
	a->port = ntohs(in->sin_port);
	memcpy(a->addr, &in->sin_addr, 4);
}

void p_tuple_of(int fd, struct p_tuple *t)
{
	struct sockaddr_in l, p;
	socklen_t ll = sizeof(l), pl = sizeof(p);

	memset(t, 0, sizeof(*t));
	t->magic = P_TUPLE_MAGIC;
	t->version = P_VERSION;
	getsockname(fd, (struct sockaddr *)&l, &ll);
	getpeername(fd, (struct sockaddr *)&p, &pl);
	addr_of(&l, &t->client);
	addr_of(&p, &t->server);
}

int p_send(SOCKET ws, const struct p_hello *h)
{
	WSABUF b = { sizeof(*h), (char *)h };
	uint32_t n;
	int err;

	return p_procs.lpWSPSend(ws, &b, 1, &n, 0, NULL, NULL, NULL, &err) ? -1 : 0;
}

static int64_t now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

int p_recv(SOCKET ws, struct p_hello *h, int ms)
{
	WSABUF b = { sizeof(*h), (char *)h };
	WSAOVERLAPPED ov = { .hEvent = (void *)1 };
	uint32_t n = 0, fl = 0;
	int err = 0;
	int64_t end = now_ms() + ms;

	memset(h, 0, sizeof(*h));
	if (p_procs.lpWSPRecv(ws, &b, 1, &n, &fl, &ov, NULL, NULL, &err) == 0)
		return n == sizeof(*h) ? 0 : -1;
	if (err != WSA_IO_PENDING)
		return -1;
	while (!p_procs.lpWSPGetOverlappedResult(ws, &ov, &n, 0, &fl, &err)) {
		if (err != WSA_IO_INCOMPLETE || now_ms() > end)
			return -1;
		usleep(500);
	}
	return n == sizeof(*h) ? 0 : -1;
}

int p_write(SOCKET ws, const void *buf, uint32_t len, uint64_t handle, const uint8_t *desc,
	    uint64_t off)
{
	WSABUFEX b = { len, (char *)buf, handle };
	WSAOVERLAPPED ov = { .hEvent = (void *)1 };
	uint32_t n, fl;
	int err = 0;

	if (p_procs.lpWSPRdmaWrite(ws, &b, 1, (void *)desc, 32, (uint32_t)off, &n, 0, &ov, NULL,
				   NULL, &err) == 0)
		return 0;
	if (err != WSA_IO_PENDING)
		return -1;
	return p_procs.lpWSPGetOverlappedResult(ws, &ov, &n, 1, &fl, &err) ? 0 : -1;
}

/* SPDX-License-Identifier: MIT */
/*
 * An integrator's program, as one could write it from the man pages:
 * tests/pkgconfig_check.sh builds it against the installed headers and
 * libwsd.so alone (pkg-config --cflags --libs wsd), nothing from the tree.
 *
 * WSPStartup on the shm transport; a forked child listens on loopback and
 * accepts, the parent connects.  The child offers a buffer
 * (WSPRegisterRdmaMemory) and sends its descriptor in a message; the
 * parent reads part of it with WSPRdmaRead into a registered buffer,
 * checks every byte, says so in a message, and both end with WSPCleanup.
 * The program also checks that linking libwsd.so left its C library calls
 * to the C library.
 *
 * Exit status: 0 when everything went as the pages say, 1 otherwise (each
 * failure named on stderr).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <wsd/wsp.h>

#define OFFERED (1u << 20)     /* the child's buffer */
#define OFFSET 4093u           /* where the read starts in it: not aligned */

static const char *who = "integrator";

#define CHECK(cond, ...)                                                     \
	do {                                                                 \
		if (!(cond)) {                                               \
			fprintf(stderr, "%s: %s:%d: ", who, __FILE__, __LINE__); \
			fprintf(stderr, __VA_ARGS__);                        \
			fputc('\n', stderr);                                 \
			exit(1);                                             \
		}                                                            \
	} while (0)

static uint8_t pattern(uint32_t i)
{
	return (uint8_t)(i * 131u + (i >> 9) + 7u);
}

/* A provider instance on the transport WSD_TRANSPORT names. */
static void start(WSAPROTOCOL_INFO *info)
{
	WSPDATA data;
	WSPUPCALLTABLE up = { sizeof(up), NULL };
	WSPPROC_TABLE procs = { .cbSize = sizeof(procs) };

	CHECK(WSPStartup(WSP_VERSION, &data, info, &up, &procs) == 0, "WSPStartup failed");
	CHECK(data.wVersion == WSP_VERSION, "WSPStartup: version %#x", data.wVersion);
	CHECK(!strcmp(info->transport, "shm"), "WSPStartup: transport %s, not shm", info->transport);
}

static SOCKET new_socket(WSAPROTOCOL_INFO *info)
{
	int err = 0;
	SOCKET s = WSPSocket(AF_INET, SOCK_STREAM, 0, info, 0, 0, &err);

	CHECK(s != INVALID_SOCKET, "WSPSocket: error %d", err);
	return s;
}

/* One message of exactly n bytes into buf, waited for. */
static void recv_msg(SOCKET s, void *buf, uint32_t n)
{
	WSABUF b = { n, buf };
	uint32_t got = 0, flags = 0;
	int err = 0;

	CHECK(WSPRecv(s, &b, 1, &got, &flags, NULL, NULL, NULL, &err) == 0, "WSPRecv: error %d", err);
	CHECK(got == n, "WSPRecv: %u bytes, not %u", got, n);
}

static void send_msg(SOCKET s, const void *buf, uint32_t n)
{
	WSABUF b = { n, (char *)buf };
	uint32_t sent = 0;
	int err = 0;

	CHECK(WSPSend(s, &b, 1, &sent, 0, NULL, NULL, NULL, &err) == 0, "WSPSend: error %d", err);
	CHECK(sent == n, "WSPSend: %u bytes, not %u", sent, n);
}

/* The child: accept, offer a buffer, wait for the parent's word. */
static int server(struct sockaddr_in sa, int ready)
{
	WSAPROTOCOL_INFO info;
	uint8_t desc[WSP_RDMA_DESCRIPTOR_SIZE], *buf;
	uint32_t dl = sizeof(desc);
	char word[4];
	SOCKET l, s;
	int err = 0;

	who = "integrator (accepting child)";
	alarm(60);
	start(&info);
	l = new_socket(&info);
	CHECK(WSPBind(l, (struct sockaddr *)&sa, sizeof(sa), &err) == 0, "WSPBind: error %d", err);
	CHECK(WSPListen(l, 1, &err) == 0, "WSPListen: error %d", err);
	CHECK(write(ready, "r", 1) == 1, "cannot tell the parent");
	close(ready);
	s = WSPAccept(l, NULL, NULL, NULL, 0, &err);
	CHECK(s != INVALID_SOCKET, "WSPAccept: error %d", err);

	buf = aligned_alloc(4096, OFFERED);
	CHECK(buf, "out of memory");
	for (uint32_t i = 0; i < OFFERED; i++)
		buf[i] = pattern(i);
	CHECK(WSPRegisterRdmaMemory(s, buf, OFFERED, MEM_READ, desc, &dl, &err) == 0,
	      "WSPRegisterRdmaMemory: error %d", err);
	CHECK(dl == WSP_RDMA_DESCRIPTOR_SIZE, "descriptor of %u bytes", dl);
	send_msg(s, desc, sizeof(desc));
	/* the buffer stays offered until the reader is done with it */
	recv_msg(s, word, sizeof(word));
	CHECK(!memcmp(word, "done", 4), "the reader said %.4s", word);
	CHECK(WSPDeregisterRdmaMemory(s, desc, sizeof(desc), &err) == 0,
	      "WSPDeregisterRdmaMemory: error %d", err);
	CHECK(WSPCloseSocket(s, &err) == 0, "WSPCloseSocket: error %d", err);
	CHECK(WSPCloseSocket(l, &err) == 0, "WSPCloseSocket: error %d", err);
	CHECK(WSPCleanup(info.provider, &err) == 0, "WSPCleanup: error %d", err);
	free(buf);
	return 0;
}

/* A loopback port the kernel has free now, for the listener. */
static in_port_t free_port(void)
{
	struct sockaddr_in sa = { .sin_family = AF_INET,
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(sa);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	CHECK(fd >= 0, "socket failed");
	CHECK(bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
	      getsockname(fd, (struct sockaddr *)&sa, &len) == 0, "no free port");
	close(fd);
	return sa.sin_port;
}

/* Linking libwsd.so must leave the C library's calls to the C library. */
static void libc_untouched(void)
{
	static const struct { const char *name; void *fn; } calls[] = {
		{ "read", (void *)read }, { "close", (void *)close },
		{ "free", (void *)free }, { "socket", (void *)socket },
	};

	for (size_t i = 0; i < sizeof(calls) / sizeof(calls[0]); i++) {
		Dl_info d;

		CHECK(dladdr(calls[i].fn, &d) && d.dli_fname, "%s: dladdr knows nothing",
		      calls[i].name);
		CHECK(strstr(d.dli_fname, "libc.so"), "%s comes from %s, not the C library",
		      calls[i].name, d.dli_fname);
	}
}

int main(void)
{
	struct sockaddr_in sa = { .sin_family = AF_INET,
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	WSAPROTOCOL_INFO info;
	uint8_t desc[WSP_RDMA_DESCRIPTOR_SIZE], *buf;
	WSAOVERLAPPED ov = { 0 };
	char transport[16] = "";
	uint32_t n = 0, bytes = 0, len;
	uint64_t h;
	socklen_t ol;
	int ready[2], status, err = 0, max = 0;
	pid_t child;
	SOCKET s;
	char c;

	libc_untouched();
	/* the same-host transport: both ends are processes of this user */
	setenv("WSD_TRANSPORT", "shm", 1);
	sa.sin_port = free_port();
	CHECK(pipe(ready) == 0, "pipe failed");
	fflush(NULL);
	child = fork();
	CHECK(child >= 0, "fork failed");
	if (child == 0) {
		close(ready[0]);
		_exit(server(sa, ready[1]));
	}
	close(ready[1]);
	CHECK(read(ready[0], &c, 1) == 1, "the accepting child died before it listened");
	close(ready[0]);
	alarm(60);

	start(&info);
	s = new_socket(&info);
	CHECK(WSPConnect(s, (struct sockaddr *)&sa, sizeof(sa), NULL, NULL, NULL, NULL, &err) == 0,
	      "WSPConnect: error %d", err);
	CHECK(WSPIoctl(s, SIO_WSP_TRANSPORT, NULL, 0, transport, sizeof(transport), &n, NULL, NULL,
		       NULL, &err) == 0, "WSPIoctl(SIO_WSP_TRANSPORT): error %d", err);
	CHECK(!strcmp(transport, "shm"), "connected over %s, not shm", transport);
	ol = sizeof(max);
	CHECK(WSPGetSockOpt(s, SOL_WSP, SO_MAX_RDMA_SIZE, &max, &ol, &err) == 0 && max > 0,
	      "SO_MAX_RDMA_SIZE: error %d", err);
	len = OFFERED - OFFSET < (uint32_t)max ? OFFERED - OFFSET : (uint32_t)max;

	recv_msg(s, desc, sizeof(desc));
	buf = aligned_alloc(4096, OFFERED);
	CHECK(buf, "out of memory");
	memset(buf, 0, OFFERED);
	h = WSPRegisterMemory(s, buf, OFFERED, MEM_WRITE, &err);
	CHECK(h, "WSPRegisterMemory: error %d", err);
	{
		WSABUFEX b = { len, (char *)buf, h };
		int r = WSPRdmaRead(s, &b, 1, desc, sizeof(desc), OFFSET, &n, 0, &ov, NULL, NULL,
				    &err);

		CHECK(r == 0 || err == WSA_IO_PENDING, "WSPRdmaRead: error %d", err);
	}
	CHECK(WSPGetOverlappedResult(s, &ov, &bytes, 1, NULL, &err), "WSPGetOverlappedResult: error %d",
	      err);
	CHECK(bytes == len, "WSPRdmaRead moved %u bytes, not %u", bytes, len);
	for (uint32_t i = 0; i < len; i++)
		CHECK(buf[i] == pattern(OFFSET + i), "byte %u read is %#x, not %#x", i, buf[i],
		      pattern(OFFSET + i));
	/* what was not asked for was not written */
	for (uint32_t i = len; i < OFFERED; i++)
		CHECK(buf[i] == 0, "byte %u past the read was written", i);
	send_msg(s, "done", 4);

	CHECK(WSPDeregisterMemory(s, h, &err) == 0, "WSPDeregisterMemory: error %d", err);
	CHECK(WSPCloseSocket(s, &err) == 0, "WSPCloseSocket: error %d", err);
	CHECK(WSPCleanup(info.provider, &err) == 0, "WSPCleanup: error %d", err);
	free(buf);
	CHECK(waitpid(child, &status, 0) == child, "waitpid failed");
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the accepting child failed (status %#x)",
	      status);
	printf("integrator: %u bytes read by WSPRdmaRead over shm, each as offered\n", len);
	return 0;
}

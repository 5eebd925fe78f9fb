/* SPDX-License-Identifier: MIT */
/*
 * The SPI test suites' shared helpers (wsp_test.c, wsp_life_test.c): an
 * SPI instance, and a forked peer that listens, accepts one connection
 * and runs a function, with a pipe each way beside the connection for
 * ordering the two sides.  Runs on the transport named by
 * WSD_TEST_TRANSPORT (tests/pair.h).
 */
#ifndef WSD_TESTS_SPI_H
#define WSD_TESTS_SPI_H

#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "tests/pair.h"
#include "wsd/wsp.h"

#define BUF (1u << 20)               /* each side's buffer (struct spi, buf) */

struct spi {
	WSAPROTOCOL_INFO info;
	WSPPROC_TABLE procs;
	SOCKET s, l;                 /* l: the peer's listener, for more accepts */
	int oob_in, oob_out;
	pid_t peer;
	uint8_t *buf;
	int cleaned;                 /* the test ran WSPCleanup itself */
};

typedef int (*spi_peer_fn)(struct spi *p, void *arg);

/* Start an SPI instance on the test's transport, with a zeroed buffer of BUF bytes. */
void spi_start(struct spi *p);
/* Close what the test left open and stop the instance. */
void spi_stop(struct spi *p);
/* Fork a peer that accepts one connection and runs fn; connect to it. */
void spi_pair(struct spi *me, spi_peer_fn fn, void *arg);
/* Stop the instance, close the pipes, reap the peer: its exit status. */
int spi_finish(struct spi *me);
/* Where the latest spi_pair peer listens (network order). */
extern in_port_t spi_last_port;

/* All of n bytes on a pipe, or _exit(98). */
void xsend(int fd, const void *p, size_t n);
void xrecv(int fd, void *p, size_t n);
/* A byte each way: both sides reached this point. */
void sync_fd(int in, int out);

#define PCHECK(c) PEER_CHECK(c)

#endif /* WSD_TESTS_SPI_H */

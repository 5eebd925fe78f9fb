/* SPDX-License-Identifier: MIT */
/*
 * The program of chan_kill_check.sh: many connections between processes,
 * each a stream both ways whose every byte comes from a seeded generator
 * (fault.h, as stream.c's), so that a receiver checks each byte against
 * the one that belongs there.
 *
 *   fanout serve PORTFILE SEED CONNS
 *       listens on 127.0.0.1, writes its port, takes CONNS connections;
 *       each starts with its id and length (two 32-bit words, the length
 *       in MiB), then carries that many bytes each way; closes its
 *       listener once it has them all (FANOUT_LISTEN_ON=1: at its end)
 *   fanout connect PORT SEED CONNS ID0 MIB
 *       makes CONNS connections with ids ID0, ID0 + 1, ...; prints
 *       "upgraded" once wsd_switch_path() says shm for all (under wsd run)
 *
 * Either prints, as each connection ends, "conn ID tx N STATUS rx N
 * STATUS" (tx: complete, EPIPE, ECONNRESET, EIO; rx: complete, eof,
 * reset, eio), and exits 0 when all ended so; 1 at the first wrong byte
 * ("conn ID mismatch at N"), 2 for anything else.  A thread each way per
 * connection, blocking calls: nothing waits on anything unbounded of its
 * own, and the script kills what outlives its deadline (a hang is what it
 * looks for).  EINTR is retried.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/fault/fault.h"

#define CHUNK (64u << 10)

struct conn {
	int fd;
	uint32_t id;
	uint64_t len;
	uint64_t seed_tx, seed_rx;
	uint64_t sent, got;
	const char *tx_end, *rx_end;
	bool wrong;
	uint64_t found;              /* after a wrong byte: where the bytes belong */
	uint8_t bad[16];             /* ...and the first of them */
};

static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *tx_name(int e)
{
	return e == EPIPE ? "EPIPE" : e == ECONNRESET ? "ECONNRESET" : e == EIO ? "EIO" : NULL;
}

static void *tx_main(void *arg)
{
	struct conn *c = arg;
	uint8_t *buf = malloc(CHUNK);

	c->tx_end = "complete";
	while (buf && c->sent < c->len) {
		size_t n = c->len - c->sent < CHUNK ? (size_t)(c->len - c->sent) : CHUNK, off = 0;

		fill(c->seed_tx, c->sent, buf, n);
		while (off < n) {
			ssize_t r = send(c->fd, buf + off, n - off, MSG_NOSIGNAL);

			if (r < 0 && errno == EINTR)
				continue;
			if (r < 0) {
				c->tx_end = tx_name(errno) ? tx_name(errno) : strerror(errno);
				c->sent += off;
				goto out;
			}
			off += (size_t)r;
		}
		c->sent += n;
	}
out:
	if (!buf)
		c->tx_end = "ENOMEM";
	free(buf);
	return NULL;
}

/*
 * After a wrong byte: where the bytes given there belong, if they are this
 * stream's own (lost or repeated bytes) within 64 MiB of it; the line says.
 */
static void where(struct conn *c, const uint8_t *got, size_t n)
{
	uint64_t w;

	c->found = UINT64_MAX;
	memcpy(c->bad, got, n < 16 ? n : 16);
	/* the first whole word in what was given */
	for (size_t k = 0; k + 8 <= n; k++) {
		if ((c->got + k) % 8)
			continue;
		memcpy(&w, got + k, 8);
		for (uint64_t i = 0; i < (64u << 20) / 8; i++) {
			if (word(c->seed_rx, i) == w) {
				c->found = i * 8 - k;
				return;
			}
		}
		return;
	}
}

/*
 * WSD_FAULT_PAUSE_MS=N: the receiver stops reading for up to N ms (seeded)
 * after each 4 MiB, so that both ends' senders fill their rings with no
 * reader in sight: the switch's stall rule then moves connections back to
 * the stream mid-transfer (stall_check.sh).
 */
static unsigned pause_ms;

static void rx_pause(const struct conn *c, uint64_t before)
{
	if (pause_ms && before >> 22 != c->got >> 22)
		usleep((useconds_t)(word(c->seed_rx ^ 0xa5a5, c->got >> 22) % pause_ms) * 1000);
}

static void rx_run(struct conn *c)
{
	uint8_t *buf = malloc(CHUNK), *want = malloc(CHUNK);

	c->rx_end = "complete";
	while (buf && want && c->got < c->len) {
		ssize_t n = recv(c->fd, buf, CHUNK, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			c->rx_end = n == 0 ? "eof" : errno == ECONNRESET ? "reset" :
				    errno == EIO ? "eio" : strerror(errno);
			break;
		}
		if (c->got + (uint64_t)n > c->len) {
			c->wrong = true;
			break;
		}
		fill(c->seed_rx, c->got, want, (size_t)n);
		if (memcmp(buf, want, (size_t)n)) {
			size_t i = 0;

			while (buf[i] == want[i])
				i++;
			c->got += i;
			c->wrong = true;
			where(c, buf + i, (size_t)n - i);
			break;
		}
		c->got += (uint64_t)n;
		rx_pause(c, c->got - (uint64_t)n);
	}
	if (!buf || !want)
		c->rx_end = "ENOMEM";
	free(buf);
	free(want);
}

/* Both ways on c, then its line. */
static void *conn_main(void *arg)
{
	struct conn *c = arg;
	pthread_t tx;
	bool both = pthread_create(&tx, NULL, tx_main, c) == 0;

	if (!both)
		c->tx_end = "no thread";
	rx_run(c);
	if (both)
		pthread_join(tx, NULL);
	pthread_mutex_lock(&out_lock);
	if (c->wrong)
		printf("conn %u mismatch at %llu (%s %lld): %02x%02x%02x%02x %02x%02x%02x%02x "
		       "%02x%02x%02x%02x %02x%02x%02x%02x\n", c->id, (unsigned long long)c->got,
		       c->found == UINT64_MAX ? "not this stream's bytes, within 64 MiB: found" :
		       "this stream's bytes from", c->found == UINT64_MAX ? -1LL : (long long)c->found,
		       c->bad[0], c->bad[1], c->bad[2], c->bad[3], c->bad[4], c->bad[5], c->bad[6],
		       c->bad[7], c->bad[8], c->bad[9], c->bad[10], c->bad[11], c->bad[12],
		       c->bad[13], c->bad[14], c->bad[15]);
	else
		printf("conn %u tx %llu %s rx %llu %s\n", c->id, (unsigned long long)c->sent,
		       c->tx_end, (unsigned long long)c->got, c->rx_end);
	fflush(stdout);
	pthread_mutex_unlock(&out_lock);
	return NULL;
}

static bool full_io(int fd, void *p, size_t n, bool out)
{
	for (size_t k = 0; k < n;) {
		ssize_t r = out ? send(fd, (char *)p + k, n - k, MSG_NOSIGNAL) :
				  recv(fd, (char *)p + k, n - k, 0);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return false;
		k += (size_t)r;
	}
	return true;
}

static bool ok_end(const struct conn *c)
{
	return !c->wrong && (!strcmp(c->tx_end, "complete") || !strcmp(c->tx_end, "EPIPE") ||
			     !strcmp(c->tx_end, "ECONNRESET") || !strcmp(c->tx_end, "EIO")) &&
	       (!strcmp(c->rx_end, "complete") || !strcmp(c->rx_end, "eof") ||
		!strcmp(c->rx_end, "reset") || !strcmp(c->rx_end, "eio"));
}

/* A thread for each connection, both ways; false when one could not start. */
static bool start_all(struct conn *cs, int n, pthread_t *t)
{
	for (int i = 0; i < n; i++)
		if (pthread_create(&t[i], NULL, conn_main, &cs[i])) {
			perror("fanout: thread");
			return false;
		}
	return true;
}

/* Waits for the connections' ends: 0, 1 (a wrong byte) or 2. */
static int join_all(struct conn *cs, int n, pthread_t *t)
{
	int status = 0;

	for (int i = 0; i < n; i++) {
		pthread_join(t[i], NULL);
		if (cs[i].wrong)
			status = 1;
		else if (status == 0 && !ok_end(&cs[i]))
			status = 2;
	}
	return status;
}

static int serve(const char *portfile, uint64_t seed, int n)
{
	struct conn *cs = calloc((size_t)n, sizeof(*cs));
	pthread_t *t = calloc((size_t)n, sizeof(*t));
	int ls = listen_portfile(portfile, n, "fanout serve");

	if (!cs || ls < 0)
		return 2;
	for (int i = 0; i < n; i++) {
		uint32_t h[2];

		do {
			cs[i].fd = accept(ls, NULL, NULL);
		} while (cs[i].fd < 0 && errno == EINTR);
		if (cs[i].fd < 0 || !full_io(cs[i].fd, h, sizeof(h), false)) {
			perror("fanout serve: accept");
			return 2;
		}
		cs[i].id = h[0];
		cs[i].len = (uint64_t)h[1] << 20;
		cs[i].seed_tx = seed ^ cs[i].id;
		cs[i].seed_rx = seed ^ cs[i].id ^ 0x5555;
	}
	/*
	 * FANOUT_LISTEN_ON=1: the listener stays open until the streams end,
	 * as a server's that goes on serving (across users, a connection
	 * whose listener closed before it upgraded stays on TCP)
	 */
	if (!getenv("FANOUT_LISTEN_ON"))
		close(ls);
	printf("accepted %d\n", n);
	fflush(stdout);
	return t && start_all(cs, n, t) ? join_all(cs, n, t) : 2;
}

static int connect_all(const char *port, uint64_t seed, int n, uint32_t id0, uint32_t mib)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
				 .sin_port = htons((uint16_t)atoi(port)) };
	const char *(*path_of)(int) = (const char *(*)(int))dlsym(RTLD_DEFAULT, "wsd_switch_path");
	struct conn *cs = calloc((size_t)n, sizeof(*cs));
	pthread_t *t = calloc((size_t)n, sizeof(*t));
	/* FANOUT_ADDR: the server's IPv4 address (across network namespaces, a DNAT's) */
	const char *at = getenv("FANOUT_ADDR");

	if (!cs || !t || (at && inet_pton(AF_INET, at, &a.sin_addr) != 1))
		return 2;
	for (int i = 0; i < n; i++) {
		uint32_t h[2] = { id0 + (uint32_t)i, mib };
		int r;

		cs[i].fd = socket(AF_INET, SOCK_STREAM, 0);
		do {
			r = connect(cs[i].fd, (struct sockaddr *)&a, sizeof(a));
		} while (r < 0 && errno == EINTR);
		if (r < 0 || !full_io(cs[i].fd, h, sizeof(h), true)) {
			perror("fanout connect");
			return 2;
		}
		cs[i].id = h[0];
		cs[i].len = (uint64_t)mib << 20;
		cs[i].seed_tx = seed ^ cs[i].id ^ 0x5555;
		cs[i].seed_rx = seed ^ cs[i].id;
	}
	if (!start_all(cs, n, t))
		return 2;
	/* under wsd run: say when every connection is on shm (10 s at most) */
	for (int k = 0; path_of && k < 1000; k++) {
		int on = 0;

		for (int i = 0; i < n; i++) {
			const char *p = path_of(cs[i].fd);

			on += p && !strcmp(p, "shm");
		}
		if (on == n) {
			pthread_mutex_lock(&out_lock);
			printf("upgraded\n");
			fflush(stdout);
			pthread_mutex_unlock(&out_lock);
			break;
		}
		usleep(10000);
	}
	return join_all(cs, n, t);
}

int main(int argc, char **argv)
{
	const char *p = getenv("WSD_FAULT_PAUSE_MS");

	setvbuf(stdout, NULL, _IOLBF, 0);
	pause_ms = p ? (unsigned)atoi(p) : 0;
	if (argc == 5 && !strcmp(argv[1], "serve"))
		return serve(argv[2], strtoull(argv[3], NULL, 0), atoi(argv[4]));
	if (argc == 7 && !strcmp(argv[1], "connect"))
		return connect_all(argv[2], strtoull(argv[3], NULL, 0), atoi(argv[4]),
				   (uint32_t)atoi(argv[5]), (uint32_t)atoi(argv[6]));
	fprintf(stderr, "usage: fanout serve PORTFILE SEED CONNS\n"
			"       fanout connect PORT SEED CONNS ID0 MIB\n");
	return 2;
}

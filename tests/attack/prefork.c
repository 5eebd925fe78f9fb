/* SPDX-License-Identifier: MIT */
/*
 * A pre-forked echo server whose worker attacks the page its children
 * share (prefork_check.sh), and its clients.  No project library: it runs
 * under `wsd run` as any server would.
 *
 *   prefork server PORTFILE PIDFILE DIR
 *	Listens on 127.0.0.1 (any port), forks an honest worker and an
 *	attacker, and accepts in the parent too: the parent and the worker
 *	answer each connection (a thread each) with its bytes back.  The
 *	attacker drops to uid and gid 65534 as nginx's workers do, finds the
 *	256 KiB shared anonymous mappings it inherited ("/dev/zero (deleted)"
 *	in /proc/self/maps: the registration's page), and attacks them one
 *	phase more each time a file DIR/a, DIR/b, DIR/c appears, writing
 *	DIR/a.done (b, c) once it has: a, take the page's lock as the switch
 *	laid it out (pthread mutex at byte 8) and never let go; b, every slot
 *	garbage, no free one left; c, wild values over the head (counts,
 *	magic, lock) and the slots, rewritten every millisecond.  The phases
 *	add up; DIR/a that says "skip" leaves the lock alone.  PIDFILE: "PARENT WORKER ATTACKER".
 *
 *   prefork client PORT CONNS ROUNDS
 *	CONNS connections at once, each sending ROUNDS messages 20 ms apart
 *	and checking every echo, which must come within 3 s.  Exit 0 when
 *	every one came back exact.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PAGE_BYTES (256u << 10)
#define MAX_PAGES 8
#define MSG 64

static void die(const char *what)
{
	fprintf(stderr, "prefork: %s: %s\n", what, strerror(errno));
	exit(2);
}

static void *echo(void *arg)
{
	int fd = (int)(intptr_t)arg;
	char b[4096];
	ssize_t n;

	while ((n = recv(fd, b, sizeof(b), 0)) > 0)
		if (send(fd, b, (size_t)n, MSG_NOSIGNAL) != n)
			break;
	close(fd);
	return NULL;
}

static void serve(int lfd)
{
	for (;;) {
		int fd = accept(lfd, NULL, NULL);
		pthread_t t;

		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			die("accept");
		}
		if (pthread_create(&t, NULL, echo, (void *)(intptr_t)fd))
			close(fd);
		else
			pthread_detach(t);
	}
}

/* The shared anonymous mappings of the page's size, as the kernel lists them. */
static int find_pages(uint8_t **page)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	int n = 0;

	if (!f)
		die("/proc/self/maps");
	while (n < MAX_PAGES && fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;
		char perms[8];

		if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3)
			continue;
		if (hi - lo == PAGE_BYTES && !strcmp(perms, "rw-s") &&
		    strstr(line, "/dev/zero (deleted)"))
			page[n++] = (uint8_t *)lo;
	}
	fclose(f);
	return n;
}

static bool exists(const char *dir, const char *name)
{
	char path[4096];

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	return access(path, F_OK) == 0;
}

/* DIR/a says "skip": phase a takes no lock (to see phases b and c alone on a switch with one) */
static bool skip_lock(const char *dir)
{
	char path[4096], b[8] = "";
	FILE *f;

	snprintf(path, sizeof(path), "%s/a", dir);
	f = fopen(path, "r");
	if (f) {
		if (!fgets(b, sizeof(b), f))
			b[0] = 0;
		fclose(f);
	}
	return !strncmp(b, "skip", 4);
}

static void done(const char *dir, const char *name, const char *what)
{
	char path[4096];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s.done", dir, name);
	f = fopen(path, "w");
	if (!f)
		die(path);
	fprintf(f, "%s\n", what);
	fclose(f);
	printf("attacker: phase %s: %s\n", name, what);
	fflush(stdout);
}

static uint64_t rnd(void)
{
	static uint64_t x = 0x2545f4914f6cdd1dull;

	x ^= x << 13, x ^= x >> 7, x ^= x << 17;
	return x;
}

/* Slots of garbage: each one an entry with a port (no free slot, no tombstone). */
static void garbage(uint8_t *p)
{
	uint64_t *w = (uint64_t *)(p + 128);

	for (size_t i = 0; i < (PAGE_BYTES - 128) / 8; i++)
		__atomic_store_n(&w[i], rnd() | 1, __ATOMIC_RELAXED);
}

static void wild(uint8_t *p, uint16_t port, unsigned round)
{
	uint64_t *w = (uint64_t *)p;
	uint32_t *h = (uint32_t *)p;
	static const uint32_t vals[] = { 0, 1, 0xffffffffu, 0x7fffffffu, 12345, 0xffff0000u };

	/* the head: counts, magic and lock words, wild */
	for (size_t i = 0; i < 128 / 4; i++)
		__atomic_store_n(&h[i], vals[(i + round) % 6] ^ (round & 1 ? (uint32_t)rnd() : 0),
				 __ATOMIC_RELAXED);
	/* entries: garbage, tombstones, and ports no child has (the listener's, 0) */
	for (size_t i = 128 / 8; i < PAGE_BYTES / 8; i++) {
		uint64_t v = rnd();

		switch ((i + round) % 4) {
		case 0: v = (v & ~0xffffull) | port; break;
		case 1: v &= ~0xffffull; break;
		default: v |= 1; break;
		}
		__atomic_store_n(&w[i], v, __ATOMIC_RELAXED);
	}
}

static void attacker(int lfd, const char *dir)
{
	struct sockaddr_in a;
	socklen_t al = sizeof(a);
	uint8_t *page[MAX_PAGES];
	char what[256];
	int n, locked = 0;
	uint16_t port;

	alarm(120);   /* however the test ends */
	if (getsockname(lfd, (struct sockaddr *)&a, &al))
		die("getsockname");
	port = ntohs(a.sin_port);
	close(lfd);   /* it answers nobody */
	if (setgroups(0, NULL) || setresgid(65534, 65534, 65534) || setresuid(65534, 65534, 65534))
		die("dropping to uid 65534");
	prctl(PR_SET_PDEATHSIG, SIGKILL);   /* cleared by the change of uid */
	n = find_pages(page);
	printf("attacker: uid %u, %d page(s) of 256 KiB shared\n", (unsigned)getuid(), n);
	fflush(stdout);
	while (!exists(dir, "a"))
		usleep(10000);
	for (int i = 0; i < n && !skip_lock(dir); i++) {
		struct timespec t;

		clock_gettime(CLOCK_REALTIME, &t);
		t.tv_sec += 1;
		locked += !pthread_mutex_timedlock((pthread_mutex_t *)(page[i] + 8), &t);
	}
	snprintf(what, sizeof(what), "%d page(s), %d lock(s) taken and held", n, locked);
	done(dir, "a", what);
	while (!exists(dir, "b"))
		usleep(10000);
	for (int i = 0; i < n; i++)
		garbage(page[i]);
	done(dir, "b", "every slot garbage");
	while (!exists(dir, "c"))
		usleep(10000);
	done(dir, "c", "wild values, rewritten every millisecond");
	for (unsigned round = 0;; round++) {
		for (int i = 0; i < n; i++)
			wild(page[i], port, round);
		usleep(1000);
	}
}

static void server(const char *portfile, const char *pidfile, const char *dir)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t al = sizeof(a);
	int lfd = socket(AF_INET, SOCK_STREAM, 0);
	pid_t worker, evil;
	FILE *f;

	if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof(a)) || listen(lfd, 128) ||
	    getsockname(lfd, (struct sockaddr *)&a, &al))
		die("listen");
	worker = fork();
	if (worker < 0)
		die("fork");
	if (worker == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		serve(lfd);
	}
	evil = fork();
	if (evil < 0)
		die("fork");
	if (evil == 0)
		attacker(lfd, dir);
	f = fopen(pidfile, "w");
	if (!f)
		die(pidfile);
	fprintf(f, "%d %d %d\n", (int)getpid(), (int)worker, (int)evil);
	fclose(f);
	f = fopen(portfile, "w");
	if (!f)
		die(portfile);
	fprintf(f, "%u\n", ntohs(a.sin_port));
	fclose(f);
	serve(lfd);
}

struct conn {
	uint16_t port;
	int id, rounds;
	int bad;               /* 0: every echo exact */
	char why[128];
};

static void *client_conn(void *arg)
{
	struct conn *c = arg;
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(c->port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct timeval tv = { .tv_sec = 3 };
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	c->bad = 1;
	if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) ||
	    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) ||
	    connect(fd, (struct sockaddr *)&a, sizeof(a))) {
		snprintf(c->why, sizeof(c->why), "connect: %s", strerror(errno));
		goto out;
	}
	for (int r = 0; r < c->rounds; r++) {
		char m[MSG], b[MSG];
		size_t got = 0;

		memset(m, 'a' + (c->id + r) % 26, sizeof(m));
		snprintf(m, sizeof(m), "conn %d round %d ", c->id, r);
		if (send(fd, m, sizeof(m), MSG_NOSIGNAL) != (ssize_t)sizeof(m)) {
			snprintf(c->why, sizeof(c->why), "round %d: send: %s", r, strerror(errno));
			goto out;
		}
		while (got < sizeof(b)) {
			ssize_t n = recv(fd, b + got, sizeof(b) - got, 0);

			if (n <= 0) {
				const char *e = !n ? "closed" : errno == EAGAIN ?
						"no echo within 3 s" : strerror(errno);

				snprintf(c->why, sizeof(c->why), "round %d: %s", r, e);
				goto out;
			}
			got += (size_t)n;
		}
		if (memcmp(m, b, sizeof(m))) {
			snprintf(c->why, sizeof(c->why), "round %d: a wrong echo", r);
			goto out;
		}
		usleep(20000);
	}
	c->bad = 0;
out:
	if (fd >= 0)
		close(fd);
	return NULL;
}

static int client(uint16_t port, int conns, int rounds)
{
	pthread_t t[64];
	struct conn c[64];
	int bad = 0;

	if (conns < 1 || conns > 64)
		conns = 64;
	alarm(60);
	for (int i = 0; i < conns; i++) {
		c[i] = (struct conn){ .port = port, .id = i, .rounds = rounds };
		if (pthread_create(&t[i], NULL, client_conn, &c[i]))
			die("pthread_create");
	}
	for (int i = 0; i < conns; i++) {
		pthread_join(t[i], NULL);
		if (c[i].bad) {
			printf("client: connection %d: %s\n", i, c[i].why);
			bad++;
		}
	}
	printf("client: %d connections of %d rounds, %d answered exact\n", conns, rounds,
	       conns - bad);
	return bad ? 1 : 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 5 && !strcmp(argv[1], "server")) {
		server(argv[2], argv[3], argv[4]);
		return 0;
	}
	if (argc == 5 && !strcmp(argv[1], "client"))
		return client((uint16_t)atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
	fprintf(stderr, "usage: prefork server PORTFILE PIDFILE DIR | client PORT CONNS ROUNDS\n");
	return 2;
}

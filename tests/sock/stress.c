/* SPDX-License-Identifier: MIT */
/*
 * Stress: two processes, one connection, both directions at once, a
 * sending and a receiving thread at each end.  Sends and receives use
 * random sizes from 1 byte to 8 MiB (log-uniform, so small and large both
 * occur often; a fixed seed, printed, makes a run repeatable).  Every byte
 * is compared on arrival and both ends checksum the stream; the checksums
 * are exchanged and must agree.  Prints the throughput and "ok".
 *
 *   stress [--bytes N[K|M|G]] [--seed S] [--ipv6] [--timeout SECONDS]
 *
 * --bytes is per direction (default 4G); --timeout bounds the whole run
 * (default 600 s) as the watchdog does for the behaviour programs.  A run
 * in which neither direction moves for STALL_S seconds fails at once,
 * naming where each direction stopped.  With WSD_EXPECT_ZCOPY set (and
 * WSD_EXPECT_PATH, WSD_BIN) the client checks at the end, in wsd stat, that
 * some bytes went by zero copy (the VM rig, over verbs).
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/sock/common.h"

#define MAX_MSG (8u << 20)
/* the data repeat with this period: not a power of two, so a block that
 * arrives at a wrong offset does not match by accident */
#define PERIOD ((16u << 20) + 4093)
#define STALL_S 60

struct opts {
	uint64_t bytes;
	uint64_t seed;
	int family;
	unsigned timeout;
};

static struct opts o = { .bytes = 4ull << 30, .seed = 20261122, .family = AF_INET, .timeout = 600 };

/* A checksum that does not depend on how the stream was cut into calls. */
struct sum {
	uint64_t h;
	uint64_t word;
	unsigned fill;          /* bytes in word */
};

static void sum_init(struct sum *s)
{
	*s = (struct sum){ .h = CSUM_INIT };
}

static inline void sum_word(struct sum *s, uint64_t w)
{
	s->h = (s->h ^ w) * 0x100000001b3ull;
	s->h ^= s->h >> 29;
}

static void sum_add(struct sum *s, const unsigned char *p, size_t n)
{
	while (n && s->fill) {
		s->word |= (uint64_t)*p++ << (8 * s->fill);
		n--;
		if (++s->fill == 8) {
			sum_word(s, s->word);
			s->word = 0;
			s->fill = 0;
		}
	}
	for (; n >= 8; p += 8, n -= 8) {
		uint64_t w;

		memcpy(&w, p, 8);
		sum_word(s, w);
	}
	while (n--) {
		s->word |= (uint64_t)*p++ << (8 * s->fill);
		s->fill++;
	}
}

static uint64_t sum_final(const struct sum *s)
{
	struct sum t = *s;

	sum_word(&t, t.word ^ ((uint64_t)t.fill << 56));
	return t.h;
}

static uint64_t rng_next(uint64_t *x)
{
	*x ^= *x >> 12;
	*x ^= *x << 25;
	*x ^= *x >> 27;
	return *x * 0x2545f4914f6cdd1dull;
}

/* 1 .. 8 MiB, log-uniform */
static size_t rand_size(uint64_t *x)
{
	unsigned bits = rng_next(x) % 24;

	return 1 + rng_next(x) % (1ull << bits);
}

/* The stream of one direction, with its first MAX_MSG bytes repeated
 * after the period so any message is one contiguous slice. */
static unsigned char *make_stream(uint32_t seed)
{
	unsigned char *b = malloc((size_t)PERIOD + MAX_MSG);

	if (!b)
		die("out of memory");
	pattern(b, PERIOD, seed, 0);
	memcpy(b + PERIOD, b, MAX_MSG);
	return b;
}

struct dir {
	int fd;
	const unsigned char *stream;
	uint64_t rng;
	_Atomic uint64_t done;
	struct sum sum;
	double t_end;
	const char *error;
	int err;                 /* errno of a failed call, 0 for none */
	pthread_t th;
};

static void *tx_main(void *arg)
{
	struct dir *d = arg;

	while (d->done < o.bytes) {
		size_t len = rand_size(&d->rng), off = d->done % PERIOD;

		if (len > o.bytes - d->done)
			len = o.bytes - d->done;
		sum_add(&d->sum, d->stream + off, len);
		for (size_t sent = 0; sent < len;) {
			ssize_t n = send(d->fd, d->stream + off + sent, len - sent, MSG_NOSIGNAL);

			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0) {
				d->error = "send failed";
				d->err = n < 0 ? errno : 0;
				return NULL;
			}
			sent += n;
		}
		d->done += len;
	}
	d->t_end = now_ms();
	return NULL;
}

static void *rx_main(void *arg)
{
	struct dir *d = arg;
	unsigned char *buf = malloc(MAX_MSG);

	while (d->done < o.bytes) {
		size_t len = rand_size(&d->rng), off = d->done % PERIOD;
		ssize_t n;

		if (len > o.bytes - d->done)
			len = o.bytes - d->done;
		n = recv(d->fd, buf, len, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			d->error = n ? "recv failed" : "EOF before the end";
			d->err = n < 0 ? errno : 0;
			break;
		}
		if (memcmp(buf, d->stream + off, n)) {
			for (ssize_t i = 0; i < n; i++) {
				if (buf[i] == d->stream[off + i])
					continue;
				fprintf(stderr, "stress: first wrong byte at stream offset %"
					PRIu64 "\n", d->done + i);
				break;
			}
			d->error = "the data arrived changed";
			break;
		}
		sum_add(&d->sum, buf, n);
		d->done += n;
	}
	d->t_end = now_ms();
	free(buf);
	return NULL;
}

struct watch {
	struct dir *tx, *rx;
	const char *name_tx, *name_rx;
	bool parent;                 /* the client: its peer dies with it (PR_SET_PDEATHSIG) */
	atomic_bool stop;
	pthread_t th;
};

/*
 * At a stall, for the log: the switch's view of our connections (wsd stat:
 * path, reason, byte counts) and where each of our threads waits (its state
 * and, from /proc, its kernel wait channel and system call).
 */
static void stall_report(void)
{
	char cmd[512];

	if (getenv("WSD_BIN")) {
		snprintf(cmd, sizeof(cmd), "%s stat %d >&2", getenv("WSD_BIN"), (int)getpid());
		if (system(cmd) != 0)
			fprintf(stderr, "(%s failed)\n", cmd);
	}
	snprintf(cmd, sizeof(cmd),
		 "for t in /proc/%d/task/*; do echo \"stress: thread ${t##*/}: "
		 "$(cut -d' ' -f3 $t/stat) wchan $(cat $t/wchan) syscall $(cat $t/syscall)\"; "
		 "done >&2", (int)getpid());
	if (system(cmd) != 0)
		fprintf(stderr, "(the threads could not be listed)\n");
}

/* Fail a run that stopped moving, rather than wait for the watchdog. */
static void *watch_main(void *arg)
{
	struct watch *w = arg;
	uint64_t last_tx = 0, last_rx = 0;
	int still = 0;

	while (!atomic_load(&w->stop)) {
		uint64_t t = w->tx->done, r = w->rx->done;

		sleep_ms(100);
		if (t != last_tx || r != last_rx) {
			last_tx = t;
			last_rx = r;
			still = 0;
		} else if (++still == STALL_S * 10) {
			fprintf(stderr, "stress: STALLED: nothing moved for %d s; %s sent %"
				PRIu64 " of %" PRIu64 " bytes, %s received %" PRIu64 "\n",
				STALL_S, w->name_tx, t, o.bytes, w->name_rx, r);
			stall_report();
			fflush(tr);
			/*
			 * The peer finds the same stall and reports its side too;
			 * it is killed when we exit, so let its report finish
			 * (wsd stat is slow in the VM rig's guest).
			 */
			if (w->parent)
				sleep_ms(10000);
			_exit(3);
		}
	}
	return NULL;
}

static void ctl_send64(struct peer *p, uint64_t v)
{
	ctl_send(p, (int)(uint32_t)v);
	ctl_send(p, (int)(uint32_t)(v >> 32));
}

static uint64_t ctl_recv64(struct peer *p)
{
	uint64_t lo = (uint32_t)ctl_recv(p);

	return lo | (uint64_t)(uint32_t)ctl_recv(p) << 32;
}

/* One end: me 0 is the client (sends a->b), 1 the server. */
static void run(struct peer *ctl, int fd, int me)
{
	static const char *name[2] = { "a->b", "b->a" };
	struct dir tx = { .fd = fd }, rx = { .fd = fd };
	struct watch w = { .tx = &tx, .rx = &rx, .name_tx = name[me], .name_rx = name[1 - me],
			   .parent = me == 0 };
	uint64_t peer_tx_sum;
	double t0, secs;

	tx.stream = make_stream((uint32_t)o.seed * 2 + me);
	rx.stream = make_stream((uint32_t)o.seed * 2 + 1 - me);
	/* four independent size sequences from the one seed */
	tx.rng = o.seed * 4 + 2 * me + 1;
	rx.rng = o.seed * 4 + 2 * (1 - me) + 2;
	sum_init(&tx.sum);
	sum_init(&rx.sum);
	for (int i = 0; i < 8; i++) {
		rng_next(&tx.rng);
		rng_next(&rx.rng);
	}
	/* both ends start the clock together */
	ctl_send(ctl, 0);
	ctl_recv(ctl);
	t0 = now_ms();
	atomic_init(&w.stop, false);
	pthread_create(&w.th, NULL, watch_main, &w);
	pthread_create(&tx.th, NULL, tx_main, &tx);
	pthread_create(&rx.th, NULL, rx_main, &rx);
	pthread_join(tx.th, NULL);
	pthread_join(rx.th, NULL);
	atomic_store(&w.stop, true);
	pthread_join(w.th, NULL);
	if ((tx.error || rx.error) && getenv("WSD_BIN")) {
		/* the switch's view of the failed connection (its reason), for the log */
		char cmd[512];

		snprintf(cmd, sizeof(cmd), "%s stat %d >&2", getenv("WSD_BIN"), (int)getpid());
		if (system(cmd) != 0)
			fprintf(stderr, "(%s failed)\n", cmd);
	}
	if (tx.error)
		die("%s: %s (%s) after %" PRIu64 " bytes", name[me], tx.error,
		    tx.err ? ename(tx.err) : "-", tx.done);
	if (rx.error)
		die("%s: %s (%s) after %" PRIu64 " bytes", name[1 - me], rx.error,
		    rx.err ? ename(rx.err) : "-", rx.done);

	ctl_send64(ctl, sum_final(&tx.sum));
	peer_tx_sum = ctl_recv64(ctl);
	secs = (rx.t_end - t0) / 1e3;
	say("%s: received %" PRIu64 " bytes in %.2f s, %.0f MB/s; checksum sent %016" PRIx64
	    " received %016" PRIx64, name[1 - me], rx.done, secs, rx.done / secs / 1e6, peer_tx_sum,
	    sum_final(&rx.sum));
	CHECK(peer_tx_sum == sum_final(&rx.sum), "%s: the checksums differ", name[1 - me]);
	free((void *)tx.stream);
	free((void *)rx.stream);
}

static void server(struct peer *ctl, void *arg)
{
	int lfd, port, fd;
	char b;

	(void)arg;
	lfd = t_listen(o.family, &port);
	ctl_send(ctl, port);
	fd = t_accept(lfd);
	warmup(fd, false);
	run(ctl, fd, 1);
	if (recv(fd, &b, 1, 0) != 0)
		fail("no EOF after the stream");
	close(fd);
	close(lfd);
}

static uint64_t parse_bytes(const char *s)
{
	char *end;
	uint64_t v = strtoull(s, &end, 0);

	switch (*end) {
	case 'G': case 'g': v <<= 10; /* fall through */
	case 'M': case 'm': v <<= 10; /* fall through */
	case 'K': case 'k': v <<= 10; end++; break;
	}
	if (*end || !v) {
		fprintf(stderr, "stress: bad byte count '%s'\n", s);
		exit(2);
	}
	return v;
}

int main(int argc, char **argv)
{
	struct peer b;
	int fd;
	double t0;

	t_init(argc, argv);
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--bytes") && i + 1 < argc) {
			o.bytes = parse_bytes(argv[++i]);
		} else if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
			o.seed = strtoull(argv[++i], NULL, 0);
		} else if (!strcmp(argv[i], "--ipv6")) {
			o.family = AF_INET6;
		} else if (!strcmp(argv[i], "--timeout") && i + 1 < argc) {
			o.timeout = atoi(argv[++i]);
		} else {
			fprintf(stderr, "usage: stress [--bytes N[K|M|G]] [--seed S] [--ipv6] "
					"[--timeout SECONDS]\n");
			return 2;
		}
	}
	t_watchdog(o.timeout);
	say("stress: seed %" PRIu64 ", %" PRIu64 " bytes each way, %s, sizes 1 B .. 8 MiB",
	    o.seed, o.bytes, famname(o.family));
	peer_start(&b, "b", server, NULL);
	fd = t_connect(o.family, ctl_recv(&b));
	warmup(fd, true);
	t0 = now_ms();
	run(&b, fd, 0);
	/* where zero copy is the default (verbs), some large transfers took it */
	if (getenv("WSD_EXPECT_ZCOPY"))
		expect_zcopy(fd);
	EXPECT(0, "close", close(fd));
	peer_end(&b);
	say("both ways: %.0f MB/s in all", 2.0 * o.bytes / ((now_ms() - t0) / 1e3) / 1e6);
	if (!t_failed)
		say("ok");
	t_exit();
}

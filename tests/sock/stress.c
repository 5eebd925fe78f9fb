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
 *          [--conns N] [--same-buffer] [--pause-ms MS] [--stall-s SECONDS]
 *
 * --bytes is per direction and connection (default 4G); --timeout bounds
 * the whole run (default 600 s) as the watchdog does for the behaviour
 * programs.  --conns opens N connections (default 1) between the same two
 * processes, so all share one switch channel, each with its own pair of
 * threads at each end and its own seed, derived from --seed; each sends
 * from a buffer of its own, or with --same-buffer all from one (as a
 * server sending one file to many clients does).  --pause-ms makes the
 * receivers sleep now and then (one receive in 8, for 0 .. MS ms, drawn
 * from the seeded generator) so that senders fill the rings and wait for
 * room, then have to be woken.  A connection that moves nothing
 * either way for --stall-s seconds (default 60) fails the run at once,
 * naming where each direction stopped.  A failed run prints its seed and
 * the command line that replays it.  With WSD_EXPECT_ZCOPY set (and
 * WSD_EXPECT_PATH, WSD_BIN) the client checks at the end, in wsd stat, that
 * some bytes of the first connection went by zero copy (the VM rig, over
 * verbs).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/sock/common.h"

#define MAX_MSG (8u << 20)
/* the data repeat with this period: not a power of two, so a block that
 * arrives at a wrong offset does not match by accident */
#define PERIOD ((16u << 20) + 4093)
/* each receiving thread holds a MAX_MSG buffer: 64 of them is 512 MiB a side */
#define MAX_CONNS 64
/* one receive in PAUSE_ONE_IN sleeps, under --pause-ms */
#define PAUSE_ONE_IN 8

struct opts {
	uint64_t bytes;
	uint64_t seed;
	int family;
	unsigned timeout;
	int conns;
	bool same_buffer;
	unsigned pause_ms;
	unsigned stall_s;
};

static struct opts o = { .bytes = 4ull << 30, .seed = 20261122, .family = AF_INET, .timeout = 600,
			 .conns = 1, .pause_ms = 0, .stall_s = 60 };

/*
 * The line that runs this test again, the same way (built before anything
 * can fail, so the watchdog's signal handler only has to write it).
 */
static char replay[4096];
static size_t replay_len;

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

#define STREAM_SIZE ((size_t)PERIOD + MAX_MSG)

/* Another mapping of the stream in memfd, at an address of its own. */
static unsigned char *map_stream(int memfd)
{
	void *p = mmap(NULL, STREAM_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);

	if (p == MAP_FAILED)
		die("mmap of the stream: %s", ename(errno));
	return p;
}

/*
 * The stream of one direction, with its first MAX_MSG bytes repeated
 * after the period so any message is one contiguous slice.  In memory of
 * its own (malloc), or, given memfd, in a memfd that map_stream maps
 * again for each connection's sender.
 */
static unsigned char *make_stream(uint32_t seed, int *memfd)
{
	unsigned char *b;

	if (memfd) {
		*memfd = memfd_create("stress-stream", 0);
		if (*memfd < 0 || ftruncate(*memfd, STREAM_SIZE) < 0)
			die("memfd for the stream: %s", ename(errno));
		b = map_stream(*memfd);
	} else if (!(b = malloc(STREAM_SIZE))) {
		die("out of memory");
	}
	pattern(b, PERIOD, seed, 0);
	memcpy(b + PERIOD, b, MAX_MSG);
	return b;
}

/*
 * Connection c's seed.  Connection 0 keeps --seed itself, so a run of one
 * connection is the run stress made before --conns.
 */
static uint64_t conn_seed(int c)
{
	return o.seed + (uint64_t)c * 0x9e3779b97f4a7c15ull;
}

struct dir {
	int fd;
	int conn;
	const unsigned char *stream;
	/*
	 * Where in the stream this connection starts: the connections share
	 * the stream's bytes (run), each from its own place in it, so that
	 * bytes of one connection delivered on another do not match.
	 */
	uint64_t start;
	uint64_t rng;
	uint64_t pause_rng;      /* receivers' pauses: apart from the sizes */
	_Atomic uint64_t done;
	struct sum sum;
	double t_end;
	const char *error;
	int err;                 /* errno of a failed call, 0 for none */
	pthread_t th;
};

struct conn {
	int fd;
	struct dir tx, rx;
};

/* "conn 3: " before a message when there is more than one connection */
static const char *conn_tag(int c)
{
	static __thread char buf[24];

	if (o.conns == 1)
		return "";
	snprintf(buf, sizeof(buf), "conn %d: ", c);
	return buf;
}

static void *tx_main(void *arg)
{
	struct dir *d = arg;

	while (d->done < o.bytes) {
		size_t len = rand_size(&d->rng), off = (d->start + d->done) % PERIOD;

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

	if (!buf) {
		d->error = "out of memory";
		d->t_end = now_ms();
		return NULL;
	}
	while (d->done < o.bytes) {
		size_t len = rand_size(&d->rng), off = (d->start + d->done) % PERIOD;
		ssize_t n;

		if (len > o.bytes - d->done)
			len = o.bytes - d->done;
		/*
		 * A receiver that looks away for a while lets its sender fill
		 * the ring and go to sleep waiting for room; the receive after
		 * it has to wake that sender.
		 */
		if (o.pause_ms && rng_next(&d->pause_rng) % PAUSE_ONE_IN == 0)
			sleep_ms((int)(rng_next(&d->pause_rng) % (o.pause_ms + 1)));
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
				fprintf(stderr, "stress: %sfirst wrong byte at stream offset %"
					PRIu64 "\n", conn_tag(d->conn), d->done + i);
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
	struct conn *c;
	const char *name_tx, *name_rx;
	bool parent;                 /* the client: its peer dies with it (PR_SET_PDEATHSIG) */
	atomic_bool stop;
	pthread_t th;
};

/* The seed and the command line that replays the run, on stderr. */
static void replay_note(void)
{
	fprintf(stderr, "%.*s", (int)replay_len, replay);
	fflush(stderr);
}

/* The client's exit after a failure (die, or failed checks at the end). */
static void replay_at_exit(void)
{
	if (t_failed)
		replay_note();
}

static void watchdog(int sig)
{
	static const char msg[] = "TIMEOUT: the watchdog fired (a call hung)\n";

	(void)sig;
	if (write(2, msg, sizeof(msg) - 1) < 0 || write(2, replay, replay_len) < 0) {
		/* nothing more to do */
	}
	_exit(124);
}

/*
 * Before the reports below start a child (system): under the switch, a
 * child started so gets every socket that is not close-on-exec, and each
 * of those is first moved back to the kernel stream (a BACK handshake
 * with the peer, bounded in time).  On a stalled channel that would
 * change what the report is meant to show; the child needs none of them.
 */
static void keep_from_children(const struct conn *c)
{
	for (int i = 0; i < o.conns; i++)
		fcntl(c[i].fd, F_SETFD, fcntl(c[i].fd, F_GETFD) | FD_CLOEXEC);
}

/*
 * Fail a run that stopped moving, rather than wait for the watchdog.  Each
 * connection is watched on its own: one that stopped while the others
 * still run is as stuck as all of them stopping.
 */
static void *watch_main(void *arg)
{
	struct watch *w = arg;
	uint64_t last_tx[MAX_CONNS] = { 0 }, last_rx[MAX_CONNS] = { 0 };
	unsigned still[MAX_CONNS] = { 0 };

	while (!atomic_load(&w->stop)) {
		int stalled = -1;

		sleep_ms(100);
		for (int i = 0; i < o.conns; i++) {
			uint64_t t = w->c[i].tx.done, r = w->c[i].rx.done;

			if (t != last_tx[i] || r != last_rx[i] || (t == o.bytes && r == o.bytes)) {
				last_tx[i] = t;
				last_rx[i] = r;
				still[i] = 0;
			} else if (++still[i] >= o.stall_s * 10 && stalled < 0) {
				stalled = i;
			}
		}
		if (stalled < 0)
			continue;
		fprintf(stderr, "stress: STALLED: %snothing moved for %u s; %s sent %"
			PRIu64 " of %" PRIu64 " bytes, %s received %" PRIu64 "\n",
			conn_tag(stalled), o.stall_s, w->name_tx, w->c[stalled].tx.done, o.bytes,
			w->name_rx, w->c[stalled].rx.done);
		for (int i = 0; o.conns > 1 && i < o.conns; i++)
			fprintf(stderr, "stress: conn %d (fd %d, threads tx%d rx%d): %s sent %" PRIu64
				", %s received %" PRIu64 " of %" PRIu64 ", still for %.1f s\n",
				i, w->c[i].fd, i, i, w->name_tx, w->c[i].tx.done, w->name_rx,
				w->c[i].rx.done, o.bytes, still[i] / 10.0);
		/* our view of it; the peer, which finds the stall too, gives its own */
		t_where(false);
		fflush(tr);
		/*
		 * The peer finds the same stall and reports its side too;
		 * it is killed when we exit, so let its report finish
		 * (wsd stat is slow in the VM rig's guest).  The peer
		 * waits as long, so that a look from outside (the VM rig's
		 * soak: QP states, kernel stacks) finds both ends as they
		 * stalled, not one of them gone and its QP with it.
		 */
		sleep_ms(10000);
		if (w->parent)
			replay_note();
		_exit(3);
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

/* Where the stream that end sender sends on a connection of seed s starts. */
static uint64_t stream_start(uint64_t s, int sender)
{
	uint64_t x = (s ^ 0xbb67ae8584caa73bull) * 2 + sender + 1;

	return rng_next(&x) % PERIOD;
}

/* Connection i's two directions at end me, on the shared streams. */
static void conn_init(struct conn *c, int i, int fd, int me, const unsigned char *tx_stream,
		      const unsigned char *rx_stream)
{
	uint64_t s = conn_seed(i);

	c->fd = fd;
	c->tx = (struct dir){ .fd = fd, .conn = i, .stream = tx_stream };
	c->rx = (struct dir){ .fd = fd, .conn = i, .stream = rx_stream };
	/* four independent size sequences from the one seed */
	c->tx.rng = s * 4 + 2 * me + 1;
	c->rx.rng = s * 4 + 2 * (1 - me) + 2;
	/* and the pauses of our receiver, which change none of the sizes */
	c->rx.pause_rng = (s ^ 0x6a09e667f3bcc909ull) * 2 + me + 1;
	if (i > 0) {
		c->tx.start = stream_start(s, me);
		c->rx.start = stream_start(s, 1 - me);
	}
	sum_init(&c->tx.sum);
	sum_init(&c->rx.sum);
	for (int k = 0; k < 8; k++) {
		rng_next(&c->tx.rng);
		rng_next(&c->rx.rng);
		rng_next(&c->rx.pause_rng);
	}
}

/* One end: me 0 is the client (sends a->b), 1 the server. */
static void run(struct peer *ctl, const int *fds, int me)
{
	static const char *name[2] = { "a->b", "b->a" };
	struct conn *c = calloc(o.conns, sizeof(*c));
	struct watch w = { .c = c, .name_tx = name[me], .name_rx = name[1 - me],
			   .parent = me == 0 };
	unsigned char *tx_stream, *rx_stream;
	bool own_maps = o.conns > 1 && !o.same_buffer;
	int failed = -1, memfd = -1;
	double t0;

	if (!c)
		die("out of memory");
	/*
	 * The connections' senders share one copy of the stream (24 MiB
	 * apiece would not fit the VM rig's guest), each connection from
	 * its own place in it.  Unless --same-buffer, each sends from its
	 * own mapping of it: to the switch, which registers a sender's
	 * buffer for zero copy by its address, they are separate buffers,
	 * as separate programs' would be.
	 */
	tx_stream = make_stream((uint32_t)o.seed * 2 + me, own_maps ? &memfd : NULL);
	rx_stream = make_stream((uint32_t)o.seed * 2 + 1 - me, NULL);
	for (int i = 0; i < o.conns; i++)
		conn_init(&c[i], i, fds[i], me, own_maps && i ? map_stream(memfd) : tx_stream,
			  rx_stream);
	/* both ends start the clock together */
	ctl_send(ctl, 0);
	ctl_recv(ctl);
	t0 = now_ms();
	atomic_init(&w.stop, false);
	pthread_create(&w.th, NULL, watch_main, &w);
	pthread_setname_np(w.th, "stall-watch");
	for (int i = 0; i < o.conns; i++) {
		char tname[16];

		pthread_create(&c[i].tx.th, NULL, tx_main, &c[i].tx);
		pthread_create(&c[i].rx.th, NULL, rx_main, &c[i].rx);
		/* so that a stall report's thread list says which is which */
		snprintf(tname, sizeof(tname), "tx%d", i);
		pthread_setname_np(c[i].tx.th, tname);
		snprintf(tname, sizeof(tname), "rx%d", i);
		pthread_setname_np(c[i].rx.th, tname);
	}
	for (int i = 0; i < o.conns; i++) {
		pthread_join(c[i].tx.th, NULL);
		pthread_join(c[i].rx.th, NULL);
		if (failed < 0 && (c[i].tx.error || c[i].rx.error))
			failed = i;
	}
	atomic_store(&w.stop, true);
	pthread_join(w.th, NULL);
	if (failed >= 0 && getenv("WSD_BIN")) {
		/* the switch's view of the failed connection (its reason), for the log */
		char cmd[512];

		keep_from_children(c);
		snprintf(cmd, sizeof(cmd), "%s stat %d 2>&1 | sed 's/^/stress: wsd stat: /' >&2",
			 getenv("WSD_BIN"), (int)getpid());
		if (system(cmd) != 0)
			fprintf(stderr, "(%s failed)\n", cmd);
	}
	for (int i = 0; i < o.conns; i++) {
		struct dir *tx = &c[i].tx, *rx = &c[i].rx;

		if (tx->error)
			fail("%s%s: %s (%s) after %" PRIu64 " bytes", conn_tag(i), name[me],
			     tx->error, tx->err ? ename(tx->err) : "-", tx->done);
		if (rx->error)
			fail("%s%s: %s (%s) after %" PRIu64 " bytes", conn_tag(i), name[1 - me],
			     rx->error, rx->err ? ename(rx->err) : "-", rx->done);
	}
	if (failed >= 0)
		t_exit();

	/* all our checksums first, then the peer's: the pipe holds them */
	for (int i = 0; i < o.conns; i++)
		ctl_send64(ctl, sum_final(&c[i].tx.sum));
	for (int i = 0; i < o.conns; i++) {
		uint64_t peer_tx_sum = ctl_recv64(ctl), rx_sum = sum_final(&c[i].rx.sum);
		double secs = (c[i].rx.t_end - t0) / 1e3;

		say("%s%s: received %" PRIu64 " bytes in %.2f s, %.0f MB/s; checksum sent %016"
		    PRIx64 " received %016" PRIx64, conn_tag(i), name[1 - me], c[i].rx.done, secs,
		    c[i].rx.done / secs / 1e6, peer_tx_sum, rx_sum);
		CHECK(peer_tx_sum == rx_sum, "%s%s: the checksums differ", conn_tag(i), name[1 - me]);
	}
	if (own_maps) {
		for (int i = 0; i < o.conns; i++)
			munmap((void *)c[i].tx.stream, STREAM_SIZE);
		close(memfd);
	} else {
		free(tx_stream);
	}
	free(rx_stream);
	free(c);
}

static void server(struct peer *ctl, void *arg)
{
	int lfd, port, fds[MAX_CONNS];
	char b;

	(void)arg;
	lfd = t_listen(o.family, &port);
	ctl_send(ctl, port);
	/* in the client's order: it connects the next once this one is warm */
	for (int i = 0; i < o.conns; i++) {
		fds[i] = t_accept(lfd);
		warmup(fds[i], false);
	}
	run(ctl, fds, 1);
	for (int i = 0; i < o.conns; i++) {
		if (recv(fds[i], &b, 1, 0) != 0)
			fail("%sno EOF after the stream", conn_tag(i));
		close(fds[i]);
	}
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

/* A whole number from lo to hi, or the usage error. */
static unsigned parse_uint(const char *opt, const char *s, unsigned lo, unsigned hi)
{
	char *end;
	unsigned long v = strtoul(s, &end, 0);

	if (*end || !*s || v < lo || v > hi) {
		fprintf(stderr, "stress: %s wants a number from %u to %u, not '%s'\n", opt, lo, hi, s);
		exit(2);
	}
	return (unsigned)v;
}

/* n bytes of s onto replay, as far as they fit (keeping room for the '\n') */
static void replay_put(const char *s, size_t n)
{
	size_t room = sizeof(replay) - 1 - replay_len;

	if (n > room)
		n = room;
	memcpy(replay + replay_len, s, n);
	replay_len += n;
}

/* s as one shell word onto replay */
static void replay_word(const char *s)
{
	static const char safe[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
				   "0123456789_-+=.,:/@%";

	replay_put(" ", 1);
	if (*s && strspn(s, safe) == strlen(s)) {
		replay_put(s, strlen(s));
		return;
	}
	replay_put("'", 1);
	for (; *s; s++) {
		if (*s == '\'')
			replay_put("'\\''", 4);
		else
			replay_put(s, 1);
	}
	replay_put("'", 1);
}

/* an option and its number onto replay */
static void replay_opt(const char *opt, uint64_t v)
{
	char num[24];

	snprintf(num, sizeof(num), "%" PRIu64, v);
	replay_word(opt);
	replay_word(num);
}

/*
 * The replay line: the seed, then the switch's settings (every WSD_* of the
 * environment), wsd run when the switch is loaded, and this program with
 * every option spelled out, defaults too, so it does not depend on them.
 */
static void make_replay(void)
{
	extern char **environ;
	char head[64];

	snprintf(head, sizeof(head), "stress: seed %" PRIu64 "; replay:", o.seed);
	replay_len = 0;
	replay_put(head, strlen(head));
	replay_word("env");
	for (char **e = environ; *e; e++)
		if (!strncmp(*e, "WSD_", 4))
			replay_word(*e);
	if (dlsym(RTLD_DEFAULT, "wsd_switch_path")) {
		replay_word(getenv("WSD_BIN") ? getenv("WSD_BIN") : "wsd");
		replay_word("run");
		replay_word("--");
	}
	replay_word(t_argv0);
	replay_opt("--bytes", o.bytes);
	replay_opt("--seed", o.seed);
	if (o.family == AF_INET6)
		replay_word("--ipv6");
	replay_opt("--timeout", o.timeout);
	replay_opt("--conns", o.conns);
	if (o.same_buffer)
		replay_word("--same-buffer");
	replay_opt("--pause-ms", o.pause_ms);
	replay_opt("--stall-s", o.stall_s);
	replay[replay_len++] = '\n';
}

int main(int argc, char **argv)
{
	struct peer b;
	struct sigaction sa = { .sa_handler = watchdog };
	int fds[MAX_CONNS];
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
		} else if (!strcmp(argv[i], "--conns") && i + 1 < argc) {
			o.conns = (int)parse_uint(argv[i], argv[i + 1], 1, MAX_CONNS);
			i++;
		} else if (!strcmp(argv[i], "--same-buffer")) {
			o.same_buffer = true;
		} else if (!strcmp(argv[i], "--pause-ms") && i + 1 < argc) {
			o.pause_ms = parse_uint(argv[i], argv[i + 1], 0, 60000);
			i++;
		} else if (!strcmp(argv[i], "--stall-s") && i + 1 < argc) {
			o.stall_s = parse_uint(argv[i], argv[i + 1], 1, 86400);
			i++;
		} else {
			fprintf(stderr, "usage: stress [--bytes N[K|M|G]] [--seed S] [--ipv6] "
					"[--timeout SECONDS] [--conns N] [--same-buffer] "
					"[--pause-ms MS] [--stall-s SECONDS]\n");
			return 2;
		}
	}
	/* a pause must not look like a stall */
	if (o.pause_ms >= o.stall_s * 500) {
		fprintf(stderr, "stress: --pause-ms %u is too long for --stall-s %u\n", o.pause_ms,
			o.stall_s);
		return 2;
	}
	make_replay();
	t_watchdog(o.timeout);
	/* the same watchdog, which names the seed and the replay too */
	sigaction(SIGALRM, &sa, NULL);
	atexit(replay_at_exit);
	say("stress: seed %" PRIu64 ", %" PRIu64 " bytes each way, %s, sizes 1 B .. 8 MiB",
	    o.seed, o.bytes, famname(o.family));
	if (o.conns > 1 || o.pause_ms)
		say("stress: %d connections, each with its own threads%s; receivers pause up to %u ms",
		    o.conns, o.same_buffer && o.conns > 1 ? ", all sending from one buffer" : "",
		    o.pause_ms);
	peer_start(&b, "b", server, NULL);
	{
		int port = ctl_recv(&b);

		for (int i = 0; i < o.conns; i++) {
			fds[i] = t_connect(o.family, port);
			warmup(fds[i], true);
		}
	}
	t0 = now_ms();
	run(&b, fds, 0);
	/* where zero copy is the default (verbs), some large transfers took it */
	if (getenv("WSD_EXPECT_ZCOPY"))
		expect_zcopy(fds[0]);
	for (int i = 0; i < o.conns; i++)
		EXPECT(0, "close", close(fds[i]));
	peer_end(&b);
	say("both ways: %.0f MB/s in all",
	    2.0 * o.bytes * o.conns / ((now_ms() - t0) / 1e3) / 1e6);
	if (!t_failed)
		say("ok");
	t_exit();
}

/* SPDX-License-Identifier: MIT */
/*
 * Helpers for the socket behaviour programs (tests/sock/README.md).
 *
 * Each program forks its own peer, talks to it over loopback and prints a
 * transcript that must come out byte for byte the same with and without
 * `wsd run`: every call's return value and errno name, and only values that
 * do not depend on timing.  A peer's transcript goes to a memfd and is
 * printed, prefixed with its name, when the peer is reaped, so output of
 * several processes never interleaves.
 *
 * common.c: the transcript, peers, data patterns; conn.c: sockets, the
 * warm-up and the path check; servant.c: the two ready-made peers.
 */
#ifndef WSD_TESTS_SOCK_COMMON_H
#define WSD_TESTS_SOCK_COMMON_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

/* ---- transcript (common.c) ----------------------------------------------- */

/* Where this process writes its transcript: stdout, or a peer's memfd. */
extern FILE *tr;
/* Set by a failed expectation; t_exit() turns it into exit status 1. */
extern bool t_failed;

/*
 * Start a program: a 60 s watchdog (a hang fails instead of blocking CI),
 * the transcript on stdout.  argv[0] is kept for programs that re-exec.
 */
void t_init(int argc, char **argv);
extern const char *t_argv0;
/* Another bound than 60 s, for this process and the peers it starts later. */
void t_watchdog(unsigned seconds);
/*
 * For a program about to fail (all its sockets made close-on-exec): wsd
 * stat and each thread's waits, for it and, with peers, its children.
 * The watchdog prints it before it exits.
 */
void t_where(bool peers);
/* Exit with 1 if anything failed, else 0; flushes the transcript first. */
void t_exit(void) __attribute__((noreturn));

void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A failed expectation: noted in the transcript and on stderr, go on. */
void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A failure after which going on makes no sense: exit 1 now. */
void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

const char *ename(int e);
const char *pollstr(int revents);
const char *epollstr(uint32_t events);

/*
 * Print "what -> r" (or "-> -1 ENAME") and check it against the expected
 * result: want_r when want_err is 0, else -1 with errno want_err.
 */
long t_expect(const char *what, long r, int err, long want_r, int want_err);
/* expr must return want */
#define EXPECT(want, what, expr) ({ errno = 0; long r_ = (long)(expr); \
		t_expect((what), r_, errno, (want), 0); })
/* expr must fail with errno e */
#define EXPECT_ERR(e, what, expr) ({ errno = 0; long r_ = (long)(expr); \
		t_expect((what), r_, errno, -1, (e)); })
/* a check that is not a return value: noted, and the program goes on */
#define CHECK(cond, ...) do { if (!(cond)) fail(__VA_ARGS__); } while (0)
/* a step the rest depends on: exit on failure, with errno's name */
#define MUST(expr) ({ errno = 0; long r_ = (long)(expr); \
		t_must(r_, errno, __FILE__, __LINE__, #expr); })
long t_must(long r, int err, const char *file, int line, const char *expr);

/* ---- peers (common.c) ---------------------------------------------------- */

/*
 * A forked peer process with a control channel both ways (pipes, so the
 * switch never sees them) and its own transcript.  In the peer, fn gets a
 * struct peer whose ctl_* ends talk to the parent.
 */
struct peer {
	pid_t pid;
	const char *name;
	int ctl_r, ctl_w;
	int log;
};

void peer_start(struct peer *p, const char *name, void (*fn)(struct peer *self, void *arg),
		void *arg);
/* Reap the peer, print its transcript, and fail unless it exited 0. */
void peer_end(struct peer *p);
/* The control channel: one int each way, in order. */
void ctl_send(struct peer *p, int v);
int ctl_recv(struct peer *p);

/*
 * The sanitizer build forks a test's peers before the test listens and
 * sends them the port by the control channel: gcc 12's ASan allocator is
 * not fork-safe while the switch's threads run (a child forked after a
 * listen hung in malloc, tests/vm/README.md).  Otherwise they are forked
 * after the listen and inherit the listener, as a server's children do.
 */
#ifdef WSD_SANITIZERS
#define T_FORK_FIRST true
#else
#define T_FORK_FIRST false
#endif
/*
 * For the programs whose point is a server's fork with the switch's
 * threads running (fork.pair, forksrv.pair): in the sanitizer build,
 * where a child forked while one of them is inside the allocator, or
 * ending, hangs in its first malloc, say so and exit 77.
 */
void t_skip_server_forks(void);
/* In a peer: the port its parent listens on: port, or (forked first) the control channel's. */
int t_peer_port(struct peer *self, int port);
/* Listen (t_listen) and start the peer p, first when early (then the port goes by p's channel). */
int t_listen_peer(struct peer *p, const char *name, void (*fn)(struct peer *self, void *arg),
		  void *arg, int *port, bool early);

/* ---- sockets (conn.c) ---------------------------------------------------- */

const char *famname(int family);
/* A loopback listener (127.0.0.1, or WSD_TEST_ADDR; ::1) on an ephemeral port. */
int t_listen(int family, int *port);
int t_connect(int family, int port);
int t_accept(int lfd);
void set_nonblock(int fd, bool on);

/*
 * Wait until poll reports every bit of mask on fd (5 s at most), then 10 ms
 * more so that what the kernel does at the same moment is done too.  The
 * state a transcript prints is then settled, not caught half-way.
 */
void wait_events(int fd, short mask);

/* Whole buffers on a blocking socket; die on error or early EOF. */
void send_all(int fd, const void *buf, size_t len);
void recv_all(int fd, void *buf, size_t len);

/*
 * The warm-up every tested connection gets first, so the behaviour under
 * test happens on an accelerated connection: 256 KiB each way, 20 ms of
 * quiet, 64 KiB each way (the switch upgrades lazily, after some traffic),
 * then the path check.  One end passes first = true, the other false.
 */
void warmup(int fd, bool first);
/* The parts, for programs that warm up many connections at once. */
void warmup_bulk(int fd, bool first);
void warmup_tail(int fd, bool first);
/*
 * Under WSD_EXPECT_PATH only: both ends swap a byte saying whether their
 * side has moved yet, until both have (5 s at most), since the switch
 * finishes an upgrade in the background.  Then expect_path decides.
 */
void settle(int fd, bool first);
/*
 * With WSD_EXPECT_PATH set, the connection must take that path
 * (wsd_switch_path); a mismatch or a missing switch exits 1.  Prints to
 * stderr only, so the transcript stays the same with and without wsd.
 */
void expect_path(int fd);
/* The path fd takes now under the switch ("tcp", "shm"...), NULL without it. */
const char *path_now(int fd);
/* Under WSD_EXPECT_PATH only: fd takes path want now (say "tcp"), or exit 1. */
void expect_path_now(int fd, const char *want);
/* Under wsd run (WSD_EXPECT_PATH, WSD_BIN): wsd stat gives fd this reason, or die. */
void expect_reason(int fd, const char *reason);
/* wsd stat's JSON (out) gives fd this reason. */
bool stat_reason(const char *out, int fd, const char *reason);
/* Under wsd run (WSD_EXPECT_PATH, and WSD_BIN naming the wsd command): bytes
 * went by zero copy on fd, as wsd stat --json says, or die. */
void expect_zcopy(int fd);
/*
 * Under wsd run (WSD_EXPECT_PATH, WSD_BIN): what wsd stat --json says of
 * this process now, or NULL when not under wsd (one spawn: under wsd, a
 * spawn ends the process's channels); and in it, the bytes fd carried on
 * the stream and by ring or RDMA, both ways.
 */
const char *stat_now(void);
void stat_bytes(const char *json, int fd, unsigned long long *tcp, unsigned long long *ring);
/* A number of fd's object in wsd stat's JSON (json), or 0. */
unsigned long long stat_field(const char *json, int fd, const char *name);

/*
 * Wait until FIONREAD says n bytes are queued (5 s at most), then 5 ms
 * more: what one receive takes next is then fixed, not timing's.
 */
void wait_queued(int fd, int n);
/*
 * Non-blocking sends of pattern(seed) from offset 0 until EAGAIN; returns
 * the bytes that went in.  drain_exactly receives exactly len bytes of that
 * stream (blocking) and dies if any differ.
 */
int fill_until_eagain(int fd, uint32_t seed);
void drain_exactly(int fd, int len, uint32_t seed);

/* ---- the servant (servant.c) --------------------------------------------- */

/*
 * A peer that runs a loopback server and does, step by step, what the
 * parent tells it on the connections it accepted; each step is printed in
 * its transcript.  Sequencing every step through the control channel is
 * what keeps the transcripts independent of timing.
 *
 * Data it sends is servant_data(n) (pattern seed 55 from offset 0); data it
 * receives must be client_data(n) (seed 56).  Commands answer 0, S_FILL
 * the number of bytes it wrote.
 */
enum servant_cmd {
	S_QUIT,
	S_ACCEPT,      /* accept the next connection and warm it up */
	S_SEND,        /* send arg bytes */
	S_SEND_ERR,    /* send 1 byte (MSG_NOSIGNAL): must fail with errno arg */
	S_SEND_LATER,  /* report done, then sleep 30 ms and send arg bytes */
	S_RECV,        /* receive exactly arg bytes and check them */
	S_RECV_EOF,    /* receive: must be EOF (arg 0) or fail with errno arg */
	S_SHUT_WR,
	S_SHUT_RD,
	S_CLOSE,
	S_RESET,       /* SO_LINGER {1, 0} and close: the peer sees a reset */
	S_POLL,        /* print the connection's poll(IN|OUT|RDHUP) now */
	S_FILL,        /* non-blocking sends until EAGAIN; answers the byte count */
	S_DRAIN,       /* receive exactly arg bytes (count not printed) */
	S_EMPTY,       /* recv MSG_DONTWAIT: must be EAGAIN */
};

struct servant {
	struct peer p;
	int family;
	int port;
	int nconn;
};

void servant_start(struct servant *s, int family);
/* A new connection, warmed up on both ends; returns the client's fd. */
int servant_connect(struct servant *s);
/* Do cmd on the servant's connection conn and wait until it has. */
int servant_do(struct servant *s, int conn, enum servant_cmd cmd, int arg);
/* The same without waiting; servant_wait collects the completion. */
void servant_go(struct servant *s, int conn, enum servant_cmd cmd, int arg);
int servant_wait(struct servant *s);
void servant_end(struct servant *s);

void servant_data(void *buf, size_t len);
void client_data(void *buf, size_t len);
/* Receive exactly len bytes of servant_data on a blocking fd. */
void recv_servant_data(int fd, size_t len);

/* ---- the echo server (servant.c) ----------------------------------------- */

/*
 * Request: a 4-byte length and that many bytes; response: the same bytes
 * with every byte xor 0x5a.  echo_call makes one call and dies if the
 * answer is wrong; echo_calls makes n of varied sizes.
 */
void echo_call(int fd, uint32_t len, uint32_t seed);
/* The two halves of echo_call. */
void echo_request(int fd, uint32_t len, uint32_t seed);
void echo_response(int fd, uint32_t len, uint32_t seed);
void echo_calls(int fd, int n, uint32_t seed);
/* Answer requests on fd until EOF; the number served, or -1 on an error. */
int echo_serve(int fd);

/*
 * A peer serving nconn connections, each in its own thread after its
 * warm-up; when all have ended it prints, in accept order, how many
 * requests each served.
 */
struct echo {
	struct peer p;
	int family, port, nconn;
};

void echo_start(struct echo *e, int family, int nconn);
/* A new connection to it, warmed up. */
int echo_connect(struct echo *e);
void echo_end(struct echo *e);

/* ---- data (common.c) ----------------------------------------------------- */

/* Bytes that depend on the seed and the stream offset (catches reordering). */
void pattern(void *buf, size_t len, uint32_t seed, uint64_t offset);
/* buf holds pattern(len, seed, offset), or die naming what and the offset. */
void expect_pattern(const void *buf, size_t len, uint32_t seed, uint64_t offset, const char *what);
/* FNV-1a 64, continued from h (start with CSUM_INIT). */
#define CSUM_INIT 0xcbf29ce484222325ull
uint64_t csum(uint64_t h, const void *buf, size_t len);

/* Milliseconds on the monotonic clock; and a sleep. */
double now_ms(void);
void sleep_ms(int ms);
/* Descriptors the process has open now (/proc/self/fd). */
int open_fds(void);

#endif

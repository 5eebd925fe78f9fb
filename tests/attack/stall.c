/* SPDX-License-Identifier: MIT */
/*
 * The programs of stall_check.sh: a squatter that makes every rendezvous
 * with its registry name wait, and a victim that must not wait for it.
 *
 *   stall squat PORTFILE STOPFILE
 *        a plain TCP echo service on a free port P (written to PORTFILE)
 *        that also binds the registry name "\0wsd-nd.P" with the smallest
 *        backlog, fills that backlog itself and never accepts: a connect
 *        to the name blocks for as long as the squatter lives (until
 *        STOPFILE exists, 60 s at most)
 *   stall victim SQUATPORT SERVERPORT
 *        under wsd run: 64-byte exchanges with the squatter's service
 *        (whose upgrade can only wait), that connection kept open; then a
 *        connection to the server on SERVERPORT (a wsd program), which
 *        must be on shm within 3 s; then 20 forks, each timed from the
 *        call to its return in the parent.  Prints
 *          "victim: server on PATH after N ms; fork min U us p50 U us max U us;
 *           T threads"
 *        and exits 0 when every answer was right (1 otherwise)
 *   stall quick SERVERPORT
 *        under wsd run, no attacker: one short connection to the server
 *        (64 bytes each way, closed), then the 20 forks at once
 *   stall forkmid SERVERPORT
 *        under wsd run with the HELLO held back (the fault point
 *        hello-delay): a fork while the connection's upgrade is under
 *        way; the child makes 20 exchanges on the inherited connection
 *        and exits, then the parent 20 more, after the handshake ended:
 *        it must be on TCP (back), every answer right.  Prints
 *          "forkmid: fork U us; parent on PATH"
 *   stall forks [THREADS]
 *        the same 20 forks with no connection at all (the baseline), with
 *        THREADS more threads that wait for ever (as many as a victim had
 *        besides its own: a threaded process's fork costs the kernel more)
 *
 * Every wait is bounded; each program exits by itself.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MSG 64
#define FORKS 20

static __attribute__((noreturn)) void die(const char *what)
{
	fprintf(stderr, "stall: %s: %s\n", what, strerror(errno));
	exit(2);
}

static int64_t now_us(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000 + t.tv_nsec / 1000;
}

static int dial(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)))
		die("connect");
	return fd;
}

/* One 64-byte call and its answer (each byte xor 0x5a) within 2 s: 0, else -1. */
static int exchange(int fd, unsigned seed)
{
	char out[MSG], in[MSG];
	size_t got = 0;
	int64_t end = now_us() + 2000000;

	for (int i = 0; i < MSG; i++)
		out[i] = (char)(seed * 31 + (unsigned)i);
	if (send(fd, out, MSG, MSG_NOSIGNAL) != MSG)
		return -1;
	while (got < MSG) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int64_t left = (end - now_us()) / 1000;
		ssize_t k;

		if (left <= 0 || poll(&p, 1, (int)left) <= 0)
			return -1;
		k = recv(fd, in + got, MSG - got, MSG_DONTWAIT);
		if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR))
			return -1;
		if (k > 0)
			got += (size_t)k;
	}
	for (int i = 0; i < MSG; i++)
		if ((char)(in[i] ^ 0x5a) != out[i])
			return -1;
	return 0;
}

/* ---- the squatter ---------------------------------------------------------------- */

static void *echo(void *arg)
{
	int fd = (int)(intptr_t)arg;
	char b[4096];
	ssize_t n;

	while ((n = recv(fd, b, sizeof(b), 0)) > 0) {
		for (ssize_t i = 0; i < n; i++)
			b[i] ^= 0x5a;
		if (send(fd, b, (size_t)n, MSG_NOSIGNAL) != n)
			break;
	}
	close(fd);
	return NULL;
}

static int squat(const char *portfile, const char *stopfile)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct sockaddr_un un = { .sun_family = AF_UNIX };
	socklen_t al = sizeof(a), ul;
	int lfd = socket(AF_INET, SOCK_STREAM, 0), ufd, filled = 0, port, n;
	int64_t end = now_us() + 60 * 1000000ll;
	FILE *f;

	if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof(a)) || listen(lfd, 64) ||
	    getsockname(lfd, (struct sockaddr *)&a, &al))
		die("squat: tcp");
	port = ntohs(a.sin_port);
	n = snprintf(un.sun_path + 1, sizeof(un.sun_path) - 1, "wsd-nd.%d", port);
	ul = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
	ufd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
	if (ufd < 0 || bind(ufd, (struct sockaddr *)&un, ul) || listen(ufd, 0))
		die("squat: the registry name");
	/* the backlog full: our own connections, never accepted */
	for (int i = 0; i < 8; i++) {
		int c = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK, 0);

		if (c < 0)
			die("squat: socket");
		if (connect(c, (struct sockaddr *)&un, ul) == 0)
			filled++;
		else if (errno == EAGAIN)
			break;
		else
			die("squat: fill");
	}
	if (!filled)
		die("squat: the backlog did not fill");
	f = fopen(portfile, "w");
	if (!f || fprintf(f, "%d\n", port) < 0 || fclose(f))
		die(portfile);
	fcntl(lfd, F_SETFL, O_NONBLOCK);
	while (now_us() < end && access(stopfile, F_OK)) {
		struct pollfd p = { .fd = lfd, .events = POLLIN };
		pthread_t t;
		int c;

		if (poll(&p, 1, 100) <= 0)
			continue;
		c = accept(lfd, NULL, NULL);
		if (c >= 0 && pthread_create(&t, NULL, echo, (void *)(intptr_t)c) == 0)
			pthread_detach(t);
	}
	printf("squat: port %d, registry backlog filled with %d\n", port, filled);
	return 0;
}

/* ---- the victim ---------------------------------------------------------------------- */

static int cmp(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

	return x < y ? -1 : x > y;
}

/* A thread that waits for ever (the baseline's stand-in for one of the switch's). */
static void *idle(void *fd)
{
	char c;

	(void)!read(*(int *)fd, &c, 1);
	return NULL;
}

/*
 * FORKS forks, each child gone at once: the parent's time in fork(),
 * sorted, in t.  Returns the process's threads as it forks (a fork of a
 * threaded process costs the kernel more: the baseline's threads match).
 */
static int forks(int64_t *t)
{
	int threads = 0;
	DIR *d = opendir("/proc/self/task");

	for (struct dirent *e; d && (e = readdir(d));)
		threads += e->d_name[0] != '.';
	if (d)
		closedir(d);
	for (int i = 0; i < FORKS; i++) {
		int64_t t0 = now_us();
		pid_t pid = fork();

		if (pid == 0)
			_exit(0);
		t[i] = now_us() - t0;
		if (pid < 0)
			die("fork");
		waitpid(pid, NULL, 0);
	}
	qsort(t, FORKS, sizeof(*t), cmp);
	return threads;
}

static int victim(int squat_port, int server_port)
{
	const char *(*path)(int) = (const char *(*)(int))dlsym(RTLD_DEFAULT, "wsd_switch_path");
	int64_t t[FORKS], t0;
	const char *p = "none";
	int a, b, bad = 0, th;

	if (!path) {
		fprintf(stderr, "victim: not under wsd run\n");
		return 2;
	}
	a = dial(squat_port);
	for (unsigned i = 0; i < 5; i++)
		bad |= exchange(a, i);
	usleep(100000);   /* its upgrade under way, in the squatter's backlog */
	b = dial(server_port);
	t0 = now_us();
	for (unsigned i = 0; now_us() - t0 < 3000000; i++) {
		bad |= exchange(b, i);
		p = path(b);
		if (p && !strcmp(p, "shm"))
			break;
		usleep(10000);
	}
	t0 = now_us() - t0;
	/* the squatter's connection still waits for its upgrade */
	bad |= exchange(a, 99);
	th = forks(t);
	bad |= exchange(a, 100) | exchange(b, 100);
	printf("victim: server on %s after %lld ms; fork min %lld us p50 %lld us max %lld us; "
	       "%d threads%s\n", p ? p : "none", (long long)t0 / 1000, (long long)t[0],
	       (long long)t[FORKS / 2], (long long)t[FORKS - 1], th, bad ? "; WRONG ANSWERS" : "");
	close(a);
	close(b);
	return bad ? 1 : 0;
}

int main(int argc, char **argv)
{
	if (argc == 4 && !strcmp(argv[1], "squat"))
		return squat(argv[2], argv[3]);
	if (argc == 4 && !strcmp(argv[1], "victim"))
		return victim(atoi(argv[2]), atoi(argv[3]));
	if (argc == 3 && !strcmp(argv[1], "quick")) {
		int64_t t[FORKS];
		int c = dial(atoi(argv[2])), bad = exchange(c, 1);

		int th;

		close(c);
		th = forks(t);
		printf("quick: fork min %lld us p50 %lld us max %lld us; %d threads%s\n",
		       (long long)t[0], (long long)t[FORKS / 2], (long long)t[FORKS - 1], th,
		       bad ? "; WRONG ANSWERS" : "");
		return bad ? 1 : 0;
	}
	if (argc == 3 && !strcmp(argv[1], "forkmid")) {
		const char *(*path)(int) =
			(const char *(*)(int))dlsym(RTLD_DEFAULT, "wsd_switch_path");
		int c = dial(atoi(argv[2])), bad = exchange(c, 1), st = 1;
		int64_t t0;
		pid_t pid;

		usleep(100000);   /* its HELLO held back: the upgrade under way */
		t0 = now_us();
		pid = fork();
		if (pid == 0) {
			for (unsigned i = 0; i < 20; i++)
				bad |= exchange(c, 10 + i);
			_exit(bad ? 1 : 0);
		}
		t0 = now_us() - t0;
		if (pid < 0)
			die("fork");
		waitpid(pid, &st, 0);
		usleep(1000000);   /* the handshake's end, seen by the parent */
		for (unsigned i = 0; i < 20; i++)
			bad |= exchange(c, 40 + i);
		printf("forkmid: fork %lld us; parent on %s%s%s\n", (long long)t0,
		       path ? path(c) : "?", st ? "; the child saw a wrong answer" : "",
		       bad ? "; WRONG ANSWERS" : "");
		return bad || st ? 1 : 0;
	}
	if ((argc == 2 || argc == 3) && !strcmp(argv[1], "forks")) {
		int64_t t[FORKS];
		int n = argc == 3 ? atoi(argv[2]) : 0, hold[2];
		pthread_t th;

		if (pipe(hold))
			die("pipe");
		for (int i = 0; i < n; i++)
			if ((errno = pthread_create(&th, NULL, idle, &hold[0])))
				die("pthread_create");
		usleep(10000);
		forks(t);
		printf("forks: min %lld us p50 %lld us max %lld us\n", (long long)t[0],
		       (long long)t[FORKS / 2], (long long)t[FORKS - 1]);
		return 0;
	}
	fprintf(stderr, "usage: stall squat PORTFILE STOPFILE | victim SQUATPORT SERVERPORT |\n"
		"       quick SERVERPORT | forkmid SERVERPORT | forks [THREADS]\n");
	return 2;
}

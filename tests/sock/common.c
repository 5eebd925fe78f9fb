/* SPDX-License-Identifier: MIT */
/* The transcript, the peers, and the data patterns: see common.h. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/sock/common.h"

FILE *tr;
bool t_failed;
const char *t_argv0;

/* ---- transcript ---------------------------------------------------------- */

/*
 * Where this program stands, on stderr: for it (and its children, the
 * peers, with peers), the switch's view of each connection (wsd stat;
 * --waits: each one's ring state at its last sleep) and each thread's
 * state, kernel wait channel, system call and kernel stack.  For a
 * program about to fail: its sockets are made close-on-exec first, so
 * that the child system() starts does not move them back to the stream
 * (switch/proc.c).
 */
void t_where(bool peers)
{
	static const char cmd[] =
		"procs=\"$WHERE_PID ${WHERE_PEERS:+$(cat /proc/$WHERE_PID/task/*/children 2>/dev/null)}\";"
		"d=$(mktemp -d) || { echo \"report: no temporary folder\" >&2; exit; };"
		/*
		 * First, per process, the wait that began last, on one line: a
		 * hang's likeliest culprit, out before the long dumps (the
		 * report has a minute, and 1,000 sockets under TCG take many
		 * seconds a dump); the waits are read once, kept for the dump
		 */
		"for p in $procs; do"
		"  [ \"$p\" = $$ ] || [ -z \"${WSD_BIN:-}\" ] && continue;"
		"  timeout 20 \"$WSD_BIN\" stat --waits $p >$d/$p 2>&1;"
		"  awk '"
		"    / fd [0-9]+: slept [0-9]+ ms ago/ {"
		"      for (i = 1; i < NF; i++) if ($i == \"slept\") n = $(i + 1) + 0;"
		"      take = best == \"\" || n < bestn; if (take) { best = $0; bestn = n } next }"
		"    take && /^  / { best = best \" |\" $0 }"
		"    END { if (best != \"\") print \"latest wait: \" best }' $d/$p;"
		"done >&2;"
		"for p in $procs; do"
		"  [ \"$p\" = $$ ] && continue;"
		"  echo \"== process $p ($(cat /proc/$p/comm 2>/dev/null))\";"
		"  [ -n \"${WSD_BIN:-}\" ] && timeout 20 \"$WSD_BIN\" stat $p && cat $d/$p;"
		"  for t in /proc/$p/task/*; do"
		"    echo \"thread ${t##*/} ($(cat $t/comm)): $(cut -d' ' -f3 $t/stat)"
		" wchan $(cat $t/wchan) syscall $(cat $t/syscall)\";"
		"    sed 's/^/    /' $t/stack 2>/dev/null;"
		"  done;"
		"done >&2;"
		"rm -rf $d";
	char pid[24];

	for (int fd = 3; fd < 4096; fd++)
		(void)fcntl(fd, F_SETFD, FD_CLOEXEC);
	snprintf(pid, sizeof(pid), "%d", (int)getpid());
	setenv("WHERE_PID", pid, 1);
	if (peers)
		setenv("WHERE_PEERS", "1", 1);
	else
		unsetenv("WHERE_PEERS");
	if (system(cmd) != 0) {
		/* what it printed is all there is */
	}
}

static void watchdog(int sig)
{
	static const char msg[] = "TIMEOUT: the watchdog fired (a call hung)\n";
	static const char again[] = "TIMEOUT: the report on the hang hung too\n";
	static volatile sig_atomic_t fired;

	(void)sig;
	if (fired) {
		if (write(2, again, sizeof(again) - 1) < 0) {
			/* nothing more to do */
		}
		_exit(124);
	}
	fired = 1;
	if (write(2, msg, sizeof(msg) - 1) < 0) {
		/* nothing more to do */
	}
	alarm(60);   /* should the report hang */
	t_where(true);
	_exit(124);
}

static unsigned watchdog_s = 60;

static void arm_watchdog(void)
{
	/* SA_NODEFER: the second alarm, should the report hang, must get in */
	struct sigaction sa = { .sa_handler = watchdog, .sa_flags = SA_NODEFER };

	sigaction(SIGALRM, &sa, NULL);
	alarm(watchdog_s);
}

void t_watchdog(unsigned seconds)
{
	watchdog_s = seconds;
	arm_watchdog();
}

void t_init(int argc, char **argv)
{
	(void)argc;
	t_argv0 = argv[0];
	tr = stdout;
	/* line by line, so a transcript cut short by the watchdog still shows */
	setvbuf(stdout, NULL, _IOLBF, 0);
	arm_watchdog();
}

void t_exit(void)
{
	fflush(tr);
	fflush(stdout);
	fflush(stderr);
	if (tr != stdout)
		_exit(t_failed ? 1 : 0);   /* a peer: the parent's atexit work is not ours */
	exit(t_failed ? 1 : 0);
}

void say(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vfprintf(tr, fmt, ap);
	va_end(ap);
	fputc('\n', tr);
}

static void vnote(const char *fmt, va_list ap)
{
	char msg[512];

	vsnprintf(msg, sizeof(msg), fmt, ap);
	fprintf(tr, "FAIL: %s\n", msg);
	fflush(tr);
	fprintf(stderr, "%s[%d]: FAIL: %s\n", t_argv0 ? t_argv0 : "test", (int)getpid(), msg);
	t_failed = true;
}

void fail(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vnote(fmt, ap);
	va_end(ap);
}

void die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vnote(fmt, ap);
	va_end(ap);
	t_exit();
}

const char *ename(int e)
{
	static __thread char buf[16];
	const char *n = e ? strerrorname_np(e) : "0";

	if (n)
		return n;
	snprintf(buf, sizeof(buf), "E%d", e);
	return buf;
}

struct flagname {
	unsigned bit;
	const char *name;
};

static const char *flagstr(unsigned v, const struct flagname *t, size_t n, char *buf, size_t len)
{
	size_t used = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < n; i++) {
		if (!(v & t[i].bit))
			continue;
		used += snprintf(buf + used, len - used, "%s%s", used ? "|" : "", t[i].name);
		v &= ~t[i].bit;
	}
	if (v)
		used += snprintf(buf + used, len - used, "%s0x%x", used ? "|" : "", v);
	if (!used)
		snprintf(buf, len, "0");
	return buf;
}

const char *pollstr(int revents)
{
	static const struct flagname t[] = {
		{ POLLIN, "IN" }, { POLLPRI, "PRI" }, { POLLOUT, "OUT" }, { POLLRDHUP, "RDHUP" },
		{ POLLERR, "ERR" }, { POLLHUP, "HUP" }, { POLLNVAL, "NVAL" },
		{ POLLRDNORM, "RDNORM" }, { POLLRDBAND, "RDBAND" }, { POLLWRNORM, "WRNORM" },
		{ POLLWRBAND, "WRBAND" },
	};
	static __thread char buf[128];

	return flagstr((unsigned)revents & 0xffff, t, sizeof(t) / sizeof(t[0]), buf, sizeof(buf));
}

const char *epollstr(uint32_t events)
{
	static const struct flagname t[] = {
		{ EPOLLIN, "IN" }, { EPOLLPRI, "PRI" }, { EPOLLOUT, "OUT" },
		{ EPOLLRDHUP, "RDHUP" },
		{ EPOLLERR, "ERR" }, { EPOLLHUP, "HUP" }, { EPOLLRDNORM, "RDNORM" },
		{ EPOLLRDBAND, "RDBAND" }, { EPOLLWRNORM, "WRNORM" }, { EPOLLWRBAND, "WRBAND" },
	};
	static __thread char buf[128];

	return flagstr(events, t, sizeof(t) / sizeof(t[0]), buf, sizeof(buf));
}

long t_expect(const char *what, long r, int err, long want_r, int want_err)
{
	bool ok;

	if (r < 0)
		fprintf(tr, "%s -> %ld %s", what, r, ename(err));
	else
		fprintf(tr, "%s -> %ld", what, r);
	ok = want_err ? (r == -1 && err == want_err) : r == want_r;
	if (!ok) {
		if (want_err)
			fprintf(tr, "  [UNEXPECTED: want -1 %s]", ename(want_err));
		else
			fprintf(tr, "  [UNEXPECTED: want %ld]", want_r);
		fprintf(stderr, "%s[%d]: FAIL: %s -> %ld %s\n", t_argv0 ? t_argv0 : "test",
			(int)getpid(), what, r, r < 0 ? ename(err) : "");
		t_failed = true;
	}
	fputc('\n', tr);
	errno = err;    /* the caller may look at it */
	return r;
}

long t_must(long r, int err, const char *file, int line, const char *expr)
{
	if (r < 0)
		die("%s:%d: %s: %s", file, line, expr, ename(err));
	return r;
}

/* ---- peers --------------------------------------------------------------- */

void peer_start(struct peer *p, const char *name, void (*fn)(struct peer *self, void *arg),
		void *arg)
{
	int down[2], up[2];
	pid_t parent = getpid();

	MUST(pipe(down));
	MUST(pipe(up));
	p->name = name;
	p->log = MUST(memfd_create("wsd-test-transcript", 0));
	/* stdio buffers would otherwise be written twice, once by each process */
	fflush(NULL);
	p->pid = MUST(fork());
	if (p->pid == 0) {
		struct peer self = { .pid = parent, .name = "parent", .ctl_r = down[0],
				     .ctl_w = up[1], .log = -1 };

		/* a peer left behind by a failed parent must not hang CI */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(1);
		arm_watchdog();   /* alarms do not cross fork */
		close(down[1]);
		close(up[0]);
		tr = fdopen(p->log, "w");
		if (!tr)
			_exit(1);
		setvbuf(tr, NULL, _IOLBF, 0);
		t_failed = false;
		fn(&self, arg);
		t_exit();
	}
	close(down[0]);
	close(up[1]);
	p->ctl_r = up[0];
	p->ctl_w = down[1];
}

void peer_end(struct peer *p)
{
	int status;
	char line[1024];
	FILE *f;

	close(p->ctl_w);
	while (waitpid(p->pid, &status, 0) < 0) {
		if (errno != EINTR)
			die("waitpid %s: %s", p->name, ename(errno));
	}
	f = fdopen(p->log, "r");
	if (!f)
		die("fdopen: %s", ename(errno));
	rewind(f);
	while (fgets(line, sizeof(line), f))
		fprintf(tr, "  %s: %s", p->name, line);
	fclose(f);
	close(p->ctl_r);
	if (WIFEXITED(status))
		say("%s exited %d", p->name, WEXITSTATUS(status));
	else
		say("%s killed by signal %d", p->name, WTERMSIG(status));
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "peer %s did not exit 0", p->name);
}

void ctl_send(struct peer *p, int v)
{
	if (write(p->ctl_w, &v, sizeof(v)) != sizeof(v))
		die("control channel to %s: %s", p->name, ename(errno));
}

int ctl_recv(struct peer *p)
{
	int v;
	ssize_t n;

	do
		n = read(p->ctl_r, &v, sizeof(v));
	while (n < 0 && errno == EINTR);
	if (n != sizeof(v))
		die("control channel from %s: %s", p->name, n == 0 ? "closed" : ename(errno));
	return v;
}

int t_peer_port(struct peer *self, int port)
{
	return port ? port : ctl_recv(self);
}

int t_listen_peer(struct peer *p, const char *name, void (*fn)(struct peer *self, void *arg),
		  void *arg, int *port, bool early)
{
	int lfd;

	if (early)
		peer_start(p, name, fn, arg);
	lfd = t_listen(AF_INET, port);
	if (early)
		ctl_send(p, *port);
	else
		peer_start(p, name, fn, arg);
	return lfd;
}

/* ---- data ---------------------------------------------------------------- */

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

void pattern(void *buf, size_t len, uint32_t seed, uint64_t offset)
{
	unsigned char *p = buf;
	uint64_t w = mix(((uint64_t)seed << 40) ^ (offset >> 3));

	for (size_t i = 0; i < len; i++, offset++) {
		if ((offset & 7) == 0)
			w = mix(((uint64_t)seed << 40) ^ (offset >> 3));
		p[i] = (unsigned char)(w >> (8 * (offset & 7)));
	}
}

void expect_pattern(const void *buf, size_t len, uint32_t seed, uint64_t offset, const char *what)
{
	uint8_t *want = malloc(len);

	if (!want)
		die("no memory");
	pattern(want, len, seed, offset);
	if (memcmp(buf, want, len))
		die("%s: the data arrived changed (offset %llu)", what, (unsigned long long)offset);
	free(want);
}

uint64_t csum(uint64_t h, const void *buf, size_t len)
{
	const unsigned char *p = buf;

	for (size_t i = 0; i < len; i++)
		h = (h ^ p[i]) * 0x100000001b3ull;
	return h;
}

double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	if (!d)
		die("opendir /proc/self/fd");
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n - 1;   /* the directory's own */
}

void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

void t_skip_server_forks(void)
{
#ifdef WSD_SANITIZERS
	fprintf(stderr, "the sanitizer build's allocator is not fork-safe beside the switch's "
		"threads (gcc 12's ASan has no fork handling); the plain build runs this\n");
	exit(77);
#endif
}

/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>
#include <sys/syscall.h>

#include "provider/internal.h"

/* Every runtime parameter, declared once; `wsd info` lists this table. */
static const struct wsd_param params[] = {
	{ "WSD_TRANSPORT", "string", "auto",
	  "transport for adapters opened without a name: auto, shm or verbs" },
	{ "WSD_VERBS_DEVICE", "string", "",
	  "RDMA device the verbs transport uses (empty: the first one)" },
	{ "WSD_DEBUG", "integer", "0",
	  "1: log transport events (connections, failed completions) to stderr" },
	{ "WSD_SPIN_US", "integer", "50",
	  "microseconds a waiter polls (yielding between polls) before it sleeps" },
	{ "WSD_SHM_RING_SIZE", "integer", "262144",
	  "bytes in each direction's shared-memory ring (power of two, 4 KiB to 64 MiB)" },
	{ "WSD_RCACHE_ENTRIES", "integer", "256",
	  "unused memory registrations the SPI keeps for reuse, per provider instance, "
	  "once freed memory is reported (wsd_rcache_enable: the memory hooks)" },
	{ "WSD_SHM_WINDOWS", "integer", "256",
	  "memory windows one shm endpoint can have bound at once" },
	{ "WSD_SWITCH", "integer", "1",
	  "0: the preloaded switch leaves every connection on kernel TCP" },
	{ "WSD_CONF", "path", "/etc/wsd.conf",
	  "the policy file: which connections the switch may accelerate (wsd.conf(5)); "
	  "empty: none" },
	{ "WSD_RENDEZVOUS_DIR", "path", "",
	  "a directory the host shares with its containers, where registries publish how "
	  "a connector of another network namespace reaches them (wsd-protocol(7)); empty: "
	  "none, each namespace on its own" },
	{ "WSD_SWITCH_RING", "integer", "0",
	  "bytes in each connection's receive ring (power of two, 16 KiB to 64 MiB; 0: 8 MiB "
	  "on shm, a sender's window growing into it while it streams, 256 KiB on verbs)" },
	{ "WSD_UPGRADE_BYTES", "integer", "16384",
	  "a connection is upgraded once it has carried this many bytes ..." },
	{ "WSD_UPGRADE_US", "integer", "1000",
	  "... or once it is this many microseconds old, whichever comes first" },
	{ "WSD_HOLD_US", "integer", "2000",
	  "on verbs, a new connection's first sends wait this long at most for its upgrade's "
	  "answer, then go by TCP (0: never held)" },
	{ "WSD_ZCOPY_THRESHOLD", "integer", "-1",
	  "blocking sends of at least this many bytes go by zero copy (0: never; -1: on shm "
	  "receives of 256 KiB offer their buffers, filled in two parts; else 262144)" },
};

const struct wsd_param *wsd_params(size_t *count)
{
	*count = sizeof(params) / sizeof(params[0]);
	return params;
}

static const struct wsd_param *find(const char *name)
{
	for (size_t i = 0; i < sizeof(params) / sizeof(params[0]); i++)
		if (!strcmp(params[i].name, name))
			return &params[i];
	abort(); /* a typo in the caller: fail loudly in tests */
}

/* A path's empty value is a value: no file (WSD_CONF). */
const char *wsd_param_str(const char *name)
{
	const struct wsd_param *p = find(name);
	const char *v = getenv(name);

	return v && (*v || !strcmp(p->type, "path")) ? v : p->def;
}

long wsd_param_long(const char *name)
{
	const struct wsd_param *p = find(name);
	const char *v = getenv(name);
	char *end;
	long n;

	if (v && *v) {
		n = strtol(v, &end, 0);
		if (*end == '\0' && n >= 0)
			return n;
	}
	return strtol(p->def, NULL, 0);
}

static pthread_once_t debug_once = PTHREAD_ONCE_INIT;
static int debug_on;

static void debug_init(void)
{
	debug_on = wsd_param_long("WSD_DEBUG") > 0;
}

void wsd_debug(const char *fmt, ...)
{
	va_list ap;

	pthread_once(&debug_once, debug_init);
	if (!debug_on)
		return;
	va_start(ap, fmt);
	fprintf(stderr, "wsd[%d]: ", (int)getpid());
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

static pthread_once_t spin_once = PTHREAD_ONCE_INIT;
static int64_t spin_ns;

static void spin_init(void)
{
	spin_ns = wsd_param_long("WSD_SPIN_US") * 1000;
}

/* WSD_SPIN_US in ns, read once: waits ask for it on every call. */
int64_t wsd_spin_ns(void)
{
	pthread_once(&spin_once, spin_init);
	return spin_ns;
}

_Atomic int wsd_threads_busy;
static _Atomic int threads_held;
static __thread bool counted;   /* this thread is counted busy by wsd_threads_work */

void wsd_threads_hold(int ms)
{
	atomic_store(&threads_held, 1);
	for (int64_t end = wsd_now_ms() + ms;
	     atomic_load(&wsd_threads_busy) > 0 && wsd_now_ms() < end;)
		sched_yield();
}

void wsd_threads_release(void)
{
	atomic_store(&threads_held, 0);
}

/*
 * Counted busy, unless a fork holds the threads: then back to idle until
 * it is done.  Both sides write, then read the other's word (sequentially
 * consistent), so either the hold sees this thread busy or it sees the hold.
 */
void wsd_threads_work(void)
{
	for (;;) {
		atomic_fetch_add(&wsd_threads_busy, 1);
		if (!atomic_load(&threads_held)) {
			counted = true;
			return;
		}
		wsd_threads_rest();
		while (atomic_load(&threads_held))
			sched_yield();
	}
}

void wsd_threads_rest(void)
{
	counted = false;
	atomic_fetch_sub(&wsd_threads_busy, 1);
}

bool wsd_threads_away(void)
{
	if (!counted)
		return false;
	wsd_threads_rest();
	return true;
}

void wsd_threads_back(bool away)
{
	if (away)
		wsd_threads_work();
}

int wsd_wait_fds(struct pollfd *p, unsigned n, int timeout_ms)
{
	int64_t end = timeout_ms < 0 ? -1 : wsd_now_ms() + timeout_ms;
	bool away = timeout_ms != 0 && wsd_threads_away();
	long r;

	for (;;) {
		int ms = wsd_ms_left(end);
		struct timespec ts = { ms / 1000, ms % 1000 * 1000000L };

		r = syscall(SYS_ppoll, p, (unsigned long)n, ms < 0 ? NULL : &ts, NULL, 8);
		if (r >= 0 || errno != EINTR)
			break;
	}
	wsd_threads_back(away);
	return (int)r;
}

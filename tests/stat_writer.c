/* SPDX-License-Identifier: MIT */
/*
 * For tests/stat_check.sh: publishes sockets through the switch's stat table
 * (switch/stat.c linked in directly: no preload, no real sockets), so that
 * `wsd stat` has known rows to show.
 *
 * usage: stat_writer [fork|exec|name|full]
 *   (none)  three slots: fd 11 IPv4 on shm with every counter set, fd 12
 *           IPv6 on tcp with reason peer-plain, fd 13 listening; prints
 *           "ready".  SIGUSR1 frees fd 12's slot ("freed"); SIGUSR2 exits
 *           normally, which removes the file.
 *   fork    the same, then forks: the child adds to fd 11's inherited slot
 *           (which must not reach the parent's file) and publishes fd 99 in
 *           a file of its own; it prints "child <pid>".
 *   exec    the same, then execs sleep: the file stays behind under a live
 *           pid that no longer maps it.
 *   name    the same under a name JSON must escape: x"y\z, a tab, an e
 *           acute, and a character cut short.
 *   full    allocates past the end of the table and checks what comes back;
 *           prints "full ok" and exits.
 * Exits by itself after 30 s, so a failed test leaves nothing running.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "switch/stat.h"
#include "switch/switch.h"   /* enum wsd_path, enum wsd_reason */

static volatile sig_atomic_t want_free, want_exit;

static void on_signal(int sig)
{
	if (sig == SIGUSR1)
		want_free = 1;
	else
		want_exit = 1;
}

static void set_addr(struct wsd_stat_addr *a, int family, const char *ip, uint16_t port)
{
	memset(a, 0, sizeof(*a));
	a->family = (uint8_t)family;
	a->port = port;
	if (inet_pton(family, ip, a->addr) != 1) {
		fprintf(stderr, "stat_writer: bad address %s\n", ip);
		exit(1);
	}
}

static struct wsd_stat_slot *publish(int fd, int path, int reason, int family, const char *lip,
				     uint16_t lport, const char *pip, uint16_t pport)
{
	struct wsd_stat_slot *s = wsd_stat_alloc();

	wsd_stat_begin(s);
	s->fd = fd;
	s->path = (uint8_t)path;
	s->reason = (uint8_t)reason;
	s->listening = reason == R_LISTENER;
	set_addr(&s->local, family, lip, lport);
	if (pip)
		set_addr(&s->peer, family, pip, pport);
	wsd_stat_end(s);
	return s;
}

static int full(void)
{
	static struct wsd_stat_slot *s[WSD_STAT_SLOTS];
	struct wsd_stat_slot *extra, *again, *other;

	for (unsigned int i = 0; i < WSD_STAT_SLOTS; i++) {
		s[i] = wsd_stat_alloc();
		/* the table is one array: slot i is i places after slot 0 */
		if (!s[i] || s[i] != s[0] + i) {
			fprintf(stderr, "stat_writer: slot %u is not the table's\n", i);
			return 1;
		}
	}
	extra = wsd_stat_alloc();   /* full: one of its own off the table, never NULL */
	if (!extra || (extra >= s[0] && extra <= s[WSD_STAT_SLOTS - 1])) {
		fprintf(stderr, "stat_writer: a full table gave %p\n", (void *)extra);
		return 1;
	}
	other = wsd_stat_alloc();
	if (!wsd_stat_own(extra) || extra == other) {
		fprintf(stderr, "stat_writer: slots off the table are shared\n");
		return 1;
	}
	wsd_stat_free(other);
	wsd_stat_add(extra, &extra->tcp_tx, 1);
	wsd_stat_free(extra);       /* back to the heap, not to the table */
	wsd_stat_free(s[100]);
	wsd_stat_free(s[100]);      /* a second free must not hand it out twice */
	again = wsd_stat_alloc();
	other = wsd_stat_alloc();
	if (again != s[100] || other == s[100]) {
		fprintf(stderr, "stat_writer: a freed slot did not come back once\n");
		return 1;
	}
	wsd_stat_free(other);       /* off the table again: its heap slot, freed (LSan) */
	printf("full ok\n");
	return 0;
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "";
	struct wsd_stat_slot *v4, *v6;
	struct sigaction sa;
	time_t end = time(NULL) + 30;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!strcmp(mode, "full"))
		return full();

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigaction(SIGUSR1, &sa, NULL);
	sigaction(SIGUSR2, &sa, NULL);

	/* before the first slot: the file takes the name when it is made */
	if (!strcmp(mode, "name"))
		prctl(PR_SET_NAME, "x\"y\\z\t\xc3\xa9\xc3");
	v4 = publish(11, PATH_SHM, R_NONE, AF_INET, "127.0.0.1", 5001, "127.0.0.1", 40000);
	v4->way = WAY_COPY;
	wsd_stat_add(v4, &v4->tcp_tx, 11);
	wsd_stat_add(v4, &v4->tcp_rx, 12);
	wsd_stat_add(v4, &v4->copy_tx, 1000);
	wsd_stat_add(v4, &v4->copy_rx, 2000);
	wsd_stat_add(v4, &v4->zcopy_tx, 3000000);
	wsd_stat_add(v4, &v4->zcopy_rx, 4000000);
	wsd_stat_add(v4, &v4->doorbells_tx, 5);
	wsd_stat_add(v4, &v4->doorbells_rx, 6);
	wsd_stat_add(v4, &v4->waits, 7);
	wsd_stat_add(v4, &v4->fallbacks, 8);
	wsd_stat_add(v4, &v4->channel, 9);        /* the channel's number, its peer's pid */
	wsd_stat_add(v4, &v4->peer_pid, 4321);
	/* the channel's memory: 16 pages of a 1 MiB memfd written (wsd stat --channels) */
	{
		int mfd = memfd_create("wsd-chan", MFD_CLOEXEC);
		struct stat st;
		uint8_t *m;

		if (mfd < 0 || ftruncate(mfd, 1 << 20) || fstat(mfd, &st) ||
		    (m = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0)) ==
			    MAP_FAILED) {
			perror("stat_writer: the channel's memfd");
			return 1;
		}
		for (int pg = 0; pg < 16; pg++)
			m[pg * 4096] = 1;
		atomic_store(&v4->mem_ino[0], (uint64_t)st.st_ino);
	}
	v6 = publish(12, PATH_TCP, R_PEER_PLAIN, AF_INET6, "::1", 5002, "2001:db8::7", 40001);
	wsd_stat_add(v6, &v6->tcp_tx, 100);
	wsd_stat_add(v6, &v6->tcp_rx, 200);
	wsd_stat_add(v6, &v6->fallbacks, 1);
	publish(13, PATH_TCP, R_LISTENER, AF_INET, "0.0.0.0", 5003, NULL, 0);
	printf("ready\n");

	if (!strcmp(mode, "exec")) {
		execlp("sleep", "sleep", "30", (char *)NULL);
		perror("stat_writer: sleep");
		return 1;
	}
	if (!strcmp(mode, "fork")) {
		pid_t pid = fork();

		if (pid < 0) {
			perror("stat_writer: fork");
			return 1;
		}
		if (pid == 0) {
			wsd_stat_atfork_child();
			/* an inherited socket counting on: into private memory */
			wsd_stat_add(v4, &v4->tcp_tx, 999);
			wsd_stat_free(v6);
			publish(99, PATH_TCP, R_FORKED, AF_INET, "127.0.0.1", 5099, "127.0.0.1",
				40099);
			printf("child %d\n", (int)getpid());
		}
	}

	while (!want_exit && time(NULL) < end) {
		struct timespec ts = { 0, 20 * 1000 * 1000 };

		if (want_free) {
			want_free = 0;
			wsd_stat_free(v6);
			printf("freed\n");
		}
		nanosleep(&ts, NULL);
	}
	return 0;
}

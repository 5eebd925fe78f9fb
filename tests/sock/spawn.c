/* SPDX-License-Identifier: MIT */
/*
 * Children started without fork: vfork then exec (what Python's subprocess
 * does), posix_spawn and posix_spawnp (glibc clones and execs inside), and
 * system and popen (which spawn inside the C library too).  A child that
 * execs leaves the parent's connections as they were, a close-on-exec one
 * included; a child that inherits a connection, or is given one by a dup2
 * file action, uses it, including a response that arrived before it
 * started; and the parent goes on with it afterwards.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/sock/common.h"

#define MARK "--child"
#define WAITING_LEN 3000

extern char **environ;

static struct echo e;
static char self[4096];

/* The child: a response waiting (when asked), then 10 calls on fd, exit 0. */
static void child(int fd, uint32_t seed, bool waiting)
{
	alarm(20);   /* a hang is a failure the parent reports */
	if (waiting)
		echo_response(fd, WAITING_LEN, seed);
	echo_calls(fd, 10, seed + 1);
	exit(0);
}

static int status_of(const char *what, pid_t pid)
{
	int st = -1;

	if (pid < 0) {
		fail("%s: %s", what, ename(errno));
		return -1;
	}
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	return st;
}

static void show_status(const char *what, int st)
{
	if (st >= 0 && WIFEXITED(st))
		say("%s: the child exited %d", what, WEXITSTATUS(st));
	else
		say("%s: the child ended with status %#x", what, st);
	CHECK(st == 0, "%s: the child failed (status %#x)", what, st);
}

static void args(char a[3][32], int fd, uint32_t seed, bool waiting)
{
	snprintf(a[0], 32, "%d", fd);
	snprintf(a[1], 32, "%u", seed);
	snprintf(a[2], 32, "%d", waiting);
}

int main(int argc, char **argv)
{
	posix_spawn_file_actions_t fa;
	char a[3][32], cmd[4200];
	int c1, c2, cl, st;
	pid_t pid;
	FILE *p;

	t_init(argc, argv);
	if (argc == 5 && !strcmp(argv[1], MARK))
		child(atoi(argv[2]), (uint32_t)atoi(argv[3]), atoi(argv[4]));
	if (readlink("/proc/self/exe", self, sizeof(self) - 1) < 0)
		die("readlink /proc/self/exe: %s", ename(errno));

	echo_start(&e, AF_INET, 2);
	c1 = echo_connect(&e);
	c2 = echo_connect(&e);
	EXPECT(0, "FD_CLOEXEC on the first", fcntl(c1, F_SETFD, FD_CLOEXEC));
	echo_calls(c1, 5, 1);
	echo_calls(c2, 5, 2);
	say("5 calls on each connection: ok");

	say("-- vfork, then exec in the child (Python's subprocess)");
	fflush(stdout);
	pid = vfork();
	if (pid == 0) {
		execl("/bin/true", "true", (char *)NULL);
		_exit(127);
	}
	show_status("vfork and exec /bin/true", status_of("vfork", pid));
	expect_path(c1);
	echo_calls(c1, 10, 3);
	say("10 calls on the close-on-exec connection: ok");
	/* the other, not close-on-exec, went to the child too (vfork as fork) */
	echo_calls(c2, 10, 4);
	say("10 calls on the other: ok");

	say("-- posix_spawn: the child inherits the second, a response waiting");
	echo_request(c2, WAITING_LEN, 100);
	wait_events(c2, POLLIN);
	args(a, c2, 100, true);
	fflush(stdout);
	pid = -1;
	errno = posix_spawn(&pid, self, NULL, NULL,
			    (char *[]){ self, MARK, a[0], a[1], a[2], NULL }, environ);
	show_status("posix_spawn", status_of("posix_spawn", pid));
	echo_calls(c2, 10, 5);
	say("10 calls on it in the parent afterwards: ok");
	/* the close-on-exec one went nowhere: still accelerated */
	expect_path(c1);
	echo_calls(c1, 5, 9);
	say("5 calls on the close-on-exec one: ok");

	say("-- posix_spawnp: a dup2 file action gives the child the close-on-exec one, a response waiting");
	cl = 800;
	while (fcntl(cl, F_GETFD) >= 0)
		cl++;
	echo_request(c1, WAITING_LEN, 200);
	wait_events(c1, POLLIN);
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, c1, cl);
	args(a, cl, 200, true);
	fflush(stdout);
	pid = -1;
	errno = posix_spawnp(&pid, self, &fa, NULL,
			     (char *[]){ self, MARK, a[0], a[1], a[2], NULL }, environ);
	posix_spawn_file_actions_destroy(&fa);
	show_status("posix_spawnp", status_of("posix_spawnp", pid));
	echo_calls(c1, 10, 6);
	say("10 calls on it in the parent afterwards: ok");

	say("-- system: the shell's child inherits the second");
	snprintf(cmd, sizeof(cmd), "exec '%s' %s %d 300 0", self, MARK, c2);
	fflush(stdout);
	st = system(cmd);
	show_status("system", st);
	echo_calls(c2, 10, 7);
	say("10 calls on it in the parent afterwards: ok");

	say("-- popen: the same through a pipe");
	snprintf(cmd, sizeof(cmd), "exec '%s' %s %d 400 0", self, MARK, c2);
	fflush(stdout);
	p = popen(cmd, "r");
	CHECK(p != NULL, "popen: %s", ename(errno));
	if (p) {
		char buf[16];

		EXPECT(0, "fread: the child printed nothing", fread(buf, 1, sizeof(buf), p));
		show_status("popen", pclose(p));
	}
	echo_calls(c2, 10, 8);
	say("10 calls on it in the parent afterwards: ok");

	EXPECT(0, "close", close(c1));
	EXPECT(0, "close", close(c2));
	echo_end(&e);
	t_exit();
}

/* SPDX-License-Identifier: MIT */
/*
 * The rendezvous directory's refusals (provider/shm/rdv.c): which
 * directories are used, which entries a connector follows, and which a
 * listener replaces.  Another user (nobody) owns the hostile entries and
 * sockets; needs root to make them, exits 77 otherwise.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "provider/internal.h"
#include "provider/shm/shm.h"
#include "tests/pair.h"

#define NOBODY 65534

static char dir[64];

/* 127.0.0.1:port, as a connector's own end */
static struct sockaddr_in end_of(uint16_t port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	return a;
}

/* The entry's path for that end, as the listener names it. */
static void entry_path(uint16_t port, char *out, size_t n)
{
	struct sockaddr_in a = end_of(port);
	char name[80];

	ck_assert_int_eq(shm_rdv_entry((struct sockaddr *)&a, sizeof(a), name, sizeof(name)), 0);
	snprintf(out, n, "%s/%s", dir, name);
}

/* Look up that end for at most 50 ms: the socket, or -errno. */
static int find(uint16_t port, uid_t *owner)
{
	struct sockaddr_in a = end_of(port);

	return shm_rdv_find((struct sockaddr *)&a, sizeof(a), wsd_now_ms() + 50, owner);
}

/* A directory is used only when it is one, owned by root or us, closed to others' writes. */
START_TEST(dir_refusals)
{
	char got[80], file[96];
	int fd;

	ck_assert_int_eq(chmod(dir, 01770), 0);
	ck_assert_int_eq(shm_rdv_dir(got, sizeof(got)), 0);
	ck_assert_str_eq(got, dir);
	ck_assert_int_eq(chmod(dir, 01777), 0);                      /* anyone may write */
	ck_assert_int_eq(shm_rdv_dir(got, sizeof(got)), -EPERM);
	ck_assert_int_eq(chmod(dir, 01770), 0);
	ck_assert_int_eq(chown(dir, NOBODY, NOBODY), 0);             /* another user's */
	ck_assert_int_eq(shm_rdv_dir(got, sizeof(got)), -EPERM);
	ck_assert_int_eq(chown(dir, 0, 0), 0);
	snprintf(file, sizeof(file), "%s/file", dir);                 /* not a directory */
	fd = open(file, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
	ck_assert(fd >= 0);
	close(fd);
	setenv("WSD_RENDEZVOUS_DIR", file, 1);
	ck_assert_int_eq(shm_rdv_dir(got, sizeof(got)), -EPERM);
	setenv("WSD_RENDEZVOUS_DIR", "relative/dir", 1);              /* not absolute */
	ck_assert_int_eq(shm_rdv_dir(got, sizeof(got)), -EINVAL);
	setenv("WSD_RENDEZVOUS_DIR", "", 1);                          /* none */
	ck_assert_int_eq(shm_rdv_dir(got, sizeof(got)), -ENOENT);
	setenv("WSD_RENDEZVOUS_DIR", dir, 1);
	unlink(file);
}
END_TEST

/* A listener published for an end: found, connected, its owner ours; withdrawn: not found. */
START_TEST(publish_find)
{
	char path[PATH_MAX];
	struct sockaddr_in peer = end_of(40001);
	uid_t owner = 12345;
	int l, s;

	l = shm_rdv_listen(5000, 4, path, sizeof(path));
	ck_assert_msg(l >= 0, "listen: %s", strerror(-l));
	ck_assert_int_eq(find(40001, &owner), -ENOENT);
	ck_assert_int_eq(shm_rdv_publish(path, (struct sockaddr *)&peer, sizeof(peer), true), 0);
	s = find(40001, &owner);
	ck_assert_msg(s >= 0, "find: %s", strerror(-s));
	ck_assert_int_eq(owner, geteuid());
	close(s);
	ck_assert_int_eq(shm_rdv_publish(path, (struct sockaddr *)&peer, sizeof(peer), false), 0);
	ck_assert_int_eq(find(40001, &owner), -ENOENT);
	shm_rdv_unlisten(path);
	close(l);
}
END_TEST

/* Entries a connector does not follow. */
START_TEST(entry_refusals)
{
	char entry[PATH_MAX], target[PATH_MAX], sock_path[96];
	struct sockaddr_un un = { .sun_family = AF_UNIX };
	uid_t owner;
	int fd;

	/* out of the directory */
	entry_path(40002, entry, sizeof(entry));
	ck_assert_int_eq(symlink("../l.0.0", entry), 0);
	ck_assert_int_eq(find(40002, &owner), -EACCES);
	unlink(entry);
	/* not named as a listener's socket */
	ck_assert_int_eq(symlink("passwd", entry), 0);
	ck_assert_int_eq(find(40002, &owner), -EACCES);
	unlink(entry);
	/* a listener's name, but a plain file */
	snprintf(target, sizeof(target), "%s/l.1.file", dir);
	fd = open(target, O_CREAT | O_WRONLY | O_CLOEXEC, 0666);
	ck_assert(fd >= 0);
	close(fd);
	ck_assert_int_eq(symlink("l.1.file", entry), 0);
	ck_assert_int_eq(find(40002, &owner), -EACCES);
	unlink(entry);
	unlink(target);
	/* a link to a link (O_PATH | O_NOFOLLOW opens the second link itself: no socket) */
	ck_assert_int_eq(symlink("/etc", target), 0);
	ck_assert_int_eq(symlink("l.1.file", entry), 0);
	ck_assert_int_eq(find(40002, &owner), -EACCES);
	unlink(entry);
	unlink(target);
	/* not a link at all */
	fd = open(entry, O_CREAT | O_WRONLY | O_CLOEXEC, 0666);
	ck_assert(fd >= 0);
	close(fd);
	ck_assert_int_eq(find(40002, &owner), -EACCES);
	unlink(entry);
	/* a socket of another user than the entry's (root's link, nobody's socket) */
	snprintf(sock_path, sizeof(sock_path), "%s/l.2.other", dir);
	snprintf(un.sun_path, sizeof(un.sun_path), "%s", sock_path);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	ck_assert(fd >= 0 && bind(fd, (struct sockaddr *)&un, sizeof(un)) == 0 && listen(fd, 4) == 0);
	ck_assert_int_eq(chown(sock_path, NOBODY, NOBODY), 0);
	ck_assert_int_eq(symlink("l.2.other", entry), 0);
	ck_assert_int_eq(find(40002, &owner), -EACCES);
	/* ...and the same socket under an entry of its own user: followed */
	unlink(entry);
	ck_assert_int_eq(symlink("l.2.other", entry), 0);
	ck_assert_int_eq(lchown(entry, NOBODY, NOBODY), 0);
	{
		int s = find(40002, &owner);

		ck_assert_msg(s >= 0, "find: %s", strerror(-s));
		ck_assert_int_eq(owner, NOBODY);
		close(s);
	}
	unlink(entry);
	unlink(sock_path);
	close(fd);
}
END_TEST

/* A listener does not replace another user's entry; its own stale one, it does. */
START_TEST(publish_keeps_others)
{
	char path[PATH_MAX], entry[PATH_MAX], target[64];
	struct sockaddr_in peer = end_of(40003);
	ssize_t n;
	int l = shm_rdv_listen(5001, 4, path, sizeof(path));

	ck_assert_msg(l >= 0, "listen: %s", strerror(-l));
	entry_path(40003, entry, sizeof(entry));
	ck_assert_int_eq(symlink("l.9.theirs", entry), 0);
	ck_assert_int_eq(lchown(entry, NOBODY, NOBODY), 0);
	ck_assert_int_eq(shm_rdv_publish(path, (struct sockaddr *)&peer, sizeof(peer), true),
			 -EEXIST);
	n = readlink(entry, target, sizeof(target) - 1);
	ck_assert(n > 0);
	target[n] = 0;
	ck_assert_str_eq(target, "l.9.theirs");
	/* withdrawing leaves it too: not ours */
	ck_assert_int_eq(shm_rdv_publish(path, (struct sockaddr *)&peer, sizeof(peer), false), 0);
	ck_assert_int_eq(readlink(entry, target, sizeof(target) - 1), n);
	unlink(entry);
	/* a stale entry of ours is replaced */
	ck_assert_int_eq(symlink("l.9.stale", entry), 0);
	ck_assert_int_eq(shm_rdv_publish(path, (struct sockaddr *)&peer, sizeof(peer), true), 0);
	n = readlink(entry, target, sizeof(target) - 1);
	ck_assert(n > 0);
	target[n] = 0;
	ck_assert_str_eq(target, strrchr(path, '/') + 1);
	ck_assert_int_eq(shm_rdv_publish(path, (struct sockaddr *)&peer, sizeof(peer), false), 0);
	shm_rdv_unlisten(path);
	close(l);
}
END_TEST

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *f)
{
	(void)st; (void)flag; (void)f;
	(void)remove(path);
	return 0;
}

int main(void)
{
	TCase *tc;
	int r;

	if (geteuid() != 0) {
		printf("rdv_test: makes entries and sockets of another user: needs root; skipped\n");
		return 77;
	}
	snprintf(dir, sizeof(dir), "/tmp/wsd-rdv-test.%d", (int)getpid());
	if (mkdir(dir, 01770) < 0 || chmod(dir, 01770) < 0) {
		printf("rdv_test: %s: %s\n", dir, strerror(errno));
		return 99;
	}
	setenv("WSD_RENDEZVOUS_DIR", dir, 1);
	tc = t_case("rdv", 0, NULL);
	tcase_add_test(tc, dir_refusals);
	tcase_add_test(tc, publish_find);
	tcase_add_test(tc, entry_refusals);
	tcase_add_test(tc, publish_keeps_others);
	r = t_run("rdv", tc);
	/* what a failed case left behind too */
	nftw(dir, rm_one, 8, FTW_DEPTH | FTW_PHYS);
	return r;
}

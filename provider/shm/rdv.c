/* SPDX-License-Identifier: MIT */
/*
 * The rendezvous directory (WSD_RENDEZVOUS_DIR): how a connector finds a
 * registry in another network namespace on this host, where the abstract
 * name "\0wsd-nd.PORT" cannot reach (wsd-protocol(7), "Across network
 * namespaces").
 *
 * A listener binds a pathname socket "l.PORT.RANDOM" in the directory.
 * For each TCP connection its program accepts, the switch publishes
 * "c.ADDR_PORT", a symbolic link to that socket named by the connection's
 * peer end: the client's own end, which a DNAT rule does not change and
 * which the client knows as its local address.  The connector looks up
 * its own end of the connection it upgrades and connects to the socket
 * the entry names.
 *
 * Whoever may write the directory may publish there, so the directory
 * decides whom a connector trusts: it is used only when owned by root or
 * by us and not writable by others (a group of server users may write it;
 * the sticky bit keeps them from removing each other's entries).  An
 * entry is made with symlink(2), which never replaces one; it is followed
 * only to a socket in the same directory owned by the entry's owner, never
 * through a second link (O_PATH | O_NOFOLLOW, then a connect through that
 * handle), and every wait is bounded.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "provider/shm/shm.h"

/* Room in sun_path for the directory, "/l.PORT.RANDOM" and its NUL. */
#define RDV_DIR_MAX 80
/* A connector waits this long at most for the listener's accept to publish its entry. */
#define RDV_WAIT_MS 1000
#define RDV_BUSY_MS 100

/*
 * The sockets this process bound there, unlinked when their listener
 * closes or, at the latest, when the process exits (a registry outlives
 * its listener a while, and a program may exit with listeners open).  A
 * process killed leaves its sockets: stale names nobody answers on, which
 * a connector takes for nothing published.
 */
#define RDV_OWN_MAX 64
static pthread_mutex_t own_lock = PTHREAD_MUTEX_INITIALIZER;
static struct { pid_t pid; char path[108]; } own[RDV_OWN_MAX];

static void own_note(const char *path, bool on)
{
	pthread_mutex_lock(&own_lock);
	for (int i = 0; i < RDV_OWN_MAX; i++) {
		if (on && !own[i].pid) {
			own[i].pid = getpid();
			snprintf(own[i].path, sizeof(own[i].path), "%s", path);
			break;
		}
		if (!on && own[i].pid == getpid() && !strcmp(own[i].path, path)) {
			own[i].pid = 0;
			break;
		}
	}
	pthread_mutex_unlock(&own_lock);
}

__attribute__((destructor)) static void rdv_exit(void)
{
	for (int i = 0; i < RDV_OWN_MAX; i++)
		if (own[i].pid && own[i].pid == getpid())
			unlink(own[i].path);
}

void shm_rdv_unlisten(const char *path)
{
	unlink(path);
	own_note(path, false);
}

/* The directory, when configured and fit to trust: 0 and its path in dir. */
int shm_rdv_dir(char *dir, size_t n)
{
	const char *d = wsd_param_str("WSD_RENDEZVOUS_DIR");
	struct stat st;
	size_t len = strlen(d);

	if (!len)
		return -ENOENT;
	while (len > 1 && d[len - 1] == '/')
		len--;
	if (d[0] != '/' || len >= RDV_DIR_MAX || len >= n)
		return -EINVAL;
	memcpy(dir, d, len);
	dir[len] = 0;
	if (stat(dir, &st) < 0)
		return -errno;
	if (!S_ISDIR(st.st_mode) || (st.st_uid != 0 && st.st_uid != geteuid()) ||
	    (st.st_mode & S_IWOTH)) {
		wsd_debug("shm: rendezvous directory %s not used: not a directory owned by root "
			  "or us and closed to others' writes", dir);
		return -EPERM;
	}
	return 0;
}

/* "c.ADDR_PORT" for an address of the peer's end (IPv4-mapped as IPv4). */
int shm_rdv_entry(const struct sockaddr *a, socklen_t len, char *name, size_t n)
{
	char ip[INET6_ADDRSTRLEN];
	unsigned port;

	if (a->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)a;

		inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip));
		port = ntohs(in->sin_port);
	} else if (a->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)a;

		if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr))
			inet_ntop(AF_INET, &in6->sin6_addr.s6_addr[12], ip, sizeof(ip));
		else
			inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof(ip));
		port = ntohs(in6->sin6_port);
	} else {
		return -EINVAL;
	}
	if (!port || (size_t)snprintf(name, n, "c.%s_%u", ip, port) >= n)
		return -EINVAL;
	return 0;
}

/*
 * A listening pathname socket "DIR/l.PORT.RANDOM" for the listener of
 * port, open to every user (who may connect is the transport's uid check's
 * to say, as on the abstract name): its descriptor, the path in path.
 */
int shm_rdv_listen(unsigned port, int backlog, char *path, size_t n)
{
	struct sockaddr_un un = { .sun_family = AF_UNIX };
	char dir[RDV_DIR_MAX];
	uint64_t r;
	int fd, ret = shm_rdv_dir(dir, sizeof(dir));

	if (ret < 0)
		return ret;
	while (getrandom(&r, sizeof(r), 0) != sizeof(r))
		;
	snprintf(un.sun_path, sizeof(un.sun_path), "%s/l.%u.%016llx", dir, port,
		 (unsigned long long)r);
	if (strlen(un.sun_path) >= n)
		return -ENAMETOOLONG;
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&un, sizeof(un)) < 0 ||
	    chmod(un.sun_path, 0666) < 0 || listen(fd, backlog > 0 ? backlog : 16) < 0) {
		ret = -errno;
		unlink(un.sun_path);
		close(fd);
		return ret;
	}
	strcpy(path, un.sun_path);
	own_note(path, true);
	return fd;
}

static const char *base_of(const char *path)
{
	const char *b = strrchr(path, '/');

	return b ? b + 1 : path;
}

/*
 * Publish (on) the entry for a connection from peer, a link to the
 * listener's socket lpath, or withdraw it.  An entry there already is
 * replaced only when it is ours (one left by a connection of ours that
 * went without withdrawing it); another user's stays, and the connection
 * stays unpublished (-EEXIST).
 */
int shm_rdv_publish(const char *lpath, const struct sockaddr *peer, socklen_t len, bool on)
{
	char dir[RDV_DIR_MAX], name[80], entry[RDV_DIR_MAX + 80], target[128];
	struct stat st;
	ssize_t n;
	int ret = shm_rdv_dir(dir, sizeof(dir));

	if (ret < 0)
		return ret;
	ret = shm_rdv_entry(peer, len, name, sizeof(name));
	if (ret < 0)
		return ret;
	snprintf(entry, sizeof(entry), "%s/%s", dir, name);
	if (on) {
		for (int i = 0; i < 2; i++) {
			if (symlink(base_of(lpath), entry) == 0)
				return 0;
			if (errno != EEXIST || lstat(entry, &st) < 0 || !S_ISLNK(st.st_mode) ||
			    st.st_uid != geteuid() || unlink(entry) < 0)
				break;
		}
		wsd_debug("shm: rendezvous entry %s: %s", name, strerror(errno));
		return -EEXIST;
	}
	/* ours, and naming this listener: a later connection from peer may have its own */
	n = readlink(entry, target, sizeof(target) - 1);
	if (n < 0 || lstat(entry, &st) < 0 || st.st_uid != geteuid())
		return 0;
	target[n] = 0;
	if (!strcmp(target, base_of(lpath)))
		unlink(entry);
	return 0;
}

/*
 * The entry for our end from, followed: a socket in the directory, owned
 * by the entry's owner, opened without following a link.  An O_PATH handle
 * on it, or -ENOENT (no entry yet), or another -errno (not one to follow).
 */
static int entry_follow(const char *dir, const char *name)
{
	char entry[RDV_DIR_MAX + 80], target[128], path[RDV_DIR_MAX + 130];
	struct stat st, sock;
	ssize_t n;
	int h;

	snprintf(entry, sizeof(entry), "%s/%s", dir, name);
	if (lstat(entry, &st) < 0)
		return -errno;
	n = readlink(entry, target, sizeof(target) - 1);
	if (!S_ISLNK(st.st_mode) || n < 3)
		return -EACCES;
	target[n] = 0;
	if (strncmp(target, "l.", 2) || strchr(target, '/'))
		return -EACCES;
	snprintf(path, sizeof(path), "%s/%s", dir, target);
	h = open(path, O_PATH | O_NOFOLLOW | O_CLOEXEC);
	if (h < 0)
		return errno == ENOENT ? -ECONNREFUSED : -errno;   /* a listener gone */
	if (fstat(h, &sock) < 0 || !S_ISSOCK(sock.st_mode) || sock.st_uid != st.st_uid) {
		close(h);
		return -EACCES;
	}
	return h;
}

/*
 * Our end of the connection is from: the registry its peer's listener
 * published for it, connected (non-blocking) within deadline and
 * RDV_WAIT_MS.  The socket, or -ENOENT (nothing published: not upgraded
 * by this way), -EACCES (an entry not to follow), -ETIMEDOUT (a backlog
 * full for RDV_BUSY_MS), another -errno.  *owner: the uid of the entry.
 */
int shm_rdv_find(const struct sockaddr *from, socklen_t len, int64_t deadline, uid_t *owner)
{
	char dir[RDV_DIR_MAX], name[80], via[40];
	int64_t wait_end = wsd_now_ms() + RDV_WAIT_MS, busy_end;
	struct sockaddr_un un = { .sun_family = AF_UNIX };
	struct stat st;
	int h, sock, ret = shm_rdv_dir(dir, sizeof(dir));

	if (ret < 0)
		return ret;
	ret = shm_rdv_entry(from, len, name, sizeof(name));
	if (ret < 0)
		return ret;
	if (deadline >= 0 && deadline < wait_end)
		wait_end = deadline;
	/* the peer's accept may come a little after our connect: look again, briefly */
	while ((h = entry_follow(dir, name)) == -ENOENT && wsd_ms_left(wait_end) > 0) {
		bool away = wsd_threads_away();   /* a fork need not wait for it */

		poll(NULL, 0, 5);
		wsd_threads_back(away);
	}
	if (h < 0) {
		wsd_debug("shm: rendezvous %s/%s: %s", dir, name, strerror(-h));
		return h;
	}
	if (fstat(h, &st) < 0) {
		close(h);
		return -EACCES;
	}
	*owner = st.st_uid;
	snprintf(via, sizeof(via), "/proc/self/fd/%d", h);
	snprintf(un.sun_path, sizeof(un.sun_path), "%s", via);
	sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (sock < 0) {
		ret = -errno;
		close(h);
		return ret;
	}
	busy_end = wsd_now_ms() + RDV_BUSY_MS;
	if (deadline >= 0 && deadline < busy_end)
		busy_end = deadline;
	for (;;) {
		if (connect(sock, (struct sockaddr *)&un, sizeof(un)) == 0) {
			ret = 0;
			break;
		}
		ret = -errno;
		if ((ret != -EAGAIN && ret != -EINTR) || !wsd_ms_left(busy_end)) {
			ret = ret == -EAGAIN ? -ETIMEDOUT : ret;
			break;
		}
		bool away = wsd_threads_away();

		poll(NULL, 0, 5);
		wsd_threads_back(away);
	}
	close(h);
	if (ret < 0) {
		close(sock);
		return ret;
	}
	wsd_debug("shm: rendezvous %s/%s: connected", dir, name);
	return sock;
}

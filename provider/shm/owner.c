/* SPDX-License-Identifier: MIT */
/*
 * Does the registry's process hold the TCP listener it stands for?
 *
 * Anyone can bind the abstract name "wsd-nd.PORT" first.  The mutual
 * proof (proof.c) shows only that the squatter may read us and we it, so a
 * process of our own user passes it; the switch would then take a
 * connection to a server on PORT, plain or not, over to the squatter.  So
 * a connector that asks for it (SO_WSP_TCP_LISTENER) checks the process
 * behind the registry socket, by the pid the kernel gave (SO_PEERCRED,
 * never a pid the peer claims), in its own network namespace
 * (/proc/PID/net/tcp and tcp6 are the namespace of PID):
 *
 *  - the descriptor it names is a TCP socket listening on the port dialled,
 *    on the address dialled or a wildcard (a listener on another local
 *    address with the same port, which anyone may open, does not count);
 *  - or, failing that, it holds a connected TCP socket whose local end is
 *    exactly the address and port dialled.  Only the server's accepted
 *    connections have that end while its listener is open (a bind to it
 *    conflicts with the listener), and a one-shot server closes its
 *    listener once it has accepted, before its peer's switch comes; its
 *    registry lives on for such connections and must still pass.
 *
 * Reading /proc/PID/fd needs the ptrace read right, which the proof has
 * shown already; a process we may not inspect fails here as it fails there.
 *
 * The sockets on the port are asked of the kernel by sock_diag (netlink),
 * which filters by state and port itself, when PID's network namespace is
 * ours: /proc/PID/net/tcp lists every socket of the namespace, TIME_WAIT
 * included, and a server that has just closed 75,000 connections takes a
 * tenth of a second to print it, each time a new peer upgrades.  Another
 * namespace, or a kernel without sock_diag, is read from /proc as before.
 *
 * The registry's names themselves are asked of unix_diag (the end of this
 * file): who holds "wsd-nd.PORT" when a listener finds it taken, and
 * which alternate names "wsd-nd.PORT.INO.RANDOM" (wsd-protocol(7)) stand
 * for a TCP listener on the address dialled, held by a socket of our uid.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>

#include "provider/shm/shm.h"

/* the kernel's TCP state numbers */
#define ST_ESTABLISHED 0x01
#define ST_CLOSE_WAIT 0x08
#define ST_LISTEN 0x0A

struct inodes {
	unsigned long *v;
	size_t n, cap;
};

static const uint8_t v4mapped[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };

/* The dialled address as IPv6 (IPv4 mapped) and its port; -EINVAL if neither. */
int shm_owner_want(const struct sockaddr *addr, socklen_t len, struct shm_owner *o)
{
	int port = shm_addr_port(addr, len);

	memset(o, 0, sizeof(*o));    /* no end of ours known (from_port 0) */
	if (port <= 0)
		return -EINVAL;
	o->port = (unsigned)port;
	if (addr->sa_family == AF_INET) {
		memcpy(o->addr, v4mapped, 12);
		memcpy(o->addr + 12, &((const struct sockaddr_in *)addr)->sin_addr, 4);
	} else {
		memcpy(o->addr, &((const struct sockaddr_in6 *)addr)->sin6_addr, 16);
	}
	return 0;
}

/*
 * An address as /proc/net/tcp{,6} prints it: each 32-bit word of the
 * address as it lies in memory, printed %08X.  Into 16 bytes, IPv4 mapped.
 */
static int parse_addr(const char *hex, size_t len, uint8_t out[16])
{
	size_t words = len / 8;

	if (len != 8 && len != 32)
		return -1;
	if (words == 1)
		memcpy(out, v4mapped, 12);
	for (size_t i = 0; i < words; i++) {
		char w[9];
		uint32_t v;

		memcpy(w, hex + 8 * i, 8);
		w[8] = 0;
		v = (uint32_t)strtoul(w, NULL, 16);
		memcpy(out + 16 - 4 * (words - i), &v, 4);
	}
	return 0;
}

static int wildcard(const uint8_t a[16])
{
	static const uint8_t zero[16];

	return !memcmp(a, zero, 16) || (!memcmp(a, v4mapped, 12) && !memcmp(a + 12, zero, 4));
}

static int add(struct inodes *s, unsigned long ino)
{
	if (s->n == s->cap) {
		size_t cap = s->cap ? 2 * s->cap : 64;
		unsigned long *v = realloc(s->v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		s->v = v;
		s->cap = cap;
	}
	s->v[s->n++] = ino;
	return 0;
}

/*
 * One socket of the port: into *listen or *conn by its state and local
 * address (a, the port's), and, where o->from_port says which, its remote
 * end (ra, rport): then only the other end of that connection is one.
 */
static int sort_in(unsigned st, const uint8_t a[16], const uint8_t ra[16], unsigned rport,
		   unsigned long ino, const struct shm_owner *o, struct inodes *listen,
		   struct inodes *conn)
{
	if (st == ST_LISTEN && (wildcard(a) || !memcmp(a, o->addr, 16)))
		return add(listen, ino);
	if ((st == ST_ESTABLISHED || st == ST_CLOSE_WAIT) && !memcmp(a, o->addr, 16) &&
	    (!o->from_port || (rport == o->from_port && !memcmp(ra, o->from, 16))))
		return add(conn, ino);
	return 0;
}

/* Is pid's network namespace ours?  (false when we cannot tell) */
static bool same_netns(pid_t pid)
{
	char path[64];
	struct stat a, b;

	snprintf(path, sizeof(path), "/proc/%d/ns/net", (int)pid);
	return stat(path, &a) == 0 && stat("/proc/self/ns/net", &b) == 0 &&
	       a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

/*
 * A sock_diag dump: request q (len bytes) sent, and each message of the
 * answer, at least minlen bytes of payload, given to fn(arg, message)
 * until the dump is done; fn returns 0 to go on, 1 to look at no more (the
 * rest is read all the same), or -errno to fail.  0, -errno, or -1 when
 * the kernel would not answer.
 */
static int diag_dump(const void *q, size_t len, size_t minlen,
		     int (*fn)(void *arg, const struct nlmsghdr *h), void *arg)
{
	enum { BUF = 32768 };   /* a dump's messages come in pieces of up to this much */
	bool done = false, stop = false;
	int fd, ret = -1;
	char *buf;

	if (!(buf = malloc(BUF)))
		return -ENOMEM;
	fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
	if (fd < 0 || send(fd, q, len, 0) != (ssize_t)len)
		goto out;
	while (!done) {
		ssize_t n = recv(fd, buf, BUF, 0);
		struct nlmsghdr *h = (struct nlmsghdr *)buf;

		if (n <= 0)
			goto out;
		for (; NLMSG_OK(h, (size_t)n); h = NLMSG_NEXT(h, n)) {
			int r;

			if (h->nlmsg_type == NLMSG_DONE) {
				done = true;
				break;
			}
			if (h->nlmsg_type == NLMSG_ERROR || h->nlmsg_len < NLMSG_LENGTH(minlen))
				goto out;
			if (stop)
				continue;
			r = fn(arg, h);
			if (r < 0) {
				ret = r;
				goto out;
			}
			stop = r > 0;
		}
	}
	ret = 0;
out:
	if (fd >= 0)
		close(fd);
	free(buf);
	return ret;
}

struct diag_ctx {
	int family;
	const struct shm_owner *o;
	struct inodes *listen, *conn;
};

static int diag_one(void *arg, const struct nlmsghdr *h)
{
	const struct diag_ctx *c = arg;
	const struct inet_diag_msg *m = NLMSG_DATA(h);
	uint8_t a[16], ra[16];

	if (ntohs(m->id.idiag_sport) != c->o->port)
		return 0;   /* the filter is the kernel's: looked at again */
	if (c->family == AF_INET) {
		memcpy(a, v4mapped, 12);
		memcpy(a + 12, m->id.idiag_src, 4);
		memcpy(ra, v4mapped, 12);
		memcpy(ra + 12, m->id.idiag_dst, 4);
	} else {
		memcpy(a, m->id.idiag_src, 16);
		memcpy(ra, m->id.idiag_dst, 16);
	}
	return sort_in(m->idiag_state, a, ra, ntohs(m->id.idiag_dport), m->idiag_inode, c->o,
		       c->listen, c->conn) < 0 ? -ENOMEM : 0;
}

/*
 * collect() by sock_diag, in our namespace: TCP sockets of family whose
 * local port is o->port, in the states of the mask.  0, or -1 when the
 * kernel would not answer (the caller reads /proc instead).
 */
static int collect_diag_family(int family, const struct shm_owner *o, uint32_t states,
			       struct inodes *listen, struct inodes *conn)
{
	struct {
		struct nlmsghdr nh;
		struct inet_diag_req_v2 r;
		struct nlattr na;
		struct inet_diag_bc_op op[2];   /* "local port == o->port" */
	} q = {
		.nh = { .nlmsg_len = sizeof(q), .nlmsg_type = SOCK_DIAG_BY_FAMILY,
			.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP },
		.r = { .sdiag_family = (uint8_t)family, .sdiag_protocol = IPPROTO_TCP,
		       .idiag_states = states },
		.na = { .nla_len = NLA_HDRLEN + sizeof(q.op), .nla_type = INET_DIAG_REQ_BYTECODE },
		/* true: jump to the end (keep); false: past it (drop) */
		.op = { { INET_DIAG_BC_S_EQ, sizeof(q.op), sizeof(q.op) + 4 },
			{ 0, 0, (unsigned short)o->port } },
	};
	struct diag_ctx c = { family, o, listen, conn };

	_Static_assert(sizeof(q) == NLMSG_HDRLEN + sizeof(struct inet_diag_req_v2) + NLA_HDRLEN +
				       2 * sizeof(struct inet_diag_bc_op), "sock_diag request layout");
	return diag_dump(&q, sizeof(q), sizeof(struct inet_diag_msg), diag_one, &c);
}

/*
 * The inodes of pid's namespace that stand for the address dialled: in
 * *listen, listeners covering it; in *conn, connections with it as their
 * local end; those of the states in the mask (sock_diag; /proc gives all).
 */
static int collect(pid_t pid, const struct shm_owner *o, uint32_t states, struct inodes *listen,
		   struct inodes *conn)
{
	static const char *const tables[] = { "tcp", "tcp6" };
	char path[64], line[512];

	if (same_netns(pid)) {
		int r = collect_diag_family(AF_INET, o, states, listen, conn);

		if (!r)
			r = collect_diag_family(AF_INET6, o, states, listen, conn);
		if (r != -1)
			return r;
		/* no answer: what it found is found again below */
		listen->n = conn->n = 0;
	}
	for (size_t t = 0; t < sizeof(tables) / sizeof(tables[0]); t++) {
		FILE *f;

		snprintf(path, sizeof(path), "/proc/%d/net/%s", (int)pid, tables[t]);
		f = fopen(path, "re");
		if (!f)
			continue;   /* no IPv6 in that namespace, say */
		/* "sl local:port remote:port st queues timer retr uid timeout inode" */
		while (fgets(line, sizeof(line), f)) {
			char hex[33], rhex[33];
			unsigned lport, rport, st;
			unsigned long ino;
			uint8_t a[16], ra[16];
			int ret = 0;

			if (sscanf(line, " %*s %32[0-9A-Fa-f]:%x %32[0-9A-Fa-f]:%x %x %*s %*s %*s %*u "
				   "%*u %lu", hex, &lport, rhex, &rport, &st, &ino) != 6 ||
			    lport != o->port || parse_addr(hex, strlen(hex), a) < 0 ||
			    parse_addr(rhex, strlen(rhex), ra) < 0)
				continue;   /* the heading, or another port */
			ret = sort_in(st, a, ra, rport, ino, o, listen, conn);
			if (ret < 0) {
				fclose(f);
				return ret;
			}
		}
		fclose(f);
	}
	return 0;
}

static int member(const struct inodes *s, unsigned long ino)
{
	for (size_t i = 0; i < s->n; i++)
		if (s->v[i] == ino)
			return 1;
	return 0;
}

/* The inode of the socket pid holds as fd: 0, or -1 when it is none. */
static int socket_inode(pid_t pid, const char *fd, unsigned long *inode)
{
	char path[64], link[64], tail;
	ssize_t n;

	snprintf(path, sizeof(path), "/proc/%d/fd/%s", (int)pid, fd);
	n = readlink(path, link, sizeof(link) - 1);
	if (n <= 0)
		return -1;
	link[n] = 0;
	/* exactly "socket:[N]" */
	return sscanf(link, "socket:[%lu%c", inode, &tail) == 2 && tail == ']' &&
	       link[n - 1] == ']' ? 0 : -1;
}

/* Does pid hold, as any descriptor, a socket of s? */
static int holds_any(pid_t pid, const struct inodes *s)
{
	char path[64];
	struct dirent *d;
	DIR *dir;
	int found = 0;

	if (!s->n)
		return 0;
	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	dir = opendir(path);
	if (!dir)
		return 0;
	while (!found && (d = readdir(dir))) {
		unsigned long ino;

		if (d->d_name[0] != '.' && socket_inode(pid, d->d_name, &ino) == 0)
			found = member(s, ino);
	}
	closedir(dir);
	return found;
}

int shm_owner_check(pid_t pid, int fd, const struct shm_owner *o)
{
	struct inodes listen = { 0 }, conn = { 0 };
	unsigned long ino;
	char name[16];
	/*
	 * Listeners first: asked for alone, sock_diag walks only the
	 * listening table, where connections (TIME_WAIT too) would have it
	 * walk every established bucket, milliseconds on a large machine.
	 */
	int ret = collect(pid, o, 1u << ST_LISTEN, &listen, &conn), ok = 0;

	snprintf(name, sizeof(name), "%d", fd);
	if (ret == 0)
		ok = fd >= 0 && socket_inode(pid, name, &ino) == 0 && member(&listen, ino);
	if (ret == 0 && !ok)
		ret = collect(pid, o, 1u << ST_ESTABLISHED | 1u << ST_CLOSE_WAIT, &listen, &conn);
	if (ret == 0 && !ok)
		ok = holds_any(pid, &conn);
	free(listen.v);
	free(conn.v);
	if (ret < 0)
		return ret;
	if (!ok)
		wsd_debug("shm: pid %d holds no TCP listener (fd %d) nor connection on port %u: "
			  "refused", (int)pid, fd, o->port);
	return ok ? 0 : -EACCES;
}

/*
 * fd, handed over by a listener of another user, is a TCP listener of our
 * network namespace covering the address dialled (sock_diag lists only
 * ours): holding it is what the registry's process has to show.  A port
 * has one listener, or one SO_REUSEPORT group, which the kernel keeps to
 * one user.  Or, when we know our end of the connection (o->from_port), it
 * is that connection's other end: a fork child that closed the listener
 * (PostgreSQL's backends) holds that, and nobody else can show it.  0,
 * -EACCES, or -errno when the kernel would not tell.
 */
int shm_owner_check_fd(int fd, const struct shm_owner *o)
{
	struct inodes listen = { 0 }, conn = { 0 };
	struct stat st;
	int ret, ok;

	if (fstat(fd, &st) < 0 || !S_ISSOCK(st.st_mode))
		return -EACCES;
	ret = collect(getpid(), o, 1u << ST_LISTEN, &listen, &conn);
	ok = ret == 0 && member(&listen, (unsigned long)st.st_ino);
	if (ret == 0 && !ok && o->from_port) {
		ret = collect(getpid(), o, 1u << ST_ESTABLISHED | 1u << ST_CLOSE_WAIT, &listen,
			      &conn);
		ok = ret == 0 && member(&conn, (unsigned long)st.st_ino);
	}
	free(listen.v);
	free(conn.v);
	if (ret < 0)
		return ret;
	if (!ok)
		wsd_debug("shm: the listener handed over no TCP listener for port %u%s: refused",
			  o->port, o->from_port ? " nor our connection's other end" : "");
	return ok ? 0 : -EACCES;
}

/* ---- registry names held by whom: unix_diag ---------------------------- */

/*
 * Each listening (states) unix socket of our network namespace with an
 * abstract name: fn(arg, name without its leading 0, length, owner's uid
 * or -1 when the kernel does not say, inode); fn returns nonzero to stop.
 * 0, or -1 when the kernel would not answer.
 */
struct unix_ctx {
	int (*fn)(void *arg, const char *name, size_t len, long uid);
	void *arg;
};

static int unix_one(void *arg, const struct nlmsghdr *h)
{
	const struct unix_ctx *c = arg;
	const struct unix_diag_msg *m = NLMSG_DATA(h);
	int alen = (int)(h->nlmsg_len - NLMSG_LENGTH(sizeof(*m)));
	const struct rtattr *a;
	const char *name = NULL;
	size_t nlen = 0;
	long uid = -1;

	for (a = (const struct rtattr *)(m + 1); RTA_OK(a, alen); a = RTA_NEXT(a, alen)) {
		if (a->rta_type == UNIX_DIAG_NAME) {
			name = RTA_DATA(a);
			nlen = RTA_PAYLOAD(a);
		} else if (a->rta_type == UNIX_DIAG_UID && RTA_PAYLOAD(a) >= sizeof(uint32_t)) {
			uint32_t u;

			memcpy(&u, RTA_DATA(a), sizeof(u));
			uid = (long)u;
		}
	}
	if (name && nlen > 1 && name[0] == 0)
		return c->fn(c->arg, name + 1, nlen - 1, uid) != 0;
	return 0;
}

static int unix_names(uint32_t states,
		      int (*fn)(void *arg, const char *name, size_t len, long uid), void *arg)
{
	struct {
		struct nlmsghdr nh;
		struct unix_diag_req r;
	} q = {
		.nh = { .nlmsg_len = sizeof(q), .nlmsg_type = SOCK_DIAG_BY_FAMILY,
			.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP },
		.r = { .sdiag_family = AF_UNIX, .udiag_states = states,
		       .udiag_show = UDIAG_SHOW_NAME | UDIAG_SHOW_UID },
	};
	struct unix_ctx c = { fn, arg };

	return diag_dump(&q, sizeof(q), sizeof(struct unix_diag_msg), unix_one, &c) ? -1 : 0;
}

struct holder {
	const char *name;
	size_t len;
	long uid;
	bool found;
};

static int holder_fn(void *arg, const char *name, size_t len, long uid)
{
	struct holder *h = arg;

	if (len != h->len || memcmp(name, h->name, len))
		return 0;
	h->found = true;
	h->uid = uid;
	return 1;
}

int shm_name_holder(const struct sockaddr_un *un, socklen_t unlen)
{
	struct holder h = { .name = un->sun_path + 1, .uid = -1,
			    .len = unlen - offsetof(struct sockaddr_un, sun_path) - 1 };

	/* bound and never listening, or listening: every state (unix_diag numbers them as TCP's) */
	if (unix_names(~0u, holder_fn, &h) < 0 || !h.found || h.uid < 0 || h.uid > INT32_MAX)
		return -2;
	return (int)h.uid;
}

struct alts {
	char prefix[32];                     /* "wsd-nd.PORT." */
	size_t plen;
	const struct inodes *listen;
	struct sockaddr_un *out;
	socklen_t *outlen;
	int n, max;
};

/* "INO.HHHHHHHHHHHHHHHH": 0 and the inode, or -1 when it is not that shape. */
static int parse_alt(const char *s, size_t len, unsigned long *ino)
{
	size_t i = 0;

	*ino = 0;
	for (; i < len && s[i] >= '0' && s[i] <= '9' && i < 11; i++)
		*ino = *ino * 10 + (unsigned long)(s[i] - '0');
	if (i == 0 || i + 1 + 16 != len || s[i] != '.')
		return -1;
	for (i++; i < len; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return -1;
	return 0;
}

static int alts_fn(void *arg, const char *name, size_t len, long uid)
{
	struct alts *a = arg;
	unsigned long ino;

	if (len <= a->plen || len > sizeof(a->out->sun_path) - 1 ||
	    memcmp(name, a->prefix, a->plen) || parse_alt(name + a->plen, len - a->plen, &ino) ||
	    (uid >= 0 && (uid_t)uid != geteuid()) || !member(a->listen, ino))
		return 0;
	memset(&a->out[a->n], 0, sizeof(a->out[a->n]));
	a->out[a->n].sun_family = AF_UNIX;
	memcpy(a->out[a->n].sun_path + 1, name, len);
	a->outlen[a->n] = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + len);
	return ++a->n == a->max;
}

int shm_alt_names(unsigned name_port, const struct shm_owner *o, struct sockaddr_un *out,
		  socklen_t *outlen, int max)
{
	struct inodes listen = { 0 }, conn = { 0 };
	struct alts a = { .out = out, .outlen = outlen, .max = max, .listen = &listen };
	int ret;

	a.plen = (size_t)snprintf(a.prefix, sizeof(a.prefix), "wsd-nd.%u.", name_port);
	ret = collect(getpid(), o, 1u << ST_LISTEN, &listen, &conn);
	if (ret == 0 && listen.n)
		ret = unix_names(1u << ST_LISTEN, alts_fn, &a) < 0 ? -EOPNOTSUPP : 0;
	free(listen.v);
	free(conn.v);
	return ret < 0 ? ret : a.n;
}

struct alt_of {
	char prefix[48];                     /* "wsd-nd.PORT.INO." */
	size_t plen, ino_at;                 /* where INO begins in it */
	bool found;
};

static int alt_of_fn(void *arg, const char *name, size_t len, long uid)
{
	struct alt_of *a = arg;
	unsigned long ino;

	if (len <= a->plen || memcmp(name, a->prefix, a->plen) ||
	    (uid >= 0 && (uid_t)uid != geteuid()))
		return 0;
	a->found = parse_alt(name + a->ino_at, len - a->ino_at, &ino) == 0;
	return a->found;
}

/* Does a listener of our uid hold an alternate name for port and TCP listener ino? */
bool shm_alt_held(unsigned port, unsigned long ino)
{
	struct alt_of a = { .found = false };

	a.ino_at = (size_t)snprintf(a.prefix, sizeof(a.prefix), "wsd-nd.%u.", port);
	a.plen = a.ino_at + (size_t)snprintf(a.prefix + a.ino_at, sizeof(a.prefix) - a.ino_at,
					     "%lu.", ino);
	return unix_names(1u << ST_LISTEN, alt_of_fn, &a) == 0 && a.found;
}

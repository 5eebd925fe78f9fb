/* SPDX-License-Identifier: MIT */
/*
 * shm set-up trusts no peer: attackers that may not read the server (same
 * uid but a non-dumpable server; another uid), squatters on the registry
 * name, and a silent connector.  Each case checks that the attacker is
 * refused, gets no descriptor, and that the server lives and its existing
 * connection still moves data.  Needs root (to run processes as nobody).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/pair.h"
#include "provider/shm/shm.h"

#define NOBODY 65534

static int drop(void)
{
	/* setuid resets dumpable: be readable, as an ordinary same-user process is */
	return setgid(NOBODY) == 0 && setuid(NOBODY) == 0 &&
	       prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) == 0 ? 0 : -1;
}

static int64_t now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static int wait_child(pid_t pid)
{
	int status;

	if (waitpid(pid, &status, 0) != pid)
		return -1;
	return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

static int raw_connect(uint16_t port)
{
	struct sockaddr_in sa = t_addr(port);
	struct sockaddr_un un;
	socklen_t unlen;
	int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	if (s < 0 || shm_sock_name((struct sockaddr *)&sa, sizeof(sa), &un, &unlen) < 0 ||
	    connect(s, (struct sockaddr *)&un, unlen) < 0)
		return -1;
	return s;
}

static struct shm_ctl ctl(uint16_t type)
{
	return (struct shm_ctl){ .magic = SHM_MAGIC, .version = SHM_VERSION, .type = type };
}

/* The listener's next word: its type, 0 on EOF, -1 on silence. */
static int answer(int s, struct shm_ctl *m)
{
	int fds[4];
	int ret = shm_recv_ctl(s, m, fds, 4, 3000);

	for (int i = 0; i < 4; i++)
		if (fds[i] >= 0) {
			fprintf(stderr, "attacker got a descriptor\n");
			_exit(40);
		}
	if (ret == -ECONNABORTED || ret == -ECONNRESET)
		return 0;
	return ret < 0 ? -1 : m->type;
}

/*
 * An attacker speaking the protocol itself: HELLO with a region before any
 * proof; then a proof with a made-up echo.  Neither may get further.
 */
static int raw_attacks(uint16_t port)
{
	struct shm_ctl m = ctl(SHM_HELLO);
	static uint8_t my_nonce[SHM_NONCE] = { 1, 2, 3 };
	int fds[3], s, t;

	s = raw_connect(port);
	fds[0] = memfd_create("evil", MFD_CLOEXEC);
	fds[1] = eventfd(0, EFD_CLOEXEC);
	fds[2] = eventfd(0, EFD_CLOEXEC);
	if (s < 0 || fds[0] < 0 || ftruncate(fds[0], 1 << 20) < 0)
		return 30;
	m.ring_size = 1u << 30;   /* and more than the listener would ever map */
	m.nwindows = 1;
	(void)shm_send_ctl(s, &m, fds, 3);
	t = answer(s, &m);
	if (t != 0 && t != SHM_REJECT)
		return 31;
	close(s);

	s = raw_connect(port);
	m = ctl(SHM_PROVE);
	m.probe_addr = (uintptr_t)my_nonce;
	if (s < 0)
		return 32;
	/* a listener that refuses our uid may have closed already: its answer counts */
	(void)shm_send_ctl(s, &m, NULL, 0);
	t = answer(s, &m);
	if (t == SHM_PROVE_ACK) {
		m = ctl(SHM_ECHO);   /* a guess: we could not read the listener's */
		(void)shm_send_ctl(s, &m, NULL, 0);
		t = answer(s, &m);
		if (t != SHM_REJECT || m.reason != ND_ACCESS_DENIED)
			return 33;
	} else if (t != SHM_REJECT && t != 0) {
		return 34;
	}
	close(s);
	return 0;
}

/* The attacker: an honest connect that must be refused, then the raw ones. */
static int attacker(uint16_t port)
{
	struct sockaddr_in sa = t_addr(port);
	struct tside c;
	nd_status st;

	tside_open(&c, NULL);
	st = nd_ep_connect(c.ep, (struct sockaddr *)&sa, sizeof(sa), NULL, 0, 3000);
	if (st != ND_ACCESS_DENIED) {
		fprintf(stderr, "attacker uid %d: connect %s\n", getuid(), nd_strstatus(st));
		return 20;
	}
	return raw_attacks(port);
}

/*
 * The victim server: connected already (pair_start), it makes itself
 * non-dumpable, listens on a second port, sees no request from the attack,
 * then echoes one message over its existing connection.
 */
static int victim_server(struct tside *s, void *arg)
{
	uint16_t port = *(uint16_t *)arg;
	struct sockaddr_in sa = t_addr(port);
	struct nd_listener *l;
	struct nd_conn_request *req;
	struct nd_sge g = t_sge(s, 0, 4096);
	struct nd_result r;
	char ok = 'R';

	PEER_CHECK(prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0);
	PEER_CHECK(nd_listen(s->ad, (struct sockaddr *)&sa, sizeof(sa), 8, &l) == ND_SUCCESS);
	PEER_CHECK(nd_ep_receive(s->ep, NULL, &g, 1) == ND_SUCCESS);
	oob_send(s, &ok, 1);
	/* the attacks run now; none may reach us */
	PEER_CHECK(nd_listen_get_request(l, 2500, &req) == ND_TIMEOUT);
	nd_listen_close(l);
	oob_sync(s);
	r = t_wait(s->icq, 5000);
	PEER_CHECK(r.status == ND_SUCCESS && r.bytes == 5 && !memcmp(s->buf, "after", 5));
	g = t_sge(s, 0, 5);
	PEER_CHECK(nd_ep_send(s->ep, NULL, &g, 1, 0) == ND_SUCCESS);
	PEER_CHECK(t_wait(s->ocq, 5000).status == ND_SUCCESS);
	oob_sync(s);
	return 0;
}

/* The client of the victim's existing connection, and the one who starts the attacker. */
static int client_and_attack(int attacker_drops)
{
	uint16_t port = t_port();
	struct tside me;
	struct nd_sge g;
	struct nd_result r;
	pid_t pid;
	char c;
	int st;

	pair_start(&me, NULL, victim_server, &port, NULL);
	oob_recv(&me, &c, 1);
	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		alarm(20);
		if (attacker_drops && drop() < 0)
			_exit(10);
		_exit(attacker(port));
	}
	st = wait_child(pid);
	if (st) {
		fprintf(stderr, "attacker: exit %d\n", st);
		return 50 + st % 50;
	}
	oob_sync(&me);
	memcpy(me.buf, "after", 5);
	g = t_sge(&me, 0, 5);
	if (nd_ep_receive(me.ep, NULL, &(struct nd_sge){ me.buf + 4096, 64, me.mr }, 1) ||
	    nd_ep_send(me.ep, NULL, &g, 1, 0))
		return 2;
	if (t_wait(me.ocq, 5000).status != ND_SUCCESS)
		return 3;
	r = t_wait(me.icq, 5000);
	if (r.status != ND_SUCCESS || r.bytes != 5 || memcmp(me.buf + 4096, "after", 5))
		return 4;
	oob_sync(&me);
	st = pair_finish(&me);
	tside_close(&me);
	if (st)
		fprintf(stderr, "victim server: exit %d\n", st);
	return st ? 5 : 0;
}

/* (a) Same uid, the server not dumpable: the attacker cannot read it. */
START_TEST(same_uid_nondumpable_server)
{
	pid_t pid;

	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		alarm(40);
		if (drop() < 0)
			_exit(10);
		_exit(client_and_attack(0));
	}
	ck_assert_int_eq(wait_child(pid), 0);
}
END_TEST

/* (b) Another uid attacks a server of ours. */
START_TEST(other_uid_attacker)
{
	ck_assert_int_eq(client_and_attack(1), 0);
}
END_TEST

/*
 * A squatter on the registry name: answers like a listener would (reading
 * the connector's nonce if it can) and reports how many descriptors it got.
 */
static int squat(uint16_t port, int ready_fd, int report_fd)
{
	struct sockaddr_in sa = t_addr(port);
	struct sockaddr_un un;
	socklen_t unlen;
	int l = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0), s, got = 0;
	struct ucred cr;
	socklen_t crlen = sizeof(cr);

	if (l < 0 || shm_sock_name((struct sockaddr *)&sa, sizeof(sa), &un, &unlen) < 0 ||
	    bind(l, (struct sockaddr *)&un, unlen) < 0 || listen(l, 4) < 0)
		return 60;
	if (write(ready_fd, "r", 1) != 1 || shm_wait_readable(l, 5000) < 0)
		return 61;
	s = accept(l, NULL, NULL);
	if (s < 0 || getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cr, &crlen) < 0)
		return 62;
	for (;;) {
		char buf[512];
		union {
			char b[CMSG_SPACE(sizeof(int) * 8)];
			struct cmsghdr a;
		} u;
		struct iovec iov = { buf, sizeof(buf) };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.b,
				     .msg_controllen = sizeof(u.b) };
		struct shm_ctl m;
		ssize_t n;

		if (shm_wait_readable(s, 3000) < 0)
			break;
		n = recvmsg(s, &mh, 0);
		if (n <= 0)
			break;
		for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm))
			if (cm->cmsg_type == SCM_RIGHTS)
				got += (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
		memcpy(&m, buf, sizeof(m) < (size_t)n ? sizeof(m) : (size_t)n);
		if (m.type == SHM_PROVE) {
			struct iovec li = { m.nonce, SHM_NONCE };
			struct iovec ri = { (void *)(uintptr_t)m.probe_addr, SHM_NONCE };

			memset(m.nonce, 0, SHM_NONCE);
			(void)process_vm_readv(cr.pid, &li, 1, &ri, 1, 0);
			m.type = SHM_PROVE_ACK;
			m.probe_addr = (uintptr_t)buf;
			(void)send(s, &m, sizeof(m), MSG_NOSIGNAL);
		} else if (m.type == SHM_ECHO) {
			m.type = SHM_PROVED;   /* claim the echo was right */
			(void)send(s, &m, sizeof(m), MSG_NOSIGNAL);
		}
	}
	return write(report_fd, &got, sizeof(got)) == sizeof(got) ? 0 : 63;
}

/* A connector (this process) to a squatter of another uid or one that cannot read us. */
static int connect_to_squatter(int squatter_drops, int hide_self)
{
	uint16_t port = t_port();
	struct sockaddr_in sa = t_addr(port);
	int ready[2], report[2], got = -1, st;
	struct tside c;
	nd_status ns;
	pid_t pid;
	char b;

	if (pipe(ready) < 0 || pipe(report) < 0)
		return 1;
	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		alarm(20);
		if (squatter_drops && drop() < 0)
			_exit(10);
		_exit(squat(port, ready[1], report[1]));
	}
	if (read(ready[0], &b, 1) != 1)
		return 2;
	if (hide_self && prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
		return 3;
	tside_open(&c, NULL);
	ns = nd_ep_connect(c.ep, (struct sockaddr *)&sa, sizeof(sa), NULL, 0, 3000);
	if (ns != ND_ACCESS_DENIED) {
		fprintf(stderr, "connect to a squatter: %s\n", nd_strstatus(ns));
		return 4;
	}
	tside_close(&c);
	st = wait_child(pid);
	if (st) {
		fprintf(stderr, "squatter: exit %d\n", st);
		return 5;
	}
	if (read(report[0], &got, sizeof(got)) != sizeof(got) || got != 0) {
		fprintf(stderr, "squatter received %d descriptors\n", got);
		return 6;
	}
	return 0;
}

/* (c) A squatter of another uid gets nothing. */
START_TEST(squatter_other_uid)
{
	ck_assert_int_eq(connect_to_squatter(1, 0), 0);
}
END_TEST

/* (c) A same-uid squatter that cannot read the connector gets nothing. */
START_TEST(squatter_same_uid_unreadable)
{
	pid_t pid;

	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		alarm(30);
		if (drop() < 0)
			_exit(10);
		_exit(connect_to_squatter(0, 1));
	}
	ck_assert_int_eq(wait_child(pid), 0);
}
END_TEST

/* (e) A connector that says nothing does not hold up an honest one. */
START_TEST(silent_connector_does_not_stall)
{
	uint16_t port = t_port();
	struct sockaddr_in sa = t_addr(port);
	struct nd_listener *l;
	struct nd_conn_request *req;
	struct tside s;
	int p[2], q[2], took;
	int64_t t0;
	pid_t hush, honest;
	char b;

	ck_assert(pipe(p) == 0 && pipe(q) == 0);
	tside_open(&s, NULL);
	ck_status(nd_listen(s.ad, (struct sockaddr *)&sa, sizeof(sa), 8, &l), ND_SUCCESS);
	fflush(NULL);
	hush = fork();
	if (hush == 0) {
		alarm(20);
		if (raw_connect(port) < 0)
			_exit(1);
		(void)!write(p[1], "c", 1);
		(void)!read(q[0], &b, 1);   /* silent until told to go */
		_exit(0);
	}
	ck_assert(read(p[0], &b, 1) == 1);
	fflush(NULL);
	honest = fork();
	if (honest == 0) {
		struct tside c;

		alarm(20);
		tside_open(&c, NULL);
		t0 = now_ms();
		if (nd_ep_connect(c.ep, (struct sockaddr *)&sa, sizeof(sa), NULL, 0, 5000))
			_exit(1);
		took = (int)(now_ms() - t0);
		if (took > 1000) {
			fprintf(stderr, "honest connect took %d ms\n", took);
			_exit(2);
		}
		_exit(0);
	}
	t0 = now_ms();
	ck_status(nd_listen_get_request(l, 3000, &req), ND_SUCCESS);
	took = (int)(now_ms() - t0);
	ck_assert_msg(took < 1000, "the honest request came after %d ms", took);
	ck_status(nd_ep_accept(s.ep, req, NULL, 0, 3000), ND_SUCCESS);
	ck_assert_int_eq(wait_child(honest), 0);
	ck_assert(write(q[1], "g", 1) == 1);
	ck_assert_int_eq(wait_child(hush), 0);
	nd_listen_close(l);
	tside_close(&s);
}
END_TEST

/*
 * A process that already holds its share of the listener's proof slots
 * (two silent connections) is told "no room now" for a third, which the
 * switch asks again later, not "nobody listens", which it would take for
 * a plain program and leave alone for a while.
 */
START_TEST(full_share_is_no_room)
{
	uint16_t port = t_port();
	struct sockaddr_in sa = t_addr(port);
	struct nd_listener *l;
	struct tside s;
	pid_t pid;

	tside_open(&s, NULL);
	ck_status(nd_listen(s.ad, (struct sockaddr *)&sa, sizeof(sa), 8, &l), ND_SUCCESS);
	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		struct tside c;
		nd_status st;
		int64_t t0;

		alarm(20);
		tside_open(&c, NULL);
		/* two slots held (each for SHM_PROOF_MS at most), then the third asked */
		if (raw_connect(port) < 0 || raw_connect(port) < 0)
			_exit(1);
		t0 = now_ms();
		st = nd_ep_connect(c.ep, (struct sockaddr *)&sa, sizeof(sa), NULL, 0, 3000);
		if (st != ND_NO_MORE_ENTRIES) {
			fprintf(stderr, "the third connect: status %#x after %lld ms\n", (unsigned)st, (long long)(now_ms() - t0));
			_exit(2);
		}
		_exit(0);
	}
	{
		struct nd_conn_request *req;

		/* the listener works while we wait: no request completes */
		ck_status(nd_listen_get_request(l, 4000, &req), ND_TIMEOUT);
	}
	ck_assert_int_eq(wait_child(pid), 0);
	nd_listen_close(l);
	tside_close(&s);
}
END_TEST

/* A TCP socket of ours on ip, listening or not, on *port (0: any, then set). */
static int tcp_socket(const char *ip, int listening, uint16_t *port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(*port) };
	socklen_t al = sizeof(a);
	int one = 1, fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	ck_assert(fd >= 0 && inet_pton(AF_INET, ip, &a.sin_addr) == 1);
	ck_assert(setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0);
	ck_assert_msg(bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0, "bind %s:%u", ip, *port);
	ck_assert(!listening || listen(fd, 4) == 0);
	ck_assert(getsockname(fd, (struct sockaddr *)&a, &al) == 0);
	*port = ntohs(a.sin_port);
	return fd;
}

static struct shm_owner want(const char *ip, uint16_t port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	struct shm_owner o;

	ck_assert(inet_pton(AF_INET, ip, &a.sin_addr) == 1);
	ck_assert_int_eq(shm_owner_want((struct sockaddr *)&a, sizeof(a), &o), 0);
	return o;
}

/* (f) The registry's process holds the TCP listener: only that descriptor passes. */
START_TEST(owner_check_names_the_listener)
{
	uint16_t port = 0, other = 0, same;
	int lfd = tcp_socket("127.0.0.1", 1, &port), idle = tcp_socket("127.0.0.1", 0, &other);
	int sv[2], pp[2], elsewhere, cfd, afd;
	struct shm_owner o = want("127.0.0.1", port);
	struct shm_owner o2 = want("127.0.0.2", port);
	struct shm_owner oi = want("127.0.0.1", other);
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	pid_t me = getpid();

	ck_assert(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0 && pipe(pp) == 0);
	ck_assert_int_eq(shm_owner_check(me, lfd, &o), 0);
	ck_assert_int_eq(shm_owner_check(me, lfd, &o2), -EACCES);      /* another address */
	o.port++;
	ck_assert_int_eq(shm_owner_check(me, lfd, &o), -EACCES);       /* another port */
	o.port--;
	ck_assert_int_eq(shm_owner_check(me, idle, &oi), -EACCES);     /* bound, not listening */
	ck_assert_int_eq(shm_owner_check(me, sv[0], &o), -EACCES);     /* a unix socket */
	ck_assert_int_eq(shm_owner_check(me, pp[0], &o), -EACCES);     /* not a socket */
	ck_assert_int_eq(shm_owner_check(me, -1, &o), -EACCES);        /* named none */
	close(idle);
	ck_assert_int_eq(shm_owner_check(me, idle, &oi), -EACCES);     /* closed */
	/* anyone may listen on the same port of another local address: it does not count */
	same = port;
	elsewhere = tcp_socket("127.0.0.2", 1, &same);
	ck_assert_int_eq(shm_owner_check(me, elsewhere, &o), -EACCES);
	close(elsewhere);
	/*
	 * A one-shot server: its listener closed, it holds the accepted
	 * connection, whose local end is the address dialled.  A connection
	 * only queued (not accepted), or one with the port at its far end
	 * (cfd), does not count.
	 */
	cfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ck_assert(connect(cfd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
	ck_assert_int_eq(shm_owner_check(me, -1, &o), -EACCES);
	afd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
	ck_assert(afd >= 0);
	close(lfd);
	ck_assert_int_eq(shm_owner_check(me, lfd, &o), 0);
	close(afd);
	ck_assert_int_eq(shm_owner_check(me, lfd, &o), -EACCES);
	close(cfd);
	close(sv[0]); close(sv[1]); close(pp[0]); close(pp[1]);
}
END_TEST

/* A child connects asking for the check; its exit: 0 when ns was the outcome. */
static pid_t owner_connector(uint16_t port, nd_status want)
{
	pid_t pid;

	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		struct sockaddr_in sa = t_addr(port);
		struct tside c;
		nd_status ns;

		alarm(20);
		tside_open(&c, NULL);
		wsd_ep_owner_check(c.ep, true, 0);
		ns = nd_ep_connect(c.ep, (struct sockaddr *)&sa, sizeof(sa), NULL, 0, 5000);
		if (ns != want)
			fprintf(stderr, "connect asking for the owner check: %s\n", nd_strstatus(ns));
		tside_close(&c);
		_exit(ns == want ? 0 : 1);
	}
	return pid;
}

/*
 * (g) A listener that names no TCP listener is refused by a connector that
 * asks, and taken once it names the one it holds on that port.
 */
START_TEST(owner_check_end_to_end)
{
	struct sockaddr_in sa = t_addr(0);   /* the address the connector dials */
	char ip[INET_ADDRSTRLEN];
	uint16_t port = 0;
	int lfd = tcp_socket(inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof(ip)), 1, &port);
	struct nd_conn_request *req;
	struct nd_listener *l;
	struct tside s;
	pid_t pid;

	sa.sin_port = htons(port);
	tside_open(&s, NULL);
	ck_status(nd_listen(s.ad, (struct sockaddr *)&sa, sizeof(sa), 8, &l), ND_SUCCESS);
	pid = owner_connector(port, ND_ACCESS_DENIED);
	ck_status(nd_listen_get_request(l, 3000, &req), ND_TIMEOUT);
	ck_assert_int_eq(wait_child(pid), 0);

	ck_assert_int_eq(wsd_listen_owner(l, lfd), 0);
	pid = owner_connector(port, ND_SUCCESS);
	ck_status(nd_listen_get_request(l, 5000, &req), ND_SUCCESS);
	ck_status(nd_ep_accept(s.ep, req, NULL, 0, 5000), ND_SUCCESS);
	ck_assert_int_eq(wait_child(pid), 0);
	nd_listen_close(l);
	tside_close(&s);
	close(lfd);
}
END_TEST

/*
 * (h) A process in another network namespace: its sockets are looked up in
 * its namespace (/proc/PID/net), not ours (sock_diag answers for ours).  A
 * child listens on 0.0.0.0:port in a namespace of its own, where nothing
 * of ours is; the check must find that listener.
 */
START_TEST(owner_check_other_netns)
{
	int pp[2], go[2], info[2] = { -1, -1 };
	pid_t pid;

	ck_assert(pipe(pp) == 0 && pipe(go) == 0);
	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		struct sockaddr_in a = { .sin_family = AF_INET };
		socklen_t al = sizeof(a);
		int fd;
		char c;

		close(pp[0]);
		close(go[1]);
		alarm(20);
		if (unshare(CLONE_NEWNET) ||
		    (fd = socket(AF_INET, SOCK_STREAM, 0)) < 0 ||
		    bind(fd, (struct sockaddr *)&a, sizeof(a)) || listen(fd, 1) ||
		    getsockname(fd, (struct sockaddr *)&a, &al))
			_exit(1);
		info[0] = fd;
		info[1] = ntohs(a.sin_port);
		if (write(pp[1], info, sizeof(info)) != (ssize_t)sizeof(info))
			_exit(1);
		/* until the parent has looked (its end closed counts too) */
		_exit(read(go[0], &c, 1) < 0);
	}
	close(pp[1]);
	close(go[0]);
	ck_assert_int_eq(read(pp[0], info, sizeof(info)), (ssize_t)sizeof(info));
	{
		struct shm_owner o = want("127.0.0.1", (uint16_t)info[1]);

		ck_assert_int_eq(shm_owner_check(pid, info[0], &o), 0);
		o.port++;
		ck_assert_int_eq(shm_owner_check(pid, info[0], &o), -EACCES);
	}
	close(go[1]);
	close(pp[0]);
	ck_assert_int_eq(wait_child(pid), 0);
}
END_TEST

int main(void)
{
	TCase *tc;

	if (strcmp(t_transport(), "shm")) {
		printf("shm_proof_test: shm set-up only; skipped on %s\n", t_transport());
		return 77;
	}
	if (geteuid() != 0) {
		printf("shm_proof_test: needs root to run processes as uid %d; skipped\n", NOBODY);
		return 77;
	}
	tc = t_case("proof", 0, NULL);
	tcase_add_test(tc, same_uid_nondumpable_server);
	tcase_add_test(tc, other_uid_attacker);
	tcase_add_test(tc, squatter_other_uid);
	tcase_add_test(tc, squatter_same_uid_unreadable);
	tcase_add_test(tc, silent_connector_does_not_stall);
	tcase_add_test(tc, full_share_is_no_room);
	tcase_add_test(tc, owner_check_names_the_listener);
	tcase_add_test(tc, owner_check_end_to_end);
	tcase_add_test(tc, owner_check_other_netns);
	return t_run("shm_proof", tc);
}

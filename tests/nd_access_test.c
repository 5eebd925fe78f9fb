/* SPDX-License-Identifier: MIT */
/*
 * shm refuses a connection between processes that may not read each
 * other's memory (here: different uids) with ND_ACCESS_DENIED, in both
 * directions, and the listener never sees the request, unless both sides
 * take other users (SO_WSP_PEER_USERS): then they pair by copy, sends
 * alone (no read, write or bind), and a connector that asks for the TCP
 * listener's owner gets a handle on the listener to check, which lets it
 * do nothing to the listener (hostile_takes_listener).  Needs root to run
 * a second uid; exits 77 otherwise.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "provider/internal.h"
#include "provider/shm/shm.h"
#include "tests/pair.h"

#define NOBODY 65534

static int drop(void)
{
	return setgid(NOBODY) == 0 && setuid(NOBODY) == 0 ? 0 : -1;
}

/* In a child of another uid: connect to our listener; refused. */
START_TEST(other_uid_connects)
{
	struct tside s;
	struct nd_listener *l;
	struct nd_conn_request *req;
	uint16_t port = t_port();
	struct sockaddr_in sa = t_addr(port);
	int status;
	pid_t pid;

	tside_open(&s, NULL);
	ck_status(nd_listen(s.ad, (struct sockaddr *)&sa, sizeof(sa), 4, &l), ND_SUCCESS);
	pid = fork();
	if (pid == 0) {
		struct tside c;
		nd_status st;

		alarm(30);
		if (drop() < 0)
			_exit(10);
		tside_open(&c, NULL);
		st = nd_ep_connect(c.ep, (struct sockaddr *)&sa, sizeof(sa), NULL, 0, 5000);
		if (st != ND_ACCESS_DENIED) {
			fprintf(stderr, "connect from uid %d: %s\n", NOBODY, nd_strstatus(st));
			_exit(11);
		}
		_exit(0);
	}
	/* the refused request never reaches the application */
	ck_status(nd_listen_get_request(l, 1500, &req), ND_TIMEOUT);
	ck_assert(waitpid(pid, &status, 0) == pid);
	ck_assert_int_eq(WEXITSTATUS(status), 0);
	ck_status(nd_listen_close(l), ND_SUCCESS);
	tside_close(&s);
}
END_TEST

/* A listener of another uid: our connect is refused the same way. */
START_TEST(other_uid_listens)
{
	struct tside s;
	uint16_t port = t_port();
	struct sockaddr_in sa = t_addr(port);
	int p[2], status;
	pid_t pid;
	char c;

	ck_assert(pipe(p) == 0);
	pid = fork();
	if (pid == 0) {
		struct tside srv;
		struct nd_listener *l;
		struct nd_conn_request *req;

		alarm(30);
		if (drop() < 0)
			_exit(10);
		tside_open(&srv, NULL);
		if (nd_listen(srv.ad, (struct sockaddr *)&sa, sizeof(sa), 4, &l) != ND_SUCCESS)
			_exit(11);
		if (write(p[1], "r", 1) != 1)
			_exit(12);
		_exit(nd_listen_get_request(l, 1500, &req) == ND_TIMEOUT ? 0 : 13);
	}
	ck_assert(read(p[0], &c, 1) == 1);
	tside_open(&s, NULL);
	ck_status(nd_ep_connect(s.ep, (struct sockaddr *)&sa, sizeof(sa), NULL, 0, 5000),
		  ND_ACCESS_DENIED);
	ck_assert(waitpid(pid, &status, 0) == pid);
	ck_assert_int_eq(WEXITSTATUS(status), 0);
	tside_close(&s);
}
END_TEST

/*
 * In a child of another uid: connect to sa taking other users when opt
 * (and with owner, asking that the listener hold the TCP listener on the
 * port); on ND_SUCCESS trade a message each way and find reads and binds
 * refused, then wait for the parent (oob).  Exits 0 when the connect said
 * want and the rest held.
 */
static void copy_child(const struct sockaddr_in *sa, bool opt, bool owner,
		       const struct sockaddr_in *from, nd_status want, int oob_in, int oob_out)
{
	struct tside c;
	struct nd_result r;
	struct nd_sge in, out;
	struct nd_mw *mw;
	struct nd_mw_descriptor d = { 0 };
	nd_status st;

	alarm(30);
	if (drop() < 0)
		_exit(10);
	tside_open(&c, NULL);
	c.oob_in = oob_in;
	c.oob_out = oob_out;
	wsd_ep_other_users(c.ep, opt);
	wsd_ep_owner_check(c.ep, owner, 0);
	wsd_ep_owner_from(c.ep, (const struct sockaddr *)from, from ? sizeof(*from) : 0);
	in = t_sge(&c, 0, 64);
	if (nd_ep_receive(c.ep, NULL, &in, 1) != ND_SUCCESS)
		_exit(11);
	st = nd_ep_connect(c.ep, (const struct sockaddr *)sa, sizeof(*sa), NULL, 0, 5000);
	if (st != want) {
		fprintf(stderr, "connect from uid %d: %s\n", NOBODY, nd_strstatus(st));
		_exit(12);
	}
	if (st != ND_SUCCESS)
		_exit(0);
	memcpy(c.buf + 4096, "from nobody", 11);
	out = t_sge(&c, 4096, 11);
	if (nd_ep_send(c.ep, NULL, &out, 1, 0) != ND_SUCCESS ||
	    t_wait(c.ocq, 5000).status != ND_SUCCESS)
		_exit(13);
	r = t_wait(c.icq, 5000);
	if (r.status != ND_SUCCESS || r.bytes != 9 || memcmp(c.buf, "from root", 9))
		_exit(14);
	/* the peer's memory is not ours, nor ours the peer's */
	d.length = 4096;
	if (nd_ep_read(c.ep, NULL, &in, 1, &d, 0, 0) != ND_NOT_SUPPORTED ||
	    nd_mw_create(c.ad, &mw) != ND_SUCCESS ||
	    nd_ep_bind(c.ep, NULL, c.mr, mw, c.buf, 4096, ND_OP_FLAG_ALLOW_READ, &d) !=
		    ND_NOT_SUPPORTED)
		_exit(15);
	nd_mw_destroy(mw);
	oob_sync(&c);
	_exit(0);
}

/*
 * Our listener on sa, taking other users when opt, naming tcp_fd (or -1)
 * as its TCP listener; a child of another uid connects (copy_child):
 * on want == ND_SUCCESS the pair trades a message each way.
 */
static void copy_case(bool opt, bool child_opt, bool owner, int tcp_fd, uint16_t port,
		      const struct sockaddr_in *from, nd_status want)
{
	struct tside s;
	struct nd_listener *l;
	struct nd_conn_request *req;
	struct sockaddr_in sa = t_addr(port);
	int status, to[2], from_p[2];
	pid_t pid;

	ck_assert(pipe(to) == 0 && pipe(from_p) == 0);
	tside_open(&s, NULL);
	ck_status(nd_listen(s.ad, (struct sockaddr *)&sa, sizeof(sa), 4, &l), ND_SUCCESS);
	wsd_listen_other_users(l, opt);
	if (tcp_fd >= 0)
		ck_assert_int_eq(wsd_listen_owner(l, tcp_fd), 0);
	pid = fork();
	if (pid == 0) {
		copy_child(&sa, child_opt, owner, from, want, to[0], from_p[1]);
	}
	if (want != ND_SUCCESS) {
		/* a refused request never reaches the application */
		ck_status(nd_listen_get_request(l, 1500, &req), ND_TIMEOUT);
	} else {
		struct nd_sge in = t_sge(&s, 0, 64), out;
		struct nd_result r;
		struct nd_mw_descriptor d = { .length = 4096 };

		ck_status(nd_listen_get_request(l, 5000, &req), ND_SUCCESS);
		ck_status(nd_ep_receive(s.ep, NULL, &in, 1), ND_SUCCESS);
		ck_status(nd_ep_accept(s.ep, req, NULL, 0, 5000), ND_SUCCESS);
		r = t_wait(s.icq, 5000);
		ck_status(r.status, ND_SUCCESS);
		ck_assert(r.bytes == 11 && !memcmp(s.buf, "from nobody", 11));
		memcpy(s.buf + 4096, "from root", 9);
		out = t_sge(&s, 4096, 9);
		ck_status(nd_ep_send(s.ep, NULL, &out, 1, 0), ND_SUCCESS);
		ck_status(t_wait(s.ocq, 5000).status, ND_SUCCESS);
		ck_status(nd_ep_read(s.ep, NULL, &in, 1, &d, 0, 0), ND_NOT_SUPPORTED);
		s.oob_in = from_p[0];
		s.oob_out = to[1];
		oob_sync(&s);
		s.oob_in = s.oob_out = -1;
	}
	ck_assert(waitpid(pid, &status, 0) == pid);
	ck_assert_int_eq(WEXITSTATUS(status), 0);
	ck_status(nd_listen_close(l), ND_SUCCESS);
	tside_close(&s);
	close(to[0]);
	close(to[1]);
	close(from_p[0]);
	close(from_p[1]);
}

/* Both take other users: paired, by copy. */
START_TEST(copy_pairs)
{
	copy_case(true, true, false, -1, t_port(), NULL, ND_SUCCESS);
}
END_TEST

/* Only one side takes other users: refused, both ways round. */
START_TEST(copy_needs_both)
{
	copy_case(true, false, false, -1, t_port(), NULL, ND_ACCESS_DENIED);
	copy_case(false, true, false, -1, t_port(), NULL, ND_ACCESS_DENIED);
}
END_TEST

/* A TCP listener on 127.0.0.1:port, or -1. */
static int tcp_listener(uint16_t port)
{
	struct sockaddr_in a = t_addr(port);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;

	if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
	    bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 4) < 0) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

/*
 * The owner check across users: the listener hands over its TCP listener,
 * which must be the one on the port dialled; one on another port, or
 * none, is refused.
 */
START_TEST(copy_owner_by_listener)
{
	uint16_t port = t_port(), other = t_port();
	int fd = tcp_listener(port), wrong = tcp_listener(other);

	ck_assert_msg(fd >= 0 && wrong >= 0, "no TCP listener on %u or %u: %s", port, other,
		      strerror(errno));
	copy_case(true, true, true, fd, port, NULL, ND_SUCCESS);
	copy_case(true, true, true, wrong, port, NULL, ND_ACCESS_DENIED);
	copy_case(true, true, true, -1, port, NULL, ND_ACCESS_DENIED);
	close(fd);
	close(wrong);
}
END_TEST

/*
 * A fork child that closed the listener (PostgreSQL's backends) names the
 * connection it holds instead, and hands over a handle on it: the
 * connector takes it when it is the other end of its own connection
 * (SO_WSP_TCP_FROM), and not when it names another end or none.
 */
START_TEST(copy_owner_by_connection)
{
	uint16_t port = t_port();
	int l = tcp_listener(port), c, a;
	struct sockaddr_in sa = t_addr(port), mine, other;
	socklen_t ml = sizeof(mine);

	ck_assert_msg(l >= 0, "no TCP listener on %u: %s", port, strerror(errno));
	c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ck_assert(c >= 0 && connect(c, (struct sockaddr *)&sa, sizeof(sa)) == 0);
	ck_assert(getsockname(c, (struct sockaddr *)&mine, &ml) == 0);
	a = accept(l, NULL, NULL);
	ck_assert(a >= 0);
	close(l);   /* the handler's way: the listener is its parent's */
	other = mine;
	other.sin_port = htons((uint16_t)(ntohs(mine.sin_port) + 1));
	copy_case(true, true, true, a, port, &mine, ND_SUCCESS);
	copy_case(true, true, true, a, port, &other, ND_ACCESS_DENIED);
	copy_case(true, true, true, a, port, NULL, ND_ACCESS_DENIED);
	close(a);
	close(c);
}
END_TEST

/*
 * A hostile process of another uid speaks the copy proof itself and keeps
 * what PROVE_ACK hands over, then does what a socket would let it do to a
 * listener: shut it down (a TCP listener so shut stops listening), make it
 * non-blocking (a blocking server's accept would fail with EAGAIN), change
 * its backlog, take a connection from it.  Exits 0 when it got a handle of
 * the listener (its inode) and every one of those failed.
 */
static void hostile_child(uint16_t port, unsigned long ino)
{
	struct sockaddr_un un = { .sun_family = AF_UNIX };
	struct shm_ctl m = { .magic = SHM_MAGIC, .version = SHM_VERSION, .type = SHM_PROVE,
			     .features = SHM_FEAT_COPY };
	struct stat st;
	int s, fd = -1, n;

	alarm(30);
	if (drop() < 0)
		_exit(10);
	n = snprintf(un.sun_path + 1, sizeof(un.sun_path) - 1, "wsd-nd.%u", port);
	s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (s < 0 || connect(s, (struct sockaddr *)&un,
			     (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n)))
		_exit(11);
	if (shm_send_ctl(s, &m, NULL, 0) < 0 || shm_recv_ctl(s, &m, &fd, 1, 5000) < 0 ||
	    m.type != SHM_PROVE_ACK)
		_exit(12);
	if (fd < 0 || fstat(fd, &st) || st.st_ino != ino)
		_exit(13);   /* the owner check needs it: handed over, and the listener's */
	if (shutdown(fd, SHUT_RDWR) == 0 || shutdown(fd, SHUT_RD) == 0)
		_exit(14);
	if (fcntl(fd, F_SETFL, O_NONBLOCK) == 0)
		_exit(15);
	if (listen(fd, 0) == 0)
		_exit(16);
	if (accept4(fd, NULL, NULL, SOCK_NONBLOCK) >= 0)
		_exit(17);
	_exit(0);
}

/*
 * What the copy proof hands over gives its holder no power over our TCP
 * listener: after a hostile child of another uid tried (hostile_child),
 * the listener is still blocking and still takes connections.
 */
START_TEST(hostile_takes_listener)
{
	struct tside s;
	struct nd_listener *l;
	struct nd_conn_request *req;
	uint16_t port = t_port();
	struct sockaddr_in sa = t_addr(port);
	int fd = tcp_listener(port), c, a, status;
	struct pollfd p;
	struct stat st;
	pid_t pid;

	ck_assert_msg(fd >= 0, "no TCP listener on %u: %s", port, strerror(errno));
	ck_assert(fstat(fd, &st) == 0);
	tside_open(&s, NULL);
	ck_status(nd_listen(s.ad, (struct sockaddr *)&sa, sizeof(sa), 4, &l), ND_SUCCESS);
	wsd_listen_other_users(l, true);
	ck_assert_int_eq(wsd_listen_owner(l, fd), 0);
	pid = fork();
	if (pid == 0)
		hostile_child(port, (unsigned long)st.st_ino);
	/* its requests are taken here; it never says HELLO */
	ck_status(nd_listen_get_request(l, 1500, &req), ND_TIMEOUT);
	ck_assert(waitpid(pid, &status, 0) == pid);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		      "the hostile child: exit %d (13: no handle; 14-17: it acted on the listener)",
		      WIFEXITED(status) ? WEXITSTATUS(status) : -1);
	ck_assert_int_eq(fcntl(fd, F_GETFL) & O_NONBLOCK, 0);
	c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ck_assert(c >= 0 && connect(c, (struct sockaddr *)&sa, sizeof(sa)) == 0);
	p = (struct pollfd){ .fd = fd, .events = POLLIN };
	ck_assert_msg(poll(&p, 1, 5000) == 1, "the listener takes no connection");
	a = accept(fd, NULL, NULL);
	ck_assert_msg(a >= 0, "accept: %s", strerror(errno));
	close(a);
	close(c);
	ck_status(nd_listen_close(l), ND_SUCCESS);
	tside_close(&s);
	close(fd);
}
END_TEST

int main(void)
{
	TCase *tc;

	if (strcmp(t_transport(), "shm")) {
		printf("nd_access_test: the uid check is the shm transport's; skipped on %s\n",
		       t_transport());
		return 77;
	}
	if (geteuid() != 0) {
		printf("nd_access_test: needs root to run a process of another uid; skipped\n");
		return 77;
	}
	tc = t_case("access", 0, NULL);
	tcase_add_test(tc, other_uid_connects);
	tcase_add_test(tc, other_uid_listens);
	tcase_add_test(tc, copy_pairs);
	tcase_add_test(tc, copy_needs_both);
	tcase_add_test(tc, copy_owner_by_listener);
	tcase_add_test(tc, hostile_takes_listener);
	tcase_add_test(tc, copy_owner_by_connection);
	return t_run("nd_access", tc);
}

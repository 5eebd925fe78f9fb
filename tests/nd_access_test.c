/* SPDX-License-Identifier: MIT */
/*
 * shm refuses a connection between processes that may not read each
 * other's memory (here: different uids) with ND_ACCESS_DENIED, in both
 * directions, and the listener never sees the request.  Needs root to run
 * a second uid; exits 77 otherwise.
 */
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

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
	return t_run("nd_access", tc);
}

/* SPDX-License-Identifier: MIT */
/*
 * Who may take a connection: the SPI's owner check (SO_WSP_TCP_LISTENER,
 * SO_WSP_TCP_PORT) between a connector and a listener in another process.
 * Runs on the transport named by WSD_TEST_TRANSPORT: shm checks, verbs
 * ignores the check and must connect every time.
 */
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/pair.h"
#include "wsd/wsp.h"

/*
 * SO_WSP_TCP_PORT: a listener on provider port P that holds the TCP
 * listener of port T (a fork child's own registry, serving T) passes the
 * connector's owner check only when the connector names T; the port
 * dialled, P, fails it (shm; verbs ignores the check).
 */
START_TEST(owner_port)
{
	WSAPROTOCOL_INFO info;
	WSPPROC_TABLE procs = { .cbSize = sizeof(procs) };
	WSPDATA d;
	struct sockaddr_in sa = t_addr(t_port()), ta = t_addr(0);
	socklen_t tl = sizeof(ta);
	int tcp, ready[2], err, v;
	socklen_t vl = sizeof(v);
	bool shm = !strcmp(t_transport(), "shm");
	pid_t peer;
	char c;

	/* T: a kernel TCP listener the peer holds, on a port other than P */
	tcp = socket(AF_INET, SOCK_STREAM, 0);
	ck_assert(tcp >= 0 && bind(tcp, (struct sockaddr *)&ta, sizeof(ta)) == 0 &&
		  listen(tcp, 4) == 0 && getsockname(tcp, (struct sockaddr *)&ta, &tl) == 0);
	ck_assert(ta.sin_port != sa.sin_port && pipe(ready) == 0);
	fflush(NULL);
	peer = fork();
	if (peer == 0) {
		SOCKET l;

		alarm(60);
		t_is_peer = 1;
		setenv("WSD_TRANSPORT", t_transport(), 1);
		if (WSPStartup(WSP_VERSION, &d, &info, NULL, &procs))
			_exit(90);
		l = WSPSocket(AF_INET, SOCK_STREAM, 0, &info, 0, 0, &err);
		if (l == INVALID_SOCKET || WSPBind(l, (struct sockaddr *)&sa, sizeof(sa), &err) ||
		    WSPSetSockOpt(l, SOL_WSP, SO_WSP_TCP_LISTENER, &tcp, sizeof(tcp), &err) ||
		    WSPListen(l, 4, &err) || write(ready[1], "r", 1) != 1)
			_exit(91);
		for (;;)
			(void)WSPAccept(l, NULL, NULL, NULL, 0, &err);
	}
	close(tcp);
	ck_assert(read(ready[0], &c, 1) == 1);
	setenv("WSD_TRANSPORT", t_transport(), 1);
	ck_assert_int_eq(WSPStartup(WSP_VERSION, &d, &info, NULL, &procs), 0);
	for (int i = 0; i < 4; i++) {
		/* the port dialled; T; a port nobody listens on; T with no check asked */
		int want = i == 1 || i == 3 || !shm ? 0 : WSAEACCES;
		int port = i == 0 ? 0 : i == 2 ? ntohs(ta.sin_port) + 1 : ntohs(ta.sin_port);
		int check = i < 3;
		SOCKET s = WSPSocket(AF_INET, SOCK_STREAM, 0, &info, 0, 0, &err);

		ck_assert(s != INVALID_SOCKET);
		ck_assert_int_eq(WSPSetSockOpt(s, SOL_WSP, SO_WSP_TCP_LISTENER, &check,
					       sizeof(check), &err), 0);
		ck_assert_int_eq(WSPSetSockOpt(s, SOL_WSP, SO_WSP_TCP_PORT, &port, sizeof(port),
					       &err), 0);
		ck_assert_int_eq(WSPGetSockOpt(s, SOL_WSP, SO_WSP_TCP_PORT, &v, &vl, &err), 0);
		ck_assert_int_eq(v, port);
		err = 0;
		(void)WSPConnect(s, (struct sockaddr *)&sa, sizeof(sa), NULL, NULL, NULL, NULL,
				 &err);
		ck_assert_msg(err == want, "connect %d: %d, want %d", i, err, want);
		if (!err) {
			/* connected: past the point the port matters */
			v = 1;
			ck_assert_int_eq(WSPSetSockOpt(s, SOL_WSP, SO_WSP_TCP_PORT, &v, sizeof(v),
						       &err), SOCKET_ERROR);
			ck_assert_int_eq(err, WSAEINVAL);
		}
		(void)WSPCloseSocket(s, &err);
	}
	{
		SOCKET s = WSPSocket(AF_INET, SOCK_STREAM, 0, &info, 0, 0, &err);

		for (int bad = -1; bad <= 65536; bad += 65537) {
			ck_assert_int_eq(WSPSetSockOpt(s, SOL_WSP, SO_WSP_TCP_PORT, &bad,
						       sizeof(bad), &err), SOCKET_ERROR);
			ck_assert_int_eq(err, WSAEINVAL);
		}
		(void)WSPCloseSocket(s, &err);
	}
	ck_assert_int_eq(WSPCleanup(info.provider, &err), 0);
	kill(peer, SIGKILL);
	ck_assert(waitpid(peer, NULL, 0) == peer);
	close(ready[0]);
	close(ready[1]);
}
END_TEST

int main(int argc, char **argv)
{
	TCase *tc = t_case("owner", argc, argv);

	tcase_add_test(tc, owner_port);
	return t_run("wsp_owner", tc);
}

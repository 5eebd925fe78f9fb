/* SPDX-License-Identifier: MIT */
/*
 * An attacker that speaks the upgrade protocol itself, through the
 * provider (WSP*), written from wsd-protocol(7): it makes a wsd server's
 * registry hold requests.  For tests/attack/flood_check.sh.
 *
 *   flood silent PORT N     N requests that never send their HELLO,
 *                           held open for 7 s
 *   flood hello PORT N      N requests with a HELLO naming connections
 *                           that do not exist; counts the answers that
 *                           come within 2 s: "refused busy K" (and others)
 *
 * Bounded: every wait has a limit, and the program exits by itself.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tests/attack/peer.h"

static SOCKET request(int port, int n)
{
	struct p_tuple t = { .magic = P_TUPLE_MAGIC, .version = P_VERSION };

	t.client.family = t.server.family = AF_INET;
	t.client.port = (uint16_t)(20000 + n);   /* no such connection */
	t.server.port = (uint16_t)port;
	inet_pton(AF_INET, "127.0.0.1", t.client.addr);
	inet_pton(AF_INET, "127.0.0.1", t.server.addr);
	return p_request("127.0.0.1", port, &t);
}

int main(int argc, char **argv)
{
	int port, n, err, made = 0, answers[32] = { 0 }, none = 0;
	SOCKET *ws;
	struct p_hello *in;
	WSAOVERLAPPED *ov;
	time_t end;

	if (argc != 4 || (strcmp(argv[1], "silent") && strcmp(argv[1], "hello"))) {
		fprintf(stderr, "usage: flood silent|hello PORT N\n");
		return 2;
	}
	port = atoi(argv[2]);
	n = atoi(argv[3]);
	if (p_start()) {
		fprintf(stderr, "flood: no provider\n");
		return 2;
	}
	ws = calloc((size_t)n, sizeof(*ws));
	in = calloc((size_t)n, sizeof(*in));
	ov = calloc((size_t)n, sizeof(*ov));
	if (!ws || !in || !ov)
		return 2;
	for (int i = 0; i < n; i++) {
		ws[i] = request(port, i);
		if (ws[i] == INVALID_SOCKET)
			continue;
		made++;
		if (!strcmp(argv[1], "hello")) {
			struct p_hello h = { .magic = P_MAGIC, .version = P_VERSION,
					     .kind = P_HELLO, .ring_size = 16384, .key = 1,
					     .region_fd = -1, .seg_len = P_SEG_LEN(16384) };
			WSABUF b = { sizeof(h), (char *)&h }, r = { sizeof(in[i]), (char *)&in[i] };
			uint32_t k, fl = 0;

			memset(h.nonce, 0x33, sizeof(h.nonce));   /* a well-formed one */
			p_procs.lpWSPSend(ws[i], &b, 1, &k, 0, NULL, NULL, NULL, &err);
			ov[i].hEvent = (void *)1;
			if (p_procs.lpWSPRecv(ws[i], &r, 1, &k, &fl, &ov[i], NULL, NULL, &err) &&
			    err != WSA_IO_PENDING)
				ov[i].hEvent = NULL;   /* broken already: no answer */
		}
	}
	printf("requests %d\n", made);
	if (!strcmp(argv[1], "silent")) {
		fflush(stdout);
		sleep(7);
		return 0;
	}
	end = time(NULL) + 2;
	for (int i = 0; i < n; i++) {
		uint32_t k = 0, fl = 0;

		if (ws[i] == INVALID_SOCKET || !ov[i].hEvent) {
			none++;
			continue;
		}
		while (!p_procs.lpWSPGetOverlappedResult(ws[i], &ov[i], &k, 0, &fl, &err) &&
		       err == WSA_IO_INCOMPLETE && time(NULL) < end)
			usleep(1000);
		if (k == sizeof(in[i]) && in[i].magic == P_MAGIC && in[i].kind == P_REFUSE &&
		    in[i].reason < 32)
			answers[in[i].reason]++;
		else
			none++;
	}
	/* reason 14 is busy, 6 no-match, 11 protocol (wsd-protocol(7)) */
	printf("refused busy %d\nrefused no-match %d\nrefused protocol %d\nno answer %d\n",
	       answers[14], answers[6], answers[11], none);
	return 0;
}

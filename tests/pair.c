/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/pair.h"

int t_is_peer;
uint32_t t_cq_depth = 256;

const char *t_transport(void)
{
	const char *t = getenv("WSD_TEST_TRANSPORT");

	return t && *t ? t : "shm";
}

int t_verbs(void)
{
	return !strcmp(t_transport(), "verbs");
}

struct sockaddr_in t_addr(uint16_t port)
{
	const char *a = getenv("WSD_TEST_ADDR");
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };

	if (a && *a && inet_pton(AF_INET, a, &sa.sin_addr) != 1) {
		fprintf(stderr, "WSD_TEST_ADDR=%s is not an IPv4 address\n", a);
		exit(2);
	}
	return sa;
}

uint16_t t_port(void)
{
	static unsigned n;

	return (uint16_t)(20000 + (getpid() * 7 + n++) % 30000);
}

static struct nd_ep_attr defaults(const struct nd_ep_attr *a)
{
	struct nd_ep_attr d = { .inbound_entries = 64, .outbound_entries = 64,
				.inbound_sge = 4, .outbound_sge = 4, .inbound_read_limit = 4 };

	if (a) {
		if (a->inbound_entries) d.inbound_entries = a->inbound_entries;
		if (a->outbound_entries) d.outbound_entries = a->outbound_entries;
		if (a->inbound_sge) d.inbound_sge = a->inbound_sge;
		if (a->outbound_sge) d.outbound_sge = a->outbound_sge;
		d.inbound_read_limit = a->inbound_read_limit;
	}
	return d;
}

static int side_setup(struct tside *s, const struct nd_ep_attr *attr)
{
	struct nd_ep_attr a = defaults(attr);

	if (nd_adapter_open(t_transport(), &s->ad) != ND_SUCCESS ||
	    nd_cq_create(s->ad, t_cq_depth, &s->icq) != ND_SUCCESS ||
	    nd_cq_create(s->ad, t_cq_depth, &s->ocq) != ND_SUCCESS)
		return -1;
	a.inbound_cq = s->icq;
	a.outbound_cq = s->ocq;
	if (nd_ep_create(s->ad, &a, &s->ep) != ND_SUCCESS)
		return -1;
	s->buf = aligned_alloc(4096, TBUF);
	if (!s->buf)
		return -1;
	memset(s->buf, 0, TBUF);
	return nd_mr_register(s->ad, s->buf, TBUF, ND_MR_FLAG_ALLOW_LOCAL_WRITE |
			      ND_MR_FLAG_ALLOW_REMOTE_READ | ND_MR_FLAG_ALLOW_REMOTE_WRITE,
			      &s->mr) == ND_SUCCESS ? 0 : -1;
}

void tside_open(struct tside *s, const struct nd_ep_attr *attr)
{
	memset(s, 0, sizeof(*s));
	s->oob_in = s->oob_out = -1;
	ck_assert_msg(side_setup(s, attr) == 0, "side setup failed on %s", t_transport());
}

void tside_close(struct tside *s)
{
	/* Best effort: a test may have left the endpoint in any state. */
	if (s->ep && nd_ep_destroy(s->ep) == ND_SUCCESS)
		s->ep = NULL;
	if (s->mr && nd_mr_deregister(s->mr) == ND_SUCCESS)
		s->mr = NULL;
	if (!s->ep) {
		nd_cq_destroy(s->icq);
		nd_cq_destroy(s->ocq);
		nd_adapter_close(s->ad);
	}
	free(s->buf);
}

void oob_send(struct tside *s, const void *p, size_t n)
{
	if (write(s->oob_out, p, n) != (ssize_t)n) {
		fprintf(stderr, "oob write failed\n");
		_exit(99);
	}
}

void oob_recv(struct tside *s, void *p, size_t n)
{
	size_t got = 0;

	while (got < n) {
		ssize_t r = read(s->oob_in, (char *)p + got, n - got);

		if (r <= 0) {
			fprintf(stderr, "oob read failed (peer gone?)\n");
			_exit(98);
		}
		got += (size_t)r;
	}
}

void oob_sync(struct tside *s)
{
	char c = 's';

	oob_send(s, &c, 1);
	oob_recv(s, &c, 1);
}

unsigned pair_peer_uid;
void (*pair_on_listen)(struct nd_listener *l);
void (*pair_on_connect)(struct nd_ep *ep);

static int peer_main(struct tside *s, const struct nd_ep_attr *attr, uint16_t port, peer_fn fn,
		     void *arg)
{
	struct sockaddr_in sa = t_addr(port);
	struct nd_listener *l;
	struct nd_conn_request *req;
	char ok = 'L';
	nd_status st;

	t_is_peer = 1;
	if (pair_peer_uid && (setgid(pair_peer_uid) || setuid(pair_peer_uid))) {
		fprintf(stderr, "peer: uid %u: %s\n", pair_peer_uid, strerror(errno));
		return 89;
	}
	if (side_setup(s, attr) < 0)
		return 90;
	st = nd_listen(s->ad, (struct sockaddr *)&sa, sizeof(sa), 4, &l);
	if (st != ND_SUCCESS) {
		fprintf(stderr, "peer: listen: %s\n", nd_strstatus(st));
		return 91;
	}
	if (pair_on_listen)
		pair_on_listen(l);
	oob_send(s, &ok, 1);
	st = nd_listen_get_request(l, 10000, &req);
	if (st != ND_SUCCESS)
		return 92;
	st = nd_ep_accept(s->ep, req, "peer", 4, 10000);
	if (st != ND_SUCCESS) {
		fprintf(stderr, "peer: accept: %s\n", nd_strstatus(st));
		return 93;
	}
	nd_listen_close(l);
	return fn(s, arg);
}

/*
 * The peer is forked before this process opens anything: a child must not
 * inherit open RDMA devices (librdmacm keeps them per process).
 */
void pair_spawn(struct tside *me, peer_fn fn, void *arg, const struct nd_ep_attr *peer_attr)
{
	int to_peer[2], from_peer[2];
	uint16_t port = t_port();
	pid_t pid;

	memset(me, 0, sizeof(*me));
	ck_assert(pipe(to_peer) == 0 && pipe(from_peer) == 0);
	fflush(NULL);
	pid = fork();
	ck_assert(pid >= 0);
	if (pid == 0) {
		struct tside peer;

		memset(&peer, 0, sizeof(peer));
		close(to_peer[1]);
		close(from_peer[0]);
		peer.oob_in = to_peer[0];
		peer.oob_out = from_peer[1];
		alarm(60);  /* a wedged peer must not outlive the test */
		_exit(peer_main(&peer, peer_attr, port, fn, arg));
	}
	close(to_peer[0]);
	close(from_peer[1]);
	me->oob_out = to_peer[1];
	me->oob_in = from_peer[0];
	me->peer = pid;
	me->port = port;
}

void pair_connect(struct tside *me, const struct nd_ep_attr *attr)
{
	struct sockaddr_in sa = t_addr(me->port);
	int oob_in = me->oob_in, oob_out = me->oob_out;
	pid_t peer = me->peer;
	uint16_t port = me->port;
	char c;

	tside_open(me, attr);
	if (pair_on_connect)
		pair_on_connect(me->ep);
	me->oob_in = oob_in;
	me->oob_out = oob_out;
	me->peer = peer;
	me->port = port;
	oob_recv(me, &c, 1);
	ck_status(nd_ep_connect(me->ep, (struct sockaddr *)&sa, sizeof(sa), "me", 2, 10000),
		  ND_SUCCESS);
}

void pair_start(struct tside *me, const struct nd_ep_attr *attr, peer_fn fn, void *arg,
		const struct nd_ep_attr *peer_attr)
{
	pair_spawn(me, fn, arg, peer_attr);
	pair_connect(me, attr);
}

int pair_finish(struct tside *me)
{
	int status;
	pid_t r;

	do {
		r = waitpid(me->peer, &status, 0);
	} while (r < 0 && errno == EINTR);
	ck_assert(r == me->peer);
	close(me->oob_in);
	close(me->oob_out);
	if (WIFSIGNALED(status))
		return 128 + WTERMSIG(status);
	return WEXITSTATUS(status);
}

int64_t t_now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

struct nd_result t_wait(struct nd_cq *cq, int timeout_ms)
{
	int64_t t0 = t_now_ms();
	struct nd_result r;

	for (;;) {
		if (nd_cq_poll(cq, &r, 1) == 1)
			return r;
		if (t_now_ms() - t0 > timeout_ms)
			break;
		nd_cq_wait(cq, 50);
	}
	if (t_is_peer) {
		fprintf(stderr, "peer: t_wait: no result within %d ms\n", timeout_ms);
		_exit(97);
	}
	ck_abort_msg("no result within %d ms", timeout_ms);
	return r;
}

int t_quiet(struct nd_cq *cq, int ms)
{
	int64_t t0 = t_now_ms();
	struct nd_result r;

	do {
		if (nd_cq_poll(cq, &r, 1) == 1)
			return 0;
		nd_cq_wait(cq, 10);
	} while (t_now_ms() - t0 < ms);
	return 1;
}

struct nd_sge t_sge(struct tside *s, size_t off, uint32_t len)
{
	struct nd_sge g = { s->buf + off, len, s->mr };

	return g;
}

int t_peer_idle(struct tside *s, void *arg)
{
	(void)arg;
	oob_sync(s);
	return 0;
}

TCase *t_case(const char *name, int argc, char **argv)
{
	TCase *tc = tcase_create(name);

	if (argc > 1)
		setenv("WSD_TEST_TRANSPORT", argv[1], 1);
	tcase_set_timeout(tc, 60);
	return tc;
}

int t_run(const char *suite, TCase *tc)
{
	Suite *su = suite_create(suite);
	SRunner *sr;
	int failed;

	suite_add_tcase(su, tc);
	sr = srunner_create(su);
	srunner_run_all(sr, CK_ENV);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}

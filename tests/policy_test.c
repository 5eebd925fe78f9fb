/* SPDX-License-Identifier: MIT */
/*
 * The policy file (switch/policy.c, wsd.conf(5)): good files parse into
 * the rules they say, each kind of bad line fails at its line with its
 * message, a broken policy says tcp for everything, the first matching
 * rule wins, else the default; addresses by family and prefix (an
 * IPv4-mapped one as IPv4, in a rule and in a connection), ports and
 * ranges, program globs; files read in pieces, and the limits that keep a
 * hostile file from taking memory.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "switch/policy.h"
#include "tests/pair.h"

/* A policy is large (a table of rules): one per test, on the heap. */
static struct wsd_policy *pol;

static void setup(void)
{
	pol = malloc(sizeof(*pol));
	ck_assert_ptr_nonnull(pol);
	wsd_policy_init(pol, "test.conf");
}

static void teardown(void)
{
	free(pol);
}

static int parse(const char *text)
{
	wsd_policy_init(pol, "test.conf");
	return wsd_policy_parse(pol, text, strlen(text));
}

/* text fails at line with a message holding word */
#define BAD(text, ln, word) do { \
		ck_assert_int_eq(parse(text), -EINVAL); \
		ck_assert(pol->broken); \
		ck_assert_uint_eq(pol->err_line, ln); \
		ck_assert_msg(strstr(pol->err, word), "%s: \"%s\", want \"%s\"", text, pol->err, \
			      word); \
	} while (0)

static struct wsd_stat_addr addr(const char *ip, uint16_t port)
{
	struct wsd_stat_addr a = { .port = port };

	if (inet_pton(AF_INET, ip, a.addr) == 1)
		a.family = AF_INET;
	else if (inet_pton(AF_INET6, ip, a.addr) == 1)
		a.family = AF_INET6;
	else
		ck_abort_msg("bad test address %s", ip);
	return a;
}

static struct wsd_policy_conn conn(const char *prog, const char *lip, uint16_t lport,
				   const char *pip, uint16_t pport)
{
	struct wsd_policy_conn c = { .program = prog };

	if (lip)
		c.local = addr(lip, lport);
	if (pip)
		c.peer = addr(pip, pport);
	return c;
}

static enum wsd_policy_action act(const struct wsd_policy_conn *c, unsigned *line)
{
	return wsd_policy_match(pol, c, line);
}

static const char *text(unsigned i)
{
	static char buf[WSD_POLICY_LINE + 64];

	ck_assert_uint_lt(i, pol->nrules);
	wsd_policy_rule_text(&pol->rule[i], buf, sizeof(buf));
	return buf;
}

START_TEST(parse_good)
{
	const char *f =
		"# the project's example\n"
		"accelerate program iperf3\n"
		"tcp        peer 10.0.0.0/8 port 5201\n"
		"\n"
		"   tcp\tlocal port 22   # ssh stays plain\n"
		"accelerate peer ::1\n"
		"tcp peer 192.168.1.77/16 port 8000-8100 local 0.0.0.0/0 program srv\r\n"
		"default    tcp\n"
		"accelerate peer ::ffff:127.0.0.1 local fe80::1/10";

	ck_assert_int_eq(parse(f), 0);
	ck_assert(!pol->broken);
	ck_assert_uint_eq(pol->nrules, 6);
	ck_assert(pol->needs_addr);
	ck_assert_uint_eq(pol->rule[0].line, 2);
	ck_assert_int_eq(pol->rule[0].action, WSD_POLICY_ACCELERATE);
	ck_assert_str_eq(text(0), "accelerate program iperf3");
	ck_assert_uint_eq(pol->rule[1].line, 3);
	ck_assert_int_eq(pol->rule[1].action, WSD_POLICY_TCP);
	ck_assert_str_eq(text(1), "tcp peer 10.0.0.0/8 port 5201");
	ck_assert_uint_eq(pol->rule[2].line, 5);
	ck_assert_str_eq(text(2), "tcp local port 22");
	ck_assert_str_eq(text(3), "accelerate peer ::1");
	/* bits past the prefix cleared; selectors in their one order */
	ck_assert_str_eq(text(4), "tcp program srv local 0.0.0.0/0 peer 192.168.0.0/16 port 8000-8100");
	ck_assert_uint_eq(pol->rule[4].peer.port_lo, 8000);
	ck_assert_uint_eq(pol->rule[4].peer.port_hi, 8100);
	/* an IPv4-mapped address in a rule is the IPv4 address */
	ck_assert_str_eq(text(5), "accelerate local fe80::/10 peer 127.0.0.1");
	ck_assert_int_eq(pol->def, WSD_POLICY_TCP);
	ck_assert_uint_eq(pol->def_line, 8);
	ck_assert(!wsd_policy_all_tcp(pol));
}
END_TEST

START_TEST(parse_empty)
{
	unsigned line = 99;
	struct wsd_policy_conn c = conn("x", "10.0.0.1", 1, "10.0.0.2", 2);

	ck_assert_int_eq(parse(""), 0);
	ck_assert_uint_eq(pol->nrules, 0);
	ck_assert(!pol->needs_addr);
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_ACCELERATE);
	ck_assert_uint_eq(line, 0);
	ck_assert_int_eq(parse("# nothing\n\n   \n\t# more\n"), 0);
	ck_assert_uint_eq(pol->nrules, 0);
	ck_assert_int_eq(pol->def, WSD_POLICY_ACCELERATE);
	ck_assert(!wsd_policy_all_tcp(pol));
	/* program rules alone need no addresses */
	ck_assert_int_eq(parse("tcp program ssh*\n"), 0);
	ck_assert(!pol->needs_addr);
	ck_assert_int_eq(parse("default tcp\n"), 0);
	ck_assert(wsd_policy_all_tcp(pol));
	ck_assert_int_eq(parse("tcp peer ::1\ndefault tcp\n"), 0);
	ck_assert(wsd_policy_all_tcp(pol));
	ck_assert_int_eq(parse("accelerate peer ::1\ndefault tcp\n"), 0);
	ck_assert(!wsd_policy_all_tcp(pol));
}
END_TEST

/* A port whose every connection stays on TCP, whoever the peer, and ports that are not. */
START_TEST(port_tcp)
{
	ck_assert_int_eq(parse(""), 0);
	ck_assert(!wsd_policy_port_tcp(pol, "srv", 80));
	ck_assert_int_eq(parse("default tcp\n"), 0);
	ck_assert(wsd_policy_port_tcp(pol, "srv", 80));
	ck_assert(wsd_policy_port_tcp(pol, NULL, 80));
	/* by port: that port only */
	ck_assert_int_eq(parse("tcp local port 80-81\n"), 0);
	ck_assert(wsd_policy_port_tcp(pol, "srv", 80));
	ck_assert(wsd_policy_port_tcp(pol, "srv", 81));
	ck_assert(!wsd_policy_port_tcp(pol, "srv", 82));
	/* by program: that program only; an unknown name matches no program rule */
	ck_assert_int_eq(parse("tcp program sr?\n"), 0);
	ck_assert(wsd_policy_port_tcp(pol, "srv", 80));
	ck_assert(!wsd_policy_port_tcp(pol, "nginx", 80));
	ck_assert(!wsd_policy_port_tcp(pol, NULL, 80));
	/* a peer or a local address decides per connection: not the port's */
	ck_assert_int_eq(parse("tcp peer 10.0.0.0/8\n"), 0);
	ck_assert(!wsd_policy_port_tcp(pol, "srv", 80));
	ck_assert_int_eq(parse("tcp local 127.0.0.1 port 80\n"), 0);
	ck_assert(!wsd_policy_port_tcp(pol, "srv", 80));
	/* ...unless every connection that misses it stays on TCP further down */
	ck_assert_int_eq(parse("tcp peer 10.0.0.0/8\ndefault tcp\n"), 0);
	ck_assert(wsd_policy_port_tcp(pol, "srv", 80));
	ck_assert_int_eq(parse("tcp peer 10.0.0.0/8\ntcp local port 80\n"), 0);
	ck_assert(wsd_policy_port_tcp(pol, "srv", 80));
	/* a rule that may accelerate some first: not all on TCP */
	ck_assert_int_eq(parse("accelerate peer 10.0.0.0/8\ndefault tcp\n"), 0);
	ck_assert(!wsd_policy_port_tcp(pol, "srv", 80));
	ck_assert_int_eq(parse("accelerate local port 80\ndefault tcp\n"), 0);
	ck_assert(!wsd_policy_port_tcp(pol, "srv", 80));
	ck_assert(wsd_policy_port_tcp(pol, "srv", 81));
	/* the first rule that matches them all wins over later ones */
	ck_assert_int_eq(parse("tcp local port 80\naccelerate program srv\n"), 0);
	ck_assert(wsd_policy_port_tcp(pol, "srv", 80));
	ck_assert(!wsd_policy_port_tcp(pol, "srv", 81));
	/* broken: everything on TCP */
	ck_assert_int_eq(parse("acclerate\n"), -EINVAL);
	ck_assert(wsd_policy_port_tcp(pol, "srv", 80));
}
END_TEST

START_TEST(parse_bad)
{
	BAD("accelerate program a\n\n\n\n\n\nacclerate peer 1.2.3.4\n", 7,
	    "unknown keyword \"acclerate\"");
	BAD("tcp prog x\n", 1, "unknown keyword \"prog\"");
	BAD("tcp\n", 1, "no program, local or peer");
	BAD("accelerate   # all\n", 1, "default accelerate");
	BAD("default\n", 1, "expected accelerate or tcp");
	BAD("default maybe\n", 1, "expected accelerate or tcp");
	BAD("default tcp now\n", 1, "unexpected \"now\"");
	BAD("default tcp\n\ndefault accelerate\n", 3, "first is on line 1");
	BAD("tcp program\n", 1, "no name or pattern");
	BAD("tcp program a program b\n", 1, "program given twice");
	BAD("tcp peer 1.2.3.4 peer ::1\n", 1, "peer given twice");
	BAD("tcp program /usr/bin/ssh\n", 1, "no '/'");
	BAD("tcp local\n", 1, "local: no address or port");
	BAD("tcp local program x\n", 1, "local: no address or port");
	BAD("tcp peer port\n", 1, "peer port: no port");
	BAD("tcp peer 10.0.0.256\n", 1, "\"10.0.0.256\": not an IPv4 or IPv6 address");
	BAD("tcp peer localhost\n", 1, "not an IPv4 or IPv6 address");
	BAD("tcp peer fe80::1%eth0\n", 1, "not an IPv4 or IPv6 address");
	BAD("tcp peer 10.0.0.0/33\n", 1, "prefix is not a number from 0 to 32");
	BAD("tcp peer ::/129\n", 1, "from 0 to 128");
	BAD("tcp peer 10.0.0.0/\n", 1, "prefix");
	BAD("tcp peer 10.0.0.0/-1\n", 1, "prefix");
	BAD("tcp peer port 0\n", 1, "not a port");
	BAD("tcp peer port 65536\n", 1, "not a port");
	BAD("tcp peer port 22x\n", 1, "not a port");
	BAD("tcp peer port -22\n", 1, "not a port");
	BAD("tcp peer port 22-\n", 1, "not a port");
	BAD("tcp peer port 99999999999999999999\n", 1, "not a port");
	BAD("tcp peer port 9000-8000\n", 1, "runs backwards");
	BAD("tcp peer ::1 port 80 443\n", 1, "unknown keyword \"443\"");
	/* control bytes are not echoed as they are */
	BAD("\x1b[31mtcp peer ::1\n", 1, "unknown keyword \"?[31mtcp\"");

	/* broken: every connection stays on TCP, whatever the good lines said */
	{
		struct wsd_policy_conn c = conn("iperf3", "10.0.0.1", 1, "10.0.0.2", 2);
		unsigned line = 99;

		BAD("accelerate program iperf3\ndefault accelerate\nbogus\n", 3, "bogus");
		ck_assert_int_eq(act(&c, &line), WSD_POLICY_TCP);
		ck_assert_uint_eq(line, 0);
		ck_assert(wsd_policy_all_tcp(pol));
	}
}
END_TEST

START_TEST(first_match_wins)
{
	unsigned line;
	struct wsd_policy_conn c;

	ck_assert_int_eq(parse("tcp peer port 5201\n"
			       "accelerate program iperf3\n"
			       "tcp program iperf3\n"
			       "accelerate peer 10.0.0.0/8 local port 7000\n"
			       "default tcp\n"), 0);
	c = conn("iperf3", "10.0.0.1", 40000, "10.0.0.2", 5201);
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_TCP);
	ck_assert_uint_eq(line, 1);
	c.peer.port = 5202;
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_ACCELERATE);
	ck_assert_uint_eq(line, 2);
	/* several selectors: all must match */
	c = conn("nc", "10.0.0.1", 7000, "10.1.2.3", 33000);
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_ACCELERATE);
	ck_assert_uint_eq(line, 4);
	c.local.port = 7001;
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_TCP);
	ck_assert_uint_eq(line, 5);
	c = conn("nc", "10.0.0.1", 7000, "11.1.2.3", 33000);
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_TCP);
	ck_assert_uint_eq(line, 5);
	/* no default line: accelerate, line 0 */
	ck_assert_int_eq(parse("tcp program ssh\n"), 0);
	c = conn("nc", NULL, 0, NULL, 0);
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_ACCELERATE);
	ck_assert_uint_eq(line, 0);
	ck_assert_int_eq(wsd_policy_match(pol, &c, NULL), WSD_POLICY_ACCELERATE);
	/* a default anywhere in the file is the default, after every rule */
	ck_assert_int_eq(parse("default tcp\naccelerate program nc\n"), 0);
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_ACCELERATE);
	ck_assert_uint_eq(line, 2);
	c.program = "ssh";
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_TCP);
	ck_assert_uint_eq(line, 1);
}
END_TEST

START_TEST(addresses)
{
	struct wsd_policy_conn c = { 0 };
	unsigned line;

	ck_assert_int_eq(parse("tcp peer 10.0.0.0/8\n"            /* 1 */
			       "tcp peer fe80::/10\n"             /* 2 */
			       "tcp peer 192.168.7.9\n"           /* 3 */
			       "tcp peer 2001:db8::1\n"           /* 4 */
			       "tcp local 172.16.0.0/12\n"        /* 5 */
			       "tcp peer 0.0.0.0/0 port 1-1023\n" /* 6 */
			       "tcp peer ::/0 port 2000\n"),      /* 7 */
			 0);
	c.peer = addr("10.255.1.1", 5000);
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_TCP);
	ck_assert_uint_eq(line, 1);
	c.peer = addr("11.0.0.1", 5000);
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_ACCELERATE);
	/* an IPv4-mapped IPv6 address matches as the IPv4 one */
	c.peer = addr("::ffff:10.1.2.3", 5000);
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_TCP);
	ck_assert_uint_eq(line, 1);
	c.peer = addr("febf:ffff::1", 5000);
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_TCP);
	ck_assert_uint_eq(line, 2);
	c.peer = addr("fec0::1", 5000);
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_ACCELERATE);
	c.peer = addr("192.168.7.9", 5000);
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_TCP);
	ck_assert_uint_eq(line, 3);
	c.peer = addr("192.168.7.8", 5000);
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_ACCELERATE);
	c.peer = addr("2001:db8::1", 5000);
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_TCP);
	ck_assert_uint_eq(line, 4);
	c.peer = addr("2001:db8::2", 5000);
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_ACCELERATE);
	/* the local address: a /12 */
	c.local = addr("172.31.255.255", 1);
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_TCP);
	ck_assert_uint_eq(line, 5);
	c.local = addr("172.32.0.0", 1);
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_ACCELERATE);
	/* /0 with ports: every IPv4 address, not IPv6 */
	c.peer = addr("8.8.8.8", 1023);
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_TCP);
	ck_assert_uint_eq(line, 6);
	c.peer = addr("8.8.8.8", 1024);
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_ACCELERATE);
	c.peer = addr("2001:db8::9", 1000);
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_ACCELERATE);
	c.peer = addr("2001:db8::9", 2000);
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_TCP);
	ck_assert_uint_eq(line, 7);
	/* an address not known matches no address selector */
	memset(&c, 0, sizeof(c));
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_ACCELERATE);

	/* an IPv4-mapped rule (prefix 96 and more) is an IPv4 rule */
	ck_assert_int_eq(parse("tcp peer ::ffff:10.0.0.0/104\n"), 0);
	ck_assert_str_eq(text(0), "tcp peer 10.0.0.0/8");
	c.peer = addr("10.9.9.9", 1);
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_TCP);
	c.peer = addr("::ffff:10.9.9.9", 1);
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_TCP);
	c.peer = addr("11.9.9.9", 1);
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_ACCELERATE);
	/* odd prefixes: the bits up to them */
	ck_assert_int_eq(parse("tcp local 10.128.0.0/9\n"), 0);
	c.local = addr("10.200.0.1", 1);
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_TCP);
	c.local = addr("10.127.0.1", 1);
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_ACCELERATE);
}
END_TEST

START_TEST(ports)
{
	struct wsd_policy_conn c = conn("x", "127.0.0.1", 0, "127.0.0.1", 0);
	unsigned line;

	ck_assert_int_eq(parse("tcp local port 22\n"
			       "tcp peer port 8000-8100\n"
			       "tcp peer ::1 port 9000\n"
			       "tcp peer port 65535\n"), 0);
	for (unsigned p = 7998; p <= 8102; p++) {
		c.peer.port = (uint16_t)p;
		ck_assert_int_eq(act(&c, &line), p >= 8000 && p <= 8100 ? WSD_POLICY_TCP :
									WSD_POLICY_ACCELERATE);
	}
	c.peer.port = 1;
	c.local.port = 22;
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_TCP);
	ck_assert_uint_eq(line, 1);
	c.local.port = 23;
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_ACCELERATE);
	/* address and port both */
	c.peer.port = 9000;
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_ACCELERATE);
	c.peer = addr("::1", 9000);
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_TCP);
	ck_assert_uint_eq(line, 3);
	c.peer.port = 65535;
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_TCP);
	ck_assert_uint_eq(line, 4);
	/* a port of an address not known is not known */
	memset(&c.local, 0, sizeof(c.local));
	memset(&c.peer, 0, sizeof(c.peer));
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_ACCELERATE);
}
END_TEST

START_TEST(programs)
{
	struct wsd_policy_conn c = { 0 };
	unsigned line;

	ck_assert_int_eq(parse("tcp program sshd\n"
			       "tcp program iperf*\n"
			       "tcp program [pq]ython?.*\n"
			       "tcp program *-plain\n"), 0);
	c.program = "sshd";
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_TCP);
	ck_assert_uint_eq(line, 1);
	c.program = "ssh";
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_ACCELERATE);
	c.program = "sshd2";
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_ACCELERATE);
	c.program = "iperf3";
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_TCP);
	ck_assert_uint_eq(line, 2);
	c.program = "iperf";
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_TCP);
	c.program = "python3.11";
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_TCP);
	ck_assert_uint_eq(line, 3);
	c.program = "python3";
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_ACCELERATE);
	c.program = "server-plain";
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_TCP);
	ck_assert_uint_eq(line, 4);
	/* a program not known matches no program selector */
	c.program = NULL;
	ck_assert_int_eq(act(&c, &line), WSD_POLICY_ACCELERATE);
}
END_TEST

/* The limits a hostile file meets: a failure at a line, never more memory. */
START_TEST(limits)
{
	size_t n = (size_t)(WSD_POLICY_RULES + 1) * 32 + WSD_POLICY_LINE * 2;
	char *big = malloc(n), *p = big;
	char line[WSD_POLICY_LINE + 1];

	ck_assert_ptr_nonnull(big);
	for (unsigned i = 0; i < WSD_POLICY_RULES; i++)
		p += sprintf(p, "tcp peer port %u\n", i + 1);
	ck_assert_int_eq(parse(big), 0);
	ck_assert_uint_eq(pol->nrules, WSD_POLICY_RULES);
	sprintf(p, "tcp peer port 9999\n");
	BAD(big, WSD_POLICY_RULES + 1, "more than 256 rules");

	/* a line of WSD_POLICY_LINE - 1 bytes is a line; one more is too long */
	memset(line, ' ', sizeof(line));
	memcpy(line, "tcp local port 1", 16);
	line[WSD_POLICY_LINE - 1] = '\0';
	snprintf(big, n, "# one\n%s\n", line);
	ck_assert_int_eq(parse(big), 0);
	line[WSD_POLICY_LINE - 1] = ' ';
	line[WSD_POLICY_LINE] = '\0';
	snprintf(big, n, "# one\n%s\n", line);
	BAD(big, 2, "longer than 511 bytes");
	/* ...comment or not, and on the last line without its newline */
	memset(line, '#', WSD_POLICY_LINE);
	BAD(line, 1, "longer than");

	/* a pattern as long as a program name can be in the table, and no longer */
	memset(line, 'a', sizeof(line) - 1);
	memcpy(line, "tcp program ", 12);
	line[12 + WSD_POLICY_NAME - 1] = '\0';
	ck_assert_int_eq(parse(line), 0);
	ck_assert_uint_eq(strlen(pol->rule[0].program), WSD_POLICY_NAME - 1);
	memset(line, 'a', sizeof(line) - 1);
	memcpy(line, "tcp program ", 12);
	line[12 + WSD_POLICY_NAME] = '\0';
	BAD(line, 1, "longer than 127 bytes");

	/* a binary file: its first NUL */
	wsd_policy_init(pol, "test.conf");
	ck_assert_int_eq(wsd_policy_parse(pol, "tcp peer ::1\n\0\n", 15), -EINVAL);
	ck_assert_uint_eq(pol->err_line, 2);
	ck_assert_ptr_nonnull(strstr(pol->err, "NUL"));
	free(big);
}
END_TEST

static char tmpdir[] = "/tmp/policy_test.XXXXXX";

static const char *in_tmp(const char *name)
{
	static char path[256];

	snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
	return path;
}

static const char *write_file(const char *name, const void *data, size_t len)
{
	const char *path = in_tmp(name);
	FILE *f = fopen(path, "w");

	ck_assert_ptr_nonnull(f);
	ck_assert_uint_eq(fwrite(data, 1, len, f), len);
	fclose(f);
	return path;
}

START_TEST(files)
{
	char *big;
	const char *path;
	size_t n;

	ck_assert_ptr_nonnull(mkdtemp(tmpdir));
	/* a file longer than a chunk of the reader, lines across chunks, CRLF */
	n = 0;
	big = malloc(WSD_POLICY_BYTES + 2);
	ck_assert_ptr_nonnull(big);
	for (unsigned i = 0; i < 200; i++)
		n += (size_t)sprintf(big + n, "# a comment long enough to cross a chunk %u\r\n", i);
	n += (size_t)sprintf(big + n, "tcp peer port 22\r\naccelerate program a*\r\ndefault tcp");
	path = write_file("good.conf", big, n);
	ck_assert_int_eq(wsd_policy_load(pol, path), 0);
	ck_assert_str_eq(pol->path, path);
	ck_assert(pol->found && !pol->broken);
	ck_assert_uint_eq(pol->nrules, 2);
	ck_assert_uint_eq(pol->rule[0].line, 201);
	ck_assert_uint_eq(pol->def_line, 203);
	ck_assert_int_eq(pol->def, WSD_POLICY_TCP);

	path = write_file("bad.conf", "tcp peer port 22\n\ntcp peer port 0\n", 34);
	ck_assert_int_eq(wsd_policy_load(pol, path), -EINVAL);
	ck_assert(pol->found && pol->broken);
	ck_assert_uint_eq(pol->err_line, 3);

	/* missing: no error in itself (the caller decides) */
	ck_assert_int_eq(wsd_policy_load(pol, "/nonexistent/wsd.conf"), -ENOENT);
	ck_assert(!pol->found && !pol->broken);
	/* a directory: broken, the file as a whole */
	ck_assert_int_eq(wsd_policy_load(pol, tmpdir), -EISDIR);
	ck_assert(pol->broken);
	ck_assert_uint_eq(pol->err_line, 0);
	/* /dev/null reads as an empty file */
	ck_assert_int_eq(wsd_policy_load(pol, "/dev/null"), 0);
	ck_assert(pol->found && !pol->broken);
	ck_assert_uint_eq(pol->nrules, 0);

	/* more than WSD_POLICY_BYTES, all comment lines: stopped there */
	memset(big, '\n', WSD_POLICY_BYTES + 1);
	path = write_file("huge.conf", big, WSD_POLICY_BYTES + 1);
	ck_assert_int_eq(wsd_policy_load(pol, path), -EINVAL);
	ck_assert(pol->broken);
	ck_assert_ptr_nonnull(strstr(pol->err, "larger than"));
	unlink(path);

	/* WSD_CONF: a file, none (empty), one that is not there (an error) */
	path = write_file("env.conf", "tcp program x\n", 14);
	setenv("WSD_CONF", path, 1);
	ck_assert_int_eq(wsd_policy_read(pol), 0);
	ck_assert_str_eq(pol->path, path);
	ck_assert_uint_eq(pol->nrules, 1);
	setenv("WSD_CONF", "", 1);
	ck_assert_int_eq(wsd_policy_read(pol), 0);
	ck_assert_str_eq(pol->path, "");
	ck_assert(!pol->found && !pol->broken);
	ck_assert_uint_eq(pol->nrules, 0);
	setenv("WSD_CONF", "/nonexistent/wsd.conf", 1);
	ck_assert_int_eq(wsd_policy_read(pol), -ENOENT);
	ck_assert(pol->broken);
	ck_assert_str_eq(pol->err, strerror(ENOENT));
	/* unset: /etc/wsd.conf, and its absence is no error */
	unsetenv("WSD_CONF");
	if (access(WSD_POLICY_DEFAULT_FILE, F_OK) != 0) {
		ck_assert_int_eq(wsd_policy_read(pol), 0);
		ck_assert_str_eq(pol->path, WSD_POLICY_DEFAULT_FILE);
		ck_assert(!pol->found && !pol->broken);
	}
	unlink(in_tmp("good.conf"));
	unlink(in_tmp("bad.conf"));
	unlink(in_tmp("env.conf"));
	rmdir(tmpdir);
	free(big);
}
END_TEST

/* peer-users: any (the default), same, a list by name or id; our own user always. */
START_TEST(peer_users)
{
	ck_assert_int_eq(parse("tcp program x\n"), 0);
	ck_assert(wsd_policy_other_users(pol));
	ck_assert(wsd_policy_user_ok(pol, 65534, 0));
	ck_assert_int_eq(parse("peer-users any\n"), 0);
	ck_assert_uint_eq(pol->users_line, 1);
	ck_assert(wsd_policy_user_ok(pol, 12345, 0));
	ck_assert_int_eq(parse("# one user\npeer-users same\n"), 0);
	ck_assert_uint_eq(pol->users_line, 2);
	ck_assert(!wsd_policy_other_users(pol));
	ck_assert(wsd_policy_user_ok(pol, 1000, 1000));
	ck_assert(!wsd_policy_user_ok(pol, 65534, 1000));
	ck_assert_int_eq(parse("peer-users root 65534 4294967294\n"), 0);
	ck_assert(wsd_policy_other_users(pol));
	ck_assert_uint_eq(pol->nusers, 3);
	ck_assert(wsd_policy_user_ok(pol, 0, 1000));
	ck_assert(wsd_policy_user_ok(pol, 65534, 1000));
	ck_assert(wsd_policy_user_ok(pol, 4294967294u, 1000));
	ck_assert(wsd_policy_user_ok(pol, 1000, 1000));
	ck_assert(!wsd_policy_user_ok(pol, 33, 1000));
	BAD("peer-users\n", 1, "expected any, same, or users");
	BAD("peer-users same\npeer-users any\n", 2, "first is on line 1");
	BAD("peer-users root same\n", 1, "same stands alone");
	BAD("peer-users no-such-user-here\n", 1, "no user \"no-such-user-here\"");
	/* 10 digits past 2^32: not a number (it wrapped once), then no such user */
	BAD("peer-users 9999999999\n", 1, "no user");
	BAD("peer-users 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 "
	    "26 27 28 29 30 31 32\n", 1, "more than 32 users");
	/* a broken file pairs with nobody */
	ck_assert(!wsd_policy_user_ok(pol, 0, 0));
}
END_TEST

int main(int argc, char **argv)
{
	TCase *tc = t_case("policy", argc, argv);

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, parse_good);
	tcase_add_test(tc, parse_empty);
	tcase_add_test(tc, parse_bad);
	tcase_add_test(tc, port_tcp);
	tcase_add_test(tc, first_match_wins);
	tcase_add_test(tc, addresses);
	tcase_add_test(tc, ports);
	tcase_add_test(tc, programs);
	tcase_add_test(tc, limits);
	tcase_add_test(tc, files);
	tcase_add_test(tc, peer_users);
	return t_run("policy", tc);
}

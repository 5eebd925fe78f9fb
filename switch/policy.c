/* SPDX-License-Identifier: MIT */
/*
 * The policy file: parsing, matching, and the process's own copy
 * (switch/policy.h; the grammar is wsd.conf(5)'s).
 *
 * A file is read in chunks into one line buffer of WSD_POLICY_LINE bytes
 * and parsed a line at a time into the policy's fixed table of rules:
 * nothing here allocates, so a hostile file can make the policy fail
 * (a line too long, too many rules, too many bytes), never grow.  The
 * first bad line ends the parse, and a broken policy says tcp for every
 * connection: a file that says something we did not understand must not
 * accelerate what it meant to keep on TCP.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <pthread.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "provider/internal.h"
#include "switch/policy.h"

/* An IPv4-mapped IPv6 address's first 12 bytes: the rest is the IPv4 address. */
static const uint8_t mapped[12] = { [10] = 0xff, [11] = 0xff };

void wsd_policy_init(struct wsd_policy *p, const char *path)
{
	memset(p, 0, sizeof(*p));
	snprintf(p->path, sizeof(p->path), "%s", path ? path : "");
	p->def = WSD_POLICY_ACCELERATE;
}

static int fail(struct wsd_policy *p, unsigned line, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int fail(struct wsd_policy *p, unsigned line, const char *fmt, ...)
{
	va_list ap;

	p->broken = true;
	p->err_line = line;
	va_start(ap, fmt);
	vsnprintf(p->err, sizeof(p->err), fmt, ap);
	va_end(ap);
	return -EINVAL;
}

/* A word of the file, fit to quote in a message: 40 bytes at most, control bytes as '?'. */
static const char *shown(const char *w, char buf[48])
{
	size_t n = 0;

	for (; w[n] && n < 40; n++)
		buf[n] = (unsigned char)w[n] < 0x20 || w[n] == 0x7f ? '?' : w[n];
	if (w[n])
		memcpy(buf + n++, "...", 4);
	else
		buf[n] = '\0';
	return buf;
}

/* A decimal number of at most max, all digits: true and *v. */
static bool number(const char *s, size_t len, unsigned max, unsigned *v)
{
	unsigned n = 0;

	if (!len || len > 10)
		return false;
	for (size_t i = 0; i < len; i++) {
		unsigned d = (unsigned)(s[i] - '0');

		if (s[i] < '0' || s[i] > '9' || n > (max - d) / 10)
			return false;   /* (checked before it can wrap) */
		n = n * 10 + d;
	}
	*v = n;
	return true;
}

/* "N" or "N-M", ports 1 to 65535. */
static int parse_ports(struct wsd_policy *p, unsigned line, const char *w,
		       struct wsd_policy_addr *a)
{
	const char *dash = strchr(w, '-');
	unsigned lo, hi;
	char b[48];

	if (!number(w, dash ? (size_t)(dash - w) : strlen(w), 65535, &lo) || !lo ||
	    (dash && (!number(dash + 1, strlen(dash + 1), 65535, &hi) || !hi)))
		return fail(p, line, "\"%s\": not a port or port range (1 to 65535, as 8000-8100)",
			    shown(w, b));
	if (!dash)
		hi = lo;
	if (hi < lo)
		return fail(p, line, "port range \"%s\" runs backwards", shown(w, b));
	a->port_lo = (uint16_t)lo;
	a->port_hi = (uint16_t)hi;
	return 0;
}

/* "ADDRESS" or "ADDRESS/PREFIX", IPv4 or IPv6; bits past the prefix cleared. */
static int parse_address(struct wsd_policy *p, unsigned line, const char *w,
			 struct wsd_policy_addr *a)
{
	const char *slash = strchr(w, '/');
	char ip[INET6_ADDRSTRLEN], b[48];
	size_t len = slash ? (size_t)(slash - w) : strlen(w);
	unsigned bits, max;

	if (len >= sizeof(ip))
		return fail(p, line, "\"%s\": not an IPv4 or IPv6 address", shown(w, b));
	memcpy(ip, w, len);
	ip[len] = '\0';
	memset(a->addr, 0, sizeof(a->addr));
	if (inet_pton(AF_INET, ip, a->addr) == 1)
		a->family = AF_INET;
	else if (inet_pton(AF_INET6, ip, a->addr) == 1)
		a->family = AF_INET6;
	else
		return fail(p, line, "\"%s\": not an IPv4 or IPv6 address", shown(w, b));
	max = a->family == AF_INET ? 32 : 128;
	bits = max;
	if (slash && !number(slash + 1, strlen(slash + 1), max, &bits))
		return fail(p, line, "\"%s\": the prefix is not a number from 0 to %u",
			    shown(w, b), max);
	/* an IPv4-mapped IPv6 address is the IPv4 address, as in a connection */
	if (a->family == AF_INET6 && bits >= 96 && !memcmp(a->addr, mapped, 12)) {
		memmove(a->addr, a->addr + 12, 4);
		memset(a->addr + 4, 0, 12);
		a->family = AF_INET;
		bits -= 96;
	}
	a->prefix = (uint8_t)bits;
	for (unsigned i = bits; i < 128; i++)
		a->addr[i / 8] &= (uint8_t)~(0x80u >> (i % 8));
	return 0;
}

static bool action_word(const char *w, enum wsd_policy_action *a)
{
	if (!strcmp(w, "accelerate"))
		*a = WSD_POLICY_ACCELERATE;
	else if (!strcmp(w, "tcp"))
		*a = WSD_POLICY_TCP;
	else
		return false;
	return true;
}

#define MAX_WORDS (WSD_POLICY_LINE / 2 + 1)

/*
 * "peer-users any", "peer-users same", or "peer-users USER..." (names or
 * numeric ids; names looked up now, in the password database).
 */
static int parse_users(struct wsd_policy *p, char **w, size_t n, unsigned line)
{
	char b[48];

	if (p->users_line)
		return fail(p, line, "a second peer-users (the first is on line %u)", p->users_line);
	if (n < 2)
		return fail(p, line, "peer-users: expected any, same, or users");
	p->users_line = line;
	if (n == 2 && (!strcmp(w[1], "any") || !strcmp(w[1], "same"))) {
		p->users = !strcmp(w[1], "any") ? WSD_PEER_USERS_ANY : WSD_PEER_USERS_SAME;
		return 0;
	}
	p->users = WSD_PEER_USERS_LIST;
	for (size_t i = 1; i < n; i++) {
		char pwbuf[1024];
		struct passwd pw, *got = NULL;
		unsigned uid;

		if (!strcmp(w[i], "any") || !strcmp(w[i], "same"))
			return fail(p, line, "peer-users: %s stands alone", w[i]);
		if (p->nusers == WSD_POLICY_USERS)
			return fail(p, line, "peer-users: more than %u users", WSD_POLICY_USERS);
		if (!number(w[i], strlen(w[i]), UINT32_MAX - 1, &uid)) {
			if (getpwnam_r(w[i], &pw, pwbuf, sizeof(pwbuf), &got) || !got)
				return fail(p, line, "peer-users: no user \"%s\"", shown(w[i], b));
			uid = got->pw_uid;
		}
		p->user[p->nusers++] = uid;
	}
	return 0;
}

/* One line, its end and comment cut off (s is ours to cut up). */
static int parse_line(struct wsd_policy *p, char *s, unsigned line)
{
	char *w[MAX_WORDS], *save = NULL, b[48];
	struct wsd_policy_rule r = { .line = line };
	size_t n = 0, i;

	s[strcspn(s, "#")] = '\0';
	for (char *t = strtok_r(s, " \t\r\v\f", &save); t; t = strtok_r(NULL, " \t\r\v\f", &save))
		w[n++] = t;   /* a line of WSD_POLICY_LINE bytes has fewer words than MAX_WORDS */
	if (!n)
		return 0;
	if (!strcmp(w[0], "peer-users"))
		return parse_users(p, w, n, line);
	if (!strcmp(w[0], "default")) {
		if (n < 2 || !action_word(w[1], &p->def))
			return fail(p, line, "default: expected accelerate or tcp");
		if (n > 2)
			return fail(p, line, "unexpected \"%s\" after default %s", shown(w[2], b),
				    w[1]);
		if (p->def_line)
			return fail(p, line, "a second default (the first is on line %u)",
				    p->def_line);
		p->def_line = line;
		return 0;
	}
	if (!action_word(w[0], &r.action))
		return fail(p, line, "unknown keyword \"%s\"", shown(w[0], b));
	for (i = 1; i < n;) {
		const char *kw = w[i++];
		struct wsd_policy_addr *a;
		unsigned sel;

		if (!strcmp(kw, "program"))
			sel = WSD_POLICY_PROGRAM;
		else if (!strcmp(kw, "local"))
			sel = WSD_POLICY_LOCAL;
		else if (!strcmp(kw, "peer"))
			sel = WSD_POLICY_PEER;
		else
			return fail(p, line, "unknown keyword \"%s\"", shown(kw, b));
		if (r.sel & sel)
			return fail(p, line, "%s given twice", kw);
		r.sel |= sel;
		if (sel == WSD_POLICY_PROGRAM) {
			if (i == n)
				return fail(p, line, "program: no name or pattern");
			if (strlen(w[i]) >= sizeof(r.program))
				return fail(p, line, "program: a pattern longer than %u bytes",
					    WSD_POLICY_NAME - 1);
			if (strchr(w[i], '/'))
				return fail(p, line, "program \"%s\": a name has no '/' (it is "
					    "matched against the program's base name)",
					    shown(w[i], b));
			memcpy(r.program, w[i], strlen(w[i]) + 1);
			i++;
			continue;
		}
		a = sel == WSD_POLICY_LOCAL ? &r.local : &r.peer;
		if (i < n && strcmp(w[i], "port") && strcmp(w[i], "program") &&
		    strcmp(w[i], "local") && strcmp(w[i], "peer")) {
			if (parse_address(p, line, w[i++], a))
				return -EINVAL;
		}
		if (i < n && !strcmp(w[i], "port")) {
			if (++i == n)
				return fail(p, line, "%s port: no port", kw);
			if (parse_ports(p, line, w[i++], a))
				return -EINVAL;
		}
		if (!a->family && !a->port_lo)
			return fail(p, line, "%s: no address or port", kw);
	}
	if (!r.sel)
		return fail(p, line, "%s: no program, local or peer to match (\"default %s\" "
			    "for every connection)", w[0], w[0]);
	if (p->nrules == WSD_POLICY_RULES)
		return fail(p, line, "more than %u rules", WSD_POLICY_RULES);
	p->needs_addr |= (r.sel & (WSD_POLICY_LOCAL | WSD_POLICY_PEER)) != 0;
	p->rule[p->nrules++] = r;
	return 0;
}

/* The lines of a text fed in pieces, assembled in one buffer of fixed size. */
struct reader {
	char buf[WSD_POLICY_LINE];
	size_t len;
	unsigned line;               /* the number of the line in buf */
};

static int feed(struct wsd_policy *p, struct reader *rd, const char *data, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		char c = data[i];

		if (c == '\0')
			return fail(p, rd->line + 1, "a NUL byte: not a text file");
		if (c == '\n') {
			rd->buf[rd->len] = '\0';
			rd->len = 0;
			if (parse_line(p, rd->buf, ++rd->line))
				return -EINVAL;
			continue;
		}
		if (rd->len == sizeof(rd->buf) - 1)
			return fail(p, rd->line + 1, "a line longer than %u bytes",
				    WSD_POLICY_LINE - 1);
		rd->buf[rd->len++] = c;
	}
	return 0;
}

/* The last line, when the text does not end with a newline. */
static int finish(struct wsd_policy *p, struct reader *rd)
{
	if (!rd->len)
		return 0;
	rd->buf[rd->len] = '\0';
	rd->len = 0;
	return parse_line(p, rd->buf, ++rd->line);
}

int wsd_policy_parse(struct wsd_policy *p, const char *text, size_t len)
{
	struct reader rd = { .len = 0 };

	if (feed(p, &rd, text, len))
		return -EINVAL;
	return finish(p, &rd);
}

int wsd_policy_load(struct wsd_policy *p, const char *path)
{
	struct reader rd = { .len = 0 };
	char chunk[4096];
	struct stat st;
	off_t off = 0;
	int fd, r = 0;

	wsd_policy_init(p, path);
	if (strlen(path) >= sizeof(p->path)) {
		fail(p, 0, "%s", strerror(ENAMETOOLONG));
		return -ENAMETOOLONG;
	}
	/* O_NONBLOCK: a FIFO named here must not stop the program at its first connection */
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	if (fd < 0) {
		r = -errno;
		if (r != -ENOENT)
			fail(p, 0, "%s", strerror(-r));
		return r;
	}
	p->found = true;
	if (fstat(fd, &st) < 0) {
		r = -errno;
		fail(p, 0, "%s", strerror(-r));
	} else if (!S_ISREG(st.st_mode) && !S_ISCHR(st.st_mode)) {
		r = S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL;
		fail(p, 0, "%s", S_ISDIR(st.st_mode) ? strerror(EISDIR) : "not a file");
	}
	while (!r) {
		/* pread: read() is one of the switch's interposed calls */
		ssize_t n = pread(fd, chunk, sizeof(chunk), off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			r = -errno;
			fail(p, 0, "%s", strerror(-r));
		} else if (n == 0) {
			r = finish(p, &rd);
			break;
		} else if (off + n > (off_t)WSD_POLICY_BYTES) {
			r = fail(p, 0, "larger than %u bytes", WSD_POLICY_BYTES);
		} else {
			off += n;
			r = feed(p, &rd, chunk, (size_t)n);
		}
	}
	close(fd);
	return r;
}

int wsd_policy_read(struct wsd_policy *p)
{
	const char *path = wsd_param_str("WSD_CONF");
	bool named = getenv("WSD_CONF") != NULL;
	int r;

	if (!*path) {
		wsd_policy_init(p, "");   /* WSD_CONF empty: no file, no rules */
		return 0;
	}
	r = wsd_policy_load(p, path);
	if (r == -ENOENT && named) {
		/* a file named on purpose that is not there: as unreadable as any */
		fail(p, 0, "%s", strerror(ENOENT));
		return r;
	}
	return r == -ENOENT ? 0 : r;
}

/* ---- matching ---------------------------------------------------------------------- */

static bool addr_match(const struct wsd_policy_addr *a, const struct wsd_stat_addr *c)
{
	const uint8_t *ca = c->addr;
	unsigned family = c->family;

	if (a->port_lo && (c->port < a->port_lo || c->port > a->port_hi))
		return false;
	if (!a->family)
		return true;   /* a port alone */
	if (family == AF_INET6 && !memcmp(ca, mapped, 12)) {
		family = AF_INET;
		ca += 12;
	}
	if (family != a->family)
		return false;
	for (unsigned i = 0; i < a->prefix; i += 8) {
		unsigned left = a->prefix - i;
		uint8_t mask = left >= 8 ? 0xff : (uint8_t)(0xff00u >> left);

		if ((ca[i / 8] & mask) != a->addr[i / 8])
			return false;
	}
	return true;
}

static bool rule_match(const struct wsd_policy_rule *r, const struct wsd_policy_conn *c)
{
	if ((r->sel & WSD_POLICY_PROGRAM) &&
	    (!c->program || fnmatch(r->program, c->program, 0) != 0))
		return false;
	if ((r->sel & WSD_POLICY_LOCAL) && !addr_match(&r->local, &c->local))
		return false;
	return !(r->sel & WSD_POLICY_PEER) || addr_match(&r->peer, &c->peer);
}

enum wsd_policy_action wsd_policy_match(const struct wsd_policy *p,
					const struct wsd_policy_conn *c, unsigned *line)
{
	unsigned dummy;

	if (!line)
		line = &dummy;
	*line = 0;
	if (p->broken)
		return WSD_POLICY_TCP;
	for (unsigned i = 0; i < p->nrules; i++)
		if (rule_match(&p->rule[i], c)) {
			*line = p->rule[i].line;
			return p->rule[i].action;
		}
	*line = p->def_line;
	return p->def;
}

bool wsd_policy_user_ok(const struct wsd_policy *p, uint32_t uid, uint32_t self)
{
	if (p->broken)
		return false;
	if (uid == self || p->users == WSD_PEER_USERS_ANY)
		return true;
	for (unsigned i = 0; p->users == WSD_PEER_USERS_LIST && i < p->nusers; i++)
		if (p->user[i] == uid)
			return true;
	return false;
}

bool wsd_policy_other_users(const struct wsd_policy *p)
{
	return !p->broken && p->users != WSD_PEER_USERS_SAME;
}

bool wsd_policy_all_tcp(const struct wsd_policy *p)
{
	if (p->broken)
		return true;
	if (p->def != WSD_POLICY_TCP)
		return false;
	for (unsigned i = 0; i < p->nrules; i++)
		if (p->rule[i].action == WSD_POLICY_ACCELERATE)
			return false;
	return true;
}

/*
 * A rule that may match some connection accepted on port decides for all
 * of them only when nothing about the connection itself can make it miss:
 * no peer selector, and no local address (a listener on a wildcard
 * address takes connections to each of the host's).  So the rules are
 * walked as for a connection, skipping those that match none of them: the
 * first that may accelerate any says no; the first that surely keeps all
 * on TCP says yes; one that keeps only some is passed over, as the others
 * fall through it.
 */
bool wsd_policy_port_tcp(const struct wsd_policy *p, const char *program, uint16_t port)
{
	if (p->broken)
		return true;
	for (unsigned i = 0; i < p->nrules; i++) {
		const struct wsd_policy_rule *r = &p->rule[i];
		bool every = !(r->sel & WSD_POLICY_PEER);

		if ((r->sel & WSD_POLICY_PROGRAM) &&
		    (!program || fnmatch(r->program, program, 0) != 0))
			continue;
		if (r->sel & WSD_POLICY_LOCAL) {
			if (r->local.port_lo && (port < r->local.port_lo || port > r->local.port_hi))
				continue;
			every = every && !r->local.family;
		}
		if (r->action == WSD_POLICY_ACCELERATE)
			return false;
		if (every)
			return true;
	}
	return p->def == WSD_POLICY_TCP;
}

/* ---- as text ------------------------------------------------------------------------- */

static size_t addr_text(const char *kw, const struct wsd_policy_addr *a, char *buf, size_t len)
{
	char ip[INET6_ADDRSTRLEN] = "";
	size_t o = (size_t)snprintf(buf, len, " %s", kw);

	if (a->family && inet_ntop(a->family, a->addr, ip, sizeof(ip)) && o < len)
		o += (size_t)snprintf(buf + o, len - o, " %s", ip);
	if (a->family && a->prefix != (a->family == AF_INET ? 32 : 128) && o < len)
		o += (size_t)snprintf(buf + o, len - o, "/%u", a->prefix);
	if (a->port_lo && o < len)
		o += (size_t)snprintf(buf + o, len - o, " port %u", a->port_lo);
	if (a->port_hi != a->port_lo && o < len)
		o += (size_t)snprintf(buf + o, len - o, "-%u", a->port_hi);
	return o;
}

void wsd_policy_rule_text(const struct wsd_policy_rule *r, char *buf, size_t len)
{
	size_t o;

	if (!len)
		return;
	o = (size_t)snprintf(buf, len, "%s", wsd_policy_action_name(r->action));
	if ((r->sel & WSD_POLICY_PROGRAM) && o < len)
		o += (size_t)snprintf(buf + o, len - o, " program %s", r->program);
	if ((r->sel & WSD_POLICY_LOCAL) && o < len)
		o += addr_text("local", &r->local, buf + o, len - o);
	if ((r->sel & WSD_POLICY_PEER) && o < len)
		addr_text("peer", &r->peer, buf + o, len - o);
}

/* ---- the process's own ------------------------------------------------------------- */

static pthread_once_t own_once = PTHREAD_ONCE_INIT;
/* written once, under own_once; read only after it */
static struct wsd_policy own;

static void own_init(void)
{
	if (!wsd_policy_read(&own) || !own.broken)
		return;
	/* the program runs on, unaccelerated: say so once, where its user looks */
	if (own.err_line)
		fprintf(stderr, "wsd: %s:%u: %s (every connection stays on TCP)\n", own.path,
			own.err_line, own.err);
	else
		fprintf(stderr, "wsd: %s: %s (every connection stays on TCP)\n", own.path,
			own.err);
}

const struct wsd_policy *wsd_policy_get(void)
{
	pthread_once(&own_once, own_init);
	return &own;
}

/* SPDX-License-Identifier: MIT */
/*
 * The policy file (wsd.conf(5)): which connections the switch may
 * accelerate, by program name, local and peer address and port.  One rule
 * a line, the first whose selectors all match decides, else the default.
 *
 * Parsing and matching are pure functions on a struct wsd_policy the
 * caller owns (the Check suite, `wsd info`); wsd_policy_get() is the
 * process's own, read once.  A policy holds everything in fixed arrays:
 * a file can make it fail (line too long, too many rules), never grow.
 */
#ifndef WSD_SWITCH_POLICY_H
#define WSD_SWITCH_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "switch/stat.h"   /* struct wsd_stat_addr */

#define WSD_POLICY_DEFAULT_FILE "/etc/wsd.conf"
#define WSD_POLICY_LINE  512u      /* bytes in a line, its end included */
#define WSD_POLICY_RULES 256u      /* rules in a file */
#define WSD_POLICY_NAME  128u      /* bytes in a program pattern, its NUL included */
#define WSD_POLICY_PATH  4096u     /* bytes in the file's name, its NUL included */
#define WSD_POLICY_BYTES (1u << 20)   /* bytes read of a file at most */
#define WSD_POLICY_USERS 32u       /* users a peer-users line names, in all */

enum wsd_policy_action { WSD_POLICY_ACCELERATE = 0, WSD_POLICY_TCP = 1 };

/* A local or peer selector: an address with a prefix, a port range, or both. */
struct wsd_policy_addr {
	uint8_t family;              /* AF_INET, AF_INET6; 0: any address */
	uint8_t prefix;              /* bits of addr that must match */
	uint8_t addr[16];            /* IPv4 in the first 4 bytes; bits past prefix zero */
	uint16_t port_lo, port_hi;   /* 0, 0: any port */
};

enum { WSD_POLICY_PROGRAM = 1, WSD_POLICY_LOCAL = 2, WSD_POLICY_PEER = 4 };

struct wsd_policy_rule {
	unsigned line;
	enum wsd_policy_action action;
	unsigned sel;                /* WSD_POLICY_PROGRAM | _LOCAL | _PEER: those given */
	struct wsd_policy_addr local, peer;
	char program[WSD_POLICY_NAME];   /* an fnmatch(3) pattern */
};

struct wsd_policy {
	char path[WSD_POLICY_PATH];  /* the file named; "" for none (WSD_CONF empty) */
	bool found;                  /* the file was there (a missing default one is no error) */
	/* unreadable, or a bad line: every connection stays on TCP */
	bool broken;
	unsigned err_line;           /* the line at fault; 0 for the file as a whole */
	char err[160];
	enum wsd_policy_action def;
	unsigned def_line;           /* the default's line; 0: none given (accelerate) */
	bool needs_addr;             /* a rule has a local or peer selector */
	/*
	 * Which users' processes a connection may be paired with ("peer-users"):
	 * any (the default), our own only, or our own and those listed.
	 */
	enum { WSD_PEER_USERS_ANY, WSD_PEER_USERS_SAME, WSD_PEER_USERS_LIST } users;
	unsigned users_line;         /* the peer-users line; 0: none given */
	unsigned nusers;
	uint32_t user[WSD_POLICY_USERS];
	unsigned nrules;
	struct wsd_policy_rule rule[WSD_POLICY_RULES];
};

/* What a rule is matched against. */
struct wsd_policy_conn {
	const char *program;         /* the program's name (a basename), or NULL */
	/* the connection's addresses (family 0: not known); IPv4-mapped ones match as IPv4 */
	struct wsd_stat_addr local, peer;
};

/* An empty policy (no rules, default accelerate), for the file path ("" for none). */
void wsd_policy_init(struct wsd_policy *p, const char *path);
/*
 * Rules from text (len bytes), appended to p; line numbers count from 1.
 * 0, or -EINVAL at the first bad line: p is then broken, with err_line
 * and err saying why.
 */
int wsd_policy_parse(struct wsd_policy *p, const char *text, size_t len);
/*
 * p from the file path: 0; -ENOENT when it is missing (p not broken:
 * the caller decides whether that is an error); another -errno when it
 * cannot be read, -EINVAL when a line is bad (p broken either way).
 */
int wsd_policy_load(struct wsd_policy *p, const char *path);
/*
 * The policy this environment names: WSD_CONF's file, or /etc/wsd.conf
 * when WSD_CONF is unset, or none when it is empty.  Returns what
 * wsd_policy_load did, but a missing /etc/wsd.conf is 0 (no rules) and a
 * missing file WSD_CONF names leaves p broken.
 */
int wsd_policy_read(struct wsd_policy *p);

/*
 * What p says of c: the action of the first rule whose selectors all
 * match, else the default.  *line (when not NULL): that rule's line, the
 * default's, or 0 (no default given; or p broken, which says tcp).
 */
enum wsd_policy_action wsd_policy_match(const struct wsd_policy *p,
					const struct wsd_policy_conn *c, unsigned *line);

/*
 * May a connection be paired with a process of user uid?  Our own always
 * (unless p is broken); another as p's peer-users line says.
 */
bool wsd_policy_user_ok(const struct wsd_policy *p, uint32_t uid, uint32_t self);
/* Does p let any other user pair at all (no "peer-users same")? */
bool wsd_policy_other_users(const struct wsd_policy *p);

/* p keeps every connection on TCP: broken, or "default tcp" and no rule accelerates. */
bool wsd_policy_all_tcp(const struct wsd_policy *p);

/*
 * p keeps every connection that program accepts on port on TCP, whatever
 * its peer and the local address it came to (broken, or the rules say so
 * for each): the port's peers may be told once for all.
 */
bool wsd_policy_port_tcp(const struct wsd_policy *p, const char *program, uint16_t port);

/* Rule r as a line would say it, in one canonical form: "tcp peer 10.0.0.0/8 port 5201". */
void wsd_policy_rule_text(const struct wsd_policy_rule *r, char *buf, size_t len);
static inline const char *wsd_policy_action_name(enum wsd_policy_action a)
{
	return a == WSD_POLICY_TCP ? "tcp" : "accelerate";
}

/*
 * This process's policy, read once (wsd_policy_read), the first time a
 * connection asks.  A file that cannot be read or has a bad line is named
 * on stderr then ("wsd: FILE:LINE: what"), and the policy says tcp for
 * every connection.
 */
const struct wsd_policy *wsd_policy_get(void);

#endif /* WSD_SWITCH_POLICY_H */

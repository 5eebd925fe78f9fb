/* SPDX-License-Identifier: MIT */
/*
 * wsd bench's apps section, on this host and only when named (--only
 * apps): real programs in their usual configuration, each row plain and
 * under `wsd run` in turns, the median of 5 rounds at least (real servers
 * vary more than the bench's workers):
 *
 *   nginx    master as root, its worker as another user (www-data, else
 *            nobody), wrk as root: requests per second for a 4 KiB file;
 *   pgbench  a PostgreSQL cluster of the bench's own run by user postgres,
 *            pgbench -S as root: transactions per second;
 *   splice   client -> a proxy that splices -> server, the bench's own
 *            workers (bench_work_proxy.c): MB/s of 1 MiB messages.
 *
 * Each wsd run also counts the server's connections that `wsd stat` finds
 * on shm or verbs, and why the others are not: what a wsd figure is worth
 * depends on it.  A program not installed skips its row with a line that
 * says so; one that fails counts in bench_failures.  Every outside program
 * runs in a process group of its own, with a deadline, and is stopped, its
 * group killed, whatever happened to the round; the bench's own workers
 * have deadlines too.  wsd(1) documents the output.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <glob.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "wsd/bench.h"

#define MIN_ROUNDS 5
#define MAX_KIDS 64             /* an nginx's workers, a postmaster's backends */

/* Sockets not on shm or verbs, by the reason `wsd stat` gives. */
struct reasons {
	struct {
		char name[24];
		int n;
	} r[8];
	int n;
};

/*
 * The wsd runs' server connections of one row, by their path; the others'
 * reasons at each end (the two may differ: the end that declines knows).
 */
struct census {
	int fast, all;
	const char *side[2];    /* [server, client]: what the row calls each */
	struct reasons why[2];
};

/* What every row runs with. */
struct apps {
	const struct bench_opts *o;
	const char *self;       /* the wsd program */
	int rounds;
	char dir[64];           /* the row's temporary directory */
};

/* ---- programs, each in its own process group with a deadline ---------------------------- */

/*
 * Start argv in a process group of its own, under `wsd run` when wsd, as
 * user pw (NULL: as we are), in a->dir, its output in the file log
 * (truncated).  Its pid, or -1.
 */
static pid_t start(const struct apps *a, bool wsd, const struct passwd *pw, const char *log,
		   char *const argv[])
{
	char *args[32];
	int n = 0, fd;
	pid_t pid;

	if (wsd) {
		args[n++] = (char *)a->self;
		args[n++] = "run";
		args[n++] = "--";
	}
	for (int i = 0; argv[i] && n < 31; i++)
		args[n++] = argv[i];
	args[n] = NULL;
	/* opened before the child drops its rights: the user need not be able to write here */
	if ((fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0)
		return -1;
	pid = fork();
	if (pid == 0) {
		setpgid(0, 0);
		dup2(fd, 1);
		dup2(fd, 2);
		if (!wsd)
			unsetenv("LD_PRELOAD");
		if (pw && (initgroups(pw->pw_name, pw->pw_gid) || setgid(pw->pw_gid) ||
			   setuid(pw->pw_uid))) {
			fprintf(stderr, "becoming %s: %s\n", pw->pw_name, strerror(errno));
			_exit(127);
		}
		if (chdir(a->dir)) {
			fprintf(stderr, "%s: %s\n", a->dir, strerror(errno));
			_exit(127);
		}
		execvp(args[0], args);
		fprintf(stderr, "%s: %s\n", args[0], strerror(errno));
		_exit(127);
	}
	if (pid > 0)
		setpgid(pid, pid);      /* before the parent may signal the group, too */
	close(fd);
	return pid;
}

/* The processes whose parent is pid, at most max. */
static int children(pid_t pid, pid_t *out, int max)
{
	DIR *d = opendir("/proc");
	struct dirent *e;
	int n = 0;

	while (d && n < max && (e = readdir(d))) {
		char name[sizeof(e->d_name) + 16], buf[512], *p = NULL;
		FILE *f;
		int ppid;

		if (e->d_name[0] < '1' || e->d_name[0] > '9')
			continue;
		snprintf(name, sizeof(name), "/proc/%s/stat", e->d_name);
		if (!(f = fopen(name, "r")))
			continue;
		/* the name in parentheses may hold anything: the fields follow the last ')' */
		if (fgets(buf, sizeof(buf), f))
			p = strrchr(buf, ')');
		fclose(f);
		if (p && sscanf(p, ") %*c %d", &ppid) == 1 && ppid == pid)
			out[n++] = atoi(e->d_name);
	}
	if (d)
		closedir(d);
	return n;
}

/*
 * pid has not ended.  It is left unreaped either way, so that its process
 * group id stays its own until stop() has killed the group.
 */
static bool running(pid_t pid)
{
	siginfo_t si = { 0 };

	return !waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) && !si.si_pid;
}

/*
 * sig to pid; once it has ended, or secs have passed, its group and its
 * children (a postmaster's backends have groups of their own) are killed
 * and it is reaped.
 */
static void stop(pid_t pid, int sig, double secs)
{
	double end = bench_now() + secs;
	pid_t kids[MAX_KIDS];

	if (pid <= 0)
		return;
	kill(pid, sig);
	while (running(pid) && bench_now() < end)
		usleep(20000);
	for (int i = 0, n = children(pid, kids, MAX_KIDS); i < n; i++)
		kill(kids[i], SIGKILL);
	kill(-pid, SIGKILL);
	waitpid(pid, NULL, 0);
}

/* The string value of field key on a `wsd stat --json` socket's line, into buf. */
static bool json_field(const char *line, const char *key, char *buf, size_t len)
{
	char pat[32];
	const char *p;
	size_t n;

	snprintf(pat, sizeof(pat), "\"%s\":\"", key);
	if (!(p = strstr(line, pat)))
		return false;
	p += strlen(pat);
	n = strcspn(p, "\"");
	snprintf(buf, len, "%.*s", (int)n, p);
	return true;
}

static void count_why(struct reasons *w, const char *why)
{
	int i;

	for (i = 0; i < w->n && strcmp(w->r[i].name, why); i++)
		;
	if (i == w->n) {
		if (w->n == 8)
			return;         /* more kinds than a line shows */
		snprintf(w->r[w->n++].name, sizeof(w->r[0].name), "%s", why);
	}
	w->r[i].n++;
}

/*
 * The connected sockets of srv's children (an nginx's workers, a
 * postmaster's backends) and of client cli as `wsd stat --json` shows
 * them, into c: the server's by path, and both ends' reasons.
 */
static void census_take(const struct apps *a, pid_t srv, pid_t cli, struct census *c)
{
	pid_t kids[MAX_KIDS];
	int n = children(srv, kids, MAX_KIDS), pid = 0;
	char cmd[PATH_MAX + 48 + MAX_KIDS * 12], line[2048];
	size_t len;
	FILE *f;

	/* children that hold no socket have no statistics to show: not an error */
	len = (size_t)snprintf(cmd, sizeof(cmd), "timeout 10 '%s' stat --json %d", a->self,
			       (int)cli);
	for (int i = 0; i < n; i++)
		len += (size_t)snprintf(cmd + len, sizeof(cmd) - len, " %d", (int)kids[i]);
	snprintf(cmd + len, sizeof(cmd) - len, " 2>/dev/null");
	if (!(f = popen(cmd, "r")))
		return;
	/* a line per process, then one per socket: listeners and unconnected ones left out */
	while (fgets(line, sizeof(line), f)) {
		char path[16], why[24];
		bool server = pid != cli;

		if (sscanf(line, " {\"pid\":%d", &pid) == 1 || !strstr(line, "{\"fd\":") ||
		    strstr(line, "\"listening\":true") || strstr(line, "\"peer\":null") ||
		    !json_field(line, "path", path, sizeof(path)) ||
		    !json_field(line, "reason", why, sizeof(why)))
			continue;
		c->all += server;
		if (bench_fast(path))
			c->fast += server;
		else
			count_why(&c->why[!server], why);
	}
	pclose(f);
}

/*
 * Wait for client pid to end, secs at most (then it is stopped); at `at`
 * seconds into it, when c, take the census of srv's children and of the
 * client.  True if it ended of itself with status 0.
 */
static bool await(const struct apps *a, pid_t pid, double secs, double at, pid_t srv,
		  struct census *c)
{
	double t0 = bench_now();
	int st;

	for (;;) {
		pid_t r = waitpid(pid, &st, WNOHANG);

		if (r == pid)
			return WIFEXITED(st) && WEXITSTATUS(st) == 0;
		if (r < 0)
			return false;
		if (c && bench_now() - t0 >= at) {
			census_take(a, srv, pid, c);
			c = NULL;
		}
		if (bench_now() - t0 > secs) {
			fprintf(stderr, "wsd bench: pid %d still ran after %.0f s: stopped\n",
				(int)pid, secs);
			stop(pid, SIGTERM, 2);
			return false;
		}
		usleep(20000);
	}
}

/* The last line of file path that holds mark, into line; false if none. */
static bool last_line(const char *path, const char *mark, char *line, size_t len)
{
	FILE *f = fopen(path, "r");
	char buf[1024];
	bool found = false;

	while (f && fgets(buf, sizeof(buf), f))
		if (strstr(buf, mark)) {
			snprintf(line, len, "%.*s", (int)len - 1, buf);
			found = true;
		}
	if (f)
		fclose(f);
	return found;
}

/* The last lines of a program's output file, on stderr. */
static void show(const char *log)
{
	char lines[6][256];
	int n = 0;
	FILE *f = fopen(log, "r");

	fprintf(stderr, "   %s ends:\n", log);
	while (f && fgets(lines[n % 6], sizeof(lines[0]), f))
		n++;
	if (f)
		fclose(f);
	for (int i = n > 6 ? n - 6 : 0; i < n; i++)
		fprintf(stderr, "   %s", lines[i % 6]);
}

/* A measurement that did not run: what went wrong, and what the program said. */
static void tell(const char *what, const char *log)
{
	fprintf(stderr, "wsd bench: %s\n", what);
	show(log);
	bench_failures++;
}

/* Wait until something listens on 127.0.0.1:port, while srv runs; secs at most. */
static bool wait_port(pid_t srv, int port, double secs)
{
	double end = bench_now() + secs;

	while (bench_now() < end && running(srv)) {
		int fd = bench_try_connect("127.0.0.1", port);

		if (fd >= 0) {
			close(fd);
			return true;
		}
		usleep(50000);
	}
	return false;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	remove(path);
	return 0;
}

/*
 * A temporary directory of the row's, mode 0755 (other users' programs
 * read it); a->dir empty when there is none.
 */
static bool make_dir(struct apps *a, const char *name)
{
	snprintf(a->dir, sizeof(a->dir), "/tmp/wsd-bench-%s.XXXXXX", name);
	if (!mkdtemp(a->dir)) {
		fprintf(stderr, "wsd bench: %s: %s\n", a->dir, strerror(errno));
		bench_failures++;
		a->dir[0] = 0;
		return false;
	}
	return chmod(a->dir, 0755) == 0;
}

static void remove_dir(struct apps *a)
{
	if (a->dir[0])
		nftw(a->dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	a->dir[0] = 0;
}

/* ---- a row's figures --------------------------------------------------------------------- */

/* The medians of the rounds run; the row is measured when every round gave both figures. */
static void row_end(struct bench_app_row *row, double v[2][BENCH_MAXR], int rounds,
		    const struct census *c)
{
	row->measured = rounds > 0;
	for (int w = 0; w < 2; w++) {
		for (int r = 0; r < rounds; r++)
			row->measured &= v[w][r] > 0;
		row->v[w] = bench_median(v[w], rounds);
	}
	row->fast = c->fast;
	row->all = c->all;
}

/* The row's line; c may be NULL when it was not measured. */
static void row_print(const char *label, const struct bench_app_row *row, const char *unit,
		      const struct census *c)
{
	printf("apps: %s: ", label);
	if (!row->measured) {
		printf("not measured (it failed: stderr says why)\n");
		fflush(stdout);
		return;
	}
	printf("plain %.0f%s, wsd %.0f%s (%.2fx), on shm or verbs %d of %d", row->v[0], unit,
	       row->v[1], unit, bench_ratio(row->v[1], row->v[0]), c->fast, c->all);
	for (int s = 0, any = 0; s < 2; s++) {
		const struct reasons *w = &c->why[s];

		for (int i = 0; i < w->n; i++)
			printf("%s%s%s%s %d", i ? ", " : any++ ? "; " : " (", i ? "" : c->side[s],
			       i ? "" : ": ", w->r[i].name, w->r[i].n);
	}
	printf("%s\n", c->why[0].n || c->why[1].n ? ")" : "");
	fflush(stdout);
}

static void skipped(const char *name, const char *why)
{
	printf("apps: %s: %s: skipped\n", name, why);
	fflush(stdout);
}

/* ---- nginx, its worker as another user -------------------------------------------------- */

/* A 4096-byte file and a configuration as a distribution ships it, but all in a->dir. */
static bool nginx_setup(const struct apps *a, const struct passwd *pw, int port)
{
	const struct group *gr = getgrgid(pw->pw_gid);
	char path[128], page[4096];
	FILE *f;
	bool ok;

	snprintf(path, sizeof(path), "%s/www", a->dir);
	if (mkdir(path, 0755))
		return false;
	snprintf(path, sizeof(path), "%s/www/4k", a->dir);
	memset(page, 'w', sizeof(page));
	if (!(f = fopen(path, "w")))
		return false;
	ok = fwrite(page, 1, sizeof(page), f) == sizeof(page);
	if (fclose(f) || !ok || chmod(path, 0644))
		return false;
	snprintf(path, sizeof(path), "%s/nginx.conf", a->dir);
	if (!(f = fopen(path, "w")))
		return false;
	/*
	 * Debian's: the worker as another user, sendfile and tcp_nopush on.
	 * Its temporary files here too, where the master may make them.
	 */
	fprintf(f, "user %s %s;\nworker_processes 1;\ndaemon off;\nmaster_process on;\n"
		   "error_log %s/error.log;\npid %s/nginx.pid;\n"
		   "events { worker_connections 1024; }\n"
		   "http {\n\taccess_log off;\n\tsendfile on;\n\ttcp_nopush on;\n"
		   "\tkeepalive_requests 100000;\n",
		pw->pw_name, gr ? gr->gr_name : pw->pw_name, a->dir, a->dir);
	for (int i = 0; i < 5; i++) {
		static const char *const tmp[5] = { "client_body", "proxy", "fastcgi", "uwsgi",
						    "scgi" };

		fprintf(f, "\t%s_temp_path %s/%s;\n", tmp[i], a->dir, tmp[i]);
	}
	fprintf(f, "\tserver { listen 127.0.0.1:%d; root %s/www; }\n}\n", port, a->dir);
	return fclose(f) == 0;
}

/* One wrk run against a fresh nginx, both plain or both under wsd: requests/s, or 0. */
static double nginx_once(const struct apps *a, bool wsd, int port, int secs, struct census *c)
{
	char conf[96], elog[96], slog[96], clog[96], dur[16], url[64], line[256];
	char *srv[] = { "nginx", "-p", (char *)a->dir, "-c", conf, "-e", elog, NULL };
	char *cli[] = { "wrk", "-t2", "-c100", dur, url, NULL };
	double rate = 0;
	pid_t s, w;

	snprintf(conf, sizeof(conf), "%s/nginx.conf", a->dir);
	snprintf(elog, sizeof(elog), "%s/error.log", a->dir);
	snprintf(slog, sizeof(slog), "%s/nginx.out", a->dir);
	snprintf(clog, sizeof(clog), "%s/wrk.out", a->dir);
	snprintf(dur, sizeof(dur), "-d%ds", secs);
	snprintf(url, sizeof(url), "http://127.0.0.1:%d/4k", port);
	s = start(a, wsd, NULL, slog, srv);
	if (s < 0 || !wait_port(s, port, 10)) {
		tell(wsd ? "nginx under wsd run did not start" : "nginx did not start", slog);
		show(elog);
		stop(s, SIGTERM, 5);
		return 0;
	}
	w = start(a, wsd, NULL, clog, cli);
	if (w < 0 || !await(a, w, secs + 20, secs / 2.0, s, wsd ? c : NULL))
		tell(wsd ? "wrk under wsd run failed" : "wrk failed", clog);
	else if (last_line(clog, "Non-2xx", line, sizeof(line)))
		tell("nginx answered with errors", elog);
	else if (!last_line(clog, "Requests/sec:", line, sizeof(line)) ||
		 sscanf(line, " Requests/sec: %lf", &rate) != 1)
		tell("wrk printed no Requests/sec", clog);
	stop(s, SIGTERM, 10);
	return rate;
}

static void nginx_row(struct apps *a, struct bench_app_row *row)
{
	static const char *const users[2] = { "www-data", "nobody" };
	const struct passwd *pw = NULL;
	double v[2][BENCH_MAXR];
	struct census c = { .side = { "worker", "wrk" } };
	char label[96];
	int port = bench_free_port(), secs = a->o->quick ? 1 : 3, r = 0;
	bool ready;

	if (!bench_have("nginx") || !bench_have("wrk")) {
		skipped("nginx", bench_have("nginx") ? "not installed (wrk missing)" :
						      "not installed (nginx missing)");
		return;
	}
	if (geteuid()) {
		skipped("nginx", "its worker runs as another user: needs root");
		return;
	}
	for (int i = 0; i < 2 && !pw; i++)
		pw = getpwnam(users[i]);
	if (!pw) {
		skipped("nginx", "neither user www-data nor nobody exists");
		return;
	}
	snprintf(label, sizeof(label), "nginx (worker as %s, wrk -t2 -c100 -d%ds, 4 KiB)",
		 pw->pw_name, secs);
	ready = make_dir(a, "nginx") && port && nginx_setup(a, pw, port);
	if (a->dir[0] && !ready) {
		fprintf(stderr, "wsd bench: nginx's files in %s: %s\n", a->dir, strerror(errno));
		bench_failures++;
	}
	for (; ready && r < a->rounds; r++)
		if (!(v[0][r] = nginx_once(a, false, port, secs, NULL)) ||
		    !(v[1][r] = nginx_once(a, true, port, secs, &c)))
			break;
	row_end(row, v, r < a->rounds ? 0 : r, &c);
	row_print(label, row, "/s", &c);
	remove_dir(a);
}

/* ---- PostgreSQL, its backends as user postgres ------------------------------------------- */

enum { PG_POSTGRES, PG_INITDB, PG_PGBENCH, PG_ISREADY, PG_NPROGS };
static const char *const pg_names[PG_NPROGS] = { "postgres", "initdb", "pgbench", "pg_isready" };

/*
 * PostgreSQL's programs: in the newest of Debian's /usr/lib/postgresql/N/bin
 * (its PATH has wrappers at most), else on PATH.  The first missing, or NULL.
 */
static const char *pg_find(char prog[PG_NPROGS][PATH_MAX])
{
	static const char *const pat = "/usr/lib/postgresql/*/bin/postgres";
	char dir[PATH_MAX] = "";
	double best = -1;
	glob_t g;

	if (!glob(pat, 0, NULL, &g))
		for (size_t i = 0; i < g.gl_pathc; i++) {
			double ver = atof(g.gl_pathv[i] + strlen("/usr/lib/postgresql/"));

			if (ver > best) {
				best = ver;
				snprintf(dir, sizeof(dir), "%.*s",
					 (int)(strlen(g.gl_pathv[i]) - strlen("/postgres")),
					 g.gl_pathv[i]);
			}
		}
	globfree(&g);
	for (int i = 0; i < PG_NPROGS; i++) {
		snprintf(prog[i], PATH_MAX, "%s%s%s", dir, dir[0] ? "/" : "", pg_names[i]);
		if (dir[0] ? access(prog[i], X_OK) != 0 : !bench_have(prog[i]))
			return pg_names[i];
	}
	return NULL;
}

struct pg {
	struct apps *a;
	const struct passwd *pw;
	char prog[PG_NPROGS][PATH_MAX];
	char port[16], data[96], log[96];
};

/* A program of PostgreSQL's, as root and plain, given secs, its output in log. */
static bool pg_client(struct pg *pg, int prog, char *const args[], double secs, const char *log)
{
	char *argv[16] = { pg->prog[prog] };
	pid_t pid;

	for (int i = 0; args[i] && i < 14; i++)
		argv[i + 1] = args[i];
	pid = start(pg->a, false, NULL, log, argv);
	return pid > 0 && await(pg->a, pid, secs, 0, 0, NULL);
}

/*
 * The server, plain or under wsd run, as user postgres, ready: pg_isready
 * says so (it answers at once while the server is not listening yet, so
 * it is asked again), 60 s at most.  Its pid, or -1.
 */
static pid_t pg_start(struct pg *pg, bool wsd)
{
	char *srv[] = { pg->prog[PG_POSTGRES], "-D", pg->data, "-k", pg->a->dir, "-p", pg->port,
			"-c", "listen_addresses=127.0.0.1", NULL };
	char *ready[] = { "-q", "-h", "127.0.0.1", "-p", pg->port, "-t", "5", NULL };
	char rlog[96];
	double end = bench_now() + 60;
	pid_t s = start(pg->a, wsd, pg->pw, pg->log, srv);

	snprintf(rlog, sizeof(rlog), "%s/pg_isready.out", pg->a->dir);
	while (s > 0 && bench_now() < end && running(s)) {
		if (pg_client(pg, PG_ISREADY, ready, 10, rlog))
			return s;
		usleep(100000);
	}
	tell(wsd ? "postgres under wsd run did not start" : "postgres did not start", pg->log);
	stop(s, SIGQUIT, 10);
	return -1;
}

/*
 * The cluster, made by user postgres in a->dir: trust for every local
 * user (pgbench connects as root), its WAL not synced while it is made.
 */
static bool pg_init(struct pg *pg)
{
	char *argv[] = { pg->prog[PG_INITDB], "-D", pg->data, "-U", "postgres", "-A", "trust",
			 "--no-sync", NULL };
	char log[96];
	pid_t pid;

	snprintf(log, sizeof(log), "%s/initdb.out", pg->a->dir);
	pid = start(pg->a, false, pg->pw, log, argv);
	if (pid > 0 && await(pg->a, pid, 180, 0, 0, NULL))
		return true;
	tell("initdb failed", log);
	return false;
}

/*
 * `wsd run` as user postgres: the wsd program and its library must be
 * reachable for that user (a build tree in /root is not).  When it does
 * not run, the last line it said is in why.
 */
static bool pg_wsd_reachable(struct pg *pg, char *why, size_t len)
{
	char *argv[] = { "true", NULL };
	char log[96];
	pid_t pid;
	bool ok;

	snprintf(log, sizeof(log), "%s/wsd-run.out", pg->a->dir);
	pid = start(pg->a, true, pg->pw, log, argv);
	ok = pid > 0 && await(pg->a, pid, 20, 0, 0, NULL);
	/* the loader only warns when it cannot preload: any word at all is a failure */
	snprintf(why, len, "no word");
	if (last_line(log, "", why, len))
		ok = false;
	why[strcspn(why, "\n")] = 0;
	return ok;
}

/* One pgbench -S run against a fresh server: transactions per second, or 0. */
static double pg_once(struct pg *pg, bool wsd, int secs, struct census *c)
{
	char t[16], clog[96], line[256];
	char *cli[] = { pg->prog[PG_PGBENCH], "-S", "-c", "8", "-j", "2", "-T", t, "-h",
			"127.0.0.1", "-p", pg->port, "-U", "postgres", "postgres", NULL };
	double tps = 0;
	pid_t s = pg_start(pg, wsd), w;

	if (s < 0)
		return 0;
	snprintf(t, sizeof(t), "%d", secs);
	snprintf(clog, sizeof(clog), "%s/pgbench.out", pg->a->dir);
	w = start(pg->a, wsd, NULL, clog, cli);
	if (w < 0 || !await(pg->a, w, secs + 60, secs / 2.0, s, wsd ? c : NULL))
		tell(wsd ? "pgbench under wsd run failed" : "pgbench failed", clog);
	else if (!last_line(clog, "(without initial connection time)", line, sizeof(line)) ||
		 sscanf(line, "tps = %lf", &tps) != 1)
		tell("pgbench printed no tps", clog);
	stop(s, SIGINT, 30);    /* a fast shutdown: the clients are gone */
	return tps;
}

/* pgbench -i -s 1, once, against a plain server. */
static bool pg_fill(struct pg *pg)
{
	char *argv[] = { "-i", "-s", "1", "-h", "127.0.0.1", "-p", pg->port, "-U", "postgres",
			 "postgres", NULL };
	char log[96];
	pid_t s = pg_start(pg, false);
	bool ok;

	if (s < 0)
		return false;
	snprintf(log, sizeof(log), "%s/pgbench-init.out", pg->a->dir);
	if (!(ok = pg_client(pg, PG_PGBENCH, argv, 180, log)))
		tell("pgbench -i failed", log);
	stop(s, SIGINT, 30);
	return ok;
}

static void pg_rounds(struct pg *pg, struct bench_app_row *row)
{
	int secs = pg->a->o->quick ? 1 : 3, r = 0;
	double v[2][BENCH_MAXR];
	struct census c = { .side = { "backends", "pgbench" } };
	char label[96], why[256];

	snprintf(label, sizeof(label), "pgbench (backends as postgres, -S -c 8 -j 2 -T %d, "
		 "as root)", secs);
	if (!pg_wsd_reachable(pg, why, sizeof(why))) {
		printf("apps: pgbench: not measured: `wsd run` does not run as user postgres "
		       "(%s): the wsd program and its library must be readable by that user\n",
		       why);
		return;
	}
	if (pg_init(pg) && pg_fill(pg))
		for (; r < pg->a->rounds; r++)
			if (!(v[0][r] = pg_once(pg, false, secs, NULL)) ||
			    !(v[1][r] = pg_once(pg, true, secs, &c)))
				break;
	row_end(row, v, r < pg->a->rounds ? 0 : r, &c);
	row_print(label, row, " tps", &c);
}

static void pg_row(struct apps *a, struct bench_app_row *row)
{
	struct pg pg = { .a = a };
	const char *missing = pg_find(pg.prog);
	int port = bench_free_port();
	char why[64];
	bool ready;

	if (missing) {
		snprintf(why, sizeof(why), "not installed (%s missing)", missing);
		skipped("pgbench", why);
		return;
	}
	if (geteuid() || !(pg.pw = getpwnam("postgres"))) {
		skipped("pgbench", geteuid() ? "its server runs as user postgres: needs root" :
					       "no user postgres");
		return;
	}
	ready = make_dir(a, "pg") && port && chown(a->dir, pg.pw->pw_uid, pg.pw->pw_gid) == 0;
	if (!ready) {
		if (a->dir[0]) {
			fprintf(stderr, "wsd bench: %s: %s\n", a->dir, strerror(errno));
			bench_failures++;
		}
		row_print("pgbench", row, "", NULL);
	} else {
		snprintf(pg.port, sizeof(pg.port), "%d", port);
		snprintf(pg.data, sizeof(pg.data), "%s/data", a->dir);
		snprintf(pg.log, sizeof(pg.log), "%s/postgres.out", a->dir);
		pg_rounds(&pg, row);
	}
	remove_dir(a);
}

/* ---- a proxy that splices ----------------------------------------------------------------- */

/* Its first line before the deadline: a worker's streams are read unbuffered here. */
static bool spawn_line(const struct apps *a, struct bench_proc *p, bool wsd, char *args[],
		       char *line, size_t len, double deadline)
{
	return !bench_spawn(p, wsd, a->o->transport, args) && !setvbuf(p->out, NULL, _IONBF, 0) &&
	       bench_line_by(p, line, len, deadline);
}

/* One run client -> splice-proxy -> server, all plain or all under wsd: MB/s, or 0. */
static double splice_once(const struct apps *a, bool wsd, struct census *c)
{
	char warm[16], run[16], sport[16], pport[16], line[256], pa[16], pb[16];
	char *srv[] = { "tput-srv", "127.0.0.1", "1", "-1", NULL };
	char *pxy[] = { "splice-proxy", "127.0.0.1", sport, NULL };
	char *cli[] = { "tput-cli", "127.0.0.1", pport, "1048576", "1", warm, run, "-1", NULL };
	struct bench_proc p[3] = { { 0 } };     /* server, proxy, client */
	/* the client warms up until its connection moved, 2 s at most */
	double end = bench_now() + 30 + a->o->warm_ms / 1e3 + a->o->run_ms * 2 / 1e3, mbs = 0;
	unsigned long long bytes = 0;
	double secs = 0;

	snprintf(warm, sizeof(warm), "%d", a->o->warm_ms);
	snprintf(run, sizeof(run), "%d", a->o->run_ms * 2);
	if (!spawn_line(a, &p[0], wsd, srv, line, sizeof(line), end) ||
	    sscanf(line, "port %15s", sport) != 1 ||
	    !spawn_line(a, &p[1], wsd, pxy, line, sizeof(line), end) ||
	    sscanf(line, "port %15s", pport) != 1 ||
	    !spawn_line(a, &p[2], wsd, cli, line, sizeof(line), end) ||
	    sscanf(line, "bytes %llu secs %lf", &bytes, &secs) != 2 ||
	    !bench_line_by(&p[1], line, sizeof(line), end) ||
	    sscanf(line, "bytes %*u %*u path %15s %15s", pa, pb) != 2) {
		fprintf(stderr, "wsd bench: the splicing proxy's run (%s) failed\n",
			wsd ? "wsd" : "plain");
		bench_failures++;
	} else {
		mbs = secs > 0 ? bytes / secs / 1e6 : 0;
		/* the proxy's two connections: to the client and to the server */
		for (int i = 0; wsd && i < 2; i++) {
			const char *path = i ? pb : pa;

			c->all++;
			if (bench_fast(path))
				c->fast++;
			else
				count_why(&c->why[0], path);
		}
	}
	for (int i = 2; i >= 0; i--)
		if (p[i].out)
			bench_end_worker(&p[i], bench_now() + 5);
	return mbs;
}

static void splice_row(struct apps *a, struct bench_app_row *row)
{
	double v[2][BENCH_MAXR];
	struct census c = { .side = { "proxy", "client" } };
	char label[96];
	int r = 0;

	snprintf(label, sizeof(label), "splice proxy (client -> proxy -> server, 1 MiB "
		 "messages, %d ms)", a->o->run_ms * 2);
	for (; r < a->rounds; r++)
		if (!(v[0][r] = splice_once(a, false, NULL)) || !(v[1][r] = splice_once(a, true, &c)))
			break;
	row_end(row, v, r < a->rounds ? 0 : r, &c);
	row_print(label, row, " MB/s", &c);
}

/* ---- the section ------------------------------------------------------------------------- */

void bench_apps(const struct bench_opts *o, const char *self, unsigned rows,
		struct bench_apps_res *res)
{
	struct apps a = { .o = o, .self = self,
			  .rounds = o->quick ? 1 : o->rounds > MIN_ROUNDS ? o->rounds : MIN_ROUNDS };

	memset(res, 0, sizeof(*res));
	printf("\n== apps: real programs, plain and all under wsd run in turns (median of %d);\n"
	       "   the wsd runs' server connections on shm or verbs (why not, by reason)\n",
	       a.rounds);
	fflush(stdout);
	if (o->peer) {
		printf("   not measured: on this host only (not with --peer)\n");
		return;
	}
	if (rows & BENCH_APPS_NGINX)
		nginx_row(&a, &res->nginx);
	if (rows & BENCH_APPS_PG)
		pg_row(&a, &res->pgbench);
	if (rows & BENCH_APPS_SPLICE)
		splice_row(&a, &res->splice);
}

/* Met only with every wsd connection on shm or verbs: else the figure is TCP's. */
static void judge(const char *name, const struct bench_app_row *row, double target)
{
	bench_judge(name, row->measured, row->all > 0 && row->fast == row->all,
		    bench_ratio(row->v[1], row->v[0]), ">=", target, "");
}

void bench_apps_verdicts(const struct bench_apps_res *res, unsigned rows)
{
	if (rows & BENCH_APPS_NGINX)
		judge("apps_nginx_other_user_ratio", &res->nginx, 1.3);
	if (rows & BENCH_APPS_PG)
		judge("apps_pgbench_other_user_ratio", &res->pgbench, 1.15);
	if (rows & BENCH_APPS_SPLICE)
		judge("apps_splice_proxy_ratio", &res->splice, 1.0);
}

/* SPDX-License-Identifier: MIT */
/*
 * wsd stat: the sockets of every process running the switch, read from the
 * files those processes publish (/dev/shm/wsd-stat.<pid>, switch/stat.h).
 * Read-only towards live processes; a file whose process is gone is removed
 * on the way, since the process could not.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "switch/stat.h"
#include "switch/switch.h"   /* enum wsd_path, enum wsd_reason: the values only */
#include "wsd/cmd.h"
#include "wsd/stat.h"

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
_Static_assert(WSD_STAT_NREFUSED == WSD_STAT_REASONS, "wsd/stat.h: refused[]");
_Static_assert(sizeof(((struct row *)0)->wait) / sizeof(uint64_t) == WSD_STAT_WAIT_N,
	       "wsd/stat.h: wait[]");

/* the last sleep's values (switch/stat.h, WSD_WAIT_*), by their JSON keys */
static const char *const wait_keys[WSD_STAT_WAIT_N] = {
	[WSD_WAIT_AT] = "at_ms", [WSD_WAIT_WHAT] = "for", [WSD_WAIT_MODES] = "modes",
	[WSD_WAIT_SLEEPERS] = "sleepers", [WSD_WAIT_TX_POS] = "tx_pos",
	[WSD_WAIT_CONSUMED] = "consumed", [WSD_WAIT_ZC_SENT] = "zc_sent",
	[WSD_WAIT_ZC_DONE] = "zc_done", [WSD_WAIT_SPACE_GEN] = "space_arm",
	[WSD_WAIT_PEER_DATA_ARM] = "peer_data_arm", [WSD_WAIT_RUNG_DATA] = "rung_data",
	[WSD_WAIT_RX_POS] = "rx_pos", [WSD_WAIT_RX_REPORTED] = "rx_reported",
	[WSD_WAIT_DATA_GEN] = "data_arm", [WSD_WAIT_PEER_SPACE_ARM] = "peer_space_arm",
	[WSD_WAIT_RUNG_SPACE] = "rung_space", [WSD_WAIT_BELLS_TX] = "bells_tx",
	[WSD_WAIT_BELLS_RX] = "bells_rx", [WSD_WAIT_BELLS_ANN] = "bells_announced",
	[WSD_WAIT_CLOSED] = "peer_closed", [WSD_WAIT_ARM_BELLS] = "arm_bells",
	[WSD_WAIT_BELLS_UNSENT] = "bells_unsent", [WSD_WAIT_BELL_ERRNO] = "bell_errno",
};
/* every wait value a key: a new one without a name printed "(null)" */
_Static_assert(WSD_WAIT_BELL_ERRNO + 1 == WSD_STAT_WAIT_N, "wait_keys names each wait value");
#define HDR_LEN offsetof(struct wsd_stat_file, slots)

static const char *const path_names[] = {
	[PATH_TCP] = "tcp",
	[PATH_SHM] = "shm",
	[PATH_VERBS] = "verbs",
};

static const char *const way_names[] = {
	[WAY_NONE] = "-", [WAY_MAP] = "map", [WAY_VM] = "vm", [WAY_COPY] = "copy",
	[WAY_RDMA] = "rdma",
};


/* the counters in column order: table heading, JSON key, offset in the slot */
static const struct {
	const char *head, *key;
	size_t off;
} ctrs[NCTRS] = {
	{ "TCP-TX", "tcp_tx", offsetof(struct wsd_stat_slot, tcp_tx) },
	{ "TCP-RX", "tcp_rx", offsetof(struct wsd_stat_slot, tcp_rx) },
	{ "COPY-TX", "copy_tx", offsetof(struct wsd_stat_slot, copy_tx) },
	{ "COPY-RX", "copy_rx", offsetof(struct wsd_stat_slot, copy_rx) },
	{ "ZCOPY-TX", "zcopy_tx", offsetof(struct wsd_stat_slot, zcopy_tx) },
	{ "ZCOPY-RX", "zcopy_rx", offsetof(struct wsd_stat_slot, zcopy_rx) },
	{ "BELLS-TX", "doorbells_tx", offsetof(struct wsd_stat_slot, doorbells_tx) },
	{ "BELLS-RX", "doorbells_rx", offsetof(struct wsd_stat_slot, doorbells_rx) },
	{ "WAITS", "waits", offsetof(struct wsd_stat_slot, waits) },
	{ "FALLBACKS", "fallbacks", offsetof(struct wsd_stat_slot, fallbacks) },
	{ "CHAN", "channel", offsetof(struct wsd_stat_slot, channel) },
	{ "PEER-PID", "peer_pid", offsetof(struct wsd_stat_slot, peer_pid) },
};

/* A reason's name, or reason-N for one a newer switch knows (static buffer). */
static const char *reason_text(unsigned r)
{
	static char buf[24];

	if (r < R_NREASONS)
		return wsd_reason_name(r);
	snprintf(buf, sizeof(buf), "reason-%u", r);
	return buf;
}


/* ---- reading a file ----------------------------------------------------------- */

static void addr_text(const struct wsd_stat_addr *a, char *buf, size_t len)
{
	char ip[INET6_ADDRSTRLEN];

	if (a->family == AF_INET && inet_ntop(AF_INET, a->addr, ip, sizeof(ip)))
		snprintf(buf, len, "%s:%u", ip, a->port);
	else if (a->family == AF_INET6 && inet_ntop(AF_INET6, a->addr, ip, sizeof(ip)))
		snprintf(buf, len, "[%s]:%u", ip, a->port);
	else
		buf[0] = '\0';   /* not known (yet), or not an address we show */
}

/*
 * The state at the socket's last sleep: one sleep's values when its time
 * reads the same before and after the copy (switch/stat.h), else none.
 */
static void wait_read(const struct wsd_stat_slot *src, struct row *r)
{
	struct timespec ts;

	for (int tries = 0; tries < 100; tries++) {
		uint64_t at = atomic_load_explicit(&src->wait[WSD_WAIT_AT], memory_order_acquire);

		if (!at)
			break;
		for (int i = 1; i < WSD_STAT_WAIT_N; i++)
			r->wait[i] = atomic_load_explicit(&src->wait[i], memory_order_relaxed);
		atomic_thread_fence(memory_order_acquire);
		if (atomic_load_explicit(&src->wait[WSD_WAIT_AT], memory_order_relaxed) == at) {
			r->wait[WSD_WAIT_AT] = at;
			clock_gettime(CLOCK_MONOTONIC, &ts);
			r->wait_age_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 -
					 (int64_t)at;
			return;
		}
	}
	r->wait[WSD_WAIT_AT] = 0;
}

/*
 * Copy slot src by the seqlock rule (switch/stat.h): the descriptive fields
 * count only when gen was even and the same before and after.  The counters
 * are outside the seqlock (each one atomic), so they are read one by one.
 * False when the slot kept changing or is free.
 */
static bool slot_read(const struct wsd_stat_slot *src, uint32_t idx, struct row *r)
{
	struct wsd_stat_slot s;

	for (int tries = 0;; tries++) {
		uint32_t g1, g2;

		if (tries == 100)
			return false;
		if (tries >= 3)
			sched_yield();   /* a writer was preempted between begin and end */
		g1 = atomic_load_explicit(&src->gen, memory_order_acquire);
		if (g1 & 1)
			continue;
		memcpy(&s, (const void *)src, offsetof(struct wsd_stat_slot, tcp_tx));
		atomic_thread_fence(memory_order_acquire);
		g2 = atomic_load_explicit(&src->gen, memory_order_relaxed);
		if (g1 == g2)
			break;
	}
	/* a closed socket whose end is still settling: its number is another's now */
	if (!s.used || s.fd < 0)
		return false;
	r->idx = idx;
	r->fd = s.fd;
	r->listening = s.listening;
	addr_text(&s.local, r->local, sizeof(r->local));
	addr_text(&s.peer, r->peer, sizeof(r->peer));
	if (s.path < ARRAY_SIZE(path_names))
		snprintf(r->path, sizeof(r->path), "%s", path_names[s.path]);
	else
		snprintf(r->path, sizeof(r->path), "path-%u", s.path);
	snprintf(r->reason, sizeof(r->reason), "%s", reason_text(s.reason));
	snprintf(r->way, sizeof(r->way), "%s", s.way < ARRAY_SIZE(way_names) ? way_names[s.way] : "?");
	for (int c = 0; c < NCTRS; c++)
		r->ctr[c] = atomic_load_explicit(
			(const _Atomic uint64_t *)((const char *)src + ctrs[c].off),
			memory_order_relaxed);
	for (int k = 0; k < 2; k++)
		r->mem_ino[k] = atomic_load_explicit(&src->mem_ino[k], memory_order_relaxed);
	wait_read(src, r);
	return true;
}

/*
 * Whether process pid has the file (dev, ino) mapped.  A process maps its
 * file for as long as its image lives, so a live pid that does not map it
 * has exec'd since (or is another process that got the pid).  True when
 * we cannot tell (another user's process, /proc hidden): then trust the pid.
 */
static bool mapped_by(int pid, dev_t dev, ino_t ino)
{
	char name[64], *line = NULL;
	size_t cap = 0;
	bool found = false;
	FILE *f;

	snprintf(name, sizeof(name), "/proc/%d/maps", pid);
	f = fopen(name, "re");
	if (!f)
		return true;
	while (!found && getline(&line, &cap, f) > 0) {
		unsigned int maj, min;
		unsigned long long inode;

		/* start-end perms offset major:minor inode path */
		if (sscanf(line, "%*s %*s %*s %x:%x %llu", &maj, &min, &inode) == 3)
			found = inode == (unsigned long long)ino && makedev(maj, min) == dev;
	}
	if (ferror(f))
		found = true;
	free(line);
	fclose(f);
	return found;
}

/* The effective uid of process pid (/proc/PID/status), or -1 when unknown. */
static long proc_euid(int pid)
{
	char name[64], *line = NULL;
	size_t cap = 0;
	long uid = -1;
	FILE *f;

	snprintf(name, sizeof(name), "/proc/%d/status", pid);
	f = fopen(name, "re");
	if (!f)
		return -1;
	while (getline(&line, &cap, f) > 0)
		if (sscanf(line, "Uid: %*d %ld", &uid) == 1)
			break;
	free(line);
	fclose(f);
	return uid;
}

/* Remove a file found stale, unless it was replaced since we looked. */
static void remove_stale(int dirfd, const char *name, const struct stat *seen)
{
	struct stat now;

	if (fstatat(dirfd, name, &now, AT_SYMLINK_NOFOLLOW) == 0 &&
	    now.st_dev == seen->st_dev && now.st_ino == seen->st_ino)
		unlinkat(dirfd, name, 0);   /* if we may: another user's stays */
}

/*
 * Read one process's file into p.  1: read; 0: nothing to show (stale,
 * being made, not ours to understand); -errno: could not read it.
 */
static int proc_read(int dirfd, const char *name, int pid, struct proc *p)
{
	const struct wsd_stat_file *f;
	struct stat st;
	uint32_t n, hw;
	void *map;
	int fd, ret = 0;

	long uid;

	if (kill(pid, 0) < 0 && errno == ESRCH) {
		/* died without its destructor (a signal, _exit) */
		unlinkat(dirfd, name, 0);
		return 0;
	}
	fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	/* ENOENT: it exited meanwhile; ELOOP: a link someone put under its name */
	if (fd < 0)
		return errno == ENOENT || errno == ELOOP ? 0 : -errno;
	/* smaller than a header: a process is making it right now */
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (size_t)st.st_size < HDR_LEN) {
		close(fd);
		return 0;
	}
	/*
	 * Anyone may put a file under any name here: one not made by the
	 * process's own user (its effective uid, which made it) is not its.
	 */
	if ((uid = proc_euid(pid)) >= 0 && (uid_t)uid != st.st_uid) {
		close(fd);
		return 0;
	}
	map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (map == MAP_FAILED)
		return -errno;
	f = map;
	/*
	 * The magic is written last: without it the file is being made, or
	 * by a wsd of another version.  Either way its process is alive and
	 * the file is not ours to remove.
	 */
	if (f->magic != WSD_STAT_MAGIC)
		goto out;
	atomic_thread_fence(memory_order_acquire);
	if (f->version != WSD_STAT_VERSION || f->pid != pid)
		goto out;
	/* the magic first, then the maps: the magic says the mapping was made */
	if (!mapped_by(pid, st.st_dev, st.st_ino)) {
		remove_stale(dirfd, name, &st);
		goto out;
	}
	n = f->nslots;
	if (n > ((size_t)st.st_size - HDR_LEN) / sizeof(struct wsd_stat_slot))
		n = (uint32_t)(((size_t)st.st_size - HDR_LEN) / sizeof(struct wsd_stat_slot));
	hw = atomic_load_explicit(&f->hiwater, memory_order_acquire);
	if (hw > n)
		hw = n;
	p->pid = pid;
	memcpy(p->comm, f->comm, sizeof(f->comm));
	p->comm[sizeof(f->comm)] = '\0';
	snprintf(p->file, sizeof(p->file), "%s", name);
	p->stat_taken = f->stat_taken_uid ? (long)f->stat_taken_uid - 1 : -1;
	p->reg_taken = f->reg_taken_uid ? (long)f->reg_taken_uid - 1 : -1;
	p->reg_port = f->reg_taken_port;
	for (unsigned r = 0; r < WSD_STAT_REASONS; r++)
		p->refused[r] = atomic_load_explicit(&f->refused[r], memory_order_relaxed);
	p->rows = calloc(hw ? hw : 1, sizeof(*p->rows));
	if (!p->rows) {
		ret = -ENOMEM;
		goto out;
	}
	p->nrows = 0;
	for (uint32_t i = 0; i < hw; i++) {
		if (slot_read(&f->slots[i], i, &p->rows[p->nrows]))
			p->nrows++;
	}
	ret = 1;
out:
	munmap(map, (size_t)st.st_size);
	return ret;
}

static int row_cmp(const void *a, const void *b)
{
	const struct row *x = a, *y = b;

	if (x->fd != y->fd)
		return x->fd < y->fd ? -1 : 1;
	return x->idx < y->idx ? -1 : x->idx > y->idx;
}

static int proc_cmp(const void *a, const void *b)
{
	const struct proc *x = a, *y = b;

	return x->pid < y->pid ? -1 : x->pid > y->pid;
}

/* ---- output --------------------------------------------------------------- */

/* Length of the UTF-8 character at p, or 0 when the bytes there are not one. */
static int utf8_len(const unsigned char *p)
{
	unsigned char c = *p;
	int len = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 :
		  (c & 0xf8) == 0xf0 ? 4 : 0;
	uint32_t cp = len == 2 ? c & 0x1fu : len == 3 ? c & 0x0fu : c & 0x07u;

	for (int i = 1; i < len; i++) {
		if ((p[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (p[i] & 0x3fu);
	}
	/* overlong forms, surrogates and past U+10FFFF are not UTF-8 either */
	if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
	    (len > 1 && cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)
		return 0;
	return len;
}

/*
 * s as a JSON string: quotes, backslashes and control characters escaped,
 * and bytes that are not UTF-8 (a name cut at 15 bytes may end inside a
 * character) replaced by U+FFFD, so that the document stays valid.
 */
static void json_str(const char *s)
{
	const unsigned char *p = (const unsigned char *)s;

	putchar('"');
	while (*p) {
		int len = utf8_len(p);

		if (!len) {
			fputs("\\ufffd", stdout);
			p++;
		} else if (len > 1) {
			fwrite(p, 1, (size_t)len, stdout);
			p += len;
		} else {
			if (*p == '"' || *p == '\\')
				printf("\\%c", *p);
			else if (*p < 0x20 || *p == 0x7f)
				printf("\\u%04x", *p);
			else
				putchar(*p);
			p++;
		}
	}
	putchar('"');
}

static void print_json(const struct proc *procs, size_t nprocs)
{
	printf("{\"processes\":[");
	for (size_t i = 0; i < nprocs; i++) {
		const struct proc *p = &procs[i];

		printf("%s\n {\"pid\":%d,\"comm\":", i ? "," : "", p->pid);
		json_str(p->comm);
		printf(",\"file\":");
		json_str(p->file);
		if (p->stat_taken >= 0)
			printf(",\"file_name_taken_by\":%ld", p->stat_taken);
		if (p->reg_taken >= 0)
			printf(",\"registry_name_taken\":{\"port\":%u,\"by\":%ld}", p->reg_port,
			       p->reg_taken);
		printf(",\"refused\":{");
		for (unsigned r = 0, n = 0; r < WSD_STAT_REASONS; r++)
			if (p->refused[r]) {
				printf("%s", n++ ? "," : "");
				json_str(reason_text(r));
				printf(":%" PRIu64, p->refused[r]);
			}
		printf("},\"sockets\":[");
		for (size_t j = 0; j < p->nrows; j++) {
			const struct row *r = &p->rows[j];

			printf("%s\n  {\"fd\":%" PRId32 ",\"local\":", j ? "," : "", r->fd);
			if (r->local[0])
				json_str(r->local);
			else
				fputs("null", stdout);
			fputs(",\"peer\":", stdout);
			if (r->peer[0])
				json_str(r->peer);
			else
				fputs("null", stdout);
			printf(",\"listening\":%s,\"path\":", r->listening ? "true" : "false");
			json_str(r->path);
			fputs(",\"reason\":", stdout);
			json_str(r->reason);
			fputs(",\"way\":", stdout);
			json_str(r->way);
			for (int c = 0; c < NCTRS; c++)
				printf(",\"%s\":%" PRIu64, ctrs[c].key, r->ctr[c]);
			if (r->wait[WSD_WAIT_AT]) {
				printf(",\"last_wait\":{\"age_ms\":%" PRId64, r->wait_age_ms);
				for (int w = 1; w < WSD_STAT_WAIT_N; w++)
					printf(",\"%s\":%" PRIu64, wait_keys[w], r->wait[w]);
				putchar('}');
			}
			putchar('}');
		}
		printf("]");
		stat_channels_json(p);
		printf("}");
	}
	printf("%s]}\n", nprocs ? "\n" : "");
}

/* A name fit for one table cell: control characters and broken UTF-8 as '?'. */
void comm_text(const char *comm, char *buf, size_t len)
{
	const unsigned char *p = (const unsigned char *)comm;
	size_t o = 0;

	while (*p && o + 5 < len) {
		int n = utf8_len(p);

		if (n > 1) {
			memcpy(buf + o, p, (size_t)n);
			o += (size_t)n;
			p += n;
		} else {
			buf[o++] = !n || *p < 0x20 || *p == 0x7f ? '?' : (char)*p;
			p++;
		}
	}
	buf[o] = '\0';
}

/* Columns as wide as the terminal shows them: UTF-8 continuation bytes take no room. */
static int text_width(const char *s)
{
	int w = 0;

	for (; *s; s++)
		w += ((unsigned char)*s & 0xc0) != 0x80;
	return w;
}

enum { COL_PID, COL_COMM, COL_FD, COL_LOCAL, COL_PEER, COL_PATH, COL_REASON, COL_CTR0,
       COL_WAY = COL_CTR0 + NCTRS, NCOLS };

static const char *const heads[COL_CTR0] = {
	"PID", "COMM", "FD", "LOCAL", "PEER", "PATH", "REASON"
};

/* The cells of one row (or of the heading, for r == NULL). */
static void cells(const struct proc *p, const struct row *r, char cell[NCOLS][64])
{
	for (int c = 0; c < NCOLS; c++) {
		if (!r) {
			const char *h = c < COL_CTR0 ? heads[c] : c == COL_WAY ? "WAY" :
					ctrs[c - COL_CTR0].head;

			snprintf(cell[c], 64, "%s", h);
			continue;
		}
		switch (c) {
		case COL_PID:
			snprintf(cell[c], 64, "%d", p->pid);
			break;
		case COL_COMM:
			comm_text(p->comm, cell[c], 64);
			break;
		case COL_FD:
			snprintf(cell[c], 64, "%" PRId32, r->fd);
			break;
		case COL_LOCAL:
			snprintf(cell[c], 64, "%s", r->local[0] ? r->local : "-");
			break;
		case COL_PEER:
			snprintf(cell[c], 64, "%s", r->peer[0] ? r->peer : "-");
			break;
		case COL_PATH:
			snprintf(cell[c], 64, "%s", r->path);
			break;
		case COL_REASON:
			snprintf(cell[c], 64, "%s", r->reason);
			break;
		case COL_WAY:
			snprintf(cell[c], 64, "%s", r->way);
			break;
		default:
			snprintf(cell[c], 64, "%" PRIu64, r->ctr[c - COL_CTR0]);
			break;
		}
	}
}

/* Numbers to the right, words to the left, the last column unpadded. */
static void print_cells(char cell[NCOLS][64], const int width[NCOLS])
{
	for (int c = 0; c < NCOLS; c++) {
		bool right = c == COL_PID || c == COL_FD || (c >= COL_CTR0 && c != COL_WAY);
		int pad = width[c] - text_width(cell[c]);

		if (c)
			putchar(' ');
		if (right)
			printf("%*s", pad, "");
		fputs(cell[c], stdout);
		if (!right && c + 1 < NCOLS)
			printf("%*s", pad, "");
	}
	putchar('\n');
}

/*
 * After the table, only when a registry turned requests down: a line per
 * such process, "PID COMM refused: REASON N, ...".
 */
static void print_refused(const struct proc *procs, size_t nprocs)
{
	bool head = false;

	for (size_t i = 0; i < nprocs; i++) {
		unsigned n = 0;

		for (unsigned r = 0; r < WSD_STAT_REASONS; r++) {
			if (!procs[i].refused[r])
				continue;
			if (!head)
				printf("\nupgrade requests turned down by each process's registry:\n");
			head = true;
			if (!n++)
				printf("%d %s refused:", procs[i].pid, procs[i].comm);
			printf("%s %s %" PRIu64, n > 1 ? "," : "", reason_text(r), procs[i].refused[r]);
		}
		if (n)
			putchar('\n');
	}
}

/* After the table, only when another user held one of a process's names. */
static void print_taken(const struct proc *procs, size_t nprocs)
{
	bool head = false;

	for (size_t i = 0; i < nprocs; i++) {
		const struct proc *p = &procs[i];

		if (p->stat_taken < 0 && p->reg_taken < 0)
			continue;
		if (!head)
			printf("\nnames another user held first:\n");
		head = true;
		if (p->stat_taken >= 0)
			printf("%d %s: %s%d was uid %ld's; statistics in %s/%s\n", p->pid, p->comm,
			       WSD_STAT_PREFIX, p->pid, p->stat_taken, WSD_STAT_DIR, p->file);
		if (p->reg_taken >= 0)
			printf("%d %s: the registry name of port %u was uid %ld's; it listens "
			       "under an alternate name\n", p->pid, p->comm, p->reg_port,
			       p->reg_taken);
	}
}

static void print_table(const struct proc *procs, size_t nprocs)
{
	char cell[NCOLS][64];
	int width[NCOLS];

	cells(NULL, NULL, cell);
	for (int c = 0; c < NCOLS; c++)
		width[c] = text_width(cell[c]);
	for (size_t i = 0; i < nprocs; i++) {
		for (size_t j = 0; j < procs[i].nrows; j++) {
			cells(&procs[i], &procs[i].rows[j], cell);
			for (int c = 0; c < NCOLS; c++) {
				int w = text_width(cell[c]);

				if (w > width[c])
					width[c] = w;
			}
		}
	}
	cells(NULL, NULL, cell);
	print_cells(cell, width);
	for (size_t i = 0; i < nprocs; i++) {
		for (size_t j = 0; j < procs[i].nrows; j++) {
			cells(&procs[i], &procs[i].rows[j], cell);
			print_cells(cell, width);
		}
	}
	print_refused(procs, nprocs);
	print_taken(procs, nprocs);
}

/* A direction's mode (switch.h, DIR_*) as wsd-protocol(7) names it. */
static const char *mode_text(uint64_t m)
{
	static const char *const names[] = { "TCP", "DRAIN", "RING", "PROOF", "PROV" };

	return m < ARRAY_SIZE(names) ? names[m] : "?";
}

/*
 * --waits: each socket's state when a thread last went to sleep on it, the
 * ring protocol's words on both sides (wsd-protocol(7), Sleeping and
 * waking).  Of a stall, both ends' show who waits for what.
 */
static void print_waits(const struct proc *procs, size_t nprocs)
{
	static const char *const what[] = { "?", "data", "room", "a zero-copy completion" };

	for (size_t i = 0; i < nprocs; i++) {
		const struct proc *p = &procs[i];
		char comm[64];

		comm_text(p->comm, comm, sizeof(comm));
		for (size_t j = 0; j < p->nrows; j++) {
			const uint64_t *w = p->rows[j].wait;

			if (!w[WSD_WAIT_AT])
				continue;
			printf("%d %s fd %" PRId32 ": slept %" PRId64 " ms ago for %s, "
			       "tx %s rx %s, %" PRIu64 " asleep\n",
			       p->pid, comm, p->rows[j].fd, p->rows[j].wait_age_ms,
			       what[w[WSD_WAIT_WHAT] < 4 ? w[WSD_WAIT_WHAT] : 0],
			       mode_text(w[WSD_WAIT_MODES] >> 8), mode_text(w[WSD_WAIT_MODES] & 0xff),
			       w[WSD_WAIT_SLEEPERS]);
			printf("  send: pos %" PRIu64 " consumed %" PRIu64 " zc %" PRIu64 "/%"
			       PRIu64 " space_arm %" PRIu64 "; peer's data_arm %" PRIu64
			       " rung %" PRIu64 "\n",
			       w[WSD_WAIT_TX_POS], w[WSD_WAIT_CONSUMED], w[WSD_WAIT_ZC_DONE],
			       w[WSD_WAIT_ZC_SENT], w[WSD_WAIT_SPACE_GEN], w[WSD_WAIT_PEER_DATA_ARM],
			       w[WSD_WAIT_RUNG_DATA]);
			printf("  receive: pos %" PRIu64 " reported %" PRIu64 " data_arm %" PRIu64
			       "; peer's space_arm %" PRIu64 " rung %" PRIu64 "\n",
			       w[WSD_WAIT_RX_POS], w[WSD_WAIT_RX_REPORTED], w[WSD_WAIT_DATA_GEN],
			       w[WSD_WAIT_PEER_SPACE_ARM], w[WSD_WAIT_RUNG_SPACE]);
			printf("  doorbells: sent %" PRIu64 " read %" PRIu64 " announced %" PRIu64
			       " (%" PRIu64 " at the last arm); unsent %" PRIu64 " (errno %" PRIu64
			       "); peer's closed %" PRIu64 "\n",
			       w[WSD_WAIT_BELLS_TX], w[WSD_WAIT_BELLS_RX], w[WSD_WAIT_BELLS_ANN],
			       w[WSD_WAIT_ARM_BELLS], w[WSD_WAIT_BELLS_UNSENT], w[WSD_WAIT_BELL_ERRNO],
			       w[WSD_WAIT_CLOSED]);
		}
	}
}

/* ---- the command ----------------------------------------------------------- */

static int usage(void)
{
	fprintf(stderr, "usage: wsd stat [--json | --channels | --waits] [PID...]\n");
	return 2;
}

/*
 * "wsd-stat.<digits>", or "wsd-stat.<digits>.<16 hex digits>" (the name a
 * process takes when another user holds the first) -> pid, else 0
 */
static int name_pid(const char *name)
{
	const char *d = name + strlen(WSD_STAT_PREFIX);
	char *end;
	long v;

	if (strncmp(name, WSD_STAT_PREFIX, strlen(WSD_STAT_PREFIX)) || *d < '1' || *d > '9')
		return 0;
	errno = 0;
	v = strtol(d, &end, 10);
	if (errno || v > INT32_MAX)
		return 0;
	if (*end == '.' && strlen(end + 1) == 16 && strspn(end + 1, "0123456789abcdef") == 16)
		end += 17;
	return *end ? 0 : (int)v;
}

/* The processes with statistics (only those in want[], when nwant); 0 or 1 */
static int scan(const int *want, int nwant, bool *seen, struct proc **procsp, size_t *np)
{
	struct proc *procs = NULL;
	size_t nprocs = 0, cap = 0;
	int status = 0, unreadable = 0;
	struct dirent *de;
	DIR *dir;

	dir = opendir(WSD_STAT_DIR);
	if (!dir && errno != ENOENT) {
		fprintf(stderr, "wsd stat: %s: %s\n", WSD_STAT_DIR, strerror(errno));
		return 1;
	}
	while (dir && (de = readdir(dir))) {
		int pid = name_pid(de->d_name), k, r;

		if (!pid)
			continue;
		for (k = 0; k < nwant && want[k] != pid; k++)
			;
		if (nwant && k == nwant)
			continue;
		if (nprocs == cap) {
			struct proc *more = realloc(procs, (cap ? cap * 2 : 16) * sizeof(*procs));

			if (!more) {
				fprintf(stderr, "wsd stat: out of memory\n");
				status = 1;
				break;
			}
			procs = more;
			cap = cap ? cap * 2 : 16;
		}
		memset(&procs[nprocs], 0, sizeof(procs[nprocs]));
		r = proc_read(dirfd(dir), de->d_name, pid, &procs[nprocs]);
		if (r == -EACCES && !nwant) {
			unreadable++;   /* counted, not listed: there may be many */
			continue;
		}
		if (r < 0) {
			fprintf(stderr, "wsd stat: pid %d: %s\n", pid, strerror(-r));
			status = 1;
		}
		for (k = 0; k < nwant; k++)
			seen[k] |= want[k] == pid && r != 0;
		if (r > 0) {
			qsort(procs[nprocs].rows, procs[nprocs].nrows, sizeof(struct row), row_cmp);
			nprocs++;
		}
	}
	if (dir)
		closedir(dir);
	if (nprocs)   /* procs may be NULL, which qsort may not be given */
		qsort(procs, nprocs, sizeof(*procs), proc_cmp);
	if (unreadable)
		fprintf(stderr, "wsd stat: %d process%s not readable (another user's)\n",
			unreadable, unreadable > 1 ? "es" : "");
	*procsp = procs;
	*np = nprocs;
	return status;
}

int cmd_stat(int argc, char **argv)
{
	struct proc *procs = NULL;
	size_t nprocs = 0;
	int *want = NULL, nwant = 0, status, i, k;
	bool json = false, chans = false, waits = false, *seen = NULL;

	for (i = 1; i < argc && argv[i][0] == '-'; i++) {
		if (!strcmp(argv[i], "--json")) {
			json = true;
		} else if (!strcmp(argv[i], "--channels")) {
			chans = true;
		} else if (!strcmp(argv[i], "--waits")) {
			waits = true;
		} else if (!strcmp(argv[i], "--")) {
			i++;
			break;
		} else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			printf("usage: wsd stat [--json | --channels | --waits] [PID...]\n");
			return 0;
		} else {
			return usage();
		}
	}
	for (k = i; k < argc; k++) {
		char *end;
		long v;

		errno = 0;
		v = strtol(argv[k], &end, 10);
		if (!*argv[k] || *end || errno || v <= 0 || v > INT32_MAX) {
			fprintf(stderr, "wsd stat: '%s' is not a process id\n", argv[k]);
			return usage();
		}
	}
	if (i < argc) {
		want = calloc((size_t)(argc - i), sizeof(*want));
		seen = calloc((size_t)(argc - i), sizeof(*seen));
		if (!want || !seen) {
			free(want);
			free(seen);
			fprintf(stderr, "wsd stat: out of memory\n");
			return 1;
		}
		for (; i < argc; i++)
			want[nwant++] = (int)strtol(argv[i], NULL, 10);
	}

	if (json + chans + waits > 1)
		return usage();
	status = scan(want, nwant, seen, &procs, &nprocs);
	for (size_t j = 0; j < nprocs; j++)
		if (stat_channels(&procs[j])) {
			fprintf(stderr, "wsd stat: out of memory\n");
			status = 1;
		}
	if (json)
		print_json(procs, nprocs);
	else if (chans)
		stat_channels_table(procs, nprocs);
	else if (waits)
		print_waits(procs, nprocs);
	else
		print_table(procs, nprocs);
	for (k = 0; k < nwant; k++) {
		if (!seen[k]) {
			fprintf(stderr, "wsd stat: pid %d: no statistics (not running wsd, or no "
					"socket yet)\n", want[k]);
			status = 1;
		}
	}
	for (size_t j = 0; j < nprocs; j++) {
		free(procs[j].rows);
		free(procs[j].chans);
	}
	free(procs);
	free(want);
	free(seen);
	if (fflush(stdout) || ferror(stdout)) {
		fprintf(stderr, "wsd stat: writing the output: %s\n", strerror(errno));
		return 1;
	}
	return status;
}

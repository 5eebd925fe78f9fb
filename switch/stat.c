/* SPDX-License-Identifier: MIT */
/*
 * The statistics file `wsd stat` reads (layout and rules in switch/stat.h).
 *
 * Made on the first socket, not at load: most programs run under wsd never
 * open one, and they should leave nothing in /dev/shm.  Nothing here may
 * fail the application: when the file cannot be made or is full, a socket
 * gets a slot of its own on the heap and is simply not shown (its tuple
 * lives in its slot, and the upgrade matches connections by it: slots are
 * never shared).  Only when even that allocation fails do sockets share
 * the dummy, and such a socket never upgrades (wsd_stat_shown).
 *
 * The file's descriptor is closed as soon as it is mapped, so the program
 * never sees an fd it did not open; growing the reservation reopens the
 * file by name (reserve()).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "provider/internal.h"
#include "switch/stat.h"
#include "switch/switch.h"

#define HDR_LEN   offsetof(struct wsd_stat_file, slots)
#define TABLE_LEN (HDR_LEN + (size_t)WSD_STAT_SLOTS * sizeof(struct wsd_stat_slot))
/*
 * Backing is reserved this much at a time.  A page of a tmpfs file that has
 * never been written is allocated on the first write through the mapping;
 * if /dev/shm is full then, the writer gets SIGBUS.  So pages are
 * allocated ahead with fallocate(), where a failure is an error code, and
 * in chunks, so a process with a few sockets costs a few pages, not the
 * whole table.
 */
#define RESERVE_CHUNK ((size_t)64 << 10)

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
/* All below under lock, except owner (read by the destructor). */
static struct wsd_stat_file *table;   /* NULL: not made (yet) */
static bool table_failed;             /* do not try again in this process */
static char path[64];
static dev_t table_dev;               /* to recognise our file when reopening it */
static ino_t table_ino;
static size_t reserved;               /* bytes [0, reserved) have backing */
static uint32_t next_new;             /* slots never used start here (= hiwater) */
static uint32_t free_idx[WSD_STAT_SLOTS], nfree;   /* freed slots, reused first */
static _Atomic pid_t owner;           /* the process that made the file */

/* Sockets left without any slot share this; nobody reads it. */
static struct wsd_stat_slot dummy;

/* used, for a slot on the heap (not in the table) */
#define USED_HEAP 2

static size_t slot_end(uint32_t i)
{
	return HDR_LEN + ((size_t)i + 1) * sizeof(struct wsd_stat_slot);
}

/* Back [0, upto) of the file open on fd. */
static bool reserve_fd(int fd, size_t upto)
{
	size_t want = (upto + RESERVE_CHUNK - 1) / RESERVE_CHUNK * RESERVE_CHUNK;

	if (want > TABLE_LEN)
		want = TABLE_LEN;
	if (want <= reserved)
		return true;
	if (fallocate(fd, 0, (off_t)reserved, (off_t)(want - reserved)) < 0) {
		if (errno != EOPNOTSUPP && errno != ENOSYS)
			return false;
		/* a file system that cannot reserve: pages come as they are written */
		want = TABLE_LEN;
	}
	reserved = want;
	return true;
}

/* Back [0, upto) of our file, reopened by name (we keep no fd). */
static bool reserve(size_t upto)
{
	struct stat st;
	bool ok;
	int fd;

	if (upto <= reserved)
		return true;
	fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return false;
	/* someone may have removed ours and put another file there */
	ok = fstat(fd, &st) == 0 && st.st_dev == table_dev && st.st_ino == table_ino &&
	     reserve_fd(fd, upto);
	close(fd);
	return ok;
}

/* The name of the process, as ps shows it (not the calling thread's). */
static void read_comm(char comm[16])
{
	ssize_t n = -1;
	int fd = open("/proc/self/comm", O_RDONLY | O_CLOEXEC);

	memset(comm, 0, 16);
	if (fd >= 0) {
		/* pread: read() is one of the switch's interposed calls */
		n = pread(fd, comm, 15, 0);
		close(fd);
	}
	if (n <= 0) {
		prctl(PR_GET_NAME, comm);   /* no /proc: the thread's name will do */
		comm[15] = '\0';
		return;
	}
	comm[strcspn(comm, "\n")] = '\0';
}

/*
 * The files of our own user's processes that died without their
 * destructor (killed): removed when we make ours, a bounded number, so
 * that /dev/shm does not fill with them between runs of wsd stat.
 */
#define SWEEP_MAX 64

static void sweep_dead(void)
{
	size_t plen = strlen(WSD_STAT_PREFIX);
	DIR *d = opendir(WSD_STAT_DIR);
	struct dirent *de;
	int removed = 0;

	if (!d)
		return;
	while (removed < SWEEP_MAX && (de = readdir(d))) {
		struct stat st;
		char *end;
		long pid;

		if (strncmp(de->d_name, WSD_STAT_PREFIX, plen))
			continue;
		pid = strtol(de->d_name + plen, &end, 10);
		if (pid <= 0 || (*end && *end != '.') || pid == wsd_pid() ||
		    fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) ||
		    !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
		    kill((pid_t)pid, 0) == 0 || errno != ESRCH)
			continue;
		if (unlinkat(dirfd(d), de->d_name, 0) == 0)
			removed++;
	}
	closedir(d);
}

/*
 * Our file, made new under path: wsd-stat.PID, or, when another user
 * holds that name (a file planted ahead, or left by a dead process of
 * that user that had our pid), wsd-stat.PID.RANDOM, and the holder noted
 * in *taken (uid + 1).  A stale file of our own user under our pid is
 * replaced.  The descriptor, or -errno.
 */
static int table_open(pid_t pid, uint32_t *taken)
{
	struct stat st;
	int fd;

	*taken = 0;
	snprintf(path, sizeof(path), "%s/%s%d", WSD_STAT_DIR, WSD_STAT_PREFIX, (int)pid);
	fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd >= 0 || errno != EEXIST)
		return fd >= 0 ? fd : -errno;
	if (lstat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid()) {
		/*
		 * Ours, and nobody writes it any more: left by an earlier
		 * process of our user with this pid that died without its
		 * destructor, or by this process's image before an exec.
		 */
		if (unlink(path) == 0 || errno == ENOENT) {
			fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
			if (fd >= 0 || errno != EEXIST)
				return fd >= 0 ? fd : -errno;
		}
	}
	if (lstat(path, &st) == 0)
		*taken = (uint32_t)st.st_uid + 1;
	else
		*taken = UINT32_MAX;   /* gone meanwhile, or unreadable: someone's */
	for (int tries = 0; tries < 4; tries++) {
		uint64_t r;

		if (getrandom(&r, sizeof(r), 0) != sizeof(r))
			return -EIO;
		snprintf(path, sizeof(path), "%s/%s%d.%016llx", WSD_STAT_DIR, WSD_STAT_PREFIX,
			 (int)pid, (unsigned long long)r);
		fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
		if (fd >= 0 || errno != EEXIST)
			return fd >= 0 ? fd : -errno;
	}
	return -EEXIST;
}

/* Make, size and map the file, and fill its header.  Under lock. */
static int table_create(void)
{
	struct wsd_stat_file *f;
	pid_t pid = wsd_pid();
	uint32_t taken;
	struct stat st;
	int fd, err;

	static bool swept;   /* once per image: its fork children need not */

	if (!swept) {
		swept = true;
		sweep_dead();
	}
	fd = table_open(pid, &taken);
	if (fd < 0)
		return fd;

	reserved = 0;
	if (fstat(fd, &st) < 0 || ftruncate(fd, (off_t)TABLE_LEN) < 0 ||
	    !reserve_fd(fd, slot_end(0)))
		goto fail;
	f = mmap(NULL, TABLE_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (f == MAP_FAILED)
		goto fail;
	close(fd);
	table_dev = st.st_dev;
	table_ino = st.st_ino;

	f->version = WSD_STAT_VERSION;
	f->pid = pid;
	f->nslots = WSD_STAT_SLOTS;
	f->stat_taken_uid = taken;
	read_comm(f->comm);
	atomic_store_explicit(&f->hiwater, 0, memory_order_relaxed);
	/* magic last: a reader that sees it sees the rest (and our mapping exists) */
	atomic_thread_fence(memory_order_release);
	f->magic = WSD_STAT_MAGIC;

	table = f;
	next_new = 0;
	nfree = 0;
	atomic_store_explicit(&owner, pid, memory_order_release);
	return 0;
fail:
	err = errno;
	close(fd);
	unlink(path);
	return -err;
}

/* Clear a slot's fields and counters (inside begin/end). */
static void slot_reset(struct wsd_stat_slot *s, uint32_t used)
{
	s->used = used;
	s->fd = -1;
	s->path = PATH_TCP;
	s->reason = used ? R_PENDING : R_NONE;
	s->listening = 0;
	s->way = WAY_NONE;
	memset(&s->local, 0, sizeof(s->local));
	memset(&s->peer, 0, sizeof(s->peer));
	atomic_store_explicit(&s->tcp_tx, 0, memory_order_relaxed);
	atomic_store_explicit(&s->tcp_rx, 0, memory_order_relaxed);
	atomic_store_explicit(&s->copy_tx, 0, memory_order_relaxed);
	atomic_store_explicit(&s->copy_rx, 0, memory_order_relaxed);
	atomic_store_explicit(&s->zcopy_tx, 0, memory_order_relaxed);
	atomic_store_explicit(&s->zcopy_rx, 0, memory_order_relaxed);
	atomic_store_explicit(&s->doorbells_tx, 0, memory_order_relaxed);
	atomic_store_explicit(&s->doorbells_rx, 0, memory_order_relaxed);
	atomic_store_explicit(&s->waits, 0, memory_order_relaxed);
	atomic_store_explicit(&s->fallbacks, 0, memory_order_relaxed);
	atomic_store_explicit(&s->channel, 0, memory_order_relaxed);
	atomic_store_explicit(&s->peer_pid, 0, memory_order_relaxed);
	atomic_store_explicit(&s->mem_ino[0], 0, memory_order_relaxed);
	atomic_store_explicit(&s->mem_ino[1], 0, memory_order_relaxed);
}

void wsd_stat_refused(unsigned reason)
{
	struct wsd_stat_file *f = __atomic_load_n(&table, __ATOMIC_ACQUIRE);

	if (reason >= WSD_STAT_REASONS)
		reason = WSD_STAT_REASONS - 1;
	if (f)
		atomic_fetch_add_explicit(&f->refused[reason], 1, memory_order_relaxed);
}

void wsd_stat_reg_taken(uint16_t port, uint32_t uid)
{
	struct wsd_stat_file *f;

	pthread_mutex_lock(&lock);
	if (!table && !table_failed && table_create())
		table_failed = true;
	f = table;
	if (f) {
		f->reg_taken_port = port;
		__atomic_store_n(&f->reg_taken_uid, uid + 1, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&lock);
}

struct wsd_stat_slot *wsd_stat_alloc(void)
{
	struct wsd_stat_slot *slot;
	uint32_t i;
	int err;

	pthread_mutex_lock(&lock);
	if (!table && !table_failed) {
		err = table_create();
		/* out of descriptors is passing; anything else will not mend */
		if (err && err != -EMFILE && err != -ENFILE)
			table_failed = true;
	}
	if (!table)
		goto heap;
	if (nfree)
		i = free_idx[--nfree];
	else if (next_new < WSD_STAT_SLOTS && reserve(slot_end(next_new)))
		i = next_new++;
	else
		goto heap;
	slot = &table->slots[i];
	wsd_stat_begin(slot);
	slot_reset(slot, 1);
	wsd_stat_end(slot);
	/* after the slot is reset: a reader scanning up to hiwater sees it whole */
	if (i >= atomic_load_explicit(&table->hiwater, memory_order_relaxed))
		atomic_store_explicit(&table->hiwater, i + 1, memory_order_release);
	pthread_mutex_unlock(&lock);
	return slot;
heap:
	pthread_mutex_unlock(&lock);
	if (!(slot = calloc(1, sizeof(*slot))))
		return &dummy;
	slot->used = USED_HEAP;
	return slot;
}

bool wsd_stat_own(const struct wsd_stat_slot *slot)
{
	return slot != &dummy;
}

void wsd_stat_free(struct wsd_stat_slot *slot)
{
	if (slot->used == USED_HEAP && slot != &dummy) {
		free(slot);
		return;
	}
	pthread_mutex_lock(&lock);
	/*
	 * Only a slot of our current table goes back: not the dummy, not a
	 * slot a fork child inherited (its table is now private memory), and
	 * not one already freed (it would be handed out twice).
	 */
	if (table && slot >= table->slots && slot < table->slots + WSD_STAT_SLOTS && slot->used) {
		wsd_stat_begin(slot);
		slot_reset(slot, 0);
		wsd_stat_end(slot);
		free_idx[nfree++] = (uint32_t)(slot - table->slots);
	}
	pthread_mutex_unlock(&lock);
}

void wsd_stat_closed(struct wsd_stat_slot *slot)
{
	/*
	 * The socket may live on a while (an OPEN in flight holds it until
	 * its answer), but its number names another socket from now on.
	 */
	wsd_stat_begin(slot);
	slot->fd = -1;
	wsd_stat_end(slot);
}

/*
 * A seqlock with one writer per slot (the socket's owner serialises its
 * updates): gen is odd while the fields change.  The fence keeps the odd
 * gen ahead of the field stores; the release store keeps them ahead of the
 * even gen.  The dummy has many writers and a meaningless gen: no one reads it.
 */
void wsd_stat_begin(struct wsd_stat_slot *slot)
{
	uint32_t g = atomic_load_explicit(&slot->gen, memory_order_relaxed);

	atomic_store_explicit(&slot->gen, g + 1, memory_order_relaxed);
	atomic_thread_fence(memory_order_release);
}

void wsd_stat_end(struct wsd_stat_slot *slot)
{
	uint32_t g = atomic_load_explicit(&slot->gen, memory_order_relaxed);

	atomic_store_explicit(&slot->gen, g + 1, memory_order_release);
}

void wsd_stat_atfork_child(void)
{
	/* a thread of the parent may have held it; it did not come along */
	pthread_mutex_init(&lock, NULL);
	if (table) {
		/*
		 * The parent's file is not ours to write, but our inherited
		 * sockets still point at slots in it.  Put private zero pages
		 * over the mapping (no copy: nobody will read them, and zero
		 * pages cost nothing until written); those slots then count
		 * into memory only we see.  Should that fail, they go on
		 * counting into the parent's file: wrong numbers beat a crash.
		 */
		(void)mmap(table, TABLE_LEN, PROT_READ | PROT_WRITE,
			   MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	}
	/* our own file comes with our first socket */
	table = NULL;
	table_failed = false;
	reserved = 0;
	next_new = 0;
	nfree = 0;
	atomic_store_explicit(&owner, 0, memory_order_relaxed);
}

/*
 * Exit removes the file (a kill or an exec does not: readers clean up
 * after those).  Not a fork child that never made its own: the pid tells.
 */
__attribute__((destructor)) static void stat_exit(void)
{
	pid_t pid = atomic_load_explicit(&owner, memory_order_acquire);

	if (pid && pid == wsd_pid())
		unlink(path);
}

/* SPDX-License-Identifier: MIT */
/*
 * The prefix: bytes a socket must deliver before its kernel stream's.
 * When a connection moves back to the stream for fork or exec
 * (wsd-protocol(7), BACK), what the peer had already put in our ring is
 * kept here, in a memfd: a fork child maps the same pages, so each byte is
 * read once whichever process reads first, as from the kernel's queue; an
 * exec passes the memfd to the new image in WSD_INHERIT.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "provider/internal.h"
#include "switch/switch.h"

#define INHERIT_VAR "WSD_INHERIT"

static size_t map_len(uint64_t len)
{
	return (sizeof(struct wsd_prefix) + len + 4095) & ~(size_t)4095;
}

struct wsd_prefix *wsd_prefix_new(const void *data, size_t len, uint64_t skip, int *fdp)
{
	pthread_mutexattr_t ma;
	struct wsd_prefix *p;
	int fd = memfd_create("wsd-prefix", MFD_CLOEXEC);

	if (fd < 0)
		return NULL;
	if (ftruncate(fd, (off_t)map_len(len))) {
		real.close(fd);
		return NULL;
	}
	p = mmap(NULL, map_len(len), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		real.close(fd);
		return NULL;
	}
	pthread_mutexattr_init(&ma);
	pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
	/* a process that dies holding it must not stop the others */
	pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
	pthread_mutex_init(&p->mu, &ma);
	pthread_mutexattr_destroy(&ma);
	p->len = len;
	p->skip = skip;
	if (len)
		memcpy(p->data, data, len);
	*fdp = fd;
	return p;
}

struct wsd_prefix *wsd_prefix_open(int fd)
{
	struct wsd_prefix *p;
	struct stat st;

	if (fstat(fd, &st) || (size_t)st.st_size < sizeof(*p))
		return NULL;
	p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return NULL;
	if (map_len(p->len) != (size_t)st.st_size) {
		munmap(p, (size_t)st.st_size);
		return NULL;
	}
	return p;
}

void wsd_prefix_close(struct wsd_prefix *p)
{
	munmap(p, map_len(p->len));
}

void wsd_prefix_lock(struct wsd_prefix *p)
{
	if (pthread_mutex_lock(&p->mu) == EOWNERDEAD)
		pthread_mutex_consistent(&p->mu);
}

void wsd_prefix_unlock(struct wsd_prefix *p)
{
	pthread_mutex_unlock(&p->mu);
}

bool wsd_prefix_has_data(const struct wsd_prefix *p)
{
	return p && !atomic_load_explicit(&p->done, memory_order_acquire) &&
	       __atomic_load_n(&p->off, __ATOMIC_RELAXED) < p->len;
}

/* ---- across exec ------------------------------------------------------------------- */

static void env_add(int fd, struct wsd_sock *s, void *arg)
{
	FILE *f = arg;

	if (!s->pre || s->pre_fd < 0 || atomic_load(&s->pre->done) ||
	    (real.fcntl(fd, F_GETFD) & FD_CLOEXEC))
		return;
	if (fprintf(f, "%s%d:%d", ftell(f) > (long)strlen(INHERIT_VAR "=") ? "," : "", fd,
		    s->pre_fd) < 0)
		return;
	/* the new image needs the memfd open: it is close-on-exec by default */
	real.fcntl(s->pre_fd, F_SETFD, 0);
}

char *wsd_prefix_env(void)
{
	char *v = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&v, &len);

	if (!f)
		return NULL;
	fputs(INHERIT_VAR "=", f);
	wsd_fd_each(env_add, f);
	if (fclose(f) || len <= strlen(INHERIT_VAR "=")) {
		free(v);
		return NULL;
	}
	return v;
}

/*
 * The old image's sockets with bytes still to deliver: "FD:MEMFD,...".
 * Each becomes a socket of ours again, on the stream, its prefix first.
 */
void wsd_prefix_inherit(void)
{
	const char *v = getenv(INHERIT_VAR);
	char *copy, *tok, *save = NULL;

	if (!v)
		return;
	copy = strdup(v);
	unsetenv(INHERIT_VAR);     /* the numbers mean nothing to our children */
	for (tok = copy ? strtok_r(copy, ",", &save) : NULL; tok;
	     tok = strtok_r(NULL, ",", &save)) {
		int fd, mfd, type = 0, family = 0;
		socklen_t tl = sizeof(type), fl = sizeof(family);
		struct wsd_prefix *p;
		struct wsd_sock *s;

		if (sscanf(tok, "%d:%d", &fd, &mfd) != 2 || fd < 0 || mfd < 0)
			continue;
		real.fcntl(mfd, F_SETFD, FD_CLOEXEC);
		if (real.getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) || type != SOCK_STREAM ||
		    real.getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &family, &fl) ||
		    !(p = wsd_prefix_open(mfd))) {
			real.close(mfd);
			continue;
		}
		s = wsd_sock_new(fd, family);
		if (!s) {
			wsd_prefix_close(p);
			real.close(mfd);
			continue;
		}
		s->pre = p;
		s->pre_fd = mfd;
		s->rx_back = s->tx_back = true;
		s->no_upgrade = true;
		s->why_not = R_BACK;
		/* readiness counts the prefix, and the bells to skip after it */
		s->accel = !atomic_load(&p->done);
		s->nonblock = real.fcntl(fd, F_GETFL) & O_NONBLOCK;
		wsd_stat_begin(s->stat);
		s->stat->reason = R_BACK;
		wsd_stat_end(s->stat);
		wsd_fd_set(fd, s);
		wsd_sock_put(s);
		wsd_debug("switch: fd %d inherited with a prefix of %llu bytes", fd,
			  (unsigned long long)(p->len - p->off));
	}
	free(copy);
}

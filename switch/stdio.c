/* SPDX-License-Identifier: MIT */
/*
 * Sockets under stdio.  A stdio stream reads and writes through the C
 * library's internal calls, which no preload sees: a socket that gets a
 * stream (fdopen) or is the program's stdin, stdout or stderr goes back to
 * the kernel stream for good, and what the switch kept unread for it goes
 * into the stream (stdin's across an exec too).  fclose and freopen close
 * a stream's fd behind the switch: it is forgotten first.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "provider/internal.h"
#include "switch/switch.h"

/* Bytes the switch still holds for s (a plain socket now), or bells to skip before the stream's. */
static bool kept_left(struct wsd_sock *s)
{
	return (s->pre && !atomic_load(&s->pre->done)) || (s->rx_skip && s->rx_back);
}

/*
 * s went back to the stream for a stdio stream that reads it: what had
 * arrived by the ring and was not yet read (the prefix) would be skipped
 * by the stream's internal reads.  The switch's receive takes it out
 * (*kept, *len; free it), and skips the peer's last doorbells on the
 * stream.  0, or -ETIMEDOUT if those bells do not come (the stream is
 * stalled: the bytes are dropped and the socket is shut both ways, so its
 * reads end rather than skip them or take bells for data), or -ENOMEM.
 */
static int take_kept(struct wsd_sock *s, uint8_t **kept_out, size_t *len_out)
{
	int64_t end = wsd_now_ms() + 10 * WSD_BACK_MS;
	size_t len = 0, cap = 0;
	uint8_t *kept = NULL;
	int r = 0;

	while (kept_left(s)) {
		struct iovec v;
		ssize_t n;

		if (cap - len < 65536) {
			uint8_t *p = realloc(kept, cap + 65536);

			if (!p) {
				r = -ENOMEM;
				break;
			}
			kept = p;
			cap += 65536;
		}
		v = (struct iovec){ kept + len, cap - len };
		n = wsd_sock_recv(s, &v, 1, MSG_DONTWAIT);
		if (n > 0) {
			len += (size_t)n;
			continue;
		}
		if (n != -EAGAIN)
			break;        /* the end or an error: f's own reads will say so */
		if (wsd_now_ms() >= end) {
			r = -ETIMEDOUT;
			break;
		}
		real.poll(&(struct pollfd){ .fd = s->fd, .events = POLLIN }, 1, 10);
	}
	if (r) {
		real.shutdown(s->fd, SHUT_RDWR);
		free(kept);
		kept = NULL;
		len = 0;
	}
	*kept_out = kept;
	*len_out = len;
	return r;
}

/*
 * Bytes keep_stdio pushed into stdin for the socket on 0.  An exec would
 * drop them with the stream: before_exec moves those still unread into a
 * prefix the new image gets (restored), and a failed exec puts them back.
 */
static _Atomic bool stdin_pushed;
static bool stdin_restored;

/* glibc: f reads from its pushback ("backup") area; what is left there is ours. */
#define GLIBC_IN_BACKUP 0x100

static size_t pushed_unread(FILE *f)
{
	if (!(f->_flags & GLIBC_IN_BACKUP) || f->_IO_read_end < f->_IO_read_ptr)
		return 0;
	return (size_t)(f->_IO_read_end - f->_IO_read_ptr);
}

/* The bytes take_kept took go in front of f's, in order (glibc's ungetc takes any number). */
static void push_kept(FILE *f, uint8_t *kept, size_t len)
{
	while (len)
		ungetc(kept[--len], f);
	free(kept);
}

/*
 * 0, 1 and 2 are the program's stdin, stdout and stderr: printf, puts and
 * fgets move their bytes with the C library's internal read and write,
 * which no preload sees.  A socket that is or becomes one of them (inetd,
 * systemd's Accept=yes, a dup2 onto stdout) stays on (or goes back to) the
 * kernel stream.  0, or -errno when its peer's switch did not answer.
 */
int wsd_keep_stdio(int fd)
{
	struct wsd_sock *s;
	int r;

	if (fd < 0 || fd > 2 || !(s = wsd_fd_get(fd)))
		return 0;
	r = wsd_sock_keep_tcp(s, R_UNSUPPORTED);
	if (!r && fd == 0) {
		/* stdin's stream reads it: what the switch kept goes there */
		uint8_t *kept;
		size_t len;

		r = take_kept(s, &kept, &len);
		if (!r && len)
			atomic_store(&stdin_pushed, true);
		if (!r)
			push_kept(stdin, kept, len);
	}
	wsd_sock_put(s);
	return r;
}

/*
 * A stream over a socket reads and writes through the C library's internal
 * calls, which no preload can see: such a socket goes back to the kernel
 * stream first (an upgrade may have been attached inside accept already)
 * and stays there; what the switch kept unread goes into the stream.  If
 * its peer's switch does not answer, fdopen fails (ETIMEDOUT, or the
 * error): a stream that loses bytes would be worse.
 */
EXPORT FILE *fdopen(int fd, const char *mode)
{
	static FILE *(*next)(int, const char *);
	struct wsd_sock *s;
	uint8_t *kept = NULL;
	size_t len = 0;
	FILE *f;
	int r = 0;

	if (!next)
		next = (FILE *(*)(int, const char *))dlsym(RTLD_NEXT, "fdopen");
	if (!next) {
		errno = ENOSYS;
		return NULL;
	}
	if (!(s = wsd_fd_get(fd)))
		return next(fd, mode);
	r = wsd_sock_keep_tcp(s, R_UNSUPPORTED);
	if (r) {
		wsd_sock_put(s);
		fprintf(stderr, "libwsd: fdopen(%d): the connection cannot go back to TCP "
			"(its peer's switch did not answer): %s\n", fd, strerror(-r));
		errno = -r;
		return NULL;
	}
	f = next(fd, mode);
	/* a stream that reads takes what the switch kept for the socket */
	if (f && mode && (strchr(mode, 'r') || strchr(mode, '+'))) {
		if (take_kept(s, &kept, &len))
			fprintf(stderr, "libwsd: fdopen(%d): the stream stalled on its way back "
				"to TCP: the connection is shut\n", fd);
		push_kept(f, kept, len);
	}
	wsd_sock_put(s);
	return f;
}

/*
 * f's fd is about to be closed by the C library's internal close: its
 * buffer goes out while the fd is still ours, then the fd is forgotten as
 * close() forgets it, or its number would still name the socket.
 */
static void stream_closing(FILE *f)
{
	struct wsd_sock *s;
	int fd = f ? fileno(f) : -1;

	if (fd < 0)
		return;
	wsd_poll_fd_closed(fd);
	if ((s = wsd_fd_get(fd))) {
		wsd_sock_put(s);
		fflush(f);
		wsd_sock_forget(fd);
	}
}

/*
 * fclose closes the stream's fd with the C library's internal close: that
 * fd is forgotten as close() forgets it (after the stream's last bytes
 * went out), or its number would still name the socket.
 */
EXPORT int fclose(FILE *f)
{
	static int (*next)(FILE *);

	if (!next)
		next = (int (*)(FILE *))dlsym(RTLD_NEXT, "fclose");
	if (!next) {
		errno = ENOSYS;
		return EOF;
	}
	stream_closing(f);
	return next(f);
}

/*
 * freopen closes the stream's old fd with the internal close, then gives
 * the new file that number when it can: the old socket is forgotten first.
 */
static FILE *reopened(FILE *(*next)(const char *, const char *, FILE *), const char *path,
		      const char *mode, FILE *f)
{
	if (!next) {
		errno = ENOSYS;
		return NULL;
	}
	/* without a path the same fd is reopened (its mode changes): nothing closes */
	if (path)
		stream_closing(f);
	return next(path, mode, f);
}

EXPORT FILE *freopen(const char *path, const char *mode, FILE *f)
{
	static FILE *(*next)(const char *, const char *, FILE *);

	if (!next)
		next = (FILE *(*)(const char *, const char *, FILE *))dlsym(RTLD_NEXT, "freopen");
	return reopened(next, path, mode, f);
}

/* The same call on 64-bit; programs built with _FILE_OFFSET_BITS=64 use this name. */
EXPORT FILE *freopen64(const char *path, const char *mode, FILE *f) __attribute__((alias("freopen")));

void wsd_stdin_to_prefix(void)
{
	struct wsd_sock *s;
	struct wsd_prefix *p;
	uint8_t *buf;
	size_t n;
	int pfd;

	if (!atomic_load(&stdin_pushed) || !(s = wsd_fd_get(0)))
		return;
	n = pushed_unread(stdin);
	if (n && (!s->pre || atomic_load(&s->pre->done)) && !s->rx_skip && (buf = malloc(n))) {
		/* all of it is in the stream's buffer: fread does not touch the fd */
		size_t got = fread(buf, 1, n, stdin);

		p = got == n ? wsd_prefix_new(buf, n, 0, &pfd) : NULL;
		if (p) {
			if (s->pre) {
				wsd_prefix_close(s->pre);
				real.close(s->pre_fd);
			}
			s->pre = p;
			s->pre_fd = pfd;
			stdin_restored = true;
		} else {
			push_kept(stdin, buf, got);   /* no memory: they stay where they were */
			buf = NULL;
		}
		free(buf);
	}
	wsd_sock_put(s);
}

/* The exec failed: what stdin_to_prefix moved goes back into stdin. */
void wsd_stdin_exec_failed(void)
{
	struct wsd_sock *s;
	uint8_t *kept;
	size_t len;

	if (!stdin_restored || !(s = wsd_fd_get(0)))
		return;
	stdin_restored = false;
	if (!take_kept(s, &kept, &len))
		push_kept(stdin, kept, len);
	wsd_sock_put(s);
}

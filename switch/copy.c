/* SPDX-License-Identifier: MIT */
/*
 * sendfile and splice on a socket of ours: a correct copy loop through
 * the session (the kernel's own would move the stream's bytes behind it).
 * Each takes from its source only what the socket or the pipe took, so no
 * byte is lost or sent twice, and waits only where the kernel's would.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>

#include "switch/switch.h"

#define COPY_CHUNK 65536
#define PIPE_PAGE 4096          /* a pipe's slot holds a page: at least this */
/* the most one piece moves: the largest pipe an unprivileged program may make */
#define COPY_MAX (1u << 20)

/*
 * Each thread keeps its buffer between calls: a proxy moves every piece
 * through it, and memory taken afresh for each would be faulted in afresh.
 * Unmapped when the thread ends.  Pieces of up to COPY_CHUNK get a small
 * one, larger ones a transparent huge page where the kernel gives them:
 * the kernel's copies to and from small pages spend a good part of their
 * time on address translation (more on a virtual machine).
 */
#define SMALL_BUF (COPY_CHUNK + 4096)
#define BIG_BUF (2u << 20)

/*
 * Where in the buffer the bytes go.  The kernel copies with rep movsb,
 * which AMD's Zen cores run several times slower when the destination lies
 * 1 to 31 bytes past the source within a 64-byte line.  A pipe's and a
 * file's bytes begin at the start of their pages, a program's large buffer
 * (glibc's malloc) 16 bytes in, or at its start: from a peer's buffer into
 * the pipe, the buffer's start suits both copies; from the pipe or a file
 * to a peer's buffer, 32 bytes in.
 */
#define AT_IN 0
#define AT_OUT 32

static pthread_key_t buf_key;
static pthread_once_t buf_once = PTHREAD_ONCE_INIT;
static bool buf_key_made;
/*
 * This thread's calls under way: a signal handler's call inside another
 * must not use the buffer that one's bytes are in (it gets the small one).
 */
static __thread volatile sig_atomic_t calls;

struct copy_buf {
	char *data;
	size_t size;
};

static void buf_free(void *p)
{
	struct copy_buf *b = p;

	if (b->data)
		munmap(b->data, b->size);
	free(b);
}

static void buf_key_make(void)
{
	buf_key_made = !pthread_key_create(&buf_key, buf_free);
}

/* A buffer of size bytes, BIG_BUF aligned to a huge page, within the program's reserve. */
static char *map_buf(size_t size)
{
	size_t span = size == BIG_BUF ? 2 * size : size;
	char *p, *a;

	if (!wsd_guard_room(0, span))
		return NULL;
	p = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED || span == size)
		return p == MAP_FAILED ? NULL : p;
	a = (char *)(((uintptr_t)p + size - 1) & ~(uintptr_t)(size - 1));
	if (a > p)
		munmap(p, (size_t)(a - p));
	munmap(a + size, (size_t)(p + span - (a + size)));
	(void)madvise(a, size, MADV_HUGEPAGE);
	return a;
}

/*
 * Room for *len bytes (at most COPY_MAX) at `at` in this thread's buffer,
 * grown at most once; when memory is short, what there is, or the caller's
 * small one, *len cut to fit: the copy then goes in smaller pieces rather
 * than fail.
 */
static void *copy_buf(size_t *len, size_t at, char *small, size_t small_len)
{
	size_t size;
	struct copy_buf *b;
	char *data;

	if (*len > COPY_MAX)
		*len = COPY_MAX;
	size = at + *len <= SMALL_BUF ? SMALL_BUF : BIG_BUF;
	if (*len > small_len && calls == 1 && !pthread_once(&buf_once, buf_key_make) &&
	    buf_key_made) {
		b = pthread_getspecific(buf_key);
		if (!b && (b = calloc(1, sizeof(*b))) && pthread_setspecific(buf_key, b)) {
			free(b);
			b = NULL;
		}
		if (b && b->size < at + *len && (data = map_buf(size))) {
			if (b->data)
				munmap(b->data, b->size);
			b->data = data;
			b->size = size;
		}
		if (b && b->size >= at + small_len) {
			if (*len > b->size - at)
				*len = b->size - at;
			return b->data + at;
		}
	}
	if (*len > small_len)
		*len = small_len;
	return small;
}

/*
 * Send all of buf on a blocking socket (the kernel's sendfile takes it all
 * too).  First without waiting: a blocking send may hand the bytes over by
 * zero copy and return only once the receiver has read them all, where the
 * kernel's splice and sendfile return once they are queued; what does not
 * fit then waits for room.  EAGAIN after that (SO_SNDTIMEO ran out) ends
 * it with what went, unless the bytes were already taken from their source
 * (must): then it waits on.  No MSG_NOSIGNAL: the kernel's sendfile and
 * splice raise SIGPIPE too.
 */
static ssize_t send_all(struct wsd_sock *s, const char *buf, size_t len, size_t *sent, bool must)
{
	int flags = MSG_DONTWAIT;

	*sent = 0;
	while (*sent < len) {
		struct iovec v = { (char *)buf + *sent, len - *sent };
		ssize_t r = wsd_sock_send(s, &v, 1, flags);

		if (r == -EAGAIN && flags) {
			flags = 0;
			continue;
		}
		if (r == -EAGAIN && must) {
			struct pollfd p = { .fd = s->fd, .events = POLLOUT };

			poll(&p, 1, 10);
			continue;
		}
		if (r == -EAGAIN && *sent)
			return 0;
		if (r < 0)
			return r;
		*sent += (size_t)r;
	}
	return 0;
}

/*
 * The bytes go on the socket's own terms: a non-blocking one takes what
 * fits and a full one fails EAGAIN at once, as the kernel's sendfile.  A
 * positioned read takes nothing from the file, so the position (or *off)
 * moves by exactly what went.  The kernel reads only regular files and
 * block devices here (anything else is EINVAL; a pipe or a socket with an
 * offset, ESPIPE), so nothing is ever read that could not be put back.
 */
static ssize_t file_to_sock(struct wsd_sock *s, int in, off_t *off, size_t count)
{
	struct stat st;
	off_t pos;
	ssize_t got, r = 0;
	size_t total = 0, sent;
	char small[PIPE_PAGE];

	if (fstat(in, &st))
		return -errno;
	if (off && (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)))
		return -ESPIPE;
	if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode))
		return -EINVAL;
	if (off && *off < 0)
		return -EINVAL;
	pos = off ? *off : lseek(in, 0, SEEK_CUR);
	if (pos < 0)
		return -errno;
	while (total < count) {
		/* a non-blocking socket may take little: read no more than it likely takes */
		size_t want = s->nonblock && count - total > COPY_CHUNK ? COPY_CHUNK : count - total;
		char *buf = copy_buf(&want, AT_OUT, small, sizeof(small));

		got = pread(in, buf, want, pos);
		if (got < 0) {
			r = -errno;
			break;
		}
		if (got == 0)
			break;
		if (s->nonblock) {
			struct iovec v = { buf, (size_t)got };

			r = wsd_sock_send(s, &v, 1, 0);
			if (r < 0)
				break;
			sent = (size_t)r;
			r = 0;
		} else {
			r = send_all(s, buf, (size_t)got, &sent, false);
		}
		total += sent;
		pos += (off_t)sent;
		if (r < 0 || sent < (size_t)got)
			break;
	}
	if (off)
		*off = pos;
	else
		lseek(in, pos, SEEK_SET);
	return total ? (ssize_t)total : r;
}

EXPORT ssize_t sendfile(int out, int in, off_t *off, size_t count)
{
	struct wsd_sock *s = wsd_data_sock(out);
	ssize_t r;

	if (!s)
		return real.sendfile(out, in, off, count);
	calls++;
	r = file_to_sock(s, in, off, count);
	calls--;
	wsd_sock_put(s);
	return wsd_ret(r);
}

EXPORT ssize_t sendfile64(int out, int in, off64_t *off, size_t count)
{
	off_t o = off ? (off_t)*off : 0;
	ssize_t r = sendfile(out, in, off ? &o : NULL, count);

	if (off)
		*off = o;
	return r;
}

/*
 * Bytes a write into out takes without waiting, at least: its free slots
 * (F_GETPIPE_SZ counts its slots in pages) times a page, or the one page
 * a pipe that polls writable takes.
 */
static size_t pipe_room(int out)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE), slots, used;
	int size = real.fcntl(out, F_GETPIPE_SZ), queued;

	if (size <= 0 || real.ioctl(out, FIONREAD, &queued) < 0 || queued < 0)
		return PIPE_PAGE;
	slots = (size_t)size / page;
	used = (size_t)queued < slots ? (size_t)queued : slots;
	return slots - used > 1 ? (slots - used) * page : PIPE_PAGE;
}

/*
 * socket -> pipe.  Bytes taken from the socket cannot be put back, so each
 * piece is no larger than the pipe surely holds: its free slots, of a page
 * each, are at least its slots less one for every byte it holds (a pipe
 * that polls writable has one), and a write into that many free slots goes
 * in whole.  As in the kernel, the call first waits for room in the pipe
 * (EAGAIN at once when the pipe or the call is non-blocking), then for
 * data as the socket's own O_NONBLOCK says, and returns what fit.
 */
static ssize_t sock_to_pipe(struct wsd_sock *s, int out, size_t len, unsigned int flags)
{
	int pfl = real.fcntl(out, F_GETFL), rflags = 0;
	bool nb = (flags & SPLICE_F_NONBLOCK) || (pfl >= 0 && (pfl & O_NONBLOCK));
	char small[PIPE_PAGE];
	size_t done = 0;
	ssize_t r = 0;

	while (done < len) {
		struct pollfd p = { .fd = out, .events = POLLOUT };
		struct msghdr m = { 0 };
		struct iovec v;
		ssize_t w = 0, k;
		size_t room;
		int e;

		e = real.poll(&p, 1, nb || done ? 0 : -1);
		if (e < 0) {
			r = -errno;
			break;
		}
		if (e && (p.revents & POLLERR)) {
			/* no reader: EPIPE before the socket is touched, as in the kernel */
			if (!done)
				raise(SIGPIPE);
			r = -EPIPE;
			break;
		}
		if (!e || !(p.revents & POLLOUT)) {
			r = -EAGAIN;
			break;
		}
		room = pipe_room(out);
		v.iov_len = len - done < room ? len - done : room;
		v.iov_base = copy_buf(&v.iov_len, AT_IN, small, sizeof(small));
		m.msg_iov = &v;
		m.msg_iovlen = 1;
		r = wsd_io_recv(s, &m, rflags);
		if (r <= 0)
			break;
		/* a writer of its own may have filled the pipe since: then wait for room */
		while (w < r && ((k = real.write(out, (char *)v.iov_base + w, (size_t)(r - w))) > 0 ||
				 (k < 0 && (errno == EAGAIN || errno == EINTR)))) {
			if (k > 0) {
				w += k;
			} else {
				struct pollfd q = { .fd = out, .events = POLLOUT };

				real.poll(&q, 1, 10);
			}
		}
		if (w < r) {
			/* the pipe's reader went: what was taken is gone, as in the kernel */
			r = done ? 0 : -errno;
			break;
		}
		done += (size_t)w;
		/* less than asked: the socket ran dry, and the rest would be what came since */
		if ((size_t)r < v.iov_len)
			break;
		rflags = MSG_DONTWAIT;   /* the rest is what is there now */
	}
	return done ? (ssize_t)done : r;
}

/*
 * pipe -> socket.  A blocking socket takes all that is read from the pipe.
 * A non-blocking one may take less, or nothing: the pipe's bytes are
 * copied first (tee into a pipe of our own, which consumes nothing; at
 * most what its default size holds), sent, and exactly what went is then
 * read from the pipe.
 */
static ssize_t pipe_to_nb_sock(struct wsd_sock *s, int in, int tp[2], size_t len)
{
	struct pollfd p = { .fd = in, .events = POLLIN };
	char small[PIPE_PAGE];
	struct iovec v = { .iov_len = len < COPY_CHUNK ? len : COPY_CHUNK };
	ssize_t r, got;

	v.iov_base = copy_buf(&v.iov_len, AT_OUT, small, sizeof(small));
	/* wait for data (or the end) as the kernel would, then copy it */
	while ((r = tee(in, tp[1], v.iov_len, SPLICE_F_NONBLOCK)) < 0 && errno == EAGAIN &&
	       real.poll(&p, 1, -1) >= 0)
		;
	got = r > 0 ? real.read(tp[0], v.iov_base, (size_t)r) : r;
	if (got <= 0)
		return got < 0 ? -errno : 0;
	v.iov_len = (size_t)got;
	r = wsd_sock_send(s, &v, 1, 0);
	if (r > 0 && real.read(in, v.iov_base, (size_t)r) != r)
		r = -EIO;    /* another reader took them meanwhile */
	return r;
}

static ssize_t pipe_to_sock(struct wsd_sock *s, int in, size_t len, unsigned int flags)
{
	struct pollfd p = { .fd = in, .events = POLLIN };
	int tp[2], pfl = real.fcntl(in, F_GETFL);
	char small[PIPE_PAGE];
	size_t sent = 0;
	ssize_t r, got;
	void *buf;

	/* an empty pipe: no wait when it or the call is non-blocking */
	if (((flags & SPLICE_F_NONBLOCK) || (pfl >= 0 && (pfl & O_NONBLOCK))) &&
	    real.poll(&p, 1, 0) == 0)
		return -EAGAIN;
	if (s->nonblock && pipe2(tp, O_CLOEXEC) == 0) {
		r = pipe_to_nb_sock(s, in, tp, len);
		real.close(tp[0]);
		real.close(tp[1]);
		return r;
	}
	buf = copy_buf(&len, AT_OUT, small, sizeof(small));
	got = real.read(in, buf, len);
	if (got <= 0)
		return got < 0 ? -errno : 0;
	r = send_all(s, buf, (size_t)got, &sent, true);
	return sent ? (ssize_t)sent : r;
}

EXPORT ssize_t splice(int in, off_t *off_in, int out, off_t *off_out, size_t len,
		      unsigned int flags)
{
	struct wsd_sock *si = wsd_data_sock(in), *so = si ? NULL : wsd_data_sock(out);
	struct stat st;
	ssize_t r;

	if (!si && !so)
		return real.splice(in, off_in, out, off_out, len, flags);
	calls++;
	if ((si && off_in) || (so && off_out))
		r = -ESPIPE;
	else if (fstat(si ? out : in, &st))
		r = -errno;
	else if (!S_ISFIFO(st.st_mode))
		r = -EINVAL;    /* one end must be a pipe (the kernel's rule) */
	else if (!len)
		r = 0;
	else
		r = si ? sock_to_pipe(si, out, len, flags) : pipe_to_sock(so, in, len, flags);
	calls--;
	if (si)
		wsd_sock_put(si);
	if (so)
		wsd_sock_put(so);
	return wsd_ret(r);
}

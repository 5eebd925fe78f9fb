/* SPDX-License-Identifier: MIT */
/*
 * The data calls under the preload.  An fd that names no socket of ours
 * (files, pipes, unix sockets, listeners) goes straight to the C library;
 * a TCP socket goes through the session, which is the kernel stream itself
 * until a direction switches.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "switch/switch.h"

/* The socket behind fd when it carries data through the session. */
static struct wsd_sock *data_sock(int fd)
{
	struct wsd_sock *s;

	wsd_real_init();
	s = wsd_fd_get(fd);
	if (s && s->listening) {
		wsd_sock_put(s);
		return NULL;
	}
	return s;
}

/* Receive flags the session carries exactly as TCP does. */
#define RX_FLAGS (MSG_PEEK | MSG_WAITALL | MSG_DONTWAIT | MSG_NOSIGNAL | MSG_CMSG_CLOEXEC)
/* Send flags the ring carries: MSG_MORE, MSG_EOR and MSG_CONFIRM change no byte. */
#define TX_FLAGS (MSG_DONTWAIT | MSG_NOSIGNAL | MSG_MORE | MSG_EOR | MSG_CONFIRM)

/*
 * MSG_TRUNC on a TCP socket discards what it counts and never writes the
 * buffer (which may be NULL), peeking or not: the session's bytes go to a
 * scratch buffer instead.  The first take waits as the call would; the
 * rest are what is there, up to len (all of it with MSG_WAITALL).
 */
static ssize_t recv_discard(struct wsd_sock *s, size_t len, int flags)
{
	size_t chunk = len < (1u << 20) ? len : (1u << 20), done = 0;
	char *junk;
	ssize_t r = 0;

	if (!(flags & MSG_PEEK) && chunk > 65536)
		chunk = 65536;
	if (!(junk = malloc(chunk ? chunk : 1)))
		return -ENOMEM;
	do {
		struct iovec v = { junk, len - done < chunk ? len - done : chunk };

		r = wsd_sock_recv(s, &v, 1, flags & ~MSG_TRUNC);
		if (r <= 0)
			break;
		done += (size_t)r;
		if (!(flags & MSG_WAITALL))
			flags |= MSG_DONTWAIT;
	} while (!(flags & MSG_PEEK) && done < len);
	free(junk);
	return done ? (ssize_t)done : r;
}

/*
 * One receive through the session, whatever the flags.  MSG_OOB and
 * MSG_ERRQUEUE move no stream byte: the kernel answers them (m as the
 * application gave it, for the error queue's control data).  A socket
 * that took urgent data never upgrades: its peer's kernel counted that
 * byte as sent, ours does not count it as stream data.  A flag the ring
 * does not carry takes the connection back to TCP for good first.
 */
static ssize_t sock_recv(struct wsd_sock *s, struct msghdr *m, int flags)
{
	const struct iovec *iov = m->msg_iov;
	int n = (int)m->msg_iovlen, r;
	ssize_t k;

	if (flags & (MSG_OOB | MSG_ERRQUEUE)) {
		k = real.recvmsg(s->fd, m, flags);
		if (k < 0)
			return -errno;
		if ((flags & MSG_OOB) && k > 0 && !(flags & MSG_PEEK))
			(void)wsd_sock_keep_tcp(s, R_UNSUPPORTED);
		return k;
	}
	if (flags & MSG_TRUNC) {
		size_t len = 0;

		for (int i = 0; i < n; i++)
			len += iov[i].iov_len;
		return recv_discard(s, len, flags);
	}
	if (flags & ~RX_FLAGS) {
		r = wsd_sock_keep_tcp(s, R_UNSUPPORTED);
		if (r)
			return r;
	}
	return wsd_sock_recv(s, iov, n, flags);
}

/*
 * One send through the session.  MSG_OOB, MSG_ZEROCOPY and any flag the
 * ring does not carry take the connection back to TCP for good first; the
 * kernel then gets the flag with the bytes.  An urgent byte must never be
 * counted in a handover: the receiving kernel keeps it out of the stream.
 */
static ssize_t sock_send(struct wsd_sock *s, const struct iovec *iov, int n, int flags)
{
	if (flags & ~TX_FLAGS) {
		int r = wsd_sock_keep_tcp(s, R_UNSUPPORTED);

		if (r)
			return r;
	}
	return wsd_sock_send(s, iov, n, flags);
}

/*
 * sendto/sendmsg with MSG_FASTOPEN connect and send in one call, to the
 * address given: the kernel's alone, on a socket that stays on TCP.
 */
static ssize_t fastopen(struct wsd_sock *s, const struct msghdr *m, int flags)
{
	int r = wsd_sock_keep_tcp(s, R_UNSUPPORTED);
	ssize_t n;

	if (r)
		return r;
	n = real.sendmsg(s->fd, m, flags);
	return n < 0 ? -errno : n;
}

static ssize_t do_recv(struct wsd_sock *s, const struct iovec *iov, int n, int flags)
{
	struct msghdr m = { .msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)n };
	ssize_t r = sock_recv(s, &m, flags);

	wsd_sock_put(s);
	return wsd_ret(r);
}

static ssize_t do_send(struct wsd_sock *s, const struct iovec *iov, int n, int flags)
{
	ssize_t r = sock_send(s, iov, n, flags);

	wsd_sock_put(s);
	return wsd_ret(r);
}

EXPORT ssize_t read(int fd, void *buf, size_t len)
{
	struct wsd_sock *s = data_sock(fd);
	struct iovec v = { buf, len };

	return s ? do_recv(s, &v, 1, 0) : real.read(fd, buf, len);
}

EXPORT ssize_t write(int fd, const void *buf, size_t len)
{
	struct wsd_sock *s = data_sock(fd);
	struct iovec v = { (void *)buf, len };

	return s ? do_send(s, &v, 1, 0) : real.write(fd, buf, len);
}

EXPORT ssize_t readv(int fd, const struct iovec *iov, int n)
{
	struct wsd_sock *s = data_sock(fd);

	if (s && (n < 0 || n > IOV_MAX)) {
		wsd_sock_put(s);
		errno = EINVAL;
		return -1;
	}
	return s ? do_recv(s, iov, n, 0) : real.readv(fd, iov, n);
}

EXPORT ssize_t writev(int fd, const struct iovec *iov, int n)
{
	struct wsd_sock *s = data_sock(fd);

	if (s && (n < 0 || n > IOV_MAX)) {
		wsd_sock_put(s);
		errno = EINVAL;
		return -1;
	}
	return s ? do_send(s, iov, n, 0) : real.writev(fd, iov, n);
}

EXPORT ssize_t recv(int fd, void *buf, size_t len, int flags)
{
	struct wsd_sock *s = data_sock(fd);
	struct iovec v = { buf, len };

	return s ? do_recv(s, &v, 1, flags) : real.recv(fd, buf, len, flags);
}

EXPORT ssize_t send(int fd, const void *buf, size_t len, int flags)
{
	struct wsd_sock *s = data_sock(fd);
	struct iovec v = { (void *)buf, len };

	return s ? do_send(s, &v, 1, flags) : real.send(fd, buf, len, flags);
}

EXPORT ssize_t recvfrom(int fd, void *buf, size_t len, int flags, struct sockaddr *addr,
			socklen_t *alen)
{
	struct wsd_sock *s = data_sock(fd);
	struct iovec v = { buf, len };
	ssize_t r;

	if (!s)
		return real.recvfrom(fd, buf, len, flags, addr, alen);
	r = do_recv(s, &v, 1, flags);
	if (r >= 0 && addr && alen)
		*alen = 0;       /* as the kernel does for a stream socket */
	return r;
}

EXPORT ssize_t sendto(int fd, const void *buf, size_t len, int flags,
		      const struct sockaddr *addr, socklen_t alen)
{
	struct wsd_sock *s = data_sock(fd);
	struct iovec v = { (void *)buf, len };
	struct msghdr m = { (void *)addr, alen, &v, 1, NULL, 0, 0 };
	ssize_t r;

	if (!s)
		return real.sendto(fd, buf, len, flags, addr, alen);
	if (!(flags & MSG_FASTOPEN))
		return do_send(s, &v, 1, flags);
	r = fastopen(s, &m, flags);
	wsd_sock_put(s);
	return wsd_ret(r);
}

/* recvmsg's work on a socket of ours: -errno, or bytes with msghdr as the kernel leaves it. */
static ssize_t msg_recv(struct wsd_sock *s, struct msghdr *m, int flags)
{
	ssize_t r;

	if ((int)m->msg_iovlen < 0 || m->msg_iovlen > IOV_MAX)
		return -EMSGSIZE;
	r = sock_recv(s, m, flags);
	if (r >= 0 && !(flags & MSG_ERRQUEUE) && !(flags & MSG_OOB)) {
		m->msg_namelen = 0;
		m->msg_controllen = 0;
		m->msg_flags = 0;
	}
	return r;
}

EXPORT ssize_t recvmsg(int fd, struct msghdr *m, int flags)
{
	struct wsd_sock *s = data_sock(fd);
	ssize_t r;

	if (!s)
		return real.recvmsg(fd, m, flags);
	r = msg_recv(s, m, flags);
	wsd_sock_put(s);
	return wsd_ret(r);
}

static ssize_t msg_send(struct wsd_sock *s, const struct msghdr *m, int flags)
{
	if (flags & MSG_FASTOPEN)
		return fastopen(s, m, flags);
	if ((int)m->msg_iovlen < 0 || m->msg_iovlen > IOV_MAX)
		return -EMSGSIZE;
	return sock_send(s, m->msg_iov, (int)m->msg_iovlen, flags);
}

EXPORT ssize_t sendmsg(int fd, const struct msghdr *m, int flags)
{
	struct wsd_sock *s = data_sock(fd);
	ssize_t r;

	if (!s)
		return real.sendmsg(fd, m, flags);
	r = msg_send(s, m, flags);
	wsd_sock_put(s);
	return wsd_ret(r);
}

/*
 * sendmmsg and recvmmsg as the kernel runs them on a stream socket: one
 * sendmsg/recvmsg per message, msg_len each; a failure after the first
 * message ends the call with the count so far.  sendmmsg stops after a
 * short send; recvmmsg's MSG_WAITFORONE makes every message after the
 * first non-blocking, and its timeout is looked at only between messages
 * (it bounds no wait), then written back with what is left.
 */
EXPORT int sendmmsg(int fd, struct mmsghdr *mm, unsigned int vlen, int flags)
{
	struct wsd_sock *s = data_sock(fd);
	unsigned int i;
	ssize_t r = 0;

	if (!s)
		return real.sendmmsg(fd, mm, vlen, flags);
	if (vlen > UIO_MAXIOV)
		vlen = UIO_MAXIOV;
	for (i = 0; i < vlen; i++) {
		const struct msghdr *m = &mm[i].msg_hdr;
		size_t want = 0;

		r = msg_send(s, m, flags);
		if (r < 0)
			break;
		mm[i].msg_len = (unsigned int)r;
		for (size_t j = 0; j < m->msg_iovlen; j++)
			want += m->msg_iov[j].iov_len;
		if ((size_t)r < want) {
			i++;
			break;
		}
	}
	wsd_sock_put(s);
	return i ? (int)i : (int)wsd_ret(r);
}

static int64_t ts_ns(const struct timespec *t)
{
	return (int64_t)t->tv_sec * 1000000000 + t->tv_nsec;
}

EXPORT int recvmmsg(int fd, struct mmsghdr *mm, unsigned int vlen, int flags,
		    struct timespec *tmo)
{
	struct wsd_sock *s = data_sock(fd);
	struct timespec now;
	int64_t end = 0;
	unsigned int i;
	ssize_t r = 0;

	if (!s)
		return real.recvmmsg(fd, mm, vlen, flags, tmo);
	if (tmo) {
		if (tmo->tv_sec < 0 || tmo->tv_nsec < 0 || tmo->tv_nsec >= 1000000000) {
			wsd_sock_put(s);
			errno = EINVAL;
			return -1;
		}
		clock_gettime(CLOCK_MONOTONIC, &now);
		end = ts_ns(&now) + ts_ns(tmo);
	}
	if (vlen > UIO_MAXIOV)
		vlen = UIO_MAXIOV;
	for (i = 0; i < vlen;) {
		struct msghdr *m = &mm[i].msg_hdr;

		r = msg_recv(s, m, flags & ~MSG_WAITFORONE);
		if (r < 0)
			break;
		mm[i++].msg_len = (unsigned int)r;
		if (flags & MSG_WAITFORONE)
			flags |= MSG_DONTWAIT;
		if (tmo) {
			int64_t left;

			clock_gettime(CLOCK_MONOTONIC, &now);
			left = end - ts_ns(&now);
			if (left < 0)
				left = 0;
			tmo->tv_sec = left / 1000000000;
			tmo->tv_nsec = left % 1000000000;
			if (!left)
				break;
		}
		if (m->msg_flags & MSG_OOB)
			break;
	}
	wsd_sock_put(s);
	return i ? (int)i : (int)wsd_ret(r);
}

/*
 * The positioned calls.  A socket has no position: an explicit offset is
 * ESPIPE (a negative one EINVAL) before anything else, as the kernel
 * checks; preadv2/pwritev2 at offset -1 are readv/writev with RWF_* flags.
 * On a TCP socket the kernel ignores RWF_HIPRI, RWF_DSYNC, RWF_SYNC and
 * RWF_APPEND and turns RWF_NOWAIT into MSG_DONTWAIT; any other flag is the
 * kernel's to judge, on a socket back on TCP for good.
 */
#define RWF_KNOWN (RWF_HIPRI | RWF_DSYNC | RWF_SYNC | RWF_NOWAIT | RWF_APPEND)

static ssize_t no_offset(off64_t off)
{
	return off < 0 ? -EINVAL : -ESPIPE;
}

static ssize_t pos_read(int fd, const struct iovec *iov, int n, off64_t off, int rwf, bool v2)
{
	struct wsd_sock *s = data_sock(fd);
	ssize_t r;

	if (!s)
		return v2 ? real.preadv64v2(fd, iov, n, off, rwf) : real.preadv64(fd, iov, n, off);
	if (!v2 || off != -1) {
		r = no_offset(off);
	} else if (n < 0 || n > IOV_MAX) {
		r = -EINVAL;
	} else if (rwf & ~RWF_KNOWN) {
		r = wsd_sock_keep_tcp(s, R_UNSUPPORTED);
		/* what the switch still owes (kept at the way back) comes first */
		if (!r && !(s->pre && wsd_prefix_has_data(s->pre)) && !s->rx_skip) {
			if ((r = real.preadv64v2(fd, iov, n, off, rwf)) < 0)
				r = -errno;
		} else if (!r) {
			r = wsd_sock_recv(s, iov, n, (rwf & RWF_NOWAIT) ? MSG_DONTWAIT : 0);
		}
	} else {
		struct msghdr m = { .msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)n };

		r = sock_recv(s, &m, (rwf & RWF_NOWAIT) ? MSG_DONTWAIT : 0);
	}
	wsd_sock_put(s);
	return wsd_ret(r);
}

static ssize_t pos_write(int fd, const struct iovec *iov, int n, off64_t off, int rwf, bool v2)
{
	struct wsd_sock *s = data_sock(fd);
	ssize_t r;

	if (!s)
		return v2 ? real.pwritev64v2(fd, iov, n, off, rwf) : real.pwritev64(fd, iov, n, off);
	if (!v2 || off != -1) {
		r = no_offset(off);
	} else if (n < 0 || n > IOV_MAX) {
		r = -EINVAL;
	} else if (rwf & ~RWF_KNOWN) {
		r = wsd_sock_keep_tcp(s, R_UNSUPPORTED);
		if (!r && (r = real.pwritev64v2(fd, iov, n, off, rwf)) < 0)
			r = -errno;
	} else {
		r = sock_send(s, iov, n, (rwf & RWF_NOWAIT) ? MSG_DONTWAIT : 0);
	}
	wsd_sock_put(s);
	return wsd_ret(r);
}

EXPORT ssize_t preadv(int fd, const struct iovec *iov, int n, off_t off)
{
	return pos_read(fd, iov, n, off, 0, false);
}

EXPORT ssize_t preadv64(int fd, const struct iovec *iov, int n, off64_t off)
{
	return pos_read(fd, iov, n, off, 0, false);
}

EXPORT ssize_t preadv2(int fd, const struct iovec *iov, int n, off_t off, int rwf)
{
	return pos_read(fd, iov, n, off, rwf, true);
}

EXPORT ssize_t preadv64v2(int fd, const struct iovec *iov, int n, off64_t off, int rwf)
{
	return pos_read(fd, iov, n, off, rwf, true);
}

EXPORT ssize_t pwritev(int fd, const struct iovec *iov, int n, off_t off)
{
	return pos_write(fd, iov, n, off, 0, false);
}

EXPORT ssize_t pwritev64(int fd, const struct iovec *iov, int n, off64_t off)
{
	return pos_write(fd, iov, n, off, 0, false);
}

EXPORT ssize_t pwritev2(int fd, const struct iovec *iov, int n, off_t off, int rwf)
{
	return pos_write(fd, iov, n, off, rwf, true);
}

EXPORT ssize_t pwritev64v2(int fd, const struct iovec *iov, int n, off64_t off, int rwf)
{
	return pos_write(fd, iov, n, off, rwf, true);
}

/* _FORTIFY_SOURCE's checked entry points. */
EXPORT ssize_t __read_chk(int fd, void *buf, size_t len, size_t buflen)
{
	if (len > buflen)
		abort();
	return read(fd, buf, len);
}

EXPORT ssize_t __recv_chk(int fd, void *buf, size_t len, size_t buflen, int flags)
{
	if (len > buflen)
		abort();
	return recv(fd, buf, len, flags);
}

EXPORT ssize_t __recvfrom_chk(int fd, void *buf, size_t len, size_t buflen, int flags,
			      struct sockaddr *addr, socklen_t *alen)
{
	if (len > buflen)
		abort();
	return recvfrom(fd, buf, len, flags, addr, alen);
}

/*
 * dprintf and vdprintf write through the C library's own write, which no
 * preload sees: on a socket of ours the text is formatted here and sent
 * through the session.  As the C library's: the count of bytes, or -1
 * when a write fails (what went before it is gone, as from a stdio
 * stream); an interrupted or would-block write is a failure too.
 */
static int print_send(struct wsd_sock *s, const char *buf, int len)
{
	ssize_t r = 0;

	for (int done = 0; done < len; done += (int)r) {
		struct iovec v = { (char *)buf + done, (size_t)(len - done) };

		r = sock_send(s, &v, 1, 0);
		if (r <= 0) {
			errno = r ? (int)-r : EIO;
			return -1;
		}
	}
	return len;
}

static int do_vdprintf(int fd, int flag, bool chk, const char *fmt, va_list ap)
{
	extern int __vasprintf_chk(char **, int, const char *, va_list);
	struct wsd_sock *s = data_sock(fd);
	char *buf;
	int len;

	if (!s)
		return chk ? real.__vdprintf_chk(fd, flag, fmt, ap) : real.vdprintf(fd, fmt, ap);
	/* the checked formatter keeps _FORTIFY_SOURCE's %n rule */
	len = chk ? __vasprintf_chk(&buf, flag, fmt, ap) : vasprintf(&buf, fmt, ap);
	if (len >= 0) {
		len = print_send(s, buf, len);
		free(buf);
	}
	wsd_sock_put(s);
	return len;
}

EXPORT int vdprintf(int fd, const char *fmt, va_list ap)
{
	return do_vdprintf(fd, 0, false, fmt, ap);
}

EXPORT int __vdprintf_chk(int fd, int flag, const char *fmt, va_list ap)
{
	return do_vdprintf(fd, flag, true, fmt, ap);
}

EXPORT int dprintf(int fd, const char *fmt, ...)
{
	va_list ap;
	int r;

	va_start(ap, fmt);
	r = do_vdprintf(fd, 0, false, fmt, ap);
	va_end(ap);
	return r;
}

EXPORT int __dprintf_chk(int fd, int flag, const char *fmt, ...)
{
	va_list ap;
	int r;

	va_start(ap, fmt);
	r = do_vdprintf(fd, flag, true, fmt, ap);
	va_end(ap);
	return r;
}

/* ---- sendfile and splice: a correct copy loop through the session ------------------ */

#define COPY_CHUNK 65536

/*
 * Send all of buf on a blocking socket (the kernel's sendfile takes it all
 * too).  EAGAIN (SO_SNDTIMEO ran out) ends it with what went, unless the
 * bytes were already taken from their source (must): then it waits on.
 * No MSG_NOSIGNAL: the kernel's sendfile and splice raise SIGPIPE too.
 */
static ssize_t send_all(struct wsd_sock *s, const char *buf, size_t len, size_t *sent, bool must)
{
	*sent = 0;
	while (*sent < len) {
		struct iovec v = { (char *)buf + *sent, len - *sent };
		ssize_t r = wsd_sock_send(s, &v, 1, 0);

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
	char *buf;

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
	if (!(buf = malloc(COPY_CHUNK)))
		return -ENOMEM;
	while (total < count) {
		size_t want = count - total < COPY_CHUNK ? count - total : COPY_CHUNK;

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
	free(buf);
	return total ? (ssize_t)total : r;
}

EXPORT ssize_t sendfile(int out, int in, off_t *off, size_t count)
{
	struct wsd_sock *s = data_sock(out);
	ssize_t r;

	if (!s)
		return real.sendfile(out, in, off, count);
	r = file_to_sock(s, in, off, count);
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
 * socket -> pipe.  The pipe may have fewer free slots than free bytes, so
 * how much it takes is known only once written, and bytes taken from the
 * socket cannot be put back.  But a pipe that polls writable has a free
 * slot, and a write of at most a page into a free slot always goes in
 * whole: so the bytes move a page at a time, each only once the pipe says
 * it has room for it.  As in the kernel, the call first waits for room in
 * the pipe (EAGAIN at once when the pipe or the call is non-blocking),
 * then for data as the socket's own O_NONBLOCK says, and returns what fit.
 */
#define PIPE_PAGE 4096

static ssize_t sock_to_pipe(struct wsd_sock *s, int out, size_t len, unsigned int flags)
{
	int pfl = real.fcntl(out, F_GETFL), rflags = 0;
	bool nb = (flags & SPLICE_F_NONBLOCK) || (pfl >= 0 && (pfl & O_NONBLOCK));
	char buf[PIPE_PAGE];
	size_t done = 0;
	ssize_t r = 0;

	while (done < len) {
		struct pollfd p = { .fd = out, .events = POLLOUT };
		struct msghdr m = { 0 };
		struct iovec v = { buf, len - done < PIPE_PAGE ? len - done : PIPE_PAGE };
		ssize_t w = 0, k;
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
		m.msg_iov = &v;
		m.msg_iovlen = 1;
		r = sock_recv(s, &m, rflags);
		if (r <= 0)
			break;
		/* a writer of its own may have filled the pipe since: then wait for room */
		while (w < r && ((k = real.write(out, buf + w, (size_t)(r - w))) > 0 ||
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
		rflags = MSG_DONTWAIT;   /* the rest is what is there now */
	}
	return done ? (ssize_t)done : r;
}

/*
 * pipe -> socket.  A blocking socket takes all that is read from the pipe.
 * A non-blocking one may take less, or nothing: the pipe's bytes are
 * copied first (tee into a pipe of our own, which consumes nothing), sent,
 * and exactly what went is then read from the pipe.
 */
static ssize_t pipe_to_sock(struct wsd_sock *s, int in, size_t len, unsigned int flags)
{
	size_t want = len < COPY_CHUNK ? len : COPY_CHUNK, sent = 0;
	struct pollfd p = { .fd = in, .events = POLLIN };
	int tp[2] = { -1, -1 }, pfl = real.fcntl(in, F_GETFL);
	ssize_t r, got;
	char *buf;

	/* an empty pipe: no wait when it or the call is non-blocking */
	if (((flags & SPLICE_F_NONBLOCK) || (pfl >= 0 && (pfl & O_NONBLOCK))) &&
	    real.poll(&p, 1, 0) == 0)
		return -EAGAIN;
	if (!(buf = malloc(want)))
		return -ENOMEM;
	if (s->nonblock && pipe2(tp, O_CLOEXEC) == 0) {
		/* wait for data (or the end) as the kernel would, then copy it */
		while ((r = tee(in, tp[1], want, SPLICE_F_NONBLOCK)) < 0 && errno == EAGAIN &&
		       real.poll(&p, 1, -1) >= 0)
			;
		got = r > 0 ? real.read(tp[0], buf, (size_t)r) : r;
		real.close(tp[0]);
		real.close(tp[1]);
		if (got <= 0) {
			free(buf);
			return got < 0 ? -errno : 0;
		}
		{
			struct iovec v = { buf, (size_t)got };

			r = wsd_sock_send(s, &v, 1, 0);
		}
		if (r > 0 && real.read(in, buf, (size_t)r) != r)
			r = -EIO;    /* another reader took them meanwhile */
		free(buf);
		return r;
	}
	got = real.read(in, buf, want);
	if (got > 0) {
		r = send_all(s, buf, (size_t)got, &sent, true);
		r = sent ? (ssize_t)sent : r;
	} else {
		r = got < 0 ? -errno : 0;
	}
	free(buf);
	return r;
}

EXPORT ssize_t splice(int in, off_t *off_in, int out, off_t *off_out, size_t len,
		      unsigned int flags)
{
	struct wsd_sock *si = data_sock(in), *so = si ? NULL : data_sock(out);
	struct stat st;
	ssize_t r;

	if (!si && !so)
		return real.splice(in, off_in, out, off_out, len, flags);
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
	if (si)
		wsd_sock_put(si);
	if (so)
		wsd_sock_put(so);
	return wsd_ret(r);
}

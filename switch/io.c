/* SPDX-License-Identifier: MIT */
/*
 * The data calls under the preload.  An fd that names no socket of ours
 * (files, pipes, unix sockets, listeners) goes straight to the C library;
 * a TCP socket goes through the session, which is the kernel stream itself
 * until a direction switches.  sendfile and splice are in copy.c, syscall()
 * in raw.c.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "switch/switch.h"

struct wsd_sock *wsd_data_sock(int fd)
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
ssize_t wsd_io_recv(struct wsd_sock *s, struct msghdr *m, int flags)
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
	ssize_t r = wsd_io_recv(s, &m, flags);

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
	struct wsd_sock *s = wsd_data_sock(fd);
	struct iovec v = { buf, len };

	return s ? do_recv(s, &v, 1, 0) : real.read(fd, buf, len);
}

EXPORT ssize_t write(int fd, const void *buf, size_t len)
{
	struct wsd_sock *s = wsd_data_sock(fd);
	struct iovec v = { (void *)buf, len };

	return s ? do_send(s, &v, 1, 0) : real.write(fd, buf, len);
}

EXPORT ssize_t readv(int fd, const struct iovec *iov, int n)
{
	struct wsd_sock *s = wsd_data_sock(fd);

	if (s && (n < 0 || n > IOV_MAX)) {
		wsd_sock_put(s);
		errno = EINVAL;
		return -1;
	}
	return s ? do_recv(s, iov, n, 0) : real.readv(fd, iov, n);
}

EXPORT ssize_t writev(int fd, const struct iovec *iov, int n)
{
	struct wsd_sock *s = wsd_data_sock(fd);

	if (s && (n < 0 || n > IOV_MAX)) {
		wsd_sock_put(s);
		errno = EINVAL;
		return -1;
	}
	return s ? do_send(s, iov, n, 0) : real.writev(fd, iov, n);
}

EXPORT ssize_t recv(int fd, void *buf, size_t len, int flags)
{
	struct wsd_sock *s = wsd_data_sock(fd);
	struct iovec v = { buf, len };

	return s ? do_recv(s, &v, 1, flags) : real.recv(fd, buf, len, flags);
}

EXPORT ssize_t send(int fd, const void *buf, size_t len, int flags)
{
	struct wsd_sock *s = wsd_data_sock(fd);
	struct iovec v = { (void *)buf, len };

	return s ? do_send(s, &v, 1, flags) : real.send(fd, buf, len, flags);
}

EXPORT ssize_t recvfrom(int fd, void *buf, size_t len, int flags, struct sockaddr *addr,
			socklen_t *alen)
{
	struct wsd_sock *s = wsd_data_sock(fd);
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
	struct wsd_sock *s = wsd_data_sock(fd);
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
	r = wsd_io_recv(s, m, flags);
	if (r >= 0 && !(flags & MSG_ERRQUEUE) && !(flags & MSG_OOB)) {
		m->msg_namelen = 0;
		m->msg_controllen = 0;
		m->msg_flags = 0;
	}
	return r;
}

EXPORT ssize_t recvmsg(int fd, struct msghdr *m, int flags)
{
	struct wsd_sock *s = wsd_data_sock(fd);
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
	struct wsd_sock *s = wsd_data_sock(fd);
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
	struct wsd_sock *s = wsd_data_sock(fd);
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
	struct wsd_sock *s = wsd_data_sock(fd);
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
	struct wsd_sock *s = wsd_data_sock(fd);
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

		r = wsd_io_recv(s, &m, (rwf & RWF_NOWAIT) ? MSG_DONTWAIT : 0);
	}
	wsd_sock_put(s);
	return wsd_ret(r);
}

static ssize_t pos_write(int fd, const struct iovec *iov, int n, off64_t off, int rwf, bool v2)
{
	struct wsd_sock *s = wsd_data_sock(fd);
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

/* The 64-bit names are the same calls on LP64 (off_t is 64 bits). */
EXPORT ssize_t preadv64(int fd, const struct iovec *iov, int n, off64_t off)
	__attribute__((alias("preadv")));

EXPORT ssize_t preadv2(int fd, const struct iovec *iov, int n, off_t off, int rwf)
{
	return pos_read(fd, iov, n, off, rwf, true);
}

EXPORT ssize_t preadv64v2(int fd, const struct iovec *iov, int n, off64_t off, int rwf)
	__attribute__((alias("preadv2")));

EXPORT ssize_t pwritev(int fd, const struct iovec *iov, int n, off_t off)
{
	return pos_write(fd, iov, n, off, 0, false);
}

EXPORT ssize_t pwritev64(int fd, const struct iovec *iov, int n, off64_t off)
	__attribute__((alias("pwritev")));

EXPORT ssize_t pwritev2(int fd, const struct iovec *iov, int n, off_t off, int rwf)
{
	return pos_write(fd, iov, n, off, rwf, true);
}

EXPORT ssize_t pwritev64v2(int fd, const struct iovec *iov, int n, off64_t off, int rwf)
	__attribute__((alias("pwritev2")));

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
	struct wsd_sock *s = wsd_data_sock(fd);
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

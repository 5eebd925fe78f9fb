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
#include <limits.h>
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

static ssize_t do_recv(struct wsd_sock *s, const struct iovec *iov, int n, int flags)
{
	ssize_t r = wsd_sock_recv(s, iov, n, flags);

	wsd_sock_put(s);
	return wsd_ret(r);
}

static ssize_t do_send(struct wsd_sock *s, const struct iovec *iov, int n, int flags)
{
	ssize_t r = wsd_sock_send(s, iov, n, flags);

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

	return s ? do_send(s, &v, 1, flags) : real.sendto(fd, buf, len, flags, addr, alen);
}

EXPORT ssize_t recvmsg(int fd, struct msghdr *m, int flags)
{
	struct wsd_sock *s = data_sock(fd);
	ssize_t r;

	if (!s)
		return real.recvmsg(fd, m, flags);
	if ((int)m->msg_iovlen < 0 || m->msg_iovlen > IOV_MAX) {
		wsd_sock_put(s);
		errno = EMSGSIZE;
		return -1;
	}
	r = do_recv(s, m->msg_iov, (int)m->msg_iovlen, flags);
	if (r >= 0) {
		m->msg_namelen = 0;
		m->msg_controllen = 0;
		m->msg_flags = 0;
	}
	return r;
}

EXPORT ssize_t sendmsg(int fd, const struct msghdr *m, int flags)
{
	struct wsd_sock *s = data_sock(fd);

	if (!s)
		return real.sendmsg(fd, m, flags);
	if ((int)m->msg_iovlen < 0 || m->msg_iovlen > IOV_MAX) {
		wsd_sock_put(s);
		errno = EMSGSIZE;
		return -1;
	}
	return do_send(s, m->msg_iov, (int)m->msg_iovlen, flags);
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

/* ---- sendfile and splice: a correct copy loop through the session ------------------ */

#define COPY_CHUNK 65536

/* Send all of buf (a non-blocking socket waits too: the bytes are already taken). */
static ssize_t send_all(struct wsd_sock *s, const char *buf, size_t len, size_t *sent)
{
	*sent = 0;
	while (*sent < len) {
		struct iovec v = { (char *)buf + *sent, len - *sent };
		ssize_t r = wsd_sock_send(s, &v, 1, MSG_NOSIGNAL);

		if (r == -EAGAIN) {
			struct pollfd p = { .fd = s->fd, .events = POLLOUT };

			poll(&p, 1, 10);
			continue;
		}
		if (r < 0)
			return r;
		*sent += (size_t)r;
	}
	return 0;
}

EXPORT ssize_t sendfile(int out, int in, off_t *off, size_t count)
{
	struct wsd_sock *s = data_sock(out);
	char *buf;
	off_t pos;
	ssize_t got, r = 0;
	size_t total = 0, sent;

	if (!s)
		return real.sendfile(out, in, off, count);
	buf = malloc(COPY_CHUNK);
	pos = off ? *off : lseek(in, 0, SEEK_CUR);
	if (!buf || pos < 0) {
		r = buf ? -errno : -ENOMEM;
		goto out;
	}
	while (total < count) {
		size_t want = count - total < COPY_CHUNK ? count - total : COPY_CHUNK;

		got = pread(in, buf, want, pos);
		if (got < 0) {
			r = -errno;
			break;
		}
		if (got == 0)
			break;
		r = send_all(s, buf, (size_t)got, &sent);
		total += sent;
		pos += (off_t)sent;
		if (r < 0 || s->nonblock)
			break;
	}
	if (off)
		*off = pos;
	else
		lseek(in, pos, SEEK_SET);
out:
	free(buf);
	wsd_sock_put(s);
	return total ? (ssize_t)total : wsd_ret(r);
}

EXPORT ssize_t splice(int in, off_t *off_in, int out, off_t *off_out, size_t len,
		      unsigned int flags)
{
	struct wsd_sock *si = data_sock(in), *so = si ? NULL : data_sock(out);
	char *buf;
	ssize_t r;

	if (!si && !so)
		return real.splice(in, off_in, out, off_out, len, flags);
	buf = malloc(COPY_CHUNK);
	if (!buf) {
		r = -ENOMEM;
	} else if (si) {
		/* socket -> pipe: take no more than the pipe can hold now */
		int size = real.fcntl(out, F_GETPIPE_SZ), used = 0;
		size_t want = len < COPY_CHUNK ? len : COPY_CHUNK;
		struct iovec v = { buf, want };

		if (size > 0 && real.ioctl(out, FIONREAD, &used) == 0 &&
		    (size_t)(size - used) < want)
			v.iov_len = (size_t)(size - used) ? (size_t)(size - used) : 1;
		r = wsd_sock_recv(si, &v, 1, (flags & SPLICE_F_NONBLOCK) ? MSG_DONTWAIT : 0);
		if (r > 0) {
			ssize_t w = 0, k;

			while (w < r && (k = real.write(out, buf + w, (size_t)(r - w))) > 0)
				w += k;
			r = w;
		}
	} else {
		size_t sent = 0;

		r = real.read(in, buf, len < COPY_CHUNK ? len : COPY_CHUNK);
		if (r > 0) {
			ssize_t e = send_all(so, buf, (size_t)r, &sent);

			r = sent ? (ssize_t)sent : e;
		} else if (r < 0) {
			r = -errno;
		}
	}
	free(buf);
	if (si)
		wsd_sock_put(si);
	if (so)
		wsd_sock_put(so);
	return wsd_ret(r);
}

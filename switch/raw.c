/* SPDX-License-Identifier: MIT */
/*
 * syscall() itself.  A program may read or write a socket by number
 * (syscall(SYS_write, ...)) and no interposed name would see the bytes: on
 * an accelerated connection they would go around the session, and a read
 * would take a doorbell for data.  The numbers that move stream bytes,
 * name a socket's descriptors or set its O_NONBLOCK (fcntl, ioctl), and
 * those of its life and readiness the switch interposes by name (socket
 * to shutdown, poll, select, epoll, execve) go to the interposed call of
 * the same name, which returns -1 and sets errno as
 * syscall() does; io_uring_setup runs and then moves every socket back to
 * TCP (guard.c); fork and vfork go to fork(), so that its handlers run;
 * any other number is the kernel's, with all six arguments.
 *
 * The pass-through issues the system call itself: the memory hooks call
 * syscall() (munmap) from inside the C library, before and while `real`
 * is filled, where a dlsym of our own could deadlock.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/sched.h>
#include <sched.h>
#include <stdarg.h>
#include <sys/ioctl.h>
#include <sys/sendfile.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "provider/internal.h"
#include "switch/switch.h"

#if defined(__x86_64__)
static long sys6(long nr, long a, long b, long c, long d, long e, long f)
{
	register long r10 __asm__("r10") = d;
	register long r8 __asm__("r8") = e;
	register long r9 __asm__("r9") = f;
	long ret;

	__asm__ volatile("syscall"
			 : "=a"(ret)
			 : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
			 : "rcx", "r11", "memory");
	return ret;
}
#elif defined(__aarch64__)
static long sys6(long nr, long a, long b, long c, long d, long e, long f)
{
	register long x8 __asm__("x8") = nr;
	register long x0 __asm__("x0") = a;
	register long x1 __asm__("x1") = b;
	register long x2 __asm__("x2") = c;
	register long x3 __asm__("x3") = d;
	register long x4 __asm__("x4") = e;
	register long x5 __asm__("x5") = f;

	__asm__ volatile("svc 0"
			 : "+r"(x0)
			 : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5)
			 : "memory");
	return x0;
}
#else
#error "switch/raw.c: no system call sequence for this architecture"
#endif

/* The kernel's result as syscall() gives it: -1 and errno for -4095..-1. */
static long pass(long nr, const long *a)
{
	long r = sys6(nr, a[0], a[1], a[2], a[3], a[4], a[5]);

	if (r < 0 && r > -4096) {
		errno = (int)-r;
		return -1;
	}
	return r;
}

/* preadv/pwritev's offset comes in two halves (the kernel's pos_from_hilo) */
static off64_t pos_of(long lo, long hi)
{
	return (off64_t)((((unsigned long long)(unsigned long)hi << (sizeof(long) * 4)) <<
			  (sizeof(long) * 4)) | (unsigned long)lo);
}

EXPORT long syscall(long nr, ...)
{
	va_list ap;
	long a[6], r;

	/* as the C library's: six register-sized arguments, used or not */
	va_start(ap, nr);
	for (int i = 0; i < 6; i++)
		a[i] = va_arg(ap, long);
	va_end(ap);

	switch (nr) {
	/*
	 * A child by number: fork and vfork go to the C library's fork, whose
	 * handlers move shared connections to the stream as for any fork; a
	 * clone with its own memory and on this stack at least forgets our
	 * pid and random bytes (provider/self.c), which are its parent's.
	 */
#ifdef SYS_fork
	case SYS_fork:
		return fork();
#endif
#ifdef SYS_vfork
	case SYS_vfork:
		return vfork();
#endif
	case SYS_clone:
		r = pass(nr, a);
		if (r == 0 && !((unsigned long)a[0] & CLONE_VM))
			wsd_self_forget();
		return r;
#ifdef SYS_clone3
	case SYS_clone3:
		r = pass(nr, a);
		if (r == 0 && a[0] && !(((const struct clone_args *)a[0])->flags & CLONE_VM))
			wsd_self_forget();
		return r;
#endif
	case SYS_io_uring_setup:
		r = pass(nr, a);
		if (r >= 0)
			wsd_guard_io_uring();
		return r;
	case SYS_read:
		return read((int)a[0], (void *)a[1], (size_t)a[2]);
	case SYS_write:
		return write((int)a[0], (const void *)a[1], (size_t)a[2]);
	case SYS_readv:
		return readv((int)a[0], (const struct iovec *)a[1], (int)a[2]);
	case SYS_writev:
		return writev((int)a[0], (const struct iovec *)a[1], (int)a[2]);
	case SYS_pread64:
		return pread64((int)a[0], (void *)a[1], (size_t)a[2], (off64_t)a[3]);
	case SYS_pwrite64:
		return pwrite64((int)a[0], (const void *)a[1], (size_t)a[2], (off64_t)a[3]);
	case SYS_preadv:
		return preadv64((int)a[0], (const struct iovec *)a[1], (int)a[2], pos_of(a[3], a[4]));
	case SYS_pwritev:
		return pwritev64((int)a[0], (const struct iovec *)a[1], (int)a[2],
				 pos_of(a[3], a[4]));
	case SYS_preadv2:
		return preadv64v2((int)a[0], (const struct iovec *)a[1], (int)a[2],
				  pos_of(a[3], a[4]), (int)a[5]);
	case SYS_pwritev2:
		return pwritev64v2((int)a[0], (const struct iovec *)a[1], (int)a[2],
				   pos_of(a[3], a[4]), (int)a[5]);
	case SYS_recvfrom:
		return recvfrom((int)a[0], (void *)a[1], (size_t)a[2], (int)a[3],
				(struct sockaddr *)a[4], (socklen_t *)a[5]);
	case SYS_sendto:
		return sendto((int)a[0], (const void *)a[1], (size_t)a[2], (int)a[3],
			      (const struct sockaddr *)a[4], (socklen_t)a[5]);
	case SYS_recvmsg:
		return recvmsg((int)a[0], (struct msghdr *)a[1], (int)a[2]);
	case SYS_sendmsg:
		return sendmsg((int)a[0], (const struct msghdr *)a[1], (int)a[2]);
	case SYS_recvmmsg:
		return recvmmsg((int)a[0], (struct mmsghdr *)a[1], (unsigned int)a[2], (int)a[3],
				(struct timespec *)a[4]);
	case SYS_sendmmsg:
		return sendmmsg((int)a[0], (struct mmsghdr *)a[1], (unsigned int)a[2], (int)a[3]);
	case SYS_sendfile:
		return sendfile64((int)a[0], (int)a[1], (off64_t *)a[2], (size_t)a[3]);
	case SYS_splice:
		return splice((int)a[0], (off64_t *)a[1], (int)a[2], (off64_t *)a[3], (size_t)a[4],
			      (unsigned int)a[5]);
	case SYS_close:
		return close((int)a[0]);
#ifdef SYS_close_range
	case SYS_close_range:
		return close_range((unsigned int)a[0], (unsigned int)a[1], (int)a[2]);
#endif
	case SYS_dup:
		return dup((int)a[0]);
#ifdef SYS_dup2
	case SYS_dup2:
		return dup2((int)a[0], (int)a[1]);
#endif
	case SYS_dup3:
		return dup3((int)a[0], (int)a[1], (int)a[2]);
	/*
	 * fcntl and ioctl whole: F_DUPFD* makes a descriptor, and F_SETFL and
	 * FIONBIO set the O_NONBLOCK the session waits by.
	 */
	case SYS_fcntl:
		return fcntl((int)a[0], (int)a[1], (void *)a[2]);
	case SYS_ioctl:
		return ioctl((int)a[0], (unsigned long)a[1], (void *)a[2]);
	/* the socket's life and readiness: the switch must see these too */
	case SYS_socket:
		return socket((int)a[0], (int)a[1], (int)a[2]);
	case SYS_connect:
		return connect((int)a[0], (const struct sockaddr *)a[1], (socklen_t)a[2]);
	case SYS_listen:
		return listen((int)a[0], (int)a[1]);
	case SYS_accept:
		return accept((int)a[0], (struct sockaddr *)a[1], (socklen_t *)a[2]);
	case SYS_accept4:
		return accept4((int)a[0], (struct sockaddr *)a[1], (socklen_t *)a[2], (int)a[3]);
	case SYS_shutdown:
		return shutdown((int)a[0], (int)a[1]);
	case SYS_setsockopt:
		return setsockopt((int)a[0], (int)a[1], (int)a[2], (const void *)a[3],
				  (socklen_t)a[4]);
	case SYS_getsockopt:
		return getsockopt((int)a[0], (int)a[1], (int)a[2], (void *)a[3], (socklen_t *)a[4]);
	case SYS_epoll_create1:
		return epoll_create1((int)a[0]);
	case SYS_epoll_ctl:
		return epoll_ctl((int)a[0], (int)a[1], (int)a[2], (struct epoll_event *)a[3]);
#ifdef SYS_poll
	case SYS_poll:
		return poll((struct pollfd *)a[0], (nfds_t)a[1], (int)a[2]);
#endif
#ifdef SYS_epoll_wait
	case SYS_epoll_wait:
		return epoll_wait((int)a[0], (struct epoll_event *)a[1], (int)a[2], (int)a[3]);
#endif
#ifdef SYS_select
	case SYS_select:
		return select((int)a[0], (fd_set *)a[1], (fd_set *)a[2], (fd_set *)a[3],
			      (struct timeval *)a[4]);
#endif
	case SYS_execve:
		return execve((const char *)a[0], (char *const *)a[1], (char *const *)a[2]);
	default:
		return pass(nr, a);
	}
}

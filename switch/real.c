/* SPDX-License-Identifier: MIT */
/*
 * The C library's own socket calls, found behind ours with dlsym(RTLD_NEXT).
 * Filled once; every interposed call asks first, since other libraries'
 * constructors may call socket() before ours runs.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "switch/switch.h"

struct real_calls real;
static pthread_once_t real_once = PTHREAD_ONCE_INIT;

void *wsd_real_next(const char *name)
{
	void *p = dlsym(RTLD_NEXT, name);

	if (!p) {
		fprintf(stderr, "libwsd: the C library has no %s: %s\n", name, dlerror());
		abort();
	}
	return p;
}

#define FILL(name) real.name = wsd_real_next(#name)

static void fill(void)
{
	FILL(socket); FILL(connect); FILL(bind); FILL(listen); FILL(accept); FILL(accept4);
	FILL(close); FILL(shutdown); FILL(read); FILL(write); FILL(readv); FILL(writev);
	FILL(recv); FILL(send); FILL(recvfrom); FILL(sendto); FILL(recvmsg); FILL(sendmsg);
	FILL(sendfile); FILL(splice); FILL(poll); FILL(ppoll); FILL(select); FILL(pselect);
	FILL(epoll_create); FILL(epoll_create1); FILL(epoll_ctl); FILL(epoll_wait);
	FILL(epoll_pwait); FILL(dup); FILL(dup2); FILL(dup3); FILL(fcntl); FILL(ioctl);
	FILL(fork); FILL(setsockopt); FILL(getsockopt);
	FILL(sendmmsg); FILL(recvmmsg); FILL(preadv64); FILL(pwritev64); FILL(preadv64v2);
	FILL(pwritev64v2); FILL(vdprintf); FILL(__vdprintf_chk);
}

void wsd_real_init(void)
{
	pthread_once(&real_once, fill);
}

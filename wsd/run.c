/* SPDX-License-Identifier: MIT */
/*
 * wsd run: start a program with the switch (libwsd-preload.so) preloaded
 * and the runtime parameters the options give.  A setuid or setgid program
 * is named, not silently left slow: the loader ignores LD_PRELOAD for it.
 */
#define _GNU_SOURCE   /* dl_iterate_phdr, in a sanitizer build */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "wsd/cmd.h"

#ifdef WSD_SANITIZERS
#include <link.h>

static int find_asan(struct dl_phdr_info *info, size_t size, void *data)
{
	(void)size;
	if (info->dlpi_name && strstr(info->dlpi_name, "/libasan.so")) {
		*(const char **)data = info->dlpi_name;
		return 1;
	}
	return 0;
}
#endif

/*
 * A sanitizer build's libwsd-preload.so (and the libwsd.so it loads) needs
 * the sanitizer runtime loaded before anything else, or its interceptors
 * and ours meet uninitialised: preload the runtime this command itself
 * runs with, first.  NULL otherwise.
 */
static const char *sanitizer_runtime(void)
{
#ifdef WSD_SANITIZERS
	const char *path = NULL;

	dl_iterate_phdr(find_asan, &path);
	return path;
#else
	return NULL;
#endif
}

/* the installed switch: $(pkglibdir)/libwsd-preload.so, from the Makefile */
#ifndef WSD_PRELOAD
#define WSD_PRELOAD "/usr/local/lib/wsd/libwsd-preload.so"
#endif

static int usable(const char *path)
{
	return path && access(path, R_OK) == 0;
}

/*
 * The switch: --lib, WSD_LIB, the build tree next to this program
 * (.libs/libwsd-preload.so when run from a build, which finds the build's
 * libwsd.so by its run path), or the installed one.
 */
static const char *find_library(const char *opt, char *buf, size_t len)
{
	char self[PATH_MAX / 2];   /* room for the suffixes in buf */
	ssize_t n;

	if (opt)
		return usable(opt) ? opt : NULL;
	if (usable(getenv("WSD_LIB")))
		return getenv("WSD_LIB");
	n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n > 0) {
		char *slash;

		self[n] = '\0';
		slash = strrchr(self, '/');
		if (slash) {
			*slash = '\0';
			/* a libtool build: wsd/.libs/wsd or wsd/wsd next to .libs/ */
			snprintf(buf, len, "%s/../.libs/libwsd-preload.so", self);
			if (usable(buf))
				return buf;
			snprintf(buf, len, "%s/../../.libs/libwsd-preload.so", self);
			if (usable(buf))
				return buf;
		}
	}
	return usable(WSD_PRELOAD) ? WSD_PRELOAD : NULL;
}

/* The file execvp would run for name, or NULL. */
static const char *resolve(const char *name, char *buf, size_t len)
{
	const char *path = getenv("PATH");

	if (strchr(name, '/'))
		return name;
	if (!path)
		path = "/usr/bin:/bin";
	while (*path) {
		size_t k = strcspn(path, ":");

		snprintf(buf, len, "%.*s/%s", (int)k, k ? path : ".", name);
		if (access(buf, X_OK) == 0)
			return buf;
		path += k + (path[k] == ':');
	}
	return NULL;
}

static int usage(void)
{
	fprintf(stderr, "usage: wsd run [--transport auto|shm|verbs] [--spin-us N] [--debug]\n"
			"               [--lib PATH] -- PROGRAM [ARGS...]\n");
	return 2;
}

int cmd_run(int argc, char **argv)
{
	const char *lib_opt = NULL, *lib, *prog, *old;
	char libbuf[PATH_MAX], progbuf[PATH_MAX], *preload;
	struct stat st;
	int i;

	for (i = 1; i < argc && strcmp(argv[i], "--"); i++) {
		if (!strcmp(argv[i], "--transport") && i + 1 < argc) {
			const char *t = argv[++i];

			if (strcmp(t, "auto") && strcmp(t, "shm") && strcmp(t, "verbs")) {
				fprintf(stderr, "wsd run: unknown transport '%s'\n", t);
				return 2;
			}
			setenv("WSD_TRANSPORT", t, 1);
		} else if (!strcmp(argv[i], "--spin-us") && i + 1 < argc) {
			char *end;
			long v = strtol(argv[++i], &end, 10);

			if (*end || v < 0) {
				fprintf(stderr, "wsd run: --spin-us wants a number of microseconds\n");
				return 2;
			}
			setenv("WSD_SPIN_US", argv[i], 1);
		} else if (!strcmp(argv[i], "--debug")) {
			setenv("WSD_DEBUG", "1", 1);
		} else if (!strcmp(argv[i], "--lib") && i + 1 < argc) {
			lib_opt = argv[++i];
		} else {
			return usage();
		}
	}
	if (i + 1 >= argc)
		return usage();
	argv += i + 1;
	lib = find_library(lib_opt, libbuf, sizeof(libbuf));
	if (!lib) {
		fprintf(stderr, "wsd run: libwsd-preload.so not found (give --lib or WSD_LIB)\n");
		return 1;
	}
	prog = resolve(argv[0], progbuf, sizeof(progbuf));
	if (!prog) {
		fprintf(stderr, "wsd run: %s: command not found\n", argv[0]);
		return 127;
	}
	if (stat(prog, &st) == 0 &&
	    (((st.st_mode & S_ISUID) && st.st_uid != getuid()) ||
	     ((st.st_mode & S_ISGID) && st.st_gid != getgid())))
		fprintf(stderr, "wsd run: %s is set-user-ID or set-group-ID: the loader ignores "
				"LD_PRELOAD for it, so it runs without wsd\n", prog);
	/* ahead of whatever the environment already preloads */
	old = getenv("LD_PRELOAD");
	{
		const char *first = sanitizer_runtime();
		size_t n = strlen(lib) + (old ? strlen(old) : 0) + (first ? strlen(first) : 0) + 3;

		preload = malloc(n);
		if (!preload)
			return 1;
		snprintf(preload, n, "%s%s%s%s%s", first ? first : "", first ? ":" : "", lib,
			 old && *old ? ":" : "", old && *old ? old : "");
	}
	if (!preload || setenv("LD_PRELOAD", preload, 1) < 0)
		return 1;
	execv(prog, argv);
	fprintf(stderr, "wsd run: %s: %s\n", prog, strerror(errno));
	return errno == ENOENT ? 127 : 126;
}

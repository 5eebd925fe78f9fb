/* SPDX-License-Identifier: MIT */
/* The fault points of provider/fault.h, in the test build only. */
#ifdef WSD_FAULT_HOOKS
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "provider/fault.h"

#define MAX_POINTS 8

static struct point {
	char name[32];
	long arg, at;
	bool on;                      /* "@N+": from the Nth pass on */
	_Atomic long passes;
} points[MAX_POINTS];
static int npoints;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void parse(void)
{
	const char *e = getenv("WSD_FAULT");
	char buf[256], *save = NULL;

	if (!e || strlen(e) >= sizeof(buf))
		return;
	strcpy(buf, e);
	for (char *t = strtok_r(buf, ",", &save); t && npoints < MAX_POINTS;
	     t = strtok_r(NULL, ",", &save)) {
		struct point *p = &points[npoints];
		char *at = strchr(t, '@'), *eq;

		if (at) {
			*at = 0;
			char *end;

			p->at = strtol(at + 1, &end, 0);
			p->on = *end == '+';
		}
		eq = strchr(t, '=');
		if (eq) {
			*eq = 0;
			p->arg = strtol(eq + 1, NULL, 0);
		}
		if (p->at < 1)
			p->at = 1;
		snprintf(p->name, sizeof(p->name), "%s", t);
		npoints++;
	}
}

bool wsd_fault(const char *point, long *arg)
{
	pthread_once(&once, parse);
	for (int i = 0; i < npoints; i++) {
		if (strcmp(points[i].name, point))
			continue;
		long n = atomic_fetch_add(&points[i].passes, 1) + 1;

		if (n < points[i].at || (n > points[i].at && !points[i].on))
			return false;
		if (arg)
			*arg = points[i].arg;
		if (n == points[i].at)
			fprintf(stderr, "wsd fault: %s fires\n", point);
		return true;
	}
	return false;
}
#endif

/* SPDX-License-Identifier: MIT */
/*
 * Fault points, for tests/fault only.  A build with -DWSD_FAULT_HOOKS (the
 * test copy of the library, tests/fault/libwsd_fault.la) reads WSD_FAULT,
 * a comma-separated list of POINT[=ARG][@N[+]]: the point's Nth pass (1
 * by default) fires, once, or with "+" every pass from the Nth on, and
 * hands ARG (0 by default) to the site.  Every
 * other build compiles each point to "no fault", so the shipped library
 * has none of this.  The points are listed in tests/fault/README.md.
 */
#ifndef WSD_PROVIDER_FAULT_H
#define WSD_PROVIDER_FAULT_H

#include <stdbool.h>

#ifdef WSD_FAULT_HOOKS
__attribute__((visibility("hidden"))) bool wsd_fault(const char *point, long *arg);
#else
static inline bool wsd_fault(const char *point, long *arg)
{
	(void)point;
	(void)arg;
	return false;
}
#endif

#endif

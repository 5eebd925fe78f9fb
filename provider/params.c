/* SPDX-License-Identifier: MIT */
#include <stdlib.h>
#include <string.h>

#include "provider/internal.h"

/* Every runtime parameter, declared once; `wsd info` lists this table. */
static const struct wsd_param params[] = {
	{ "WSD_TRANSPORT", "string", "auto",
	  "transport for adapters opened without a name: auto, shm or verbs" },
	{ "WSD_VERBS_DEVICE", "string", "",
	  "RDMA device the verbs transport uses (empty: the first one)" },
	{ "WSD_SPIN_US", "integer", "50",
	  "microseconds a waiter polls (yielding between polls) before it sleeps" },
	{ "WSD_SHM_RING_SIZE", "integer", "262144",
	  "bytes in each direction's shared-memory ring (power of two, 4 KiB to 64 MiB)" },
	{ "WSD_SHM_WINDOWS", "integer", "256",
	  "memory windows one shm endpoint can have bound at once" },
};

const struct wsd_param *wsd_params(size_t *count)
{
	*count = sizeof(params) / sizeof(params[0]);
	return params;
}

static const struct wsd_param *find(const char *name)
{
	for (size_t i = 0; i < sizeof(params) / sizeof(params[0]); i++)
		if (!strcmp(params[i].name, name))
			return &params[i];
	abort(); /* a typo in the caller: fail loudly in tests */
}

const char *wsd_param_str(const char *name)
{
	const struct wsd_param *p = find(name);
	const char *v = getenv(name);

	return v && *v ? v : p->def;
}

long wsd_param_long(const char *name)
{
	const struct wsd_param *p = find(name);
	const char *v = getenv(name);
	char *end;
	long n;

	if (v && *v) {
		n = strtol(v, &end, 0);
		if (*end == '\0' && n >= 0)
			return n;
	}
	return strtol(p->def, NULL, 0);
}

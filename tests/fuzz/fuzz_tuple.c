/* SPDX-License-Identifier: MIT */
/* libFuzzer: the connect request's caller data, as the registry's condition function checks it. */
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "switch/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void addr_ok(const struct wsd_stat_addr *a)
{
	if ((a->family != AF_INET && a->family != AF_INET6) || a->pad || !a->port)
		abort();
}

static int all_zero(const void *p, size_t n)
{
	const uint8_t *b = p;

	while (n--)
		if (*b++)
			return 0;
	return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct wsd_tuple t;
	const char *why;
	/* a copy of exactly size bytes: a read past it is the sanitizer's to see */
	uint8_t *copy = malloc(size ? size : 1);

	if (!copy)
		return 0;
	memcpy(copy, data, size);
	if (wsd_wire_tuple_check(copy, (uint32_t)size, &t, &why) == 0) {
		if (size != sizeof(t) || t.magic != WSD_TUPLE_MAGIC ||
		    t.version != WSD_PROTO_VERSION || t.pad)
			abort();
		/* no client at all names a channel alone (wsd-protocol(7), Channels) */
		if (!all_zero(&t.client, sizeof(t.client)))
			addr_ok(&t.client);
		addr_ok(&t.server);
	}
	free(copy);
	return 0;
}

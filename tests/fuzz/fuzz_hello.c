/* SPDX-License-Identifier: MIT */
/* libFuzzer: the handshake message check, as take_hello and client_upgrade call it. */
#include <stdlib.h>
#include <string.h>

#include "switch/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct wsd_hello h;
	const char *why;

	/* the provider delivers one message into one 96-byte receive */
	if (size != sizeof(h))
		return 0;
	memcpy(&h, data, sizeof(h));
	for (uint16_t kind = MSG_HELLO; kind <= MSG_ACCEPT; kind++) {
		if (wsd_wire_hello_check(&h, kind, &why))
			continue;
		/* what a valid message promises its user (wsd_session_peer, map_peer) */
		if (h.magic != WSD_PROTO_MAGIC || h.version != WSD_PROTO_VERSION)
			abort();
		if (h.kind == MSG_REFUSE ? kind != MSG_ACCEPT || !h.reason || h.ring_size :
		    h.kind != kind || h.ring_size < WIRE_RING_MIN || h.ring_size > WIRE_RING_MAX ||
		    (h.ring_size & (h.ring_size - 1)) || !(h.key & 1))
			abort();
		/* a refusal's one field: a moved one's port */
		if (h.kind == MSG_REFUSE && (h.reason == WSD_REASON_MOVED ? !h.seg || h.seg > 65535 :
					     h.seg != 0))
			abort();
	}
	return 0;
}

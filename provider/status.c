/* SPDX-License-Identifier: MIT */
#include <errno.h>

#include "provider/internal.h"

static const char *const names[] = {
	[ND_SUCCESS] = "ND_SUCCESS",
	[ND_PENDING] = "ND_PENDING",
	[ND_TIMEOUT] = "ND_TIMEOUT",
	[ND_CANCELED] = "ND_CANCELED",
	[ND_BUFFER_OVERFLOW] = "ND_BUFFER_OVERFLOW",
	[ND_DATA_OVERRUN] = "ND_DATA_OVERRUN",
	[ND_NO_MORE_ENTRIES] = "ND_NO_MORE_ENTRIES",
	[ND_CONNECTION_INVALID] = "ND_CONNECTION_INVALID",
	[ND_CONNECTION_REFUSED] = "ND_CONNECTION_REFUSED",
	[ND_CONNECTION_ABORTED] = "ND_CONNECTION_ABORTED",
	[ND_ACCESS_DENIED] = "ND_ACCESS_DENIED",
	[ND_ACCESS_VIOLATION] = "ND_ACCESS_VIOLATION",
	[ND_LOCAL_LENGTH] = "ND_LOCAL_LENGTH",
	[ND_INVALID_REQUEST] = "ND_INVALID_REQUEST",
	[ND_INVALID_PARAMETER] = "ND_INVALID_PARAMETER",
	[ND_FAILURE] = "ND_FAILURE",
	[ND_REMOTE_ERROR] = "ND_REMOTE_ERROR",
	[ND_INVALIDATION_ERROR] = "ND_INVALIDATION_ERROR",
	[ND_NO_MEMORY] = "ND_NO_MEMORY",
	[ND_NOT_SUPPORTED] = "ND_NOT_SUPPORTED",
	[ND_DEVICE_BUSY] = "ND_DEVICE_BUSY",
	[ND_ADDRESS_IN_USE] = "ND_ADDRESS_IN_USE",
	[ND_INSUFFICIENT_RESOURCES] = "ND_INSUFFICIENT_RESOURCES",
};

const char *nd_strstatus(nd_status status)
{
	if ((unsigned)status < sizeof(names) / sizeof(names[0]) && names[status])
		return names[status];
	return "ND_UNKNOWN";
}

/* The one map from the project's internal -errno convention to ND statuses. */
nd_status wsd_nd_from_errno(int err)
{
	switch (err < 0 ? -err : err) {
	case 0: return ND_SUCCESS;
	case ENOMEM: return ND_NO_MEMORY;
	case EINVAL: return ND_INVALID_PARAMETER;
	case EOPNOTSUPP: return ND_NOT_SUPPORTED;
	case ETIMEDOUT: return ND_TIMEOUT;
	case ECONNREFUSED: return ND_CONNECTION_REFUSED;
	case ENOENT: return ND_CONNECTION_REFUSED;
	case ECONNABORTED: case ECONNRESET: case EPIPE: return ND_CONNECTION_ABORTED;
	case ENOTCONN: return ND_CONNECTION_INVALID;
	case EACCES: case EPERM: return ND_ACCESS_DENIED;
	case EADDRINUSE: return ND_ADDRESS_IN_USE;
	case EADDRNOTAVAIL: return ND_INVALID_PARAMETER;
	case EBUSY: return ND_DEVICE_BUSY;
	case ESRCH: return ND_TIMEOUT;
	case EFAULT: return ND_FAILURE;
	case EMFILE: case ENFILE: case ENOSPC: case EAGAIN: return ND_INSUFFICIENT_RESOURCES;
	default: return ND_FAILURE;
	}
}

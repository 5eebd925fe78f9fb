/* SPDX-License-Identifier: MIT */
/* Adapters, memory regions, memory windows and listeners. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "provider/internal.h"

static const struct nd_transport *const transports[] = {
	&wsd_transport_shm,
};

const struct nd_transport *wsd_transport_find(const char *name)
{
	if (!name || !*name || !strcmp(name, "auto"))
		name = wsd_param_str("WSD_TRANSPORT");
	if (!strcmp(name, "auto"))
		name = "shm";
	for (size_t i = 0; i < sizeof(transports) / sizeof(transports[0]); i++)
		if (!strcmp(transports[i]->name, name))
			return transports[i];
	return NULL;
}

nd_status nd_adapter_open(const char *transport, struct nd_adapter **adapter)
{
	const struct nd_transport *tp;
	struct nd_adapter *ad;

	if (!adapter)
		return ND_INVALID_PARAMETER;
	tp = wsd_transport_find(transport);
	if (!tp)
		return ND_NOT_SUPPORTED;
	ad = calloc(1, sizeof(*ad));
	if (!ad)
		return ND_NO_MEMORY;
	pthread_mutex_init(&ad->lock, NULL);
	ad->tp = tp;
	ad->info = tp->caps;
	if (!strcmp(tp->name, "shm")) {
		long w = wsd_param_long("WSD_SHM_WINDOWS");

		ad->info.max_windows = w > 0 && w <= 65536 ? (uint32_t)w : 256;
	}
	*adapter = ad;
	return ND_SUCCESS;
}

nd_status nd_adapter_close(struct nd_adapter *ad)
{
	if (!ad)
		return ND_INVALID_PARAMETER;
	pthread_mutex_lock(&ad->lock);
	if (ad->nobjects) {
		pthread_mutex_unlock(&ad->lock);
		return ND_DEVICE_BUSY;
	}
	pthread_mutex_unlock(&ad->lock);
	pthread_mutex_destroy(&ad->lock);
	free(ad);
	return ND_SUCCESS;
}

nd_status nd_adapter_query(struct nd_adapter *ad, struct nd_adapter_info *info)
{
	if (!ad || !info)
		return ND_INVALID_PARAMETER;
	*info = ad->info;
	return ND_SUCCESS;
}

/* ---- memory regions ---------------------------------------------------- */

#define MR_FLAGS (ND_MR_FLAG_ALLOW_LOCAL_WRITE | ND_MR_FLAG_ALLOW_REMOTE_READ | \
		  ND_MR_FLAG_ALLOW_REMOTE_WRITE)

nd_status nd_mr_register(struct nd_adapter *ad, void *addr, size_t length, uint32_t flags,
			 struct nd_mr **out)
{
	struct nd_mr *mr;

	if (!ad || !addr || !out || !length || length > ad->info.max_registration_size ||
	    (flags & ~MR_FLAGS) || (uintptr_t)addr + length < (uintptr_t)addr)
		return ND_INVALID_PARAMETER;
	mr = calloc(1, sizeof(*mr));
	if (!mr)
		return ND_NO_MEMORY;
	mr->ad = ad;
	mr->addr = (uintptr_t)addr;
	mr->length = length;
	mr->flags = flags;
	mr->valid = true;
	pthread_mutex_lock(&ad->lock);
	ad->nobjects++;
	pthread_mutex_unlock(&ad->lock);
	*out = mr;
	return ND_SUCCESS;
}

nd_status nd_mr_deregister(struct nd_mr *mr)
{
	struct nd_adapter *ad;

	if (!mr)
		return ND_INVALID_PARAMETER;
	ad = mr->ad;
	pthread_mutex_lock(&ad->lock);
	if (mr->windows) {
		pthread_mutex_unlock(&ad->lock);
		return ND_DEVICE_BUSY;
	}
	ad->nobjects--;
	pthread_mutex_unlock(&ad->lock);
	free(mr);
	return ND_SUCCESS;
}

void wsd_mr_local_invalidate(struct nd_mr *mr)
{
	mr->valid = false;
}

nd_status wsd_sge_check(const struct nd_sge *sge, uint32_t need)
{
	const struct nd_mr *mr = sge->mr;
	uintptr_t a = (uintptr_t)sge->addr;

	if (!sge->length)
		return ND_SUCCESS;
	if (!mr || !mr->valid || a < mr->addr || a >= mr->addr + mr->length ||
	    (mr->flags & need) != need)
		return ND_ACCESS_VIOLATION;
	if (sge->length > mr->addr + mr->length - a)
		return ND_LOCAL_LENGTH;
	return ND_SUCCESS;
}

void wsd_sge_to_iov(const struct nd_sge *sgl, uint32_t nsge, struct iovec *iov)
{
	for (uint32_t i = 0; i < nsge; i++) {
		iov[i].iov_base = sgl[i].addr;
		iov[i].iov_len = sgl[i].length;
	}
}

/* ---- memory windows ---------------------------------------------------- */

nd_status nd_mw_create(struct nd_adapter *ad, struct nd_mw **out)
{
	struct nd_mw *mw;

	if (!ad || !out)
		return ND_INVALID_PARAMETER;
	if (!(ad->info.flags & ND_ADAPTER_FLAG_MEMORY_WINDOWS))
		return ND_NOT_SUPPORTED;
	mw = calloc(1, sizeof(*mw));
	if (!mw)
		return ND_NO_MEMORY;
	mw->ad = ad;
	pthread_mutex_lock(&ad->lock);
	ad->nobjects++;
	pthread_mutex_unlock(&ad->lock);
	*out = mw;
	return ND_SUCCESS;
}

nd_status nd_mw_destroy(struct nd_mw *mw)
{
	struct nd_adapter *ad;

	if (!mw)
		return ND_INVALID_PARAMETER;
	ad = mw->ad;
	pthread_mutex_lock(&ad->lock);
	if (mw->ep) {
		pthread_mutex_unlock(&ad->lock);
		return ND_DEVICE_BUSY;
	}
	ad->nobjects--;
	pthread_mutex_unlock(&ad->lock);
	free(mw);
	return ND_SUCCESS;
}

/* ---- listeners --------------------------------------------------------- */

nd_status nd_listen(struct nd_adapter *ad, const struct sockaddr *addr, socklen_t addrlen,
		    int backlog, struct nd_listener **out)
{
	struct nd_listener *l;
	int ret;

	if (!ad || !addr || !out)
		return ND_INVALID_PARAMETER;
	l = calloc(1, sizeof(*l));
	if (!l)
		return ND_NO_MEMORY;
	l->ad = ad;
	ret = ad->tp->listen(l, addr, addrlen, backlog);
	if (ret < 0) {
		free(l);
		return wsd_nd_from_errno(ret);
	}
	pthread_mutex_lock(&ad->lock);
	ad->nobjects++;
	pthread_mutex_unlock(&ad->lock);
	*out = l;
	return ND_SUCCESS;
}

nd_status nd_listen_close(struct nd_listener *l)
{
	if (!l)
		return ND_INVALID_PARAMETER;
	l->ad->tp->listen_close(l);
	pthread_mutex_lock(&l->ad->lock);
	l->ad->nobjects--;
	pthread_mutex_unlock(&l->ad->lock);
	free(l);
	return ND_SUCCESS;
}

nd_status nd_listen_get_request(struct nd_listener *l, int timeout_ms,
				struct nd_conn_request **out)
{
	struct nd_conn_request *req;
	int ret;

	if (!l || !out)
		return ND_INVALID_PARAMETER;
	req = calloc(1, sizeof(*req));
	if (!req)
		return ND_NO_MEMORY;
	req->ad = l->ad;
	ret = l->ad->tp->listen_get(l, timeout_ms, req);
	if (ret < 0) {
		free(req);
		return wsd_nd_from_errno(ret);
	}
	*out = req;
	return ND_SUCCESS;
}

nd_status nd_conn_request_data(struct nd_conn_request *req, void *buf, size_t *len)
{
	size_t have;

	if (!req || !len || (!buf && *len))
		return ND_INVALID_PARAMETER;
	have = *len;
	*len = req->len;
	if (have < req->len)
		return ND_BUFFER_OVERFLOW;
	if (req->len)
		memcpy(buf, req->data, req->len);
	return ND_SUCCESS;
}

nd_status nd_conn_request_reject(struct nd_conn_request *req)
{
	if (!req)
		return ND_INVALID_PARAMETER;
	req->ad->tp->request_reject(req);
	free(req);
	return ND_SUCCESS;
}

/* SPDX-License-Identifier: MIT */
/*
 * A position in a call's iovec array (struct cursor) and the copies
 * through it, for the ring protocol's files (sess_int.h): static inline,
 * as they are on every send's and receive's path.
 */
#ifndef WSD_SWITCH_CURSOR_H
#define WSD_SWITCH_CURSOR_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>

static inline size_t iov_total(const struct iovec *iov, int n)
{
	size_t t = 0;

	for (int i = 0; i < n; i++)
		t += iov[i].iov_len;
	return t;
}

/* A position in an iovec array. */
struct cursor {
	const struct iovec *iov;
	int n, i;
	size_t off;
};

static inline size_t cur_left(const struct cursor *c)
{
	size_t t = 0;

	for (int i = c->i; i < c->n; i++)
		t += c->iov[i].iov_len - (i == c->i ? c->off : 0);
	return t;
}

static inline void cur_skip(struct cursor *c, size_t n)
{
	while (n && c->i < c->n) {
		size_t k = c->iov[c->i].iov_len - c->off;

		if (k > n)
			k = n;
		c->off += k;
		n -= k;
		if (c->off == c->iov[c->i].iov_len) {
			c->i++;
			c->off = 0;
		}
	}
	while (c->i < c->n && c->iov[c->i].iov_len == 0)
		c->i++;
}

static inline size_t cur_copy_to(struct cursor *c, const uint8_t *src, size_t n)
{
	size_t done = 0;

	while (done < n && c->i < c->n) {
		size_t k = c->iov[c->i].iov_len - c->off;

		if (k > n - done)
			k = n - done;
		memcpy((uint8_t *)c->iov[c->i].iov_base + c->off, src + done, k);
		done += k;
		cur_skip(c, k);
	}
	return done;
}

static inline size_t cur_copy_from(struct cursor *c, uint8_t *dst, size_t n)
{
	size_t done = 0;

	while (done < n && c->i < c->n) {
		size_t k = c->iov[c->i].iov_len - c->off;

		if (k > n - done)
			k = n - done;
		memcpy(dst + done, (const uint8_t *)c->iov[c->i].iov_base + c->off, k);
		done += k;
		cur_skip(c, k);
	}
	return done;
}

#endif /* WSD_SWITCH_CURSOR_H */

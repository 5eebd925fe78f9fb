/* SPDX-License-Identifier: MIT */
/*
 * wsd stat's per-channel view: the sockets of a process grouped by the
 * channel they are slots of, and the memory of each channel, read from
 * /proc/PID/smaps by the inodes its sockets name (the channel's receive
 * segment and the peer's mapped here, switch/stat.h): what the pages that
 * exist cost, since a channel's pages come as they are written.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wsd/stat.h"

static struct chan_row *find(struct proc *p, uint64_t id)
{
	for (size_t i = 0; i < p->nchans; i++)
		if (p->chans[i].id == id)
			return &p->chans[i];
	return NULL;
}

/* Add the Rss and Pss of p's mappings of each channel's inodes. */
static void add_memory(struct proc *p)
{
	char name[64], *line = NULL;
	size_t cap = 0;
	bool *want = calloc(p->nchans, sizeof(*want));   /* per channel: the mapping is its */
	bool any = false;
	FILE *f;

	snprintf(name, sizeof(name), "/proc/%d/smaps", p->pid);
	f = want ? fopen(name, "re") : NULL;
	if (!f) {
		free(want);
		return;   /* another user's, or gone (or no memory): not known (0) */
	}
	while (getline(&line, &cap, f) > 0) {
		unsigned long long ino, kib;
		char key[32];

		/* a mapping's first line: start-end perms offset dev inode [path] */
		if (sscanf(line, "%*x-%*x %*s %*x %*x:%*x %llu", &ino) == 1) {
			any = false;
			for (size_t i = 0; i < p->nchans; i++) {
				const struct chan_row *c = &p->chans[i];

				want[i] = ino && (ino == c->ino[0] || ino == c->ino[1]);
				any |= want[i];
			}
			continue;
		}
		if (!any || sscanf(line, "%31[A-Za-z_]: %llu kB", key, &kib) != 2)
			continue;
		for (size_t i = 0; i < p->nchans; i++) {
			if (!want[i])
				continue;
			if (!strcmp(key, "Rss"))
				p->chans[i].rss_kib += kib;
			else if (!strcmp(key, "Pss"))
				p->chans[i].pss_kib += kib;
		}
	}
	free(line);
	fclose(f);
	free(want);
}

int stat_channels(struct proc *p)
{
	p->chans = NULL;
	p->nchans = 0;
	for (size_t j = 0; j < p->nrows; j++) {
		const struct row *r = &p->rows[j];
		struct chan_row *c;

		if (!r->ctr[C_CHANNEL])
			continue;
		c = find(p, r->ctr[C_CHANNEL]);
		if (!c) {
			struct chan_row *more = realloc(p->chans, (p->nchans + 1) * sizeof(*more));

			if (!more)
				return -ENOMEM;
			p->chans = more;
			c = &p->chans[p->nchans++];
			memset(c, 0, sizeof(*c));
			c->id = r->ctr[C_CHANNEL];
			c->peer_pid = r->ctr[C_PEER_PID];
		}
		c->slots++;
		/* the path of a socket still on it (one gone back to TCP says tcp) */
		if (!c->path[0] || !strcmp(c->path, "tcp"))
			snprintf(c->path, sizeof(c->path), "%s", r->path);
		for (int k = 0; k < 2; k++)
			if (!c->ino[k])
				c->ino[k] = r->mem_ino[k];
	}
	if (p->nchans)
		add_memory(p);
	return 0;
}

void stat_channels_json(const struct proc *p)
{
	printf(",\"channels\":[");
	for (size_t i = 0; i < p->nchans; i++) {
		const struct chan_row *c = &p->chans[i];

		/* path is one of the switch's names or path-N: nothing to escape */
		printf("%s\n  {\"channel\":%" PRIu64 ",\"path\":\"%s\",\"peer_pid\":%" PRIu64
		       ",\"slots\":%u,\"rss_kib\":%" PRIu64 ",\"pss_kib\":%" PRIu64 "}",
		       i ? "," : "", c->id, c->path, c->peer_pid, c->slots, c->rss_kib, c->pss_kib);
	}
	printf("]");
}

void stat_channels_table(const struct proc *procs, size_t nprocs)
{
	printf("%7s %-15s %5s %-5s %8s %6s %9s %9s\n", "PID", "COMM", "CHAN", "PATH", "PEER-PID",
	       "SLOTS", "RSS-KIB", "PSS-KIB");
	for (size_t i = 0; i < nprocs; i++)
		for (size_t j = 0; j < procs[i].nchans; j++) {
			const struct chan_row *c = &procs[i].chans[j];
			char comm[64];

			comm_text(procs[i].comm, comm, sizeof(comm));
			printf("%7d %-15s %5" PRIu64 " %-5s %8" PRIu64 " %6u %9" PRIu64 " %9" PRIu64
			       "\n", procs[i].pid, comm, c->id, c->path, c->peer_pid, c->slots,
			       c->rss_kib, c->pss_kib);
		}
}

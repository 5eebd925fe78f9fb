/* SPDX-License-Identifier: MIT */
/*
 * wsd stat's own view of what it read (wsd/stat.c): a row per socket, a
 * process per file; and the per-channel summary built from them
 * (wsd/stat_chan.c).
 */
#ifndef WSD_STAT_INT_H
#define WSD_STAT_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* switch/stat.h's WSD_STAT_REASONS (checked in wsd/stat.c) */
#define WSD_STAT_NREFUSED 32

enum { C_TCP_TX, C_TCP_RX, C_COPY_TX, C_COPY_RX, C_ZCOPY_TX, C_ZCOPY_RX,
       C_BELLS_TX, C_BELLS_RX, C_WAITS, C_FALLBACKS, C_CHANNEL, C_PEER_PID, NCTRS };

/* one socket, as copied out of its slot, with its text ready */
struct row {
	uint32_t idx;
	int32_t fd;
	bool listening;
	char local[56], peer[56];    /* "[v6addr%scope]:port" fits */
	char path[16], reason[24], way[8];
	uint64_t ctr[NCTRS];
	uint64_t mem_ino[2];         /* the channel's memory (switch/stat.h) */
	uint64_t wait[23];           /* the last sleep's state (switch/stat.h), wait[0] 0: none */
	int64_t wait_age_ms;         /* how long ago it began */
};

/* one channel of a process: its sockets counted, its memory from smaps */
struct chan_row {
	uint64_t id, peer_pid;
	char path[16];
	unsigned slots;
	uint64_t ino[2];
	uint64_t rss_kib, pss_kib;
};

struct proc {
	int pid;
	char comm[17];
	uint64_t refused[WSD_STAT_NREFUSED];
	char file[48];              /* its file's name in the folder */
	long stat_taken;            /* uid of another user that held wsd-stat.PID, -1 none */
	long reg_taken;             /* ...that held a registry name (reg_port's), -1 none */
	unsigned reg_port;
	struct row *rows;
	size_t nrows;
	struct chan_row *chans;
	size_t nchans;
};

/* A name fit for one table cell: control characters and broken UTF-8 as '?'. */
void comm_text(const char *comm, char *buf, size_t len);
/* p's channels from its rows, their memory from /proc/PID/smaps; -ENOMEM */
int stat_channels(struct proc *p);
void stat_channels_json(const struct proc *p);
void stat_channels_table(const struct proc *procs, size_t nprocs);

#endif

/* SPDX-License-Identifier: MIT */
#ifndef WSD_CMD_H
#define WSD_CMD_H

int cmd_demo(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_stat(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_bench_worker(int argc, char **argv);

#endif

/* SPDX-License-Identifier: MIT */
#ifndef WSD_CMD_H
#define WSD_CMD_H

int cmd_demo(int argc, char **argv);

#endif

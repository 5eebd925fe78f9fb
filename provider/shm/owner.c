/* SPDX-License-Identifier: MIT */
/*
 * Does the registry's process hold the TCP listener it stands for?
 *
 * Anyone can bind the abstract name "wsd-nd.PORT" first.  The mutual
 * proof (proof.c) shows only that the squatter may read us and we it, so a
 * process of our own user passes it; the switch would then take a
 * connection to a server on PORT, plain or not, over to the squatter.  So
 * a connector that asks for it (SO_WSP_TCP_LISTENER) checks that the
 * process behind the registry socket, by the pid the kernel gave
 * (SO_PEERCRED, never a pid the peer claims), holds as the descriptor it
 * names a TCP socket listening on the port dialled, in its own network
 * namespace (/proc/PID/net/tcp and tcp6 are the namespace of PID).
 *
 * Reading /proc/PID/fd needs the ptrace read right, which the proof has
 * shown already; a process we may not inspect fails here as it fails there.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "provider/shm/shm.h"

#define TCP_LISTEN 0x0A   /* TCP_LISTEN in the kernel's state numbering */

/* The inode of the socket pid holds as fd: 0, or -EACCES when it is none. */
static int socket_inode(pid_t pid, int fd, unsigned long *inode)
{
	char path[64], link[64], tail;
	ssize_t n;

	if (fd < 0)
		return -EACCES;
	snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)pid, fd);
	n = readlink(path, link, sizeof(link) - 1);
	if (n < 0)
		return -EACCES;
	link[n] = 0;
	/* exactly "socket:[N]": the closing bracket and nothing after it */
	if (sscanf(link, "socket:[%lu%c", inode, &tail) != 2 || tail != ']' ||
	    link[n - 1] != ']' || *inode == 0)
		return -EACCES;
	return 0;
}

/* Is inode a listening socket on port in one of pid's TCP tables?  0 or -EACCES. */
static int tcp_listening(pid_t pid, unsigned long inode, unsigned port)
{
	static const char *const tables[] = { "tcp", "tcp6" };
	char path[64], line[512];

	for (size_t t = 0; t < sizeof(tables) / sizeof(tables[0]); t++) {
		FILE *f;

		snprintf(path, sizeof(path), "/proc/%d/net/%s", (int)pid, tables[t]);
		f = fopen(path, "re");
		if (!f)
			continue;   /* no IPv6 in that namespace, say */
		/*
		 * "sl local:port remote:port st queues timer retr uid timeout inode";
		 * the first line is the heading and does not parse.
		 */
		while (fgets(line, sizeof(line), f)) {
			unsigned lport, st;
			unsigned long ino;

			if (sscanf(line, " %*s %*[0-9A-Fa-f]:%x %*s %x %*s %*s %*s %*u %*u %lu",
				   &lport, &st, &ino) == 3 &&
			    ino == inode && st == TCP_LISTEN && lport == port) {
				fclose(f);
				return 0;
			}
		}
		fclose(f);
	}
	return -EACCES;
}

int shm_owner_check(pid_t pid, int fd, unsigned port)
{
	unsigned long inode;
	int ret = socket_inode(pid, fd, &inode);

	if (ret == 0)
		ret = tcp_listening(pid, inode, port);
	if (ret < 0)
		wsd_debug("shm: pid %d fd %d is no TCP listener on port %u: refused",
			  (int)pid, fd, port);
	return ret;
}

/* SPDX-License-Identifier: MIT */
/*
 * Many threads on one socket, both ends, both ways at once: 4 threads send
 * fixed-size records, a mutex around each send so records do not
 * interleave; 4 threads receive one record per recv(MSG_WAITALL), also
 * under a mutex (without one, the kernel lets two waiting readers split a
 * record between them).  Every record carries its sender, sequence number
 * and checksum; each end checks that all arrived, whole, in each sender's
 * order.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/sock/common.h"

#define THREADS 4
#define RECORDS 500             /* per sending thread */
#define PAYLOAD 8192
#define TOTAL (THREADS * RECORDS)

struct record {
	uint32_t sender;
	uint32_t seq;
	uint64_t sum;
	uint32_t side;
	uint32_t pad;
	unsigned char payload[PAYLOAD];
};

struct side {
	int fd;
	uint32_t me;                /* 0 or 1: whose records these are */
	pthread_mutex_t tx, rx;
	/* under rx */
	int received;
	uint32_t next_seq[THREADS];
	int bad;
	int short_reads;
};

struct worker {
	struct side *sd;
	uint32_t id;
	pthread_t th;
};

static void *sender(void *arg)
{
	struct worker *w = arg;
	struct record *r = malloc(sizeof(*r));

	for (uint32_t seq = 0; seq < RECORDS; seq++) {
		r->sender = w->id;
		r->seq = seq;
		r->side = w->sd->me;
		r->pad = 0;
		pattern(r->payload, PAYLOAD, w->sd->me * 100 + w->id, (uint64_t)seq * PAYLOAD);
		r->sum = csum(CSUM_INIT, r->payload, PAYLOAD);
		pthread_mutex_lock(&w->sd->tx);
		send_all(w->sd->fd, r, sizeof(*r));
		pthread_mutex_unlock(&w->sd->tx);
	}
	free(r);
	return NULL;
}

static void *receiver(void *arg)
{
	struct worker *w = arg;
	struct side *sd = w->sd;
	struct record *r = malloc(sizeof(*r));
	unsigned char *want = malloc(PAYLOAD);

	for (;;) {
		ssize_t n;

		pthread_mutex_lock(&sd->rx);
		if (sd->received == TOTAL) {
			pthread_mutex_unlock(&sd->rx);
			break;
		}
		n = recv(sd->fd, r, sizeof(*r), MSG_WAITALL);
		if (n != (ssize_t)sizeof(*r)) {
			sd->short_reads++;
			sd->received = TOTAL;   /* the stream is broken: stop all */
			pthread_mutex_unlock(&sd->rx);
			break;
		}
		sd->received++;
		if (r->sender >= THREADS || r->side != 1 - sd->me ||
		    r->seq != sd->next_seq[r->sender]) {
			sd->bad++;
		} else {
			sd->next_seq[r->sender]++;
		}
		pthread_mutex_unlock(&sd->rx);
		/* the payload check needs no lock */
		if (r->sender < THREADS) {
			pattern(want, PAYLOAD, (1 - sd->me) * 100 + r->sender,
				(uint64_t)r->seq * PAYLOAD);
			if (memcmp(want, r->payload, PAYLOAD) ||
			    csum(CSUM_INIT, r->payload, PAYLOAD) != r->sum) {
				pthread_mutex_lock(&sd->rx);
				sd->bad++;
				pthread_mutex_unlock(&sd->rx);
			}
		}
	}
	free(r);
	free(want);
	return NULL;
}

static void run(int fd, uint32_t me)
{
	struct side sd = { .fd = fd, .me = me };
	struct worker tx[THREADS], rx[THREADS];
	char b;

	pthread_mutex_init(&sd.tx, NULL);
	pthread_mutex_init(&sd.rx, NULL);
	for (uint32_t i = 0; i < THREADS; i++) {
		tx[i] = (struct worker){ .sd = &sd, .id = i };
		rx[i] = (struct worker){ .sd = &sd, .id = i };
		pthread_create(&rx[i].th, NULL, receiver, &rx[i]);
		pthread_create(&tx[i].th, NULL, sender, &tx[i]);
	}
	for (int i = 0; i < THREADS; i++) {
		pthread_join(tx[i].th, NULL);
		pthread_join(rx[i].th, NULL);
	}
	say("%d sending threads, %d receiving threads, %d records of %zu bytes each way",
	    THREADS, THREADS, TOTAL, sizeof(struct record));
	CHECK(!sd.short_reads, "a recv came back short");
	CHECK(!sd.bad, "%d records wrong, torn or out of order", sd.bad);
	for (int i = 0; i < THREADS; i++)
		say("  from sender %d: %u records, in order", i, sd.next_seq[i]);
	say("  records wrong: %d", sd.bad);
	EXPECT(0, "shutdown SHUT_WR", shutdown(fd, SHUT_WR));
	EXPECT(0, "recv: EOF", recv(fd, &b, 1, 0));
	EXPECT(0, "close", close(fd));
}

static void peer_main(struct peer *ctl, void *arg)
{
	int lfd, port, fd;

	(void)arg;
	lfd = t_listen(AF_INET, &port);
	ctl_send(ctl, port);
	fd = t_accept(lfd);
	warmup(fd, false);
	run(fd, 1);
	close(lfd);
}

int main(int argc, char **argv)
{
	struct peer b;
	int fd;

	t_init(argc, argv);
	peer_start(&b, "peer", peer_main, NULL);
	fd = t_connect(AF_INET, ctl_recv(&b));
	warmup(fd, true);
	run(fd, 0);
	peer_end(&b);
	t_exit();
}

/* SPDX-License-Identifier: MIT */
/*
 * The receiving side: the record walk over our ring with its checks
 * (walk), the consumed count reported to the sender (report), and receive
 * (wsd_sock_recv): one non-blocking step in whatever mode the direction is
 * in (rx_step: TCP, DRAIN, PROOF, RING), records copied out (rx_ring),
 * then the buffer offered, a spin and a sleep.  Locks: rx_lock around the
 * ring (dropped while asleep), mu for the doorbells a ring run dry drains.
 * It does not move a direction to the ring (proof.c) nor decide how to
 * sleep (wait.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>

#include "switch/sess_int.h"

/*
 * The record walk over our ring (wsd_wire_walk), from pos past the types
 * in skip.  judge: the caller holds rx_lock, so rx_pos is the walk's true
 * start and the sender cannot be overwriting anything past it; a violation
 * then fails the connection.  A reader without rx_lock may meet a slot of
 * the next lap half written, and only stops there.  After a violation
 * nothing is read.  1 with *r, 0 at the end of the records, -EPROTO.
 */
int walk(struct wsd_session *ss, uint64_t pos, uint32_t skip, struct wire_rec *r,
	 bool judge)
{
	const char *why;
	int k;

	if (faulted(ss)) {
		r->pos = pos;
		r->type = 0;
		return -EPROTO;
	}
	k = wsd_wire_walk(&ss->rxr, judge ? ss->rx_pos : pos, pos, skip, r, &why);
	if (k < 0 && peer_untrusted(ss))
		return 0;   /* not a SWITCH: nothing we will read */
	if (k < 0 && judge)
		protocol_fail(ss, why);
	return k;
}

/* rx_lock held: the complete record at pos? */
int rec_at(struct wsd_session *ss, uint64_t pos, struct wire_rec *r)
{
	return walk(ss, pos, 0, r, true);
}

/* rx_lock held: a complete record at the head? */
bool rec_head(struct wsd_session *ss)
{
	struct wire_rec r;

	return rec_at(ss, ss->rx_pos, &r) > 0;
}

/*
 * A receiver reports its position after a quarter of its ring, and at
 * most a quarter of the smallest window: a sender whose window is smaller
 * than a large ring gets its room back as often as from a ring of its
 * window's size.
 */
#define REPORT_MAX (WIN_MIN / 4)

/* rx_lock held: tell the sender about room, when it matters. */
void report(struct wsd_sock *s, bool force)
{
	struct wsd_session *ss = s->sess;
	bool armed = ctl_get(ss, CW_SPACE_ARM) !=
		     ss->rung_space;
	uint32_t every = ss->ring_size / 4 < REPORT_MAX ? ss->ring_size / 4 : REPORT_MAX;

	if (force || armed || ss->rx_pos - ss->rx_reported >= every) {
		if (put_word(ss, W_RX, CW_CONSUMED, ss->rx_pos) == 0)
			ss->rx_reported = ss->rx_pos;
		ring_space(s);
	}
}

void consume(struct wsd_sock *s, const struct wire_rec *r)
{
	struct wsd_session *ss = s->sess;

	ss->rx_pos = r->next;
	ss->rx_off = 0;
}

/* ---- receive ----------------------------------------------------------------- */

/*
 * rx_lock held: a SPLIT record r answers our offer in two parts (zc.c):
 * read ours into the buffer past the part the sender writes, and say it is
 * read.  The bytes count once the sender's WZC says its part is there.
 * 0, or -errno (-EPROTO with *why: the peer broke the format).
 */
static int rx_split(struct wsd_sock *s, const struct wire_rec *r, struct cursor *c, bool peek,
		    const char **why)
{
	struct wsd_session *ss = s->sess;
	uint64_t room = ss->post_len < cur_left(c) ? ss->post_len : cur_left(c);
	struct wsd_split sp;
	struct cursor k;
	int take, e;

	if (peek)
		return -EAGAIN;      /* the offer's owner takes it: nothing to look at yet */
	memcpy(&sp, r->payload, sizeof(sp));
	if (wsd_wire_split_check(&sp, ss->post_gen, ss->post_active && !ss->post_split, room,
				 &take, why))
		return -EPROTO;
	consume(s, r);
	if (take) {
		k = *c;
		cur_skip(&k, (size_t)sp.wlen);
		e = zc_read(s, &sp.zc, 0, &k, (size_t)sp.zc.len);
		if (e < 0)
			return e;
		if ((uint64_t)e != sp.zc.len) {
			*why = "SPLIT: its part did not fit the offered buffer";
			return -EPROTO;
		}
		ss->post_split = sp.zc.len;
		ss->post_split_wlen = sp.wlen;
	}
	/* read, or an offer let go whose parts nobody takes: the sender may go on */
	ss->zc_finished++;
	put_word(ss, W_RX, CW_ZC_DONE, ss->zc_finished);
	return 0;
}

/*
 * rx_lock held, rx in ring mode: copy what the ring holds.  Bytes, 0 at the
 * end of the stream, -EAGAIN when empty, or -errno.
 */
static ssize_t rx_ring(struct wsd_sock *s, struct cursor *c, int flags)
{
	struct wsd_session *ss = s->sess;
	bool peek = flags & MSG_PEEK;
	uint64_t pos = ss->rx_pos;
	uint32_t off = ss->rx_off;
	const char *why;
	size_t done = 0;

	while (cur_left(c)) {
		struct wire_rec r;
		struct wsd_zc z = { 0 };
		uint64_t plen;
		size_t n;
		int k = walk(ss, pos, WIRE_SKIP(REC_PAD), &r, true);

		if (k < 0)
			return done ? (ssize_t)done : fault_rx(s);
		if (r.pos != pos) {
			/* pads passed: nothing to read in them */
			if (wsd_wire_resume_check(REC_PAD, 0, off, &why))
				goto bad;
			pos = r.pos;
			if (!peek) {
				ss->rx_pos = pos;
				ss->rx_off = 0;
			}
		}
		if (!k)
			break;
		if (r.type == REC_WZC) {
			struct wsd_wzc w;
			uint64_t got;

			memcpy(&w, r.payload, sizeof(w));
			if (wsd_wire_wzc_check(&w, ss->post_gen, ss->post_active,
					       ss->post_len < cur_left(c) ? ss->post_len : cur_left(c),
					       &got, &why) ||
			    wsd_wire_resume_check(r.type, 0, off, &why))
				goto bad;
			pos = r.next;
			if (!peek)
				consume(s, &r);
			if (!ss->post_active || w.gen != ss->post_gen)
				continue;   /* the answer to an offer already let go */
			if (ss->post_split && got != ss->post_split_wlen) {
				why = "WZC: not the bytes its SPLIT said";
				goto bad;
			}
			/* the sender wrote got bytes at the cursor: nothing came before them */
			n = (size_t)(got + ss->post_split);
			ss->post_split = 0;
			post_release(ss);
			if (n)
				ss->offer_misses = 0;
			cur_skip(c, n);
			wsd_stat_add(s->stat, &s->stat->zcopy_rx, n);
			done += n;
			continue;
		}
		if (r.type == REC_SPLIT) {
			k = rx_split(s, &r, c, peek, &why);
			if (k == -EAGAIN)
				break;        /* a peek: nothing here yet, or the end's word below */
			if (k < 0) {
				if (k == -EPROTO)
					goto bad;
				return done ? (ssize_t)done : k;
			}
			pos = r.next;
			continue;
		}
		if (r.type == REC_ZC) {
			memcpy(&z, r.payload, sizeof(z));
			if (wsd_wire_zc_check(&z, &why))
				goto bad;
		}
		plen = r.type == REC_ZC ? z.len : r.len;
		if (wsd_wire_resume_check(r.type, plen, off, &why))
			goto bad;
		if (ss->post_active && !peek) {
			post_withdraw(s, false);   /* other data came first: the offer is void */
			if (r.type != REC_DATA || plen < POST_SEND_MIN)
				post_missed(ss);
		}
		if (r.type == REC_BACK)
			break;        /* check_back moves on once its count is there */
		if (r.type == REC_FIN) {
			if (!done && !peek) {
				int e = bells_look(s);

				if (e == -ECONNRESET)
					return fault_rx(s);
				if (e)
					return e;
			}
			if (!done) {
				s->peer_fin = true;
				if (s->tx_shut && !s->kernel_fin)
					finish_kernel(s);
				return 0;
			}
			break;
		}
		if (r.type == REC_DATA) {
			n = r.len - off;
			if (n > cur_left(c))
				n = cur_left(c);
			cur_copy_to(c, r.payload + off, n);
			wsd_stat_add(s->stat, &s->stat->copy_rx, peek ? 0 : n);
		} else if (r.type == REC_ZC) {
			int e;

			n = (size_t)(z.len - off);
			if (n > cur_left(c))
				n = cur_left(c);
			e = zc_read(s, &z, off, c, n);
			if (e < 0)
				return done ? (ssize_t)done : faulted(ss) ? fault_rx(s) : e;
			n = (size_t)e;
			cur_skip(c, n);
			wsd_stat_add(s->stat, &s->stat->zcopy_rx, peek ? 0 : n);
			if (!peek && off + n == z.len) {
				ss->zc_finished++;
				put_word(ss, W_RX, CW_ZC_DONE, ss->zc_finished);
			}
		} else {
			why = "record: SWITCH after the switch";
			goto bad;
		}
		done += n;
		off += (uint32_t)n;
		if (off == plen) {
			pos = r.next;
			off = 0;
			if (!peek)
				consume(s, &r);
		} else if (!peek) {
			ss->rx_off = off;
		}
		if (peek && r.type == REC_ZC)
			break;
	}
	if (!peek && done) {
		report(s, false);
		/*
		 * Ran dry: read the doorbells now, or the kernel fd stays readable
		 * with nothing to read (a nested epoll set would report it).
		 */
		if (!rec_head(ss) && s->ep_items && wsd_poll_sock_watched(s)) {
			/*
			 * A set holding it sleeps in the kernel, or is watched
			 * through its fd, or relies on its bell: stay armed for
			 * the next arrival.  Otherwise the next epoll_wait looks
			 * at the ring itself, and a peer that finds no arm writes
			 * no bell (one send and one receive fewer each message).
			 */
			arm_data(s, false);
		} else if (!rec_head(ss) && ss->data_gen != ss->drained_gen) {
			pthread_mutex_lock(&s->mu);
			if (!s->sleepers) {
				drain(s);
				ss->drained_gen = ss->data_gen;
			}
			pthread_mutex_unlock(&s->mu);
		}
	} else if (!peek && ss->rx_pos != ss->rx_reported) {
		/*
		 * Dry, past records that carry no bytes (pads, the answer to an
		 * offer let go, a SPLIT): this may be the last look before a
		 * sleep, whose report went out before it (arm_data).  A sender
		 * short of exactly that room would wait for a report that nobody
		 * makes (wsd-protocol(7), Sleeping and waking).
		 */
		report(s, true);
	}
	if (done)
		return (ssize_t)done;
	if (!s->tcp_err && !s->tcp_eof && ctl_get(ss, CW_CLOSED) == 2) {
		s->tcp_err = true;    /* the peer reset, and all it sent is read */
		s->tcp_errno = ECONNRESET;
	}
	if (s->tcp_err)
		return take_error(s);   /* reported once, then the end, as the kernel does */
	return s->tcp_eof ? 0 : -EAGAIN;
bad:
	protocol_fail(ss, why);
	return done ? (ssize_t)done : fault_rx(s);
}

/* Count and return a kernel read; -errno on failure. */
static ssize_t kernel_recv(struct wsd_sock *s, struct cursor *c, size_t max, int flags)
{
	struct iovec v[64];
	struct msghdr m = { .msg_iov = v };
	struct cursor k = *c;
	size_t left = max;
	ssize_t n;

	while (left && k.i < k.n && m.msg_iovlen < 64) {
		size_t seg = k.iov[k.i].iov_len - k.off;

		if (seg > left)
			seg = left;
		v[m.msg_iovlen].iov_base = (uint8_t *)k.iov[k.i].iov_base + k.off;
		v[m.msg_iovlen++].iov_len = seg;
		left -= seg;
		cur_skip(&k, seg);
	}
	n = real.recvmsg(s->fd, &m, flags);
	return n < 0 ? -errno : n;
}

/* A blocking receive's look after it armed (the test build's last-look-delay). */
static __thread bool last_look;

/*
 * rx_lock held, rx_ready sent: one non-blocking step in whatever mode.
 * Bytes, 0 for the end of the stream, -EAGAIN, or -errno.
 */
ssize_t rx_step(struct wsd_sock *s, struct cursor *c, int flags)
{
	size_t want = cur_left(c);
	bool keep;
	ssize_t n;

	if (peer_bypass(s->sess))
		return fault_rx(s);
	/*
	 * Every look at the ring looks for the peer's BACK request too: the bell
	 * that came with it may have been read by the drain before a sleep.
	 */
	serve_back_unlocked(s);
	if (s->pre || s->rx_skip) {
		n = pre_recv(s, c, flags);
		if (n)
			return n;
	}
	if (s->connected_side)
		prove_self(s);
	for (;;) {
		check_switch(s, false);
		check_back(s);
		if (s->rx_back && s->rx_skip) {
			n = pre_recv(s, c, flags);
			if (n)
				return n;
		}
		if (s->rx_mode == DIR_RING) {
			return rx_ring(s, c, flags);
		}
		if (s->rx_mode == DIR_PROOF) {
			proof_read(s, false);
			if (faulted(s->sess))
				return fault_rx(s);
			if (s->rx_mode == DIR_PROOF)
				return -EAGAIN;
			if (s->rx_back)
				/* failed: plain again (its prefix first), or reset */
				return rx_step(s, c, flags);
			continue;
		}
		if (s->rx_mode == DIR_DRAIN) {
			uint64_t left = s->rx_switch_at - s->tcp_rx;

			if (!left) {
				s->rx_mode = DIR_PROOF;
				continue;
			}
			n = kernel_recv(s, c, want < left ? want : left,
					(flags & MSG_PEEK) | MSG_DONTWAIT);
			if (n > 0 && !(flags & MSG_PEEK)) {
				s->tcp_rx += (uint64_t)n;
				wsd_stat_add(s->stat, &s->stat->tcp_rx, (uint64_t)n);
			}
			if (n > 0)
				cur_skip(c, (size_t)n);   /* as the ring's copies do */
			return n;
		}
		/*
		 * TCP: the peer may switch at any moment; bytes past N are its
		 * proof, then bells.  A proof that is not ours to take (another
		 * thread's receive sleeps: proof_ours) stays where it is: look
		 * first, then take only what comes before it.  So too when
		 * another receive counts as asleep (proof_alone): the proof is
		 * then ours, but the bell after it is the other's wake-up.
		 */
		keep = !(flags & MSG_PEEK) && !proof_alone(s);
		{
			long us;

			/* the test build: the peer's SWITCH, proof and bell may all come now */
			if (last_look && s->connected_side && wsd_fault("last-look-delay", &us))
				usleep((useconds_t)us);
		}
		n = kernel_recv(s, c, want, (flags & MSG_PEEK) | MSG_DONTWAIT | (keep ? MSG_PEEK : 0));
		check_switch(s, false);
		if (keep && n > 0) {
			if (s->rx_mode != DIR_TCP && (uint64_t)n > s->rx_switch_at - s->tcp_rx)
				n = (ssize_t)(s->rx_switch_at - s->tcp_rx);
			if (n > 0)
				n = kernel_recv(s, c, (size_t)n, MSG_DONTWAIT);
		}
		if (s->rx_mode != DIR_TCP) {
			uint64_t left = s->rx_switch_at - s->tcp_rx;

			if (n > 0 && (uint64_t)n > left)
				n = (ssize_t)proof_in_read(s, c, (size_t)left, (size_t)n,
							   flags & MSG_PEEK);
			if (faulted(s->sess))
				return n > 0 ? n : fault_rx(s);
			if (n == 0 && !left)
				continue;   /* at the switch point: PROOF looks at what follows */
			if (n == -EAGAIN)
				continue;
		}
		if (n > 0 && !(flags & MSG_PEEK)) {
			s->tcp_rx += (uint64_t)n;
			wsd_stat_add(s->stat, &s->stat->tcp_rx, (uint64_t)n);
		}
		if (n > 0)
			cur_skip(c, (size_t)n);
		return n;
	}
}

/*
 * A plain socket's prefix (after BACK): its bytes, 0 when spent, or -errno.
 * A blocking caller waits for a bell still on its way as for data, in the
 * kernel (SO_RCVTIMEO and signals as a plain read).
 */
static ssize_t pre_owed(struct wsd_sock *s, struct cursor *c, int flags, bool nonblock)
{
	for (;;) {
		ssize_t n;
		char b;

		pthread_mutex_lock(&s->rx_lock);
		n = pre_recv(s, c, flags);
		pthread_mutex_unlock(&s->rx_lock);
		if (n != -EAGAIN || nonblock)
			return n;
		if (real.recv(s->fd, &b, 1, MSG_PEEK) < 0)
			return -errno;
	}
}

/*
 * mu held: a receive before the switch may wait for the stream uncounted
 * (plain_wait): it is one that RX_READY may yet be published for.
 */
static bool may_wait_uncounted(const struct wsd_sock *s)
{
	return !s->detached && !s->rx_back && !s->no_upgrade && !s->closing &&
	       atomic_load(&s->upgrade_state) != UP_FAILED;
}

/*
 * A receive before the switch (counted among plain_waiters while in the
 * kernel): the prefix's bytes, or the kernel stream's.  uncounted: the
 * read is made non-blocking, its wait to go uncounted (plain_wait).
 */
static ssize_t plain_recv(struct wsd_sock *s, struct cursor *c, int flags, bool nonblock,
			  bool uncounted)
{
	bool was;
	ssize_t n;

	if (s->detached) {
		n = -ECONNRESET;
	} else if (faulted(s->sess)) {
		pthread_mutex_lock(&s->rx_lock);
		n = fault_rx(s);
		pthread_mutex_unlock(&s->rx_lock);
	} else if ((s->pre || s->rx_skip) && (n = pre_owed(s, c, flags, nonblock)) != 0) {
		/* the prefix's bytes, or its error */
	} else {
		n = kernel_recv(s, c, cur_left(c),
				(flags & ~MSG_WAITALL) | (uncounted ? MSG_DONTWAIT : 0));
		if (n > 0 && !(flags & MSG_PEEK)) {
			s->tcp_rx += (uint64_t)n;
			wsd_stat_add(s->stat, &s->stat->tcp_rx, (uint64_t)n);
		}
		if (n > 0)
			cur_skip(c, (size_t)n);   /* MSG_WAITALL goes on after it */
	}
	pthread_mutex_lock(&s->mu);
	s->plain_waiters--;
	was = s->accel;
	publish_rx_ready(s);
	pthread_mutex_unlock(&s->mu);
	became_accel(s, was);
	return n;
}

/*
 * A blocking receive found the stream empty before the switch.  Asleep in
 * a kernel read it would hold RX_READY back until a byte came (a peer that
 * switched meanwhile would put its proof or bells where that read takes
 * them for data), and a peer that never sends would never switch, nor ring
 * us when our own sends wait for room.  So it waits in a peek, which takes
 * nothing: woken by the stream's data, by the peer's proof, or by the bell
 * its first ring data rings (RX_READY arms for it), and looks again.  The
 * kernel's peek keeps SO_RCVTIMEO, SA_RESTART and the reset's report.
 * 0 to look again, or -errno.
 */
static int plain_wait(struct wsd_sock *s)
{
	bool ready;
	char b;

	pthread_mutex_lock(&s->mu);
	ready = s->rx_ready_sent;
	pthread_mutex_unlock(&s->mu);
	if (ready)
		return 0;   /* published meanwhile: the ring's way waits */
	if (atomic_load(&s->closed))
		return -EBADF;
	if (real.recv(s->fd, &b, 1, MSG_PEEK) < 0)
		return -errno;
	/* closed while asleep: the number may be another file's now */
	return atomic_load(&s->closed) ? -EBADF : 0;
}

/* One receive without MSG_WAITALL. */
static ssize_t recv_once(struct wsd_sock *s, struct cursor *c, int flags, bool nonblock)
{
	ssize_t n;
	bool plain, uncounted, asleep_armed = false;

	/* an accepted connection's peer may have posted its OPEN since the accept */
	if (!s->sess && !s->connected_side && !s->tcp_rx) {
		int r = wsd_upgrade_box_first(s, nonblock);

		if (r)
			return r;
	}
	for (;;) {
		pthread_mutex_lock(&s->mu);
		plain = !s->rx_ready_sent || s->detached;
		uncounted = plain && !nonblock && may_wait_uncounted(s);
		if (plain)
			s->plain_waiters++;
		pthread_mutex_unlock(&s->mu);
		if (!plain)
			break;
		n = plain_recv(s, c, flags, nonblock, uncounted);
		if (n != -EAGAIN || !uncounted)
			return n;
		n = plain_wait(s);
		if (n)
			return n;
	}
	for (;;) {
		if (atomic_load(&s->closed))
			return -EBADF;   /* closed under us: nothing more on its number */
		pthread_mutex_lock(&s->rx_lock);
		reset_if_shut(s);
		if (s->tcp_err && s->rx_shut) {
			n = take_error(s);
			pthread_mutex_unlock(&s->rx_lock);
			return n;
		}
		n = rx_step(s, c, flags);
		/* after SHUT_RD what is there still reads; then the end, never a wait */
		if (s->rx_shut && n == -EAGAIN) {
			pthread_mutex_unlock(&s->rx_lock);
			return 0;
		}
		/* a large buffer is offered before the spin: the sender may write there */
		if (n == -EAGAIN && !nonblock && may_post(s, c, flags)) {
			post_offer(s, c);
			n = rx_step(s, c, flags);
		}
		if (n == -EAGAIN && !nonblock && spin_for_data(s))
			n = rx_step(s, c, flags);
		if (n == -EAGAIN) {
			if (!nonblock)
				rx_sleeper_enter(s);
			/*
			 * The last look may take the peer's proof from the
			 * stream and the bells behind it (proof_in_read): the
			 * bell rung for this very arm, after which the peer
			 * rings no more for it, and the data it announced may
			 * still be on its way.  So armed again, and looked
			 * again, until a look takes no bell (wsd-protocol(7),
			 * Sleeping and waking).
			 */
			for (;;) {
				uint64_t bells;

				arm_data(s, !nonblock);
				asleep_armed = !nonblock;
				bells = bells_read(s);
				last_look = !nonblock;
				n = rx_step(s, c, flags);
				last_look = false;
				if (n != -EAGAIN || !s->sess || bells_read(s) == bells)
					break;
			}
			if (n != -EAGAIN && !nonblock)
				rx_sleeper_leave(s);
		}
		if (n != -EAGAIN)
			n = post_settle(s, c, flags, n);
		if (n != -EAGAIN && asleep_armed && s->sess)
			disarm_data(s);
		pthread_mutex_unlock(&s->rx_lock);
		if (n != -EAGAIN)
			return n;
		if (nonblock) {
			atomic_fetch_add(&s->rx_eagain, 1);
			return -EAGAIN;
		}
		n = wait_fd(s, true, NULL);
		if (n < 0) {
			pthread_mutex_lock(&s->rx_lock);
			n = post_settle(s, c, flags, n);
			if (s->sess)
				disarm_data(s);
			pthread_mutex_unlock(&s->rx_lock);
			return n;
		}
	}
}

ssize_t wsd_sock_recv(struct wsd_sock *s, const struct iovec *iov, int iovcnt, int flags)
{
	struct cursor c = { iov, iovcnt, 0, 0 };
	bool nonblock = s->nonblock || (flags & MSG_DONTWAIT);
	size_t want = iov_total(iov, iovcnt), done = 0;
	ssize_t n;

	/* a peek leaves the bytes for a handler we may fork (accept.c, maybe_handed) */
	if (!(flags & MSG_PEEK))
		served(s);
	wsd_upgrade_maybe(s);
	if (s->prov)
		wsd_upgrade_settle(s, false);   /* our first bytes wait for the peer's answer: its answer's too */
	cur_skip(&c, 0);
	if (!want) {
		if (!s->rx_ready_sent) {
			struct msghdr m = { .msg_iov = (struct iovec *)iov, .msg_iovlen = iovcnt };

			n = real.recvmsg(s->fd, &m, flags);
			return n < 0 ? -errno : n;
		}
		return 0;
	}
	if (!nonblock)
		atomic_fetch_add_explicit(&in_calls, 1, memory_order_relaxed);
	for (;;) {
		n = recv_once(s, &c, flags, nonblock);
		if (n <= 0) {
			n = done ? (ssize_t)done : n;
			break;
		}
		done += (size_t)n;
		cur_skip(&c, 0);
		if (!(flags & MSG_WAITALL) || (flags & MSG_PEEK) || done == want || nonblock) {
			n = (ssize_t)done;
			break;
		}
	}
	if (!nonblock)
		atomic_fetch_sub_explicit(&in_calls, 1, memory_order_relaxed);
	return n;
}

/* SPDX-License-Identifier: MIT */
/*
 * Sleeping and spinning: a thread counts itself a sleeper (sleeper_enter)
 * and arms the peer's doorbell (arm_data) before its last look, then
 * sleeps in the kernel fd (wait_fd: recv(MSG_PEEK) or poll, so that
 * SO_RCVTIMEO, SO_SNDTIMEO and signals stay the kernel's).  Before that it
 * may spin on the ring (spin_for_data, spin_for_room), within the
 * process's spin policy (spinners, in_calls, each thread's adaptive
 * budget).  Locks: mu for the sleeper count and the drain, arm_data under
 * rx_lock; nobody sleeps holding a lock.  It does not read data.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>

#include "switch/sess_int.h"

/*
 * A thread about to sleep counts itself a sleeper BEFORE its last look at
 * the ring: a doorbell another thread reads is then never one it needed
 * (only a sole sleeper drains, after waking).
 */
void sleeper_enter(struct wsd_sock *s)
{
	pthread_mutex_lock(&s->mu);
	s->sleepers++;
	pthread_mutex_unlock(&s->mu);
}

void sleeper_leave(struct wsd_sock *s)
{
	pthread_mutex_lock(&s->mu);
	s->sleepers--;
	pthread_mutex_unlock(&s->mu);
}

/*
 * A blocking receive's sleep, from before its last look until it is awake
 * again (wait_fd), is also counted among the socket's receivers asleep,
 * and noted for its thread: the peer's proof on the stream is the only
 * wake-up such a receiver may get for the data the peer sent with its
 * switch, so no other thread takes the proof while one counts (proof_ours).
 */
static __thread struct wsd_sock *rx_asleep_on;

void rx_sleeper_enter(struct wsd_sock *s)
{
	pthread_mutex_lock(&s->mu);
	s->sleepers++;
	s->rx_sleepers++;
	pthread_mutex_unlock(&s->mu);
	rx_asleep_on = s;
}

/* mu held: a sleeper (a receive counted by rx_sleeper_enter, for_rx) is one no longer. */
static void sleeper_gone(struct wsd_sock *s, bool for_rx)
{
	s->sleepers--;
	if (for_rx) {
		s->rx_sleepers--;
		rx_asleep_on = NULL;
	}
}

void rx_sleeper_leave(struct wsd_sock *s)
{
	pthread_mutex_lock(&s->mu);
	sleeper_gone(s, true);
	pthread_mutex_unlock(&s->mu);
}

/* Receives on s that count as asleep, this thread's not counted. */
static int other_sleepers(struct wsd_sock *s)
{
	int n;

	pthread_mutex_lock(&s->mu);
	n = s->rx_sleepers - (rx_asleep_on == s ? 1 : 0);
	pthread_mutex_unlock(&s->mu);
	return n;
}

/*
 * rx_lock held, the peer's proof (or part of it) on the stream: whether
 * this thread may take it.  Its bytes woke every receiver asleep in the
 * kernel socket when they came; one that has not run since would sleep on
 * once they are gone, with the data they announce in its ring, were it not
 * for the doorbell after the proof (to_ring), which the taker must leave
 * on the stream for it (proof_alone).  So while a receive
 * counts as asleep, only such a receive takes the proof, in its own look;
 * any other thread (a poll, a sender's wait, a receive that does not
 * sleep) leaves it, and the sleeper, whose peek now finds it, comes back
 * for it.  The receivers asleep always wake for it: no thread waits for
 * another here.
 */
bool proof_ours(struct wsd_sock *s)
{
	return rx_asleep_on == s || other_sleepers(s) == 0;
}

/*
 * rx_lock held: no receive but this thread's counts as asleep, so the
 * bells after a proof it takes may go with it.  Else it takes the proof
 * alone (the stream peeked first, the read cut at the switch point, the
 * proof then read by its own length), and the bell stays for the others.
 */
bool proof_alone(struct wsd_sock *s)
{
	return other_sleepers(s) == 0;
}

/*
 * rx_lock held: write a new arm word, and note what it stands for.  The
 * peer's announced bells are read BEFORE the word goes out: read after,
 * they could already count the bell the peer rang for this very word, and
 * once the drain took that bell the arm would look unrung (arm_data would
 * let it stand) while the peer, having rung it, rings no more: a poll or
 * a blocking receive would sleep on data that came until its next look at
 * the ring, and an epoll set that parked the socket on that arm
 * (wsd_sock_parkable) would not look again at all.
 */
static void arm_write(struct wsd_session *ss, bool self)
{
	uint64_t ann = wsd_bells_announced(ctl_get(ss, CW_BELLS));

	put_word(ss, W_RX, CW_DATA_ARM,
		 __atomic_add_fetch(&ss->data_gen, 1, __ATOMIC_RELAXED) << 1 | self);
	ss->arm_self = self;
	ss->arm_bells = ann;
	atomic_store(&ss->arm_live, true);
	race_window();    /* armed, the last look not yet taken */
}

bool arm_unrung(struct wsd_session *ss)
{
	return atomic_load(&ss->arm_live) &&
	       wsd_bells_announced(ctl_get(ss, CW_BELLS)) == ss->arm_bells;
}

uint64_t bells_read(struct wsd_sock *s)
{
	uint64_t n;

	pthread_mutex_lock(&s->mu);
	n = s->sess ? s->sess->bells_rx : 0;
	pthread_mutex_unlock(&s->mu);
	return n;
}

/*
 * rx_lock held: make the peer ring when data comes; drop old bells unless
 * another thread sleeps on them.  self: the caller already counts as a sleeper.
 * An arm the peer has not rung yet, with no bell left unread, stands as it
 * is: no word to write, no kernel socket to read.
 */
void arm_data(struct wsd_sock *s, bool self)
{
	struct wsd_session *ss = s->sess;
	bool stands;

	pthread_mutex_lock(&s->mu);
	/* the same kind of arm, unrung, and every bell before it read */
	stands = ss->arm_self == self && arm_unrung(ss) && ss->arm_bells == ss->bells_rx;
	/*
	 * Drop old bells only while the ring is empty: with data waiting, the
	 * fd's readability is true, and an epoll set holding it (perhaps inside
	 * another set) must keep seeing it.
	 */
	if (!stands && s->sleepers == (self ? 1 : 0) && !(s->rx_mode == DIR_RING && rec_head(ss)))
		drain(s);
	pthread_mutex_unlock(&s->mu);
	/* a sender short of room may be asleep too: give it all we took */
	if (ss->rx_pos != ss->rx_reported)
		report(s, true);
	if (stands)
		return;
	arm_write(ss, self);
}

/*
 * rx_lock held: a blocking receive that armed with its sleeper bit leaves.
 * The sender may not have rung that arm (the data came before it looked),
 * and a sender that took it for a receiver still asleep would send by
 * read-based zero copy and wait for a reader that is off sending to it.
 * The new word still arms, without the bit.
 */
void disarm_data(struct wsd_sock *s)
{
	arm_write(s->sess, false);
}

/*
 * Sleep until the kernel fd has something: a doorbell, stream data, the
 * end.  recv(MSG_PEEK) keeps SO_RCVTIMEO and SA_RESTART the kernel's.
 * for_rx false: a sender's wait (SO_SNDTIMEO, ticking if no bell can come).
 */
/* SO_SNDTIMEO in ms, or -1 for none. */
static int sndtimeo_ms(struct wsd_sock *s)
{
	struct timeval tv = { 0 };
	socklen_t tl = sizeof(tv);

	if (real.getsockopt(s->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, &tl) || !(tv.tv_sec || tv.tv_usec))
		return -1;
	return (int)(tv.tv_sec * 1000 + (tv.tv_usec + 999) / 1000);
}

/*
 * For wsd stat --waits: the protocol's state as this thread goes to sleep
 * (for data, or else room or a zero-copy completion).  The peer's words as
 * last read and checked (seen[]), never read afresh here: no lock is held
 * that a fresh read's check needs.  Relaxed stores, WSD_WAIT_AT cleared
 * first and set last (switch/stat.h).
 */
static void note_wait(struct wsd_sock *s, bool for_rx)
{
	struct wsd_session *ss = s->sess;
	_Atomic uint64_t *w = s->stat->wait;
	uint64_t v[WSD_STAT_WAIT_N];

	if (!ss)
		return;
	v[WSD_WAIT_WHAT] = for_rx ? 1 : ss->zc_sent > atomic_load(&ss->seen[CW_ZC_DONE]) ? 3 : 2;
	v[WSD_WAIT_MODES] = (uint64_t)s->tx_mode << 8 | (uint64_t)s->rx_mode;
	v[WSD_WAIT_SLEEPERS] = (uint64_t)s->sleepers;
	v[WSD_WAIT_TX_POS] = ss->tx_pos;
	v[WSD_WAIT_CONSUMED] = atomic_load(&ss->seen[CW_CONSUMED]);
	v[WSD_WAIT_ZC_SENT] = ss->zc_sent;
	v[WSD_WAIT_ZC_DONE] = atomic_load(&ss->seen[CW_ZC_DONE]);
	v[WSD_WAIT_SPACE_GEN] = ss->space_gen;
	v[WSD_WAIT_PEER_DATA_ARM] = atomic_load(&ss->seen[CW_DATA_ARM]);
	v[WSD_WAIT_RUNG_DATA] = ss->rung_data;
	v[WSD_WAIT_RX_POS] = ss->rx_pos;
	v[WSD_WAIT_RX_REPORTED] = ss->rx_reported;
	v[WSD_WAIT_DATA_GEN] = ss->data_gen;
	v[WSD_WAIT_PEER_SPACE_ARM] = atomic_load(&ss->seen[CW_SPACE_ARM]);
	v[WSD_WAIT_RUNG_SPACE] = ss->rung_space;
	v[WSD_WAIT_BELLS_TX] = ss->bells_tx;
	v[WSD_WAIT_BELLS_RX] = ss->bells_rx;
	v[WSD_WAIT_BELLS_ANN] = wsd_bells_announced(atomic_load(&ss->seen[CW_BELLS]));
	v[WSD_WAIT_CLOSED] = atomic_load(&ss->seen[CW_CLOSED]);
	v[WSD_WAIT_ARM_BELLS] = ss->arm_bells;
	v[WSD_WAIT_BELLS_UNSENT] = ss->bells_unsent;
	v[WSD_WAIT_BELL_ERRNO] = (uint64_t)ss->bell_errno;
	atomic_store_explicit(&w[WSD_WAIT_AT], 0, memory_order_relaxed);
	atomic_thread_fence(memory_order_release);
	for (int i = 1; i < WSD_STAT_WAIT_N; i++)
		atomic_store_explicit(&w[i], v[i], memory_order_relaxed);
	atomic_store_explicit(&w[WSD_WAIT_AT], (uint64_t)wsd_now_ms(), memory_order_release);
}

/*
 * Sleep until the kernel fd has something: a doorbell, stream data, the
 * end.  A receiver (and a sender without SO_SNDTIMEO, once bells can reach
 * it) blocks in recv(MSG_PEEK), so SO_RCVTIMEO and SA_RESTART stay the
 * kernel's.  A sender with a timeout polls until *deadline (ms clock), and
 * gets -EAGAIN after it, -EINTR on a signal, as the kernel's send does.
 */
int wait_fd(struct wsd_sock *s, bool for_rx, int64_t *deadline)
{
	bool peek = for_rx;
	int grace = -1;
	long sleep_us;
	char b;
	ssize_t n;
	int e = 0;

	if (!for_rx && s->sess) {
		/* a sender learns here that the peer's bells can reach it */
		pthread_mutex_lock(&s->rx_lock);
		rx_settle(s, false);
		pthread_mutex_unlock(&s->rx_lock);
		if (*deadline == 0) {
			int ms = sndtimeo_ms(s);

			*deadline = ms < 0 ? -1 : wsd_now_ms() + ms;
		}
		peek = s->rx_mode == DIR_RING && *deadline < 0 &&
		       !ctl_get(s->sess, CW_BACK_BELLS);
	}
	/* part of the proof came: the rest is due within PROOF_MS, tick to see */
	if (for_rx && s->rx_mode == DIR_PROOF && s->proof_got)
		peek = false;
	/* announced bells missing: look again when their grace ends */
	pthread_mutex_lock(&s->mu);
	grace = bells_wait_ms(s);
	pthread_mutex_unlock(&s->mu);
	if (grace >= 0)
		peek = false;
	/* a ring of ours that wrote no bell: the peer may sleep for it as we do */
	if (s->sess)
		bell_retry(s, s->sess);
	/* the caller entered as a sleeper (sleeper_enter) before its last look */
	wsd_stat_add(s->stat, &s->stat->waits, 1);
	race_window();    /* looked, not yet asleep: the bell must still wake it */
	/* the test build: another thread may read the peer's proof meanwhile (proofwake_check.sh) */
	if (for_rx && s->rx_mode != DIR_RING && wsd_fault("sleep-race", &sleep_us))
		usleep((useconds_t)sleep_us);
	note_wait(s, for_rx);
	/* its last fd closed: the number may be another file's (sock.c, last_close) */
	if (atomic_load(&s->closed)) {
		pthread_mutex_lock(&s->mu);
		sleeper_gone(s, for_rx);
		pthread_mutex_unlock(&s->mu);
		return -EBADF;
	}
	if (peek) {
		n = real.recv(s->fd, &b, 1, MSG_PEEK);
		if (n < 0)
			e = errno;
		else if (n == 0 && s->rx_mode == DIR_RING)
			s->tcp_eof = true;
		if (!for_rx && e == EAGAIN)
			e = 0;   /* SO_RCVTIMEO ended a sender's wait: look again */
	} else {
		struct pollfd p = { .fd = s->fd, .events = POLLIN };
		int ms = -1;

		if (deadline && *deadline > 0) {
			int64_t left = *deadline - wsd_now_ms();

			ms = left > 0 ? (int)left : 0;
		}
		if (grace >= 0 && (ms < 0 || ms > grace))
			ms = grace;
		/*
		 * No doorbell can come while the peer still sends by the stream,
		 * and the stream's unread data would wake us at once: tick,
		 * waking early only for a reset.
		 */
		if (s->rx_mode != DIR_RING || (s->sess && ctl_get(s->sess, CW_BACK_BELLS))) {
			p.events = 0;
			if (ms < 0 || ms > TICK_MS)
				ms = TICK_MS;
		}
		n = real.poll(&p, 1, ms);
		if (n < 0)
			e = errno;
		else if (n == 0 && deadline && *deadline > 0 && wsd_now_ms() >= *deadline)
			e = EAGAIN;
		/*
		 * A ticking sender's stream hung up (the peer's reset; we sent
		 * no FIN while we send): no bell can come, and the peer takes
		 * nothing more, as a kernel send would find.  The error stays
		 * the kernel's, for the receive.
		 */
		else if (n > 0 && !for_rx && (p.revents & POLLHUP))
			e = EPIPE;
	}
	race_window();    /* awake, the bells not yet drained */
	pthread_mutex_lock(&s->mu);
	if (atomic_load(&s->closed)) {
		/* closed while we slept: its doorbells are not ours to read */
		sleeper_gone(s, for_rx);
		pthread_mutex_unlock(&s->mu);
		return -EBADF;
	}
	if (s->sleepers == 1) {
		/* not after an error: the kernel would say end of stream, and the error is ours */
		if (!e || e == EINTR || e == EAGAIN)
			drain(s);
		/* the bells it read may have been an epoll set's (parked there) */
		wsd_poll_sock_unpark(s);
	}
	sleeper_gone(s, for_rx);
	pthread_mutex_unlock(&s->mu);
	/* the peer's switch reset for a bypass: its word tells (the caller's next look) */
	if (e && e != EINTR && e != EAGAIN && peer_bypass(s->sess))
		return 0;
	if (e == EINTR || e == EAGAIN || e == EWOULDBLOCK)
		return -e;
	if (e) {
		/*
		 * The kernel reports a reset once; after it, the end of the
		 * stream.  On the ring, what the peer wrote before it is read
		 * first, as from the kernel's queue: the error waits for the
		 * ring's end (rx_ring), and the caller looks again.
		 */
		if (for_rx && s->rx_mode == DIR_RING) {
			keep_error(s, e);
			return 0;
		}
		s->tcp_eof = true;
		return -e;
	}
	return 0;
}

/*
 * Spin in short bursts: a peer on another CPU is seen within a burst.
 * Whether the peer runs elsewhere can't be known from here (our own
 * affinity says nothing about the peer's), so spinning is on whenever
 * WSD_SPIN_US is, within the limits below.
 */
#define SPIN_BURST 16     /* pauses between looks at the clock, well under a microsecond */

static int affinity_cpus(void)
{
	static int cpus;

	if (!cpus) {
		cpu_set_t set;

		cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
	}
	return cpus;
}

/*
 * Spinners in this process: at most half the CPUs it may use (at least
 * one), as its peer spins too.  With four connections' threads at each end,
 * four spinners per process on two CPUs took the CPUs from the threads
 * copying (wsd bench, 4 streams of 256 KiB to 4 MiB: about half of TCP);
 * the rest sleep at once.
 */
static _Atomic int spinners;

/*
 * Threads inside a blocking send or receive on an accelerated socket.
 * When there are more than the process's CPUs, the threads that would spin
 * are better asleep: the others are copying and need the CPUs (the four
 * streams above: 4.6 GB/s with a spinner per process, 15 without).
 */
_Atomic int in_calls;

static bool spin_start(void)
{
	int n = atomic_load_explicit(&spinners, memory_order_relaxed);
	int most = affinity_cpus() / 2 > 1 ? affinity_cpus() / 2 : 1;

	if (wsd_spin_ns() <= 0 ||
	    atomic_load_explicit(&in_calls, memory_order_relaxed) > affinity_cpus())
		return false;
	do {
		if (n >= most)
			return false;
	} while (!atomic_compare_exchange_weak(&spinners, &n, n + 1));
	return true;
}

static void spin_stop(void)
{
	atomic_fetch_sub(&spinners, 1);
}

/*
 * A process held to one CPU yields between bursts, so a peer pinned to the
 * same CPU runs at once rather than after a time slice; one free to move
 * does not (yielding there cost a busy process with several threads per
 * connection most of its throughput: the stress test, 1.1 GB/s to 0.3).
 */
static void spin_pause(void)
{
	if (affinity_cpus() == 1)
		sched_yield();
}

/*
 * Each thread's spin adapts: a spin that finds the thread was off its CPU
 * for a while (another thread wanted it: more runnable threads than CPUs)
 * ends at once and quarters the next ones; a spin that ends undisturbed
 * doubles them again, up to WSD_SPIN_US.  wsd bench, four streams each way
 * between two processes on two CPUs: 50 us spins gave 0.5-0.7 of TCP,
 * none 2x TCP, while one stream and round trips need the spin.
 */
#define PREEMPTED_NS 20000
static __thread int64_t spin_budget = -1, spin_last;

/*
 * A spin that lost its CPU for a time slice (another program wants the
 * CPU) stops spinning for a while: the thread sleeps at once, as a plain
 * TCP program's does.  The scheduler favours a thread that sleeps, and
 * wakes it ahead of the busy program, while one that spins is busy itself
 * and waits for the next slice: 64-byte round trips with one busy loop
 * beside the two ends, p99 4 ms spinning, 65 us plain TCP.  The pause
 * doubles when the next spin soon loses its CPU again (up to a second) and
 * starts again from the shortest otherwise.  A thread held to one CPU
 * yields in its spin (spin_pause): to a busy program there, a yield gives
 * away a whole slice, the same loss.
 */
#define SLICE_LOST_NS 500000
#define SPIN_OFF_MIN_NS 4000000
#define SPIN_OFF_MAX_NS 1024000000
static __thread int64_t spin_off_until, spin_off_ns;

static void spin_lost_slice(int64_t now)
{
	if (spin_off_ns && now - spin_off_until < 4 * spin_off_ns)
		spin_off_ns = spin_off_ns * 2 < SPIN_OFF_MAX_NS ? spin_off_ns * 2 : SPIN_OFF_MAX_NS;
	else
		spin_off_ns = SPIN_OFF_MIN_NS;
	spin_off_until = now + spin_off_ns;
}

static void spin_grow(void)
{
	int64_t full = wsd_spin_ns();

	spin_budget = spin_budget * 2 < full ? spin_budget * 2 : full;
}

int64_t wsd_spin_until(int64_t max_ns)
{
	int64_t full = wsd_spin_ns(), ns;

	if (full <= 0)
		return 0;
	if (spin_budget < 0 || spin_budget > full)
		spin_budget = full;
	ns = spin_budget < max_ns ? spin_budget : max_ns;
	spin_last = wsd_now_ns();
	if (spin_last < spin_off_until)    /* a pause after a lost slice */
		return 0;
	return ns > 0 ? spin_last + ns : 0;
}

/* Between looks: false when the spin is over (its time is up, or it was preempted). */
static bool spin_tick(int64_t end)
{
	int64_t now;

	spin_pause();
	now = wsd_now_ns();
	if (now - spin_last > PREEMPTED_NS) {
		spin_budget = spin_budget / 4 > 1000 ? spin_budget / 4 : 1000;
		if (now - spin_last > SLICE_LOST_NS)
			spin_lost_slice(now);
		return false;
	}
	spin_last = now;
	if (now < end)
		return true;
	spin_grow();
	return false;
}

bool wsd_spin_burst(int64_t end)
{
	for (int i = 0; i < SPIN_BURST; i++)
		__builtin_ia32_pause();
	return spin_tick(end);
}

/*
 * Spin until ready(s, len, zc) (a hint: no lock), or the spin is over.
 * The condition is looked at between single pauses, the clock between bursts.
 */
static bool spin_until_ready(struct wsd_sock *s, bool (*ready)(struct wsd_sock *, uint32_t, bool),
			     uint32_t len, bool zc)
{
	int64_t end;

	if (!spin_start())
		return false;
	end = wsd_spin_until(INT64_MAX);
	while (end) {
		for (int i = 0; i < SPIN_BURST; i++) {
			if (ready(s, len, zc)) {
				spin_grow();
				spin_stop();
				return true;
			}
			__builtin_ia32_pause();
		}
		if (!spin_tick(end))
			break;
	}
	spin_stop();
	return false;
}

static bool data_ready(struct wsd_sock *s, uint32_t len, bool zc)
{
	(void)len; (void)zc;
	if (s->rx_mode == DIR_RING || s->rx_mode == DIR_TCP)
		return rec_head(s->sess);   /* data, or (TCP) the peer's SWITCH */
	/*
	 * DRAIN, PROOF: the stream's bytes up to the switch point, then the
	 * proof.  A system call, so once a burst (a microsecond or so), not at
	 * every pause.
	 */
	{
		static __thread unsigned looks;
		struct pollfd p = { .fd = s->fd, .events = POLLIN };

		return ++looks % SPIN_BURST == 0 && real.poll(&p, 1, 0) > 0;
	}
}

static bool room_ready(struct wsd_sock *s, uint32_t len, bool zc)
{
	struct wsd_session *ss = s->sess;

	return zc ? ctl_get(ss, CW_ZC_DONE) >= ss->zc_sent : fits(ss, len, false);
}

/*
 * Poll the ring head for a while before sleeping; and, before the switch,
 * for the peer's SWITCH and proof, which a new connection's first answer
 * waits for (its peer switches as it answers).
 */
bool spin_for_data(struct wsd_sock *s)
{
	return (s->rx_mode == DIR_RING || s->rx_ready_sent) &&
	       spin_until_ready(s, data_ready, 0, false);
}

/* Poll for room (or our zero-copy records done) for a while before sleeping. */
bool spin_for_room(struct wsd_sock *s, uint32_t len, bool zc)
{
	return spin_until_ready(s, room_ready, len, zc);
}

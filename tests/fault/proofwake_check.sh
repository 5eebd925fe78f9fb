#!/bin/sh
# A proof taken by a look that reports nothing (wsd-protocol(7), The
# switch, Sleeping and waking).  tests/fault/proofwake: single bytes echoed
# on new connections, the client waiting in epoll_wait, under the test
# build of the library with two windows held open: proof-delay holds each
# side's proof 60 ms after its SWITCH record and first data went into the
# peer's ring, and park-race holds an epoll set 100 ms between arming a
# socket that waits for that proof and the look that decides whether to
# park it.  The proof comes in between; that look reads it and finds the
# data behind it.  Before, the set then slept with nothing more to come on
# the stream (the sender rang no doorbell, the proof being its wake-up),
# the echo in the ring, until the program's timeout (10 s): in every
# connection but the first.  Now the set reports what that look found.
# Then a blocking receiver whose other thread polls the socket: that poll
# reads the proof while sleep-race holds the receiver between its last look
# and its sleep, and the receiver slept until its SO_RCVTIMEO (10 s) in the
# first few connections.  Now the sender rings after its proof when the
# receiver armed (on shm; not over verbs), and the polling thread leaves a
# proof that a sleeping receive waits for to that receive (proof_ours):
# the third run turns the bell off (no-proof-bell) and so checks that rule
# alone.  Last, two blocking receives on one socket (twin): the second
# takes the proof and one byte of two while sleep-race holds the first
# between its last look and its sleep; only the bell after the proof
# wakes the first (without it, it slept to its 10 s timeout in the first
# connection).  Then bulk: a blocking receive whose last look after it
# armed takes the proof and the bell behind it, the data still to come
# (below).  About 15 s.
set -u
top=${top_builddir:-.}
lib=$top/tests/fault/.libs/libwsd_fault.so
prog=$top/tests/fault/proofwake
[ -f "$lib" ] || { echo "FAIL: no $lib (make check builds it)"; exit 1; }
[ -x "$prog" ] || { echo "FAIL: no $prog (make check builds it)"; exit 1; }
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0:detect_leaks=0"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# proofwake FAULT CONNS [MODE] [POINT...]: the program over CONNS
# connections under the test build with WSD_FAULT=FAULT (and $penv in its
# environment); fails unless all were echoed in time and each POINT fired
proofwake() {
	fault=$1 conns=$2 mode=${3:-}
	shift 2
	[ $# -gt 0 ] && shift
	# shellcheck disable=SC2086
	env ${penv:-} WSD_LIB="$lib" WSD_FAULT="$fault" WSD_UPGRADE_BYTES=1 \
		timeout -s KILL 120 "$top/wsd/wsd" run -- "$prog" "$conns" $mode \
		>"$tmp/out" 2>"$tmp/err"
	rc=$?
	cat "$tmp/out"
	if [ $rc -ne 0 ] || ! grep -q "^ok $conns\$" "$tmp/out"; then
		echo "FAIL: proofwake ${mode:-epoll} exited $rc"
		grep -v '^wsd fault:' "$tmp/err"
		exit 1
	fi
	for p; do
		grep -q "$p fires" "$tmp/err" ||
			{ echo "FAIL: the window was never open ($p did not fire)"; exit 1; }
	done
}

# run POINT [thread]: proofwake over 10 connections, the proof 60 ms late
# and POINT's window held 100 ms open
run() {
	proofwake "proof-delay=60@1+,$1=100000@1+${3:-}" 10 "${2:-}" "$1"
}

run park-race
echo "ok: 10 connections echoed at once, a proof inside the park window"
# The program's other thread reads the proof while the receiving thread is
# between its last look and its sleep (sleep-race holds it there).
run sleep-race thread
echo "ok: the receiving thread woke, its proof read by the other thread's poll"
# The same without the bell after the proof: the poll must leave the proof.
run sleep-race thread ,no-proof-bell@1+
grep -q "no-proof-bell fires" "$tmp/err" ||
	{ echo "FAIL: the bell after the proof was not turned off"; exit 1; }
# Two receives at once: the one that takes the proof leaves the other's byte in the ring.
run sleep-race twin
echo "ok: two receiving threads, the proof taken by one: the other woke for its byte"
# A blocking receive whose last look, after it armed, takes the proof and
# the bell rung for that arm (the stream read before the ring's SWITCH is
# looked at): it must arm again before it sleeps, as the data behind the
# proof comes later and the sender rings no more for the old arm.  16 KiB
# rings, so the server's 16 KiB answer cannot ride between its SWITCH and
# its proof; last-look-delay holds the client's last look 300 ms open on
# its connecting side, switch-data-delay holds the server's data 400 ms
# after its bell.  Before, the client slept to its 10 s timeout (the VM
# rig's many.pair stall over verbs, where 16 KiB rings are the rule).
penv="WSD_SWITCH_RING=16384 WSD_SPIN_US=0 WSD_EXPECT_PATH=shm"
proofwake "last-look-delay=300000@1+,switch-data-delay=400@1+" 2 bulk \
	last-look-delay switch-data-delay
echo "ok: a last look took the proof and its bell: the receive armed again and woke"
echo "PASS: a proof in either window, with and without the bell after it: all waiters woke"

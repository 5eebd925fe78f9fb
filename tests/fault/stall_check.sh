#!/bin/bash
# Two ends that both send while nobody reads (wsd-protocol(7), Back to the
# stream): each sender waits for room in the other's ring, and after a
# while without progress the switch moves the connection back to the
# kernel stream both ways, mid-transfer.  That move must be byte-exact
# whichever of the socket's threads makes it: the sender from its wait, or
# a receive that finds the peer's request first while the sender sleeps.
#
# A server holds 8 connections from each of two clients (tests/fault/fanout),
# every connection a checked stream of 32 MiB both ways, with a sender and
# a receiver thread each, 64 KiB rings (WSD_SWITCH_RING), and receivers that
# stop reading for up to 200 ms after every 4 MiB (WSD_FAULT_PAUSE_MS).
# Every connection must carry its whole stream both ways within 60 s, and
# the round must have moved some connections back (the switch's debug
# lines say "both ends wait for room").  WSD_FAULT_ROUNDS (default 2)
# rounds; WSD_FAULT_SEED=S repeats a run.
#
# Then WSD_FAULT_HELD_ROUNDS (default 2) rounds with the test build of the
# library (tests/fault/libwsd_fault.la) and WSD_FAULT=back-hold=600@1+: a
# sender that gives up waiting holds tx_lock for 600 ms after asking the
# peer back and before sending its own BACK, longer than a receiver's pause.
# Both ends' receivers then come back, see the other's request, and must
# not wait for that lock once its sender has gone back and sits in a
# blocking send on the stream, which the peer reads only once its receiver
# has read its ring up to our BACK: a receive that waits for the lock
# there hangs both processes for ever (the soak found it over verbs; a
# plain lock in switch/back.c, tx_lock_unless_back, hangs most rounds).
set -u
. "${srcdir:-.}/tests/attack/common.sh"
. "${srcdir:-.}/tests/fault/fanout.sh"
rounds=${WSD_FAULT_ROUNDS:-2}
seed0=${WSD_FAULT_SEED:-$(( $(date +%s) % 100000 * 1000 ))}
export WSD_UPGRADE_BYTES=1 WSD_SWITCH_RING=65536 WSD_FAULT_PAUSE_MS=200 WSD_DEBUG=1

# whole FILE N: FILE has N connection lines, each a whole stream both ways
whole() {
	[ "$(grep -c '^conn ' "$1")" -eq "$2" ] &&
		! grep '^conn ' "$1" | grep -qv ' tx 33554432 complete rx 33554432 complete$'
}

lib=${top_builddir:-.}/tests/fault/.libs/libwsd_fault.so
[ -f "$lib" ] || fail "no $lib (make check builds it)"
held=${WSD_FAULT_HELD_ROUNDS:-2}

# round SEED: one round, its line printed; adds its stalls to total
round() {
	# the debug lines go to .log files: fail() shows only .out and .err
	fanout_start "$1" 32 log
	for p in "$apid" "$bpid" "$spid"; do
		wait_exit "$p" 60000 ||
			fail "round $1: a process hangs (pid $p):" "$(fanout_hung a "$apid")" \
			     "$(fanout_hung b "$bpid")" "$(fanout_hung server "$spid")"
		wait "$p" || fail "round $1: pid $p exited $? (mismatch: 1)"
	done
	whole "$tmp/a.out" 8 && whole "$tmp/b.out" 8 && whole "$tmp/server.out" 16 ||
		fail "round $1: not every stream arrived whole"
	# (not "all on shm at once": a stall may move one back before the last upgrades;
	# a stall happens only on a ring, so the count below shows they were there)
	n=$(cat "$tmp"/*.log | grep -c 'both ends wait for room')
	total=$((total + n))
	echo "round $1${WSD_FAULT:+ ($WSD_FAULT)}: 16 connections whole both ways;" \
	     "$n stalls moved back to the stream"
}

total=0
echo "stall_check: $rounds rounds from seed $seed0, then $held with the lock held"
for r in $(seq 0 $((rounds - 1))); do
	round $((seed0 + r))
done
# without a stall the rounds did not test the move: a failure, not a pass
[ "$total" -gt 0 ] || fail "no connection went back to the stream in $rounds rounds"
total=0
for r in $(seq 0 $((held - 1))); do
	WSD_LIB=$lib WSD_FAULT='back-hold=600@1+' round $((seed0 + rounds + r))
done
[ "$held" -eq 0 ] || [ "$total" -gt 0 ] ||
	fail "no connection went back to the stream in $held rounds with the lock held"
echo "PASS: $rounds rounds and $held with the lock held"
exit 0

#!/bin/sh
# A squatter of another user (uid 65534) runs a plain TCP service on a port
# P and holds the registry name "\0wsd-nd.P" with its backlog full, so that
# any rendezvous there waits.  The victim, under wsd run, talks to that
# service first (its upgrade can only wait, or time out), then to an honest
# wsd server: that connection must still move to shm, and the victim's
# forks must not wait for the upgrade in hand: none takes 100 ms, and the
# quickest at most 2 ms more than the quickest fork without wsd of a
# process with as many threads (the kernel's fork of a threaded process
# costs more: on this machine class 0.15 ms for four idle threads when
# quiet, up to 0.7 ms under load).  The quickest, not the median: a wait
# would slow every fork, while a loaded machine (CI's, beside the VM rig)
# slows some by a millisecond or two, wsd or not.  What wsd adds to the
# quickest is about 0.5 ms on a quiet machine and was 0.4 to 0.9 ms beside
# a CI run; each run prints it.  Then the same forks without any
# attacker, right after a short connection to the server.
set -u
. "${srcdir:-.}/tests/attack/priv.sh"
stall=${top_builddir:-.}/tests/attack/stall
$nobody test -x "$stall" || { echo "SKIP: uid 65534 cannot run $stall"; exit 77; }

$nobody "$stall" squat "$tmp/squat.port" "$tmp/stop" >"$tmp/squat.out" 2>"$tmp/squat.err" &
pids="$pids $!"
wait_file "$tmp/squat.port" || fail "the squatter did not start"
sport=$(cat "$tmp/squat.port")
start_server

"$stall" forks >"$tmp/base.out" 2>&1 || fail "the baseline forks failed"
base=$(sed -n 's/^forks: min [0-9]* us p50 \([0-9]*\) us.*/\1/p' "$tmp/base.out")

# victim NAME [ENV...] -- ARGS: stall ARGS under wsd run (with ENV), ended
# within 20 s and exit 0; its line of output in $line
victim() {
	vname=$1
	shift
	env "$@" >"$tmp/$vname.out" 2>"$tmp/$vname.err" &
	v=$!
	pids="$pids $v"
	wait_exit "$v" 20000 || fail "$vname: the victim hung"
	wait "$v" || fail "$vname: a wrong answer or none"
	line=$(cat "$tmp/$vname.out")
}
# forks_fast WHAT: $line's quickest fork at most 2 ms above the quickest
# of a plain process with as many threads, taken right after it (the load
# alike), and none 100 ms (a loaded machine may hold one back; a wait for
# an upgrade is 200 ms to seconds).  A sanitizer build's fork waits up to
# 200 ms for a thread of ours at work (its allocator has no fork
# handling, switch/proc.c): there the bound is 300 ms.
maxfork=100000
[ -n "${WSD_TEST_SANITIZERS:-}" ] && maxfork=300000
forks_fast() {
	min=$(echo "$line" | sed -n 's/.*fork min \([0-9]*\) us.*/\1/p')
	max=$(echo "$line" | sed -n 's/.* max \([0-9]*\) us.*/\1/p')
	th=$(echo "$line" | sed -n 's/.*; \([0-9]*\) threads.*/\1/p')
	[ -n "$min" ] && [ -n "$th" ] && [ "$th" -ge 1 ] || fail "$1: not understood: $line"
	tline=$("$stall" forks $((th - 1)))
	tbase=$(echo "$tline" | sed -n 's/^forks: min \([0-9]*\) us.*/\1/p')
	[ -n "$tbase" ] || fail "the baseline forks with $((th - 1)) threads failed"
	echo "(a fork without wsd of a process with $th threads: ${tline#forks: };" \
		"wsd adds $((min - tbase)) us to the quickest)"
	[ "$min" -le $((tbase + 2000)) ] ||
		fail "$1: the quickest fork $min us, without wsd $tbase us ($th threads)"
	[ "$max" -le "$maxfork" ] || fail "$1: max $max us"
}

victim victim "$wsd" run -- "$stall" victim "$sport" "$port"
echo "$line (a fork without wsd: p50 $base us)"
case $line in
*"server on shm"*) ;;
*) fail "the victim's connection to an honest server stayed on TCP behind the squatter" ;;
esac
forks_fast "a fork waited for the upgrade in hand"

victim quick "$wsd" run -- "$stall" quick "$port"
echo "$line (no attacker)"
forks_fast "a fork after a short connection waited"

# fork_mid NAME FAULT BOUND WHAT: stall forkmid under the test build's
# fault point FAULT; its one fork within BOUND us, and the parent's copy
# back on the stream after it
lib=${top_builddir:-.}/tests/fault/.libs/libwsd_fault.so
[ -f "$lib" ] || fail "no $lib (make check builds it)"
fork_mid() {
	victim "$1" WSD_LIB="$lib" WSD_FAULT="$2" "$wsd" run -- "$stall" forkmid "$port"
	echo "$line ($2)"
	us=$(echo "$line" | sed -n 's/^forkmid: fork \([0-9]*\) us.*/\1/p')
	[ "$us" -le "$3" ] || fail "the fork waited for $4: $us us"
	case $line in
	*"parent on tcp"*) ;;
	*) fail "the parent's copy did not go back to the stream: $line" ;;
	esac
}
# a fork while a handshake runs (its HELLO held back 400 ms): the fork does
# not wait for it, and the parent's copy goes back to the stream when the
# handshake ends
fork_mid forkmid hello-delay=400 100000 "the handshake"
# a fork while the upgrade's thread is at work and does not run (held
# 400 ms, counted busy): the fork does not wait for it either
fork_mid forkbusy busy-delay=400 "$maxfork" "a thread at work"
touch "$tmp/stop"
kill -0 "$server" 2>/dev/null || fail "the server died"
echo "PASS: behind a squatted registry the victim upgraded elsewhere and forked without waiting"
exit 0

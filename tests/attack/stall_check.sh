#!/bin/sh
# A squatter of another user (uid 65534) runs a plain TCP service on a port
# P and holds the registry name "\0wsd-nd.P" with its backlog full, so that
# any rendezvous there waits.  The victim, under wsd run, talks to that
# service first (its upgrade can only wait, or time out), then to an honest
# wsd server: that connection must still move to shm, and the victim's
# forks must not wait for the upgrade in hand (at most 1 ms more than a
# fork without wsd, at the median).  Then the same forks without any
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
base=$(sed -n 's/^forks: p50 \([0-9]*\) us.*/\1/p' "$tmp/base.out")

"$wsd" run -- "$stall" victim "$sport" "$port" >"$tmp/victim.out" 2>"$tmp/victim.err" &
v=$!
pids="$pids $v"
wait_exit "$v" 20000 || fail "the victim hung"
wait "$v" || fail "the victim saw a wrong answer or none"
line=$(cat "$tmp/victim.out")
echo "$line (a fork without wsd: p50 $base us)"
case $line in
*"server on shm"*) ;;
*) fail "the victim's connection to an honest server stayed on TCP behind the squatter" ;;
esac
p50=$(echo "$line" | sed -n 's/.*fork p50 \([0-9]*\) us.*/\1/p')
max=$(echo "$line" | sed -n 's/.* max \([0-9]*\) us.*/\1/p')
[ "$p50" -le $((base + 1000)) ] ||
	fail "a fork waited for the upgrade in hand: p50 $p50 us, without wsd $base us"
# a loaded machine may hold one fork back; a wait for the upgrade is 200 ms to seconds
[ "$max" -le 100000 ] || fail "a fork waited for the upgrade in hand: max $max us"

"$wsd" run -- "$stall" quick "$port" >"$tmp/quick.out" 2>"$tmp/quick.err" &
v=$!
pids="$pids $v"
wait_exit "$v" 20000 || fail "the quick victim hung"
wait "$v" || fail "the quick victim saw a wrong answer or none"
line=$(cat "$tmp/quick.out")
echo "$line (no attacker)"
p50=$(echo "$line" | sed -n 's/.*fork p50 \([0-9]*\) us.*/\1/p')
max=$(echo "$line" | sed -n 's/.* max \([0-9]*\) us.*/\1/p')
[ "$p50" -le $((base + 1000)) ] || fail "forks after a short connection: p50 $p50 us"
[ "$max" -le 100000 ] || fail "a fork after a short connection waited: max $max us"

# a fork while a handshake runs (its HELLO held back 400 ms by the test
# build's fault point): the fork does not wait for it, and the parent's
# copy goes back to the stream when the handshake ends
lib=${top_builddir:-.}/tests/fault/.libs/libwsd_fault.so
[ -f "$lib" ] || fail "no $lib (make check builds it)"
WSD_LIB=$lib WSD_FAULT=hello-delay=400 "$wsd" run -- "$stall" forkmid "$port" \
	>"$tmp/forkmid.out" 2>"$tmp/forkmid.err" &
v=$!
pids="$pids $v"
wait_exit "$v" 20000 || fail "the forking victim hung"
wait "$v" || fail "a fork in the middle of a handshake: a wrong answer or none"
line=$(cat "$tmp/forkmid.out")
echo "$line"
us=$(echo "$line" | sed -n 's/^forkmid: fork \([0-9]*\) us.*/\1/p')
[ "$us" -le 100000 ] || fail "the fork waited for the handshake: $us us"
case $line in
*"parent on tcp"*) ;;
*) fail "the parent's copy did not go back to the stream: $line" ;;
esac
touch "$tmp/stop"
kill -0 "$server" 2>/dev/null || fail "the server died"
echo "PASS: behind a squatted registry the victim upgraded elsewhere and forked without waiting"
exit 0

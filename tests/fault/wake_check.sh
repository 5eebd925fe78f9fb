#!/bin/sh
# The sleeper/waker protocol (wsd-protocol(7), Sleeping and waking) with
# its windows held open: the test build of the library
# (tests/fault/libwsd_fault.la) with WSD_FAULT=wake-race=US sleeps US
# microseconds, at one pass in four, between each word a side publishes
# (an arm, a record, a consumed count) and the look that must follow it,
# and between a sleeper's last look and its sleep, and its waking and its
# drain.  A lost wake-up then leaves both ends asleep: the stress program
# (tests/sock/stress, both directions at once, random sizes) fails when
# nothing moves for its stall limit, printing both ends' wsd stat and
# threads.  Spinning is off (WSD_SPIN_US=0), so every wait sleeps, and
# half the rounds use 64 KiB rings, so senders wait for room often.
# WSD_WAKE_ROUNDS rounds (default 6); WSD_FAULT_SEED=S repeats round S.
set -u
top=${top_builddir:-.}
lib=$top/tests/fault/.libs/libwsd_fault.so
stress=$top/tests/sock/stress
wsd=$top/wsd/wsd
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0:detect_leaks=0"
[ -f "$lib" ] || { echo "FAIL: no $lib (make check builds it)"; exit 1; }
[ -x "$stress" ] || { echo "FAIL: no $stress (make check builds it)"; exit 1; }
command -v timeout >/dev/null 2>&1 || { echo "SKIP: no timeout command"; exit 77; }
rounds=${WSD_WAKE_ROUNDS:-6}
seed0=${WSD_FAULT_SEED:-$(( $(date +%s) % 100000 * 100 ))}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rc=0
echo "wake_check: $rounds rounds from seed $seed0"
for r in $(seq 0 $((rounds - 1))); do
	seed=$((seed0 + r))
	# the window: 0.1 to 3.2 ms; the ring: 64 KiB in odd rounds, else the default
	us=$(( 100 << (seed % 6) ))
	ring=""
	[ $((seed % 2)) -eq 1 ] && ring=65536
	WSD_LIB=$lib WSD_FAULT="wake-race=$us@1+" WSD_SPIN_US=0 WSD_SWITCH_RING=$ring \
		timeout -s KILL 120 "$wsd" run -- "$stress" --bytes 48M --seed "$seed" \
		--timeout 110 >"$tmp/out" 2>&1
	st=$?
	if [ $st -ne 0 ] || [ "$(tail -n 1 "$tmp/out")" != ok ]; then
		echo "FAIL: round $seed (wake-race=$us, ring ${ring:-default}): exit $st"
		grep -v '^wsd fault:' "$tmp/out"
		echo "(again: WSD_FAULT_SEED=$seed WSD_WAKE_ROUNDS=1 $0)"
		rc=1
		continue
	fi
	grep -q 'wake-race fires' "$tmp/out" || { echo "FAIL: round $seed: the fault point never fired"; rc=1; }
	echo "round $seed: wake-race=$us, ring ${ring:-default}: $(grep 'both ways' "$tmp/out")"
done
exit $rc

#!/bin/sh
# A doorbell the kernel does not take (wsd-protocol(7), Sleeping and
# waking): the test build of the library with WSD_FAULT=bell-unsent@N
# fails the Nth doorbell a process rings as a send that returns ENOBUFS
# would, once.  The peer that armed sleeps on its kernel socket with
# nothing else coming there, so that ring is owed: the ringing socket's
# next wait and its channel's sweep (every 500 ms) write it.  Before, the
# ring counted as made and both ends of tests/sock/stress slept for good
# (with N=20 and seed 7: a->b stopped after 5 MiB of 8).  Spinning is off,
# so every wait sleeps; the stress program fails after 10 s without
# progress, printing both ends' wsd stat and threads.  Six runs of 8 MiB
# each way, one bell failed in each process of each; about 10 s.  The
# Nth are early ones (20 at most): the sanitizer build rings fewer than 30
# in a run, and a fault that never fires tests nothing.
set -u
top=${top_builddir:-.}
lib=$top/tests/fault/.libs/libwsd_fault.so
stress=$top/tests/sock/stress
wsd=$top/wsd/wsd
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0:detect_leaks=0"
[ -f "$lib" ] || { echo "FAIL: no $lib (make check builds it)"; exit 1; }
[ -x "$stress" ] || { echo "FAIL: no $stress (make check builds it)"; exit 1; }
command -v timeout >/dev/null 2>&1 || { echo "SKIP: no timeout command"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rc=0
for n in 2 4 8 12 16 20; do
	WSD_LIB=$lib WSD_FAULT="bell-unsent@$n" WSD_SPIN_US=0 \
		timeout -s KILL 60 "$wsd" run -- "$stress" --bytes 8M --seed 7 --timeout 50 \
		--stall-s 10 >"$tmp/out" 2>&1
	st=$?
	if [ $st -ne 0 ] || [ "$(tail -n 1 "$tmp/out")" != ok ]; then
		echo "FAIL: bell-unsent@$n: exit $st"
		grep -v '^wsd fault:' "$tmp/out"
		rc=1
		continue
	fi
	fired=$(grep -c 'bell-unsent fires' "$tmp/out")
	[ "$fired" -ge 1 ] || { echo "FAIL: bell-unsent@$n never fired"; rc=1; }
	echo "bell-unsent@$n: $fired bells failed, $(grep 'both ways' "$tmp/out")"
done
[ $rc -eq 0 ] && echo "bell: every run moved all its bytes"
exit $rc

#!/bin/sh
# run_pair.sh PROGRAM [ARGS...]: the program must behave the same with and
# without wsd.  It runs plain, then under `wsd run` with WSD_EXPECT_PATH=shm
# (each of its connections must then have been moved to shared memory);
# the two transcripts (stdout) must match byte for byte and the exit
# statuses must be equal.  Exit 0 on a match, 1 otherwise, 77 when the
# program itself skips (exits 77) on this machine.
#
# top_builddir (from `make check`, else .) locates wsd/wsd.  WSD_PAIR_PATH
# names another path to expect (verbs, say) instead of shm.
set -u
if [ $# -lt 1 ]; then
	echo "usage: run_pair.sh PROGRAM [ARGS...]" >&2
	exit 2
fi
prog=$1
shift
case $prog in
*/*) ;;
*) prog=./$prog ;;
esac
wsd=${top_builddir:-.}/wsd/wsd
name=$(basename "$prog")
# each program has its own watchdog (60 s, many.pair 170 s), which reports where
# it hung before it exits; this bound is in case it never fires
bound="timeout -k 5 240"
# In a sanitizer build libwsd-preload.so carries the ASan runtime, loaded
# after the program's own; let it (as tests/wsd_run_check.sh does).  No
# effect otherwise.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0:detect_leaks=0"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

[ -x "$prog" ] || { echo "FAIL: $prog: no such program (build it first)"; exit 1; }
[ -x "$wsd" ] || { echo "FAIL: $wsd: no wsd command (build it first)"; exit 1; }

echo "== $name, plain"
env -u WSD_EXPECT_PATH $bound "$prog" "$@" >"$tmp/plain.out" 2>"$tmp/plain.err"
plain=$?
cat "$tmp/plain.err" >&2
if [ $plain -eq 77 ]; then
	echo "SKIP: $name skips on this machine (exit 77): $(cat "$tmp/plain.err")"
	exit 77
fi
# A failure plain, or a hang under wsd, is a hard error (99): never what a
# known gap in XFAIL_TESTS expects (tests/sock/acceptfork.pair's is a path).
if [ $plain -ne 0 ]; then
	cat "$tmp/plain.out"
	echo "ERROR: $name fails even without wsd (exit $plain): the program or the machine is wrong"
	exit 99
fi
echo "ok: $(wc -l <"$tmp/plain.out") transcript lines, exit 0"

echo "== $name, under wsd run (WSD_EXPECT_PATH=${WSD_PAIR_PATH:-shm})"
WSD_EXPECT_PATH=${WSD_PAIR_PATH:-shm} WSD_BIN=$wsd $bound "$wsd" run -- "$prog" "$@" \
	>"$tmp/wsd.out" 2>"$tmp/wsd.err"
under=$?
cat "$tmp/wsd.err" >&2

status=0
if ! cmp -s "$tmp/plain.out" "$tmp/wsd.out"; then
	echo "FAIL: the transcript differs under wsd run (- plain, + wsd run):"
	diff -u "$tmp/plain.out" "$tmp/wsd.out" | sed '1,2d'
	status=1
fi
if [ $under -ne $plain ]; then
	echo "FAIL: exit status $under under wsd run, $plain plain"
	if [ $under -eq 124 ] || [ $under -eq 137 ]; then
		echo "      (it hung: the watchdog or the bound ended it)"
		status=99
	else
		status=1
	fi
fi
[ $status -eq 0 ] && echo "ok: the same transcript and exit status under wsd run"
exit $status

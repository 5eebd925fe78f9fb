#!/bin/sh
# tests/sock/first.pair once more, on the way where the listening side
# cannot see the connecting side's socket (the test build of the library,
# WSD_FAULT=box-held): every connection's first bytes then wait for the
# peer's proof on the stream (wsd-protocol(7), "Proof"), as they do where
# pidfd_getfd is refused.  The default way (no proof, WSD_OPENED_HELD) is
# first.pair's own run.  The fault library must say the point fired: a run
# that took the default way after all would prove nothing here.
set -u
lib=${top_builddir:-.}/tests/fault/.libs/libwsd_fault.so
[ -f "$lib" ] || { echo "FAIL: no $lib (make check builds it)"; exit 1; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
WSD_LIB=$lib WSD_FAULT='box-held@1+' sh "${srcdir:-.}/tests/sock/run_pair.sh" \
	"${top_builddir:-.}/tests/sock/first.pair" >"$out" 2>&1
st=$?
cat "$out"
[ $st -eq 0 ] || exit $st
grep -q "box-held fires" "$out" || { echo "FAIL: the box-held fault never fired"; exit 1; }

#!/bin/sh
# fault_pair.sh PAIR FAULT: a behaviour program (tests/sock/README.md) run
# by run_pair.sh, plain and then under wsd run with the test build of the
# library (tests/fault/libwsd_fault.la) and WSD_FAULT=FAULT.  Its status is
# run_pair's; and the fault library must say the point fired, since a run
# that never took the fault's way proves nothing.
set -u
pair=$1 fault=$2
point=${fault%%[=@]*}
lib=${top_builddir:-.}/tests/fault/.libs/libwsd_fault.so
[ -f "$lib" ] || { echo "FAIL: no $lib (make check builds it)"; exit 1; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
WSD_LIB=$lib WSD_FAULT=$fault sh "${srcdir:-.}/tests/sock/run_pair.sh" \
	"${top_builddir:-.}/tests/sock/$pair" >"$out" 2>&1
st=$?
cat "$out"
[ $st -eq 0 ] || exit $st
grep -q "$point fires" "$out" || { echo "FAIL: the $point fault never fired"; exit 1; }

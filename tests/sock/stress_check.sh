#!/bin/sh
# The stress program under wsd run: 4 GiB each way at once on one
# connection, random sizes 1 B .. 8 MiB, every byte compared and the
# stream checksummed at both ends, bounded by `timeout 600`.  Then plain,
# with less data, for a throughput to compare.
#
# WSD_STRESS_BYTES changes the amount under wsd run (e.g. 256M for a quick
# run); CI runs the default.
set -u
b=${top_builddir:-.}
wsd=$b/wsd/wsd
stress=$b/tests/sock/stress
bytes=${WSD_STRESS_BYTES:-4G}
plain_bytes=512M
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0:detect_leaks=0"
command -v timeout >/dev/null 2>&1 || { echo "SKIP: no timeout command"; exit 77; }
[ -x "$stress" ] || { echo "FAIL: $stress: not built"; exit 1; }
[ -x "$wsd" ] || { echo "FAIL: $wsd: no wsd command (build it first)"; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0

# run LABEL OUTPUT COMMAND...: the run must exit 0 and end with "ok"
run() {
	label=$1
	out=$2
	shift 2
	echo "== $label"
	"$@" >"$out"
	rc=$?
	cat "$out"
	if [ $rc -ne 0 ]; then
		[ $rc -eq 124 ] && echo "FAIL: $label: did not finish within 600 s" ||
			echo "FAIL: $label: exit $rc"
		status=1
	elif [ "$(tail -n 1 "$out")" != "ok" ]; then
		echo "FAIL: $label: no \"ok\" at the end"
		status=1
	fi
}

run "stress under wsd run, $bytes each way" "$tmp/wsd.out" \
	env WSD_EXPECT_PATH=shm timeout -k 10 600 "$wsd" run -- "$stress" --bytes "$bytes" --timeout 590
run "stress plain, $plain_bytes each way" "$tmp/plain.out" \
	env -u WSD_EXPECT_PATH timeout -k 10 600 "$stress" --bytes "$plain_bytes" --timeout 590

echo "== throughput, both ways together"
echo "  wsd run: $(grep -o '[0-9]* MB/s in all' "$tmp/wsd.out")"
echo "  plain:   $(grep -o '[0-9]* MB/s in all' "$tmp/plain.out")"
[ $status -eq 0 ] && echo "stress: all checks passed"
exit $status

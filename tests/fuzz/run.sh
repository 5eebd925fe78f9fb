#!/bin/sh
# Build the libFuzzer targets of the peer-value checks (switch/wire.c, and
# the shm transport's set-up messages in provider/shm) with clang, apart
# from the autotools build, and run each for SECONDS (default 60) from its
# seed corpus.  A target names the sources it needs beside it in a
# "FUZZ_SOURCES:" line (default switch/wire.c).  Exit 0 when no target crashed, 1 when one did
# (its reproducer is left in the work directory), 77 when clang or
# libFuzzer is missing.  CI runs 3 s a target (tests/fuzz_check.sh in make
# check, WSD_FUZZ_CHECK_SECS=3); a long run (before a
# release, or after a change to a parser): tests/fuzz/run.sh 3600.
#
#   tests/fuzz/run.sh [SECONDS] [TARGET...]
#   targets: hello tuple ring words shmctl shmlisten shmprove shmring
set -u
secs=${1:-60}
[ $# -gt 0 ] && shift
targets=${*:-hello tuple ring words shmctl shmlisten shmprove shmring}
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
CLANG=${CLANG:-clang}
work=${FUZZ_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/wsd-fuzz.XXXXXX")}
flags="-g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I$top"

command -v "$CLANG" >/dev/null 2>&1 || { echo "SKIP: $CLANG not found"; exit 77; }
echo 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }' \
	>"$work/probe.c"
"$CLANG" $flags -o "$work/probe" "$work/probe.c" >/dev/null 2>&1 ||
	{ echo "SKIP: $CLANG cannot build with -fsanitize=fuzzer (libclang-rt-dev?)"; exit 77; }

status=0
for t in $targets; do
	src=$here/fuzz_$t.c
	[ -f "$src" ] || { echo "FAIL: no target $t"; exit 1; }
	srcs=$(sed -n 's/^ \* FUZZ_SOURCES: //p' "$src")
	# shellcheck disable=SC2086 # a list of paths
	if ! "$CLANG" $flags -Wall -Werror -o "$work/fuzz_$t" "$src" \
		$(for f in ${srcs:-switch/wire.c}; do echo "$top/$f"; done); then
		echo "FAIL: $t does not build"
		exit 1
	fi
	# new inputs go to the work corpus; the committed seeds stay as they are
	mkdir -p "$work/corpus_$t"
	log=$work/fuzz_$t.log
	(cd "$work" && ./fuzz_$t -max_total_time="$secs" -print_final_stats=1 \
		-artifact_prefix="$work/crash_$t-" "$work/corpus_$t" "$here/corpus/$t") >"$log" 2>&1
	rc=$?
	runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
	if [ $rc -ne 0 ]; then
		echo "FAIL: $t (exit $rc, after ${runs:-?} runs): see $log and $work/crash_$t-*"
		tail -n 30 "$log"
		status=1
	else
		echo "ok: $t: ${runs:-?} runs in ${secs} s"
	fi
done
[ $status -eq 0 ] && [ -z "${FUZZ_WORK:-}" ] && rm -rf "$work"
exit $status

#!/bin/sh
# Every fuzz target builds and runs its committed seeds clean for a moment:
# a target whose sources fell behind the code (a new symbol it does not
# link) fails here, in make check, not first in CI's long run
# (tests/fuzz/run.sh 60). Exits 77 when clang cannot build fuzzers.
set -u
srcdir=${srcdir:-.}
exec sh "$srcdir/tests/fuzz/run.sh" "${WSD_FUZZ_CHECK_SECS:-2}"

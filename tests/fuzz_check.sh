#!/bin/sh
# Every fuzz target builds and runs its committed seeds clean for a moment:
# a target whose sources fell behind the code (a new symbol it does not
# link) fails here, in make check.  WSD_FUZZ_CHECK_SECS sets the time a
# target (default 2; CI's .ci/run gives 10).  Exits 77 when clang cannot
# build fuzzers.
set -u
srcdir=${srcdir:-.}
exec sh "$srcdir/tests/fuzz/run.sh" "${WSD_FUZZ_CHECK_SECS:-2}"

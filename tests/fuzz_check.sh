#!/bin/sh
# Every fuzz target builds and runs its committed seeds clean for a moment:
# a target whose sources fell behind the code (a new symbol it does not
# link) fails here, in make check.  WSD_FUZZ_CHECK_SECS sets the time a
# target (default 2; CI's .ci/run gives 3); 0 skips the fuzzers, for a
# second build of one tree (the targets are built by clang apart from
# configure, the same in every build: CI's sanitizer build).  Exits 77
# when clang cannot build fuzzers.
set -u
srcdir=${srcdir:-.}
if [ "${WSD_FUZZ_CHECK_SECS:-2}" = 0 ]; then
	echo "SKIP: WSD_FUZZ_CHECK_SECS=0: the fuzz targets do not depend on the build; another build's make check runs them"
	exit 77
fi
exec sh "$srcdir/tests/fuzz/run.sh" "${WSD_FUZZ_CHECK_SECS:-2}"

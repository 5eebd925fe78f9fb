#!/bin/sh
# SPDX-License-Identifier: MIT
# make check entry of the RDMA VM rig: boots a Debian kernel under qemu with
# Soft-RoCE and runs the verbs tests there (tests/vm/README.md).
# Exit status: that of tests/vm/run (0 pass, 1 fail, 77 skip).
# WSD_SKIP_VM=1 skips it, for quick local runs.
if [ "${WSD_SKIP_VM:-0}" = 1 ]; then
	echo "SKIP: the RDMA VM rig (WSD_SKIP_VM=1)"
	exit 77
fi
srcdir=${srcdir:-$(dirname "$0")/../..}
top_builddir=${top_builddir:-.}
export top_builddir
run="$srcdir/tests/vm/run"
if [ ! -x "$run" ]; then
	echo "SKIP: $run is missing or not executable"
	exit 77
fi
"$run"
rc=$?
case $rc in
0|77) exit $rc ;;
*) exit 1 ;;
esac

#!/bin/sh
# The README's main job, small: two processes move data and verify it.
set -eu
# bounded: a lost completion must fail the test, not stall the suite
out=$(timeout -k 5 300 ${top_builddir:-.}/wsd/wsd demo --bytes 64M)
echo "$out"
echo "$out" | grep -q 'all checksums verified'

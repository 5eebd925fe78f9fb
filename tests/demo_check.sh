#!/bin/sh
# The README's main job, small: two processes move data and verify it.
set -eu
out=$(${top_builddir:-.}/wsd/wsd demo --bytes 64M)
echo "$out"
echo "$out" | grep -q 'all checksums verified'

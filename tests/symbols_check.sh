#!/bin/sh
# libwsd.so exports only the project's prefixes: nd_, wsd_, WSP, and the
# C library calls it interposes on purpose (the memory hooks).
set -eu
lib=${top_builddir:-.}/.libs/libwsd.so
[ -f "$lib" ] || { echo "FAIL: $lib not built"; exit 1; }
leaks=$(nm -D --defined-only "$lib" | awk '$2 != "A" {sub(/@.*/, "", $3); print $3}' | grep -vE '^(nd_|wsd_|WSP|munmap$|mremap$|madvise$|free$)' || true)
if [ -n "$leaks" ]; then
	echo "FAIL: symbols exported without the project's prefix:"
	echo "$leaks"
	exit 1
fi
count=$(nm -D --defined-only "$lib" | grep -cE ' (nd_|wsd_|WSP)')
[ "$count" -gt 0 ] || { echo "FAIL: libwsd.so exports nothing"; exit 1; }
echo "ok: $count symbols exported, all with the project's prefixes"

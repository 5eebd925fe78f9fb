#!/bin/sh
# libwsd.so exports only the project's prefixes (nd_, wsd_, WSP) and the C
# library calls it interposes on purpose: the memory hooks and the switch's
# socket calls, each named in provider/libwsd.map.  Anything else is a leak.
set -eu
lib=${top_builddir:-.}/.libs/libwsd.so
map=${srcdir:-.}/provider/libwsd.map
[ -f "$lib" ] || { echo "FAIL: $lib not built"; exit 1; }
# the map's plain names (patterns end in '*'; comments dropped)
names=$(perl -0pe 's{/\*.*?\*/}{}gs' "$map" | tr ';{} \t' '\n\n\n\n\n' |
	grep -E '^[A-Za-z_][A-Za-z0-9_]*$' | grep -vE '^(global|local)$' | sort -u)
exported=$(nm -D --defined-only "$lib" | awk '$2 != "A" {sub(/@.*/, "", $3); print $3}' | sort -u)
leaks=$(echo "$exported" | grep -vE '^(nd_|wsd_|WSP)' | grep -vxF "$names" || true)
if [ -n "$leaks" ]; then
	echo "FAIL: symbols exported without the project's prefix or a place in libwsd.map:"
	echo "$leaks"
	exit 1
fi
# every interposed name the map promises is really there (a typo would
# silently leave a call to the C library)
missing=$(echo "$names" | grep -vxF "$exported" || true)
if [ -n "$missing" ]; then
	echo "FAIL: named in libwsd.map but not defined:"
	echo "$missing"
	exit 1
fi
count=$(echo "$exported" | grep -cE '^(nd_|wsd_|WSP)')
[ "$count" -gt 0 ] || { echo "FAIL: libwsd.so exports nothing"; exit 1; }
echo "ok: $count symbols with the project's prefixes, $(echo "$names" | wc -l) interposed C library calls"

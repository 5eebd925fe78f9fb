#!/bin/sh
# What each shared library exports, against its map.  Anything else is a leak.
#
#   libwsd.so          the project's prefixes only (nd_, wsd_, WSP), and of
#                      wsd_ only the names an installed header or
#                      provider/private.h declares; not one C library name,
#                      so a program that links it keeps its own read, close,
#                      free and munmap
#   libwsd-preload.so  exactly the names of switch/libwsd-preload.map (the C
#                      library calls it interposes), each one defined
#   libwsd-hooks.so    exactly the names of provider/libwsd-hooks.map
set -eu
top=${top_builddir:-.}
src=${srcdir:-.}
status=0
fail() { echo "FAIL: $*"; status=1; }

exports() {   # the names LIB defines for others
	nm -D --defined-only "$1" | awk '$2 != "A" {sub(/@.*/, "", $3); print $3}' | sort -u
}
map_names() {   # a map's plain names (patterns end in '*'; comments dropped)
	perl -0pe 's{/\*.*?\*/}{}gs' "$1" | tr ';{} \t' '\n\n\n\n\n' |
		grep -E '^[A-Za-z_][A-Za-z0-9_]*$' | grep -vE '^(global|local)$' | sort -u
}

for f in .libs/libwsd.so .libs/libwsd-preload.so .libs/libwsd-hooks.so; do
	[ -f "$top/$f" ] || { echo "FAIL: $top/$f not built"; exit 1; }
done

# ---- libwsd.so ------------------------------------------------------------------
lib=$top/.libs/libwsd.so
exported=$(exports "$lib")
leaks=$(echo "$exported" | grep -vE '^(nd_|wsd_|WSP)' || true)
[ -z "$leaks" ] || fail "libwsd.so exports names without the project's prefixes:
$leaks"
# the wsd_ names a reader can find: the public headers' and private.h's
declared=$(cat "$src"/wsd/*.h "$src/provider/private.h" |
	grep -oE '\bwsd_[a-z0-9_]+\b' | sort -u)
stray=$(echo "$exported" | grep '^wsd_' | grep -vxF "$declared" || true)
[ -z "$stray" ] || fail "libwsd.so exports wsd_ names that neither wsd/*.h nor provider/private.h declares:
$stray"
# no C library name at all: the C library's own list, and the ones that
# matter most named again in case nm cannot read it
libc=$(${CC:-cc} -print-file-name=libc.so.6 2>/dev/null || true)
[ -f "$libc" ] || libc=$(ldd "$lib" 2>/dev/null | awk '$1 == "libc.so.6" { print $3 }')
cnames="read write close free malloc munmap mremap madvise socket connect accept send recv poll epoll_wait fork"
if [ -f "$libc" ]; then
	cnames="$cnames $(exports "$libc")"
else
	echo "note: the C library is not found; checking the usual names only"
fi
clash=$(echo "$exported" | grep -xF "$(echo $cnames | tr ' ' '\n')" || true)
[ -z "$clash" ] || fail "libwsd.so defines C library names (a program linking it would get them):
$clash"
count=$(echo "$exported" | grep -cE '^(nd_|wsd_|WSP)' || true)
[ "$count" -gt 0 ] || fail "libwsd.so exports nothing"
echo "ok: libwsd.so: $count symbols, all with the project's prefixes, no C library name"

# ---- the preload and the hooks: exactly their maps ----------------------------------
exact() {   # LIB MAP: LIB exports the map's names, no more, no fewer
	name=$(basename "$1")
	names=$(map_names "$2")
	got=$(exports "$1")
	extra=$(echo "$got" | grep -vxF "$names" || true)
	[ -z "$extra" ] || fail "$name exports names not in $(basename "$2"):
$extra"
	# a typo in the map would silently leave a call to the C library
	missing=$(echo "$names" | grep -vxF "$got" || true)
	[ -z "$missing" ] || fail "named in $(basename "$2") but not defined by $name:
$missing"
	[ -n "$extra$missing" ] || echo "ok: $name: the $(echo "$names" | wc -l) names of $(basename "$2")"
}
exact "$top/.libs/libwsd-preload.so" "$src/switch/libwsd-preload.map"
exact "$top/.libs/libwsd-hooks.so" "$src/provider/libwsd-hooks.map"
# the preload has the provider through libwsd.so, not a copy of its own
readelf -d "$top/.libs/libwsd-preload.so" | grep -q 'NEEDED.*\[libwsd\.so\.0\]' ||
	fail "libwsd-preload.so does not load libwsd.so.0"
nm --defined-only "$top/.libs/libwsd-preload.so" | grep -qE ' [Tt] (WSPStartup|nd_adapter_open)$' &&
	fail "libwsd-preload.so carries a copy of the provider"
exit $status

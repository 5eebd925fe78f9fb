#!/bin/sh
# The installed library as an integrator meets it.  `make install` into a
# staging root (DESTDIR), then:
#   - the layout packages rely on: libwsd.so.0.0.0 with its links, and
#     libwsd-hooks.so.0, in $(libdir); libwsd-preload.so in $(pkglibdir);
#     wsd.pc in $(libdir)/pkgconfig; the headers in $(includedir)/wsd;
#   - the installed libwsd.so defines no C library name (read, close, free...);
#   - each installed header compiles alone with nothing but
#     `pkg-config --cflags wsd`;
#   - tests/integrator.c builds with `pkg-config --cflags --libs wsd` and
#     runs on the installed libwsd.so: WSPStartup, a connection over shm,
#     WSPRdmaRead of a buffer the peer offered, every byte checked, WSPCleanup;
#   - the installed preload finds the installed libwsd.so.0.
# Skips (77) only without pkg-config.  Run by make check, which passes the
# install directories (inst_libdir...), MAKE and PKG_CONFIG.
set -u
top=$(cd "${top_builddir:-.}" && pwd)
src=$(cd "${srcdir:-.}" && pwd)
pkgconfig=${PKG_CONFIG:-pkg-config}
cc=${CC:-cc}
fail() { echo "FAIL: $*"; exit 1; }

command -v "$pkgconfig" >/dev/null 2>&1 ||
	{ echo "SKIP: $pkgconfig is missing (apt-get install pkg-config)"; exit 77; }
for v in inst_libdir inst_pkglibdir inst_includedir inst_bindir; do
	eval "[ -n \"\${$v:-}\" ]" || fail "$v is not set (run through make check)"
done
# In a sanitizer build libwsd.so carries the ASan runtime, loaded after the
# integrator's (uninstrumented) program: let it, as run_pair.sh does.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0:detect_leaks=0"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
root=$tmp/root
lib=$root$inst_libdir
inc=$root$inst_includedir

# The make that runs this test is not ours to share: a clean environment,
# one job, nothing left to build (make check built it all).
env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL "${MAKE:-make}" -C "$top" -j1 install DESTDIR="$root" \
	>"$tmp/install.log" 2>&1 ||
	{ tail -40 "$tmp/install.log"; fail "make install DESTDIR=$root failed"; }
echo "ok: make install DESTDIR=$root"

# ---- the layout ---------------------------------------------------------------
for f in "$lib/libwsd.so.0.0.0" "$lib/libwsd-hooks.so.0.0.0" "$root$inst_pkglibdir/libwsd-preload.so" \
	 "$lib/pkgconfig/wsd.pc" "$inc/wsd/wsp.h" "$inc/wsd/nd.h" "$root$inst_bindir/wsd"; do
	[ -f "$f" ] || fail "not installed: ${f#"$root"}"
done
for l in libwsd.so.0 libwsd.so libwsd-hooks.so.0 libwsd-hooks.so; do
	[ -L "$lib/$l" ] || fail "no link ${inst_libdir}/$l"
done
[ "$(readlink -f "$lib/libwsd.so")" = "$(readlink -f "$lib/libwsd.so.0.0.0")" ] ||
	fail "libwsd.so does not lead to libwsd.so.0.0.0"
echo "ok: the layout (libwsd.so.0.0.0, libwsd-hooks.so.0, wsd/libwsd-preload.so, pkgconfig/wsd.pc, wsd/*.h)"

# ---- no C library name in libwsd.so ----------------------------------------------
defined=$(nm -D --defined-only "$lib/libwsd.so.0" | awk '{ sub(/@.*/, "", $3); print $3 }')
[ -n "$defined" ] || fail "nm -D finds nothing in the installed libwsd.so"
for name in read write close free malloc munmap socket connect; do
	echo "$defined" | grep -qx "$name" && fail "the installed libwsd.so defines $name"
done
echo "ok: the installed libwsd.so defines no read, write, close, free, munmap..."

# ---- pkg-config -------------------------------------------------------------------
# The sysroot puts the staging root in front of the paths wsd.pc gives.
export PKG_CONFIG_PATH="$lib/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$root"
"$pkgconfig" --exists wsd || fail "$pkgconfig does not find wsd.pc: $("$pkgconfig" --print-errors --exists wsd 2>&1)"
[ "$("$pkgconfig" --modversion wsd)" = "$(sed -n 's/^Version: //p' "$lib/pkgconfig/wsd.pc")" ] ||
	fail "pkg-config --modversion wsd disagrees with wsd.pc"
cflags=$("$pkgconfig" --cflags wsd) || fail "pkg-config --cflags wsd failed"
libs=$("$pkgconfig" --libs wsd) || fail "pkg-config --libs wsd failed"
echo "ok: pkg-config --cflags --libs wsd: $cflags $libs"

# ---- the installed headers, alone ---------------------------------------------------
for h in "$inc"/wsd/*.h; do
	name=wsd/$(basename "$h")
	printf '#include <%s>\nint main(void) { return 0; }\n' "$name" >"$tmp/h.c"
	# shellcheck disable=SC2086
	$cc -std=c99 -pedantic -Wall -Wextra -Werror $cflags -c "$tmp/h.c" -o "$tmp/h.o" ||
		fail "the installed $name does not compile alone with pkg-config --cflags wsd"
done
echo "ok: each installed header compiles alone"

# ---- an integrator's program ---------------------------------------------------------
# shellcheck disable=SC2086
$cc -std=c11 -Wall -Wextra -Werror $cflags "$src/tests/integrator.c" -o "$tmp/integrator" $libs ||
	fail "tests/integrator.c does not build with pkg-config --cflags --libs wsd"
export LD_LIBRARY_PATH="$lib"
ldd "$tmp/integrator" >"$tmp/ldd.out" 2>&1
grep -q "libwsd\.so\.0 => $lib/libwsd\.so\.0 " "$tmp/ldd.out" ||
	{ cat "$tmp/ldd.out"; fail "the integrator does not load the installed libwsd.so.0"; }
timeout -k 5 90 "$tmp/integrator" || fail "the integrator's program failed (exit $?)"
echo "ok: tests/integrator.c, built and run on the installed library"

# ---- the installed preload finds the installed libwsd.so ---------------------------
ldd "$root$inst_pkglibdir/libwsd-preload.so" >"$tmp/ldd.out" 2>&1
grep -q "libwsd\.so\.0 => $lib/libwsd\.so\.0 " "$tmp/ldd.out" ||
	{ cat "$tmp/ldd.out"; fail "the installed libwsd-preload.so does not load the installed libwsd.so.0"; }
echo "ok: the installed preload loads the installed libwsd.so.0"
echo "pkgconfig_check: all checks passed"

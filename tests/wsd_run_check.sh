#!/bin/sh
# wsd run: preloads libwsd-preload.so ahead of what is already preloaded, turns
# options into runtime parameters, names setuid programs, and the program
# runs as it would without it.
set -u
wsd=${top_builddir:-.}/wsd/wsd
# In a sanitizer build libwsd-preload.so carries the ASan runtime, which
# then loads after the (uninstrumented) programs run here; let it.  No
# effect otherwise.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0:detect_leaks=0"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

out=$(LD_PRELOAD= "$wsd" run -- sh -c 'echo "$LD_PRELOAD"') || fail "wsd run -- sh failed"
case $out in
*/libwsd-preload.so) echo "ok: LD_PRELOAD=$out" ;;
*) fail "libwsd-preload.so not preloaded: '$out'" ;;
esac
# loaded, with the libwsd.so of this build beside it (a preload the loader
# cannot load is only a warning, and the program would run without wsd)
top=$(cd "${top_builddir:-.}" && pwd)
maps=$("$wsd" run -- sh -c 'cat /proc/$$/maps' 2>"$tmp/err") || fail "wsd run -- sh failed: $(cat "$tmp/err")"
echo "$maps" | grep -q " $top/.libs/libwsd-preload.so\$" ||
	fail "libwsd-preload.so is not mapped in the program: $(cat "$tmp/err")"
echo "$maps" | grep -q " $top/.libs/libwsd.so.0.0.0\$" ||
	fail "the build's libwsd.so is not mapped beside the preload: $(echo "$maps" | grep libwsd)"
echo "ok: the switch and this build's libwsd.so are loaded"
out=$(LD_PRELOAD=/nonexistent/x.so "$wsd" run -- sh -c 'echo "$LD_PRELOAD"' 2>/dev/null)
case $out in
*/libwsd-preload.so:/nonexistent/x.so) echo "ok: kept the earlier preload after ours" ;;
*) fail "earlier LD_PRELOAD not kept: '$out'" ;;
esac
out=$("$wsd" run --transport shm --spin-us 7 --debug -- sh -c 'echo $WSD_TRANSPORT $WSD_SPIN_US $WSD_DEBUG')
[ "$out" = "shm 7 1" ] || fail "options not passed: '$out'"
echo "ok: options -> WSD_TRANSPORT WSD_SPIN_US WSD_DEBUG"
"$wsd" run --transport bogus -- true 2>/dev/null
[ $? -eq 2 ] || fail "a bad transport is not a usage error"
"$wsd" run -- "$tmp/no-such-program" 2>/dev/null
[ $? -eq 127 ] || fail "a missing program does not give 127"
# the program behaves as without wsd: same output, same exit status
a=$(sh -c 'printf "%s\n" one two; exit 3'); ra=$?
b=$("$wsd" run -- sh -c 'printf "%s\n" one two; exit 3'); rb=$?
[ "$a" = "$b" ] && [ $ra -eq $rb ] || fail "output or status differ under wsd run"
echo "ok: same output and exit status"
# a set-user-ID program is named (root can make one owned by another user)
if [ "$(id -u)" -eq 0 ] && id nobody >/dev/null 2>&1; then
	cp /bin/true "$tmp/suid" && chown nobody "$tmp/suid" && chmod u+s "$tmp/suid"
	msg=$("$wsd" run -- "$tmp/suid" 2>&1) || fail "setuid program failed"
	case $msg in
	*set-user-ID*) echo "ok: setuid program reported" ;;
	*) fail "setuid program not reported: '$msg'" ;;
	esac
else
	echo "note: not root, the setuid case is not checked here"
fi
echo "wsd run: all checks passed"

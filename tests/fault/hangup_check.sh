#!/bin/sh
# A connecting process that ends between reaching its peer's registry and
# sending its HELLO (hello-delay holds its HELLO 8 s; the process has its
# 1 MiB by TCP, a quarter each 0.25 s, and ends meanwhile).  The
# listening side's handshake waits up to 5 s for that HELLO, polling its
# own request.  Before, the provider's completion thread woke again and
# again on the gone peer's socket, readable for good once it hung up: the
# server spun a core for those 5 s (prefork_check's "the parent spins",
# under load), and the handshake itself looked every 200 us (an eighth of
# a core).  Here the server, otherwise idle, must use under a tenth of a
# core over the 3 s after the client ended.  About 6 s.
set -u
. "${srcdir:-.}/tests/attack/common.sh"
stream=${top_builddir:-.}/tests/fault/stream
lib=${top_builddir:-.}/tests/fault/.libs/libwsd_fault.so
[ -f "$lib" ] || fail "no $lib (make check builds it)"

STREAM_HOLD=$tmp/release STREAM_PAUSE_US=250000 \
	"$wsd" run -- "$stream" send "$tmp/port" 7 1048576 >"$tmp/send.out" \
	2>"$tmp/send.err" &
spid=$!
pids="$pids $spid"
wait_file "$tmp/port" || fail "the server did not listen"
WSD_LIB=$lib WSD_FAULT=hello-delay=8000 WSD_UPGRADE_BYTES=1 \
	"$wsd" run -- "$stream" recv "$(cat "$tmp/port")" 7 1048576 >"$tmp/recv.out" 2>"$tmp/recv.err" &
rpid=$!
pids="$pids $rpid"
wait_file "$tmp/recv.out" "received" || fail "the client did not finish"
grep -q "^received 1048576 complete$" "$tmp/recv.out" || fail "the client's stream: $(cat "$tmp/recv.out")"
grep -q "hello-delay fires" "$tmp/recv.err" ||
	fail "the client never reached its HELLO: no window (did the upgrade start?)"
# the client may wait for its switch's threads at exit: it ends now either way
kill -9 "$rpid" 2>/dev/null
wait "$rpid" 2>/dev/null
t0=$(now_ms) c0=$(ticks "$spid")
sleep 3
t1=$(now_ms) c1=$(ticks "$spid")
hz=$(getconf CLK_TCK)
cpu=$(( (c1 - c0) * 1000 * 100 / hz / (t1 - t0) ))
echo "the server over 3 s after its peer ended before its HELLO: $cpu% of a core"
kill -0 "$spid" 2>/dev/null || fail "the server died"
if [ "$cpu" -ge 10 ]; then
	for t in /proc/$spid/task/*; do
		echo "thread ${t##*/}: $(ticks "$spid/task/${t##*/}") ticks, $(cat "$t/comm")," \
			"wchan $(cat "$t/wchan" 2>/dev/null)"
	done
	stacks "$spid"
	fail "the server spins while its handshake waits for a peer that is gone: $cpu%"
fi
touch "$tmp/release"
wait_exit "$spid" 10000 || fail "the server did not end once released"
echo "PASS: the server stayed idle while its handshake waited out a gone peer"

#!/bin/sh
# A peer that holds its TCP connection and proves it, then writes what
# wsd-protocol(7) forbids into the server's region (tests/attack/scribble.c:
# lengths near 2^32, a PAD of 0, unknown types, a ZC of 2^40 bytes, an
# unasked WZC, a BACK without its count, control words out of bounds).
# Each such connection must be reset by the server's switch within 10 s;
# the server lives, a plain client's answers stay exact throughout, and a
# wsd client that connects afterwards is still accelerated.
set -u
. "${srcdir:-.}/tests/attack/common.sh"
scribble=${top_builddir:-.}/tests/attack/scribble
export WSD_UPGRADE_BYTES=1

start_server
start_client victim
victim=$client

"$scribble" "$port" >"$tmp/scribble.out" 2>"$tmp/scribble.err" ||
	fail "a case did not end in a reset (above)"
kill -0 "$server" 2>/dev/null || fail "the server died"

start_client honest wsd
honest=$client hport=$cport
accelerated 10000 "$hport" 's["copy_rx"] > 0' ||
	fail "a wsd client is no longer accelerated by the server"
touch "$tmp/stop"
wait "$victim" || fail "the plain client saw a wrong answer or none"
wait "$honest" || fail "the wsd client saw a wrong answer or none"
kill -0 "$server" 2>/dev/null || fail "the server died"
cat "$tmp/scribble.out" "$tmp/victim.out"
echo "PASS: every malformed value reset its own connection, and nothing else"
exit 0

#!/bin/sh
# Bytes that move on an upgraded connection's kernel socket by calls the
# switch cannot see (the syscall instruction itself, tests/attack/bypass.c):
# a raw write of 1000 bytes (then a receive, or a close), a raw read that
# takes a doorbell, and (first) a raw write on a new connection beside the
# upgraded one, after its first bytes went into the peer's grant and before
# its proof (wsd-protocol(7), The mailbox).  Each
# must reset the connection at both ends (ECONNRESET or EIO, never a clean
# end, never a byte of them as data, never a byte lost unseen), and wsd stat
# must show both ends' sockets with reason bypass.
set -u
. "${srcdir:-.}/tests/attack/common.sh"
bypass=${top_builddir:-.}/tests/attack/bypass
export WSD_UPGRADE_BYTES=1

# stat_reason PID: the reasons of PID's sockets with a peer, one a line
stat_reason() {
	"$wsd" stat --json "$1" >"$tmp/stat.json" 2>/dev/null &&
	python3 -c '
import json, sys
st = json.load(open(sys.argv[1]))
for p in st["processes"]:
    for s in p["sockets"]:
        if s["peer"]:
            print(s["reason"])' "$tmp/stat.json"
}

for mode in write close read first; do
	rm -f "$tmp"/port "$tmp"/ready "$tmp"/go "$tmp"/stop "$tmp"/*.res
	"$wsd" run -- "$bypass" server "$tmp/port" "$tmp/server.res" "$tmp/stop" \
		>"$tmp/server.out" 2>"$tmp/server.err" &
	server=$!
	pids="$pids $server"
	wait_file "$tmp/port" || fail "$mode: the server did not start"
	port=$(cat "$tmp/port")
	"$wsd" run -- "$bypass" client "$port" "$mode" "$tmp/client.res" "$tmp/ready" \
		"$tmp/go" "$tmp/stop" >"$tmp/client.out" 2>"$tmp/client.err" &
	client=$!
	pids="$pids $client"
	wait_file "$tmp/ready" || {
		grep -q "^SKIP" "$tmp/client.err" && exit 77
		fail "$mode: the client did not get the connection on shm"
	}
	cport=$(cat "$tmp/ready")
	# the server's side is on the ring too, both ways
	accelerated 10000 "$cport" 's["copy_rx"] > 0 and s["copy_tx"] > 0' ||
		fail "$mode: the server's socket is not accelerated both ways"
	touch "$tmp/go"
	# as long as the programs' own bounded waits (poll 10 s, a bell 5 s, a
	# receive 20 s): a slow machine gets their verdict, not a guess
	WAIT_S=40 wait_file "$tmp/server.res" || fail "$mode: the server saw nothing within 40 s"
	WAIT_S=40 wait_file "$tmp/client.res" || fail "$mode: the client saw nothing within 40 s"
	grep -q '^ok' "$tmp/server.res" || fail "$mode: server: $(cat "$tmp/server.res")"
	grep -q '^ok' "$tmp/client.res" || fail "$mode: client: $(cat "$tmp/client.res")"
	# (after close the client has no socket left to show)
	whos="server client"
	[ "$mode" = close ] && whos=server
	for who in $whos; do
		eval pid=\$$who
		# first: the server may find the failed proof before the client's word
		want=bypass
		[ "$mode/$who" = first/server ] && want='bypass\|auth'
		stat_reason "$pid" | grep -qx "$want" ||
			fail "$mode: wsd stat does not show the $who's socket with reason $want: $(stat_reason "$pid" | tr '\n' ' ')"
	done
	touch "$tmp/stop"
	wait "$server" || fail "$mode: the server failed"
	wait "$client" || fail "$mode: the client failed"
	echo "$mode: $(cat "$tmp/server.res"); $(cat "$tmp/client.res")"
done
echo "PASS: bytes moved behind the switch's back reset the connection at both ends"
exit 0

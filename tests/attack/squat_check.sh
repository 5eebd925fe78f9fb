#!/bin/sh
# A squatter holds the registry name "\0wsd-nd.P" of a port P before the
# server on P starts (tuple squat: it answers the shm proof as a process
# that may read its connectors would, names a TCP listener of its own on
# another port, and counts the descriptors it is sent).  A wsd client of the
# server must stay on TCP with reason access, its answers exact, and the
# squatter must get no descriptor:
#  other-uid  squatter of uid 65534; server (under wsd) and client as root:
#             the connector's uid check refuses it.
#  same-uid   squatter as root, like the client, so it passes the mutual
#             proof; the server is plain.  Only the connector's check that
#             the registry's process holds the TCP listener on P (owner.c)
#             refuses it; without it the client hands over its memfd and
#             eventfds and writes its switch proof into the plain server's
#             stream.
set -u
. "${srcdir:-.}/tests/attack/priv.sh"

# case NAME SQUAT-PREFIX SERVER-PREFIX
case_run() {
	name=$1
	$2 "$prog" squat "$tmp/$name.port" "$tmp/$name.stop" >"$tmp/$name-squat.out" \
		2>"$tmp/$name-squat.err" &
	squatter=$!
	pids="$pids $squatter"
	wait_file "$tmp/$name.port" || fail "$name: the squatter did not start"
	port=$(cat "$tmp/$name.port")
	$3 "$prog" server -p "$port" "$tmp/$name.sport" >"$tmp/$name-server.out" \
		2>"$tmp/$name-server.err" &
	server=$!
	pids="$pids $server"
	wait_file "$tmp/$name.sport" || fail "$name: the server did not start on port $port"
	"$wsd" run -- "$prog" client "$port" "$tmp/$name.local" "$tmp/$name.stop" \
		>"$tmp/$name-client.out" 2>"$tmp/$name-client.err" &
	client=$!
	pids="$pids $client"
	wait_file "$tmp/$name.local" || fail "$name: the client did not connect"
	stays_tcp "$name" "$client" "$port" access
	sleep 0.3   # some calls after the refusal
	touch "$tmp/$name.stop"
	wait "$client" || fail "$name: the client saw a wrong answer or none"
	wait "$squatter" || fail "$name: the squatter failed"
	grep -q "^squat: [1-9][0-9]* connections, 0 descriptors" "$tmp/$name-squat.out" ||
		fail "$name: the squatter was not dialled, or got descriptors: $(cat "$tmp/$name-squat.out")"
	kill -0 "$server" 2>/dev/null || fail "$name: the server died"
	kill "$server"
	echo "$name: $(cat "$tmp/$name-client.out"); $(cat "$tmp/$name-squat.out")"
}

case_run other-uid "$nobody" "$wsd run --"
case_run same-uid "" ""
echo "PASS: the squatters got no descriptor; the clients stayed on TCP (access), answers exact"
exit 0

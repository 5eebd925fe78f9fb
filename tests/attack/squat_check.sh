#!/bin/sh
# A squatter holds the registry name "\0wsd-nd.P" of a port P before the
# server on P starts (tuple squat: it answers the shm proof as a process
# that may read its connectors would, names a TCP listener of its own on
# another port, and counts the descriptors it is sent).  The squatter must
# get no descriptor and the client's answers must be exact:
#  other-uid  squatter of uid 65534; server (under wsd) and client as root:
#             the server found its usual name taken and listens on an
#             alternate one (wsd-protocol(7)), which the client, finding
#             it held by its own user, tries before the usual name: it is
#             on shm, and the squatter is not even dialled.
#  same-uid   squatter as root, like the client, so it passes the mutual
#             proof; the server is plain, so there is no alternate name.
#             Only the connector's check that the registry's process holds
#             the TCP listener on P (owner.c) refuses it; without it the
#             client hands over its memfd and eventfds and writes its
#             switch proof into the plain server's stream.  The client
#             stays on TCP with reason access.
set -u
. "${srcdir:-.}/tests/attack/priv.sh"

# on_shm NAME PID PORT: PID's connection to PORT is on shm within 10 s.
on_shm() {
	n=0
	until "$wsd" stat --json "$2" >"$tmp/$1.json" 2>/dev/null && python3 - "$tmp/$1.json" "$2" "$3" <<'PY'
import json, sys
st = json.load(open(sys.argv[1]))
pid, port = sys.argv[2:4]
sys.exit(0 if any(s["path"] == "shm" for p in st["processes"] if str(p["pid"]) == pid
                  for s in p["sockets"]
                  if s["peer"] and s["peer"].rsplit(":", 1)[1] == port) else 1)
PY
	do
		n=$((n + 1))
		[ $n -le 100 ] || fail "$1: the connection to port $3 is not on shm after 10 s"
		sleep 0.1
	done
}

# case NAME SQUAT-PREFIX SERVER-PREFIX WANT (shm, or a reason on TCP)
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
	if [ "$4" = shm ]; then
		on_shm "$name" "$client" "$port"
	else
		stays_tcp "$name" "$client" "$port" "$4"
	fi
	sleep 0.3   # some calls after the refusal
	touch "$tmp/$name.stop"
	wait "$client" || fail "$name: the client saw a wrong answer or none"
	wait "$squatter" || fail "$name: the squatter failed"
	grep -q "^squat: $5 connections, 0 descriptors" "$tmp/$name-squat.out" ||
		fail "$name: the squatter got descriptors, or was dialled where it should not" \
		     "be or not where it should: $(cat "$tmp/$name-squat.out")"
	kill -0 "$server" 2>/dev/null || fail "$name: the server died"
	kill "$server"
	echo "$name: $(cat "$tmp/$name-client.out"); $(cat "$tmp/$name-squat.out")"
}

# case_run NAME SQUATTER-PREFIX SERVER-PREFIX WANT DIALLED (a grep pattern for the count)
case_run other-uid "$nobody" "$wsd run --" shm 0
case_run same-uid "" "" access "[1-9][0-9]*"
echo "PASS: the squatters got no descriptor; a wsd server's client on shm past the squatter," \
	"a plain server's on TCP (access); answers exact"
exit 0

#!/bin/sh
# A squatter holds the registry name "\0wsd-nd.P" of a port P before the
# server on P starts (namesquat.c).  A wsd server whose name another user
# holds must take an alternate name the squatter cannot know, which a wsd
# client finds; and no squatter may hang the client's upgrade:
#  full          squatter of uid 65534 whose backlog is full (a blocking
#                connect to the name would wait for good): the client is
#                on shm, through the alternate name, within 5 s.
#  silent-other  squatter of uid 65534 that accepts and never answers (the
#                connector's uid check refuses it at once): on shm, through
#                the alternate name, within 5 s.
#  silent        squatter as root, like the client and the server, so the
#                connector's uid check passes and it waits for the proof:
#                it gives up within its limit for one name (2 s), and the
#                connection settles on TCP (timeout) within 10 s.  (A name held by
#                the server's own user is in use, as for a sibling of the
#                server: the server takes no alternate one.)
#  full-plain    the full squatter and a plain server: settles on TCP
#                (timeout) within 10 s.
# Each: the client's answers are exact and it ends when told (it did not
# hang), nothing moved by ring where it stays on TCP, and the server lives.
set -u
. "${srcdir:-.}/tests/attack/priv.sh"
squat=${top_builddir:-.}/tests/attack/namesquat
$nobody test -x "$squat" || { echo "SKIP: uid 65534 cannot run $squat"; exit 77; }

# settles_tcp NAME PID PORT: PID's connection to PORT leaves "pending" within
# 10 s (by the clock: wsd stat is slow on a loaded machine), on TCP with
# reason timeout (the registry name was busy or silent), having moved
# nothing by ring; a line for the log in $tmp/NAME.how.
settles_tcp() {
	t_settle=$(( $(now_ms) + 10000 ))
	while :; do
		"$wsd" stat --json "$2" >"$tmp/$1.json" 2>"$tmp/$1-stat.err" ||
			fail "$1: wsd stat: $(cat "$tmp/$1-stat.err")"
		python3 - "$tmp/$1.json" "$2" "$3" >"$tmp/$1.how" <<'PY'
import json, sys
st = json.load(open(sys.argv[1]))
pid, port = sys.argv[2:4]
socks = [s for p in st["processes"] if str(p["pid"]) == pid for s in p["sockets"]
         if s["peer"] and s["peer"].rsplit(":", 1)[1] == port and not s["listening"]]
if len(socks) != 1 or socks[0]["reason"] == "pending":
    sys.exit(2)                      # not yet
s = socks[0]
if s["path"] != "tcp" or s["reason"] != "timeout" or s["copy_tx"] or s["copy_rx"] \
   or s["zcopy_tx"] or s["zcopy_rx"]:
    print("want tcp, reason timeout, nothing by ring: %s" % json.dumps(s))
    sys.exit(1)
print("reason %s" % s["reason"])
PY
		case $? in
		0) return 0 ;;
		2) [ "$(now_ms)" -lt "$t_settle" ] ||
			fail "$1: the upgrade of the connection to port $3 still waits after 10 s"
		   sleep 0.1 ;;
		*) fail "$1: the connection to port $3: $(cat "$tmp/$1.how")" ;;
		esac
	done
}

# case NAME MODE SQUAT-PREFIX SERVER-PREFIX WANT(shm MS | tcp)
case_run() {
	name=$1
	$3 "$squat" "$2" "$tmp/$name.port" "$tmp/$name.stop" >"$tmp/$name-squat.out" \
		2>"$tmp/$name-squat.err" &
	squatter=$!
	pids="$pids $squatter"
	wait_file "$tmp/$name.port" || fail "$name: the squatter did not start"
	port=$(cat "$tmp/$name.port")
	$4 "$prog" server -p "$port" "$tmp/$name.sport" >"$tmp/$name-server.out" \
		2>"$tmp/$name-server.err" &
	server=$!
	pids="$pids $server"
	wait_file "$tmp/$name.sport" || fail "$name: the server did not start on port $port"
	t0=$(now_ms)
	"$wsd" run -- "$prog" client "$port" "$tmp/$name.local" "$tmp/$name.stop" \
		>"$tmp/$name-client.out" 2>"$tmp/$name-client.err" &
	client=$!
	pids="$pids $client"
	wait_file "$tmp/$name.local" || fail "$name: the client did not connect"
	cport=$(cat "$tmp/$name.local")
	if [ "$5" = tcp ]; then
		settles_tcp "$name" "$client" "$port"   # not in $(): its fail must end us
		how=$(cat "$tmp/$name.how")
	else
		accelerated "$6" "$cport" ||
			fail "$name: the client's connection is not on shm after $6 ms (the squatter held it back)"
		how="shm"
		# the server says another user held its registry's name
		python3 - "$tmp/accel.json" "$server" "$port" <<'PY' ||
import json, sys
st = json.load(open(sys.argv[1]))
p = [p for p in st["processes"] if p["pid"] == int(sys.argv[2])][0]
assert p.get("registry_name_taken") == {"port": int(sys.argv[3]), "by": 65534}, p
PY
			fail "$name: wsd stat does not say that uid 65534 held the registry's name"
	fi
	how="$how after $(( $(now_ms) - t0 )) ms"
	sleep 0.3   # some calls after it settled
	touch "$tmp/$name.stop"
	wait_exit "$client" 5000 || fail "$name: the client hung"
	wait "$client" || fail "$name: the client saw a wrong answer or none"
	wait_exit "$squatter" 5000 || fail "$name: the squatter did not end"
	wait "$squatter" || fail "$name: the squatter failed"
	kill -0 "$server" 2>/dev/null || fail "$name: the server died"
	kill "$server"
	echo "$name: $how; $(cat "$tmp/$name-client.out"); $(cat "$tmp/$name-squat.out")"
}

case_run full full "$nobody" "$wsd run --" shm 5000
case_run silent-other silent "$nobody" "$wsd run --" shm 5000
case_run silent silent "" "$wsd run --" tcp
case_run full-plain full "$nobody" "" tcp
echo "PASS: squatted names cost no upgrade of a wsd server and hang no client"
exit 0

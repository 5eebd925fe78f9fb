#!/bin/sh
# A wsd client of the server's user that may not read the server's memory
# must stay on TCP with reason access, and one of another user pairs by
# copy, reading nothing of the server's but their rings; either way its
# connection works as plain TCP does:
#  nodump     server and client both uid 65534 (a same-user attacker), the
#             server not dumpable once it listens (tuple server -n), so
#             nobody of its user may read it: the client's proof (and its
#             check that the registry holds the TCP listener) fails.
#  other-uid  server as root, client as uid 65534: on shm by copy (the
#             server handed over its TCP listener for the owner check).
# Each: the client's answers are exact (tuple client checks every one),
# nothing moved by ring at the client where it stays on TCP, and the
# server lives.
set -u
. "${srcdir:-.}/tests/attack/priv.sh"

# case NAME SERVER-PREFIX SERVER-OPTION CLIENT-PREFIX WANT (access, or shm)
case_run() {
	name=$1
	$2 "$wsd" run -- "$prog" server $3 "$tmp/$name.port" >"$tmp/$name-server.out" \
		2>"$tmp/$name-server.err" &
	server=$!
	pids="$pids $server"
	wait_file "$tmp/$name.port" || fail "$name: the server did not start"
	port=$(cat "$tmp/$name.port")
	$4 "$wsd" run -- "$prog" client "$port" "$tmp/$name.local" "$tmp/$name.stop" \
		>"$tmp/$name-client.out" 2>"$tmp/$name-client.err" &
	client=$!
	pids="$pids $client"
	wait_file "$tmp/$name.local" || fail "$name: the client did not connect"
	if [ "$5" = shm ]; then
		accelerated 5000 "$(cat "$tmp/$name.local")" ||
			fail "$name: the connection did not reach shm within 5 s"
	else
		# the setpriv process execs the program: $client is its pid
		stays_tcp "$name" "$client" "$port" access
	fi
	sleep 0.3   # some calls after the refusal
	touch "$tmp/$name.stop"
	wait "$client" || fail "$name: the client saw a wrong answer or none"
	kill -0 "$server" 2>/dev/null || fail "$name: the server died"
	kill "$server"
	echo "$name: $(cat "$tmp/$name-client.out")"
}

case_run nodump "$nobody" -n "$nobody" access
case_run other-uid "" "" "$nobody" shm
echo "PASS: a client of the server's user that may not read it stayed on TCP (access)," \
     "one of another user paired by copy; answers exact"
exit 0

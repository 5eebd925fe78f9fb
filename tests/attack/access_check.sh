#!/bin/sh
# A wsd client that may not read the server's memory must stay on TCP with
# reason access, and its connection must work as plain TCP does:
#  nodump     server and client both uid 65534 (a same-user attacker), the
#             server not dumpable once it listens (tuple server -n), so
#             nobody of its user may read it: the client's proof (and its
#             check that the registry holds the TCP listener) fails.
#  other-uid  server as root, client as uid 65534: refused on SO_PEERCRED.
# Each: the client's answers are exact (tuple client checks every one),
# nothing moved by ring at the client, and the server lives.
set -u
. "${srcdir:-.}/tests/attack/priv.sh"

# case NAME SERVER-PREFIX SERVER-OPTION CLIENT-PREFIX
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
	# the setpriv process execs the program: $client is its pid
	stays_tcp "$name" "$client" "$port" access
	sleep 0.3   # some calls after the refusal
	touch "$tmp/$name.stop"
	wait "$client" || fail "$name: the client saw a wrong answer or none"
	kill -0 "$server" 2>/dev/null || fail "$name: the server died"
	kill "$server"
	echo "$name: $(cat "$tmp/$name-client.out")"
}

case_run nodump "$nobody" -n "$nobody"
case_run other-uid "" "" "$nobody"
echo "PASS: clients without the right to read the server stayed on TCP (access), answers exact"
exit 0

# Shared by chan_kill_check.sh and stall_check.sh; sourced, not run (after
# tests/attack/common.sh).  fanout_start SEED MIB EXT: the fanout server
# (16 connections) and two clients under wsd run, client a with MIB MiB a
# connection and client b with 32, their output in $tmp/{server,a,b}.out
# and stderr in $tmp/{server,a,b}.EXT; sets spid, apid and bpid.
fanout=${top_builddir:-.}/tests/fault/fanout

fanout_start() {
	rm -f "$tmp"/port "$tmp"/*.out "$tmp"/*.err "$tmp"/*.log "$tmp"/*.json
	"$wsd" run -- "$fanout" serve "$tmp/port" "$1" 16 >"$tmp/server.out" \
		2>"$tmp/server.$3" &
	spid=$!
	pids="$pids $spid"
	wait_file "$tmp/port" || fail "round $1: the server did not listen"
	"$wsd" run -- "$fanout" connect "$(cat "$tmp/port")" "$1" 8 0 "$2" >"$tmp/a.out" \
		2>"$tmp/a.$3" &
	apid=$!
	"$wsd" run -- "$fanout" connect "$(cat "$tmp/port")" "$1" 8 100 32 >"$tmp/b.out" \
		2>"$tmp/b.$3" &
	bpid=$!
	pids="$pids $apid $bpid"
}

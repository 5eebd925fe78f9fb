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

# fanout_hung NAME PID: for a process that outlived its deadline, one line
# saying where each of its connections stands (wsd stat: path, reason,
# bytes each way, what its last wait was for), so that a report that keeps
# only the failure's line still says where it stopped; its threads' stacks
# (stacks) go to $tmp/NAME.stacks.err, printed by fail.
fanout_hung() {
	"$wsd" stat --json "$2" >"$tmp/$1.hung.json" 2>&1
	stacks "$2" >"$tmp/$1.stacks.err"
	python3 - "$tmp/$1.hung.json" "$1" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    sys.exit(print("%s: no wsd stat (%s)" % (sys.argv[2], e)))
out = []
for p in d.get("processes", []):
    for s in p.get("sockets", []):
        if s.get("listening"):
            continue
        w = s.get("last_wait") or {}
        out.append("fd %s %s/%s rx %d tx %d wait %s/%s" % (
            s.get("fd"), s.get("path"), s.get("reason"),
            s.get("tcp_rx", 0) + s.get("copy_rx", 0) + s.get("zcopy_rx", 0),
            s.get("tcp_tx", 0) + s.get("copy_tx", 0) + s.get("zcopy_tx", 0),
            w.get("for", "-"), w.get("age_ms", "-")))
print("%s: %s" % (sys.argv[2], "; ".join(out) or "no connections"))
PY
}

#!/bin/sh
# Processes that hold a wsd server's proof slots (tests/attack/slots.c:
# 8 processes, 20 silent connections each to its registry, made again as
# they are closed) keep no honest wsd client on TCP, and what the registry
# turned away is counted by reason in the server's wsd stat:
#  other-user  the flooders run as uid 65534, which a registry takes (by
#              copy, without the proof): as the same user's, below,
#              counted peer-limit.
#  same-user   the flooders run as the server's user (root, without any
#              capability, so without the right to read the server): each
#              process keeps at most its share of the slots, a newcomer
#              takes the oldest slot of the process that holds the most,
#              the others wait out the deadline: counted peer-limit and
#              timeout.  The honest client, of the same user, is a newcomer.
# Each: the honest client (root, under wsd run) is on path shm within 3 s
# of connecting, its answers exact, and the server lives.
set -u
. "${srcdir:-.}/tests/attack/priv.sh"
slots=${top_builddir:-.}/tests/attack/slots
$nobody test -x "$slots" || { echo "SKIP: uid 65534 cannot run $slots"; exit 77; }
# root without its capabilities: the kernel lets it read no process that has them
nocaps="setpriv --bounding-set=-all --inh-caps=-all"
$nocaps true 2>/dev/null || { echo "SKIP: setpriv cannot drop capabilities here"; exit 77; }

refused() {   # NAME: the server's refusals, as reason=count lines, in $tmp/NAME.ref
	"$wsd" stat --json "$server" >"$tmp/$1-stat.json" 2>"$tmp/$1-stat.err" ||
		fail "$1: wsd stat: $(cat "$tmp/$1-stat.err")"
	python3 - "$tmp/$1-stat.json" >"$tmp/$1.ref" <<'PY' || fail "$1: wsd stat --json unreadable"
import json, sys
st = json.load(open(sys.argv[1]))
for k, v in st["processes"][0]["refused"].items():
    print("%s=%d" % (k, v))
PY
}
count() {   # NAME REASON: REASON's count in $tmp/NAME.ref, 0 when absent
	sed -n "s/^$2=//p" "$tmp/$1.ref" | grep . || echo 0
}

# case_run NAME PREFIX: the flood by PREFIX, an honest client meanwhile
case_run() {
	name=$1
	refused "$name-before"
	$2 "$slots" "$port" 8 20 "$tmp/$name.stop" >"$tmp/$name-flood.out" \
		2>"$tmp/$name-flood.err" &
	flood=$!
	pids="$pids $flood"
	WAIT_S=5 wait_file "$tmp/$name-flood.out" holding || fail "$name: the flood did not start"
	sleep 1.5   # the slots and the kernel's backlog full, refilled as they empty
	start=$(now_ms)
	start_client "$name-honest" wsd
	honest=$client
	accelerated $(( 3000 - ($(now_ms) - start) )) "$cport" ||
		fail "$name: the honest client was not on shm within 3 s of its connect"
	echo "$name: the honest client was on shm after $(( $(now_ms) - start )) ms"
	sleep 0.5   # the acceptor looks at the provider's counts at least every 200 ms
	refused "$name-after"
	touch "$tmp/$name.stop" "$tmp/stop"
	wait_exit "$flood" 5000 || fail "$name: the flood did not end"
	wait "$honest" || fail "$name: the honest client saw a wrong answer or none"
	rm -f "$tmp/stop"
	kill -0 "$server" 2>/dev/null || fail "$name: the server died"
	echo "$name: flood: $(sort "$tmp/$name-flood.out" | uniq -c | tr -s ' \n' '  ')"
	echo "$name: server refused $(tr '\n' ' ' <"$tmp/$name-after.ref")"
}
# more NAME REASON MIN: the case counted at least MIN refusals of REASON
more() {
	got=$(( $(count "$1-after" "$2") - $(count "$1-before" "$2") ))
	[ "$got" -ge "$3" ] || fail "$1: $got refusals counted $2 in wsd stat, want $3 or more"
}

start_server
case_run other-user "$nobody"
more other-user peer-limit 100
case_run same-user "$nocaps"
more same-user peer-limit 100
more same-user timeout 10
echo "PASS: flooded proof slots kept no honest client on TCP; refusals counted by reason"
exit 0

#!/bin/sh
# wsd stat: reads what tests/stat_writer publishes through the switch's stat
# table (switch/stat.c) and shows it as a table and as JSON; filters by pid;
# forgets freed slots; ignores and removes the files of processes that are
# gone (killed, or exec'd into something else); a fork child writes a file
# of its own and leaves the parent's alone.
set -u
wsd=${top_builddir:-.}/wsd/wsd
writer=${top_builddir:-.}/tests/stat_writer
dir=/dev/shm
if [ ! -d "$dir" ]; then
	echo "SKIP: no $dir, where the statistics files live"
	exit 77
fi
# tests/attack/statsquat_check.sh plants other users' files under the
# names of coming pids, which would give ours other names: not meanwhile
exec 9>"${TMPDIR:-/tmp}/wsd-stat-names.lock"
flock 9
command -v python3 >/dev/null 2>&1 ||
	{ echo "FAIL: python3 is needed to check the JSON (./build.sh installs it)"; exit 1; }
tmp=$(mktemp -d)
pids=
cleanup() {
	for p in $pids; do kill -9 "$p" 2>/dev/null; done
	rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

# start MODE: runs the writer in the background (pid in $pid), waits for "ready"
start() {
	out=$tmp/out.$1
	# emptied here: the background redirection may truncate it only after
	# wait_for has read the last writer's "ready" from it
	: >"$out"
	"$writer" "$1" >"$out" 2>&1 &
	pid=$!
	pids="$pids $pid"
	wait_for "^ready" "$out" || fail "stat_writer $1 did not get ready: $(cat "$out")"
}
# wait_for REGEX FILE: up to 10 s
wait_for() {
	n=0
	until grep -q "$1" "$2"; do
		n=$((n + 1))
		[ $n -le 100 ] || return 1
		sleep 0.1
	done
}
# row PID FD: that socket's row of FILE, spaces squeezed
row() {
	awk -v p="$1" -v f="$2" '$1 == p && $3 == f' "$3" | tr -s ' '
}
rows() {
	awk -v p="$1" '$1 == p' "$2" | wc -l
}

start ""
"$wsd" stat >"$tmp/table" 2>"$tmp/err" || fail "wsd stat failed: $(cat "$tmp/err")"
head="PID COMM FD LOCAL PEER PATH REASON TCP-TX TCP-RX COPY-TX COPY-RX ZCOPY-TX ZCOPY-RX"
head="$head BELLS-TX BELLS-RX WAITS FALLBACKS CHAN PEER-PID WAY"
[ "$(head -n 1 "$tmp/table" | tr -s ' ' | sed 's/^ //')" = "$head" ] ||
	fail "no header line: $(head -n 1 "$tmp/table")"
w=stat_writer
c11="11 12 1000 2000 3000000 4000000 5 6 7 8 9 4321"
for want in \
	"$pid $w 11 127.0.0.1:5001 127.0.0.1:40000 shm none $c11 copy" \
	"$pid $w 12 [::1]:5002 [2001:db8::7]:40001 tcp peer-plain 100 200 0 0 0 0 0 0 0 1 0 0 -" \
	"$pid $w 13 0.0.0.0:5003 - tcp listener 0 0 0 0 0 0 0 0 0 0 0 0 -"; do
	fd=$(echo "$want" | cut -d' ' -f3)
	got=$(row "$pid" "$fd" "$tmp/table" | sed 's/^ //')
	[ "$got" = "$want" ] || { cat "$tmp/table"; fail "row of fd $fd: '$got', want '$want'"; }
done
[ "$(rows "$pid" "$tmp/table")" -eq 3 ] || fail "not 3 rows for pid $pid"
echo "ok: table rows (IPv4 shm with counters, IPv6 tcp peer-plain, listener)"

"$wsd" stat --json >"$tmp/json" || fail "wsd stat --json failed"
python3 -m json.tool "$tmp/json" >/dev/null ||
	fail "wsd stat --json is not JSON: $(cat "$tmp/json")"
python3 - "$tmp/json" "$pid" <<'EOF' || fail "wsd stat --json fields"
import json, sys
doc = json.load(open(sys.argv[1]))
proc = [p for p in doc["processes"] if p["pid"] == int(sys.argv[2])]
assert len(proc) == 1, proc
p = proc[0]
assert p["comm"] == "stat_writer", p["comm"]
s = {x["fd"]: x for x in p["sockets"]}
assert sorted(s) == [11, 12, 13], sorted(s)
want = {"local": "127.0.0.1:5001", "peer": "127.0.0.1:40000", "listening": False,
        "path": "shm", "reason": "none", "tcp_tx": 11, "tcp_rx": 12, "copy_tx": 1000,
        "copy_rx": 2000, "zcopy_tx": 3000000, "zcopy_rx": 4000000, "doorbells_tx": 5,
        "doorbells_rx": 6, "waits": 7, "fallbacks": 8, "channel": 9, "peer_pid": 4321,
        "way": "copy"}
assert all(s[11][k] == v for k, v in want.items()), s[11]
assert (s[12]["local"], s[12]["peer"], s[12]["path"], s[12]["reason"], s[12]["fallbacks"],
        s[12]["way"]) == ("[::1]:5002", "[2001:db8::7]:40001", "tcp", "peer-plain", 1, "-"), s[12]
assert (s[13]["local"], s[13]["peer"], s[13]["listening"], s[13]["reason"]) == \
    ("0.0.0.0:5003", None, True, "listener"), s[13]
EOF
echo "ok: --json parses and carries the same fields"

# per channel: the sockets on it counted, its memory from the process's smaps
# (stat_writer wrote 16 pages of a memfd and named its inode for channel 9)
"$wsd" stat --channels "$pid" >"$tmp/chans" || fail "wsd stat --channels failed"
[ "$(head -n 1 "$tmp/chans" | tr -s ' ' | sed 's/^ //')" = \
  "PID COMM CHAN PATH PEER-PID SLOTS RSS-KIB PSS-KIB" ] ||
	fail "no --channels header: $(head -n 1 "$tmp/chans")"
got=$(awk -v p="$pid" '$1 == p' "$tmp/chans" | tr -s ' ' | sed 's/^ //')
set -- $got
[ "$#" -eq 8 ] && [ "$2 $3 $4 $5 $6" = "stat_writer 9 shm 4321 1" ] && [ "$7" -ge 64 ] &&
	[ "$8" -ge 64 ] || { cat "$tmp/chans"; fail "channel row: '$got'"; }
python3 - "$tmp/json" "$pid" <<'EOF2' || fail "wsd stat --json channels"
import json, sys
doc = json.load(open(sys.argv[1]))
p = [p for p in doc["processes"] if p["pid"] == int(sys.argv[2])][0]
c = p["channels"]
assert len(c) == 1 and c[0]["channel"] == 9 and c[0]["peer_pid"] == 4321, c
assert c[0]["slots"] == 1 and c[0]["path"] == "shm" and c[0]["rss_kib"] >= 64, c
EOF2
"$wsd" stat --json --channels >/dev/null 2>&1
[ $? -eq 2 ] || fail "--json with --channels is not a usage error"
echo "ok: --channels and the JSON channels: slots, peer, memory from smaps"

# a pid filter shows only that process; a pid without a file is an error
"$wsd" stat "$pid" >"$tmp/one" || fail "wsd stat $pid failed"
[ "$(awk 'NR > 1 && $1 != '"$pid" "$tmp/one" | wc -l)" -eq 0 ] || fail "wsd stat $pid shows others"
[ "$(rows "$pid" "$tmp/one")" -eq 3 ] || fail "wsd stat $pid: not 3 rows"
sh -c 'exit 0' &
dead=$!
wait $dead
"$wsd" stat "$dead" >"$tmp/none" 2>/dev/null
[ $? -eq 1 ] || fail "wsd stat of a pid without statistics does not exit 1"
[ "$(wc -l <"$tmp/none")" -eq 1 ] || fail "wsd stat $dead: more than the header"
empty=$("$wsd" stat --json "$dead" 2>/dev/null)
parsed=$(echo "$empty" | python3 -c 'import json, sys; print(json.load(sys.stdin))')
[ "$parsed" = "{'processes': []}" ] ||
	fail "wsd stat --json $dead: '$empty'"
"$wsd" stat --bogus >/dev/null 2>&1
[ $? -eq 2 ] || fail "an unknown option is not a usage error"
"$wsd" stat 12x >/dev/null 2>&1
[ $? -eq 2 ] || fail "a bad pid is not a usage error"
echo "ok: pid filter, empty result, usage errors"

# a freed slot is gone from the listing
kill -USR1 "$pid"
wait_for "^freed" "$out" || fail "stat_writer did not free: $(cat "$out")"
"$wsd" stat "$pid" >"$tmp/freed" || fail "wsd stat after free failed"
[ -z "$(row "$pid" 12 "$tmp/freed")" ] || fail "the freed slot is still listed"
[ "$(rows "$pid" "$tmp/freed")" -eq 2 ] || fail "not 2 rows after the free"
echo "ok: a freed slot disappears"

# a normal exit removes the file
kill -USR2 "$pid"
wait "$pid"
[ ! -e "$dir/wsd-stat.$pid" ] || fail "the file outlived a normal exit"
echo "ok: exit removes the file"

# killed: the file stays; wsd stat ignores it and removes it (unless the
# next program of this user under wsd, another test's, removed it first)
start ""
[ -e "$dir/wsd-stat.$pid" ] || fail "no $dir/wsd-stat.$pid"
kill -9 "$pid"
wait "$pid" 2>/dev/null
"$wsd" stat >"$tmp/killed" || fail "wsd stat failed"
[ "$(rows "$pid" "$tmp/killed")" -eq 0 ] || fail "a killed process is listed"
[ ! -e "$dir/wsd-stat.$pid" ] || fail "a killed process's file was not removed"
echo "ok: a killed process's file is ignored and removed"

# exec'd: the pid lives on but no longer maps the file
start exec
n=0
until [ "$(cat /proc/"$pid"/comm 2>/dev/null)" = sleep ]; do
	n=$((n + 1))
	[ $n -le 100 ] || fail "stat_writer exec did not become sleep"
	sleep 0.1
done
"$wsd" stat "$pid" >"$tmp/exec" 2>/dev/null
[ $? -eq 1 ] || fail "wsd stat of an exec'd process does not exit 1"
[ "$(rows "$pid" "$tmp/exec")" -eq 0 ] || fail "an exec'd process's old sockets are listed"
[ ! -e "$dir/wsd-stat.$pid" ] || fail "an exec'd process's old file was not removed"
kill "$pid"
wait "$pid" 2>/dev/null
echo "ok: the file an exec left behind is ignored and removed"

# fork: the child's file is its own; its inherited slots write elsewhere
start fork
wait_for "^child " "$out" || fail "no child: $(cat "$out")"
child=$(sed -n 's/^child //p' "$out")
pids="$pids $child"
"$wsd" stat "$pid" "$child" >"$tmp/fork" || fail "wsd stat $pid $child failed"
[ "$(rows "$pid" "$tmp/fork")" -eq 3 ] || fail "the parent lost rows after the fork"
row "$pid" 11 "$tmp/fork" | grep -q " shm none 11 12 1000 " ||
	fail "the child's count reached the parent: $(row "$pid" 11 "$tmp/fork")"
[ "$(rows "$child" "$tmp/fork")" -eq 1 ] || fail "the child has not exactly its own row"
[ "$(row "$child" 99 "$tmp/fork" | cut -d' ' -f4-7)" = \
  "127.0.0.1:5099 127.0.0.1:40099 tcp forked" ] ||
	fail "the child's row: $(row "$child" 99 "$tmp/fork")"
kill -USR2 "$child"
n=0
while [ -e "$dir/wsd-stat.$child" ]; do
	n=$((n + 1))
	[ $n -le 100 ] || fail "the child's file outlived its exit"
	sleep 0.1
done
[ -e "$dir/wsd-stat.$pid" ] || fail "the child's exit removed the parent's file"
kill -USR2 "$pid"
wait "$pid"
[ ! -e "$dir/wsd-stat.$pid" ] || fail "the parent's file outlived its exit"
echo "ok: a fork child publishes in its own file and leaves the parent's alone"

# a name with a quote, a backslash, a tab and a character cut short: escaped
# in JSON (the broken one as U+FFFD), '?' in the table
start name
"$wsd" stat --json "$pid" >"$tmp/json" || fail "wsd stat --json $pid failed"
python3 - "$tmp/json" <<'EOF' || fail "the name in JSON: $(cat "$tmp/json")"
import json, sys
comm = json.load(open(sys.argv[1], encoding="utf-8"))["processes"][0]["comm"]
assert comm == 'x"y\\z\t\u00e9\ufffd', repr(comm)
EOF
"$wsd" stat "$pid" >"$tmp/table" || fail "wsd stat $pid failed"
[ "$(awk -v p="$pid" '$1 == p && $3 == 11 { print $2 }' "$tmp/table")" = \
  "$(printf 'x"y\\z?\303\251?')" ] || fail "the name in the table: $(cat "$tmp/table")"
kill -USR2 "$pid"
wait "$pid"
echo "ok: names are escaped"

# a full table: every allocation answers, a freed slot comes back once
"$writer" full >"$tmp/full" 2>&1 & pid=$!
wait "$pid" || fail "stat_writer full: $(cat "$tmp/full")"
grep -q "^full ok" "$tmp/full" || fail "stat_writer full: $(cat "$tmp/full")"
[ ! -e "$dir/wsd-stat.$pid" ] || fail "the full table's file outlived its exit"
echo "ok: a full table gives each socket a heap slot of its own"
# --waits: a real connection under wsd run (the stress program, both ways,
# spinning off so that its threads sleep): each end's state at its last
# sleep, as text and in --json's last_wait
stress=${top_builddir:-.}/tests/sock/stress
# (wsd run execs it: $! is the program, bounded by its own --timeout, and
# its forked peer dies with it)
WSD_SPIN_US=0 "$wsd" run -- "$stress" --bytes 64G --timeout 50 >"$tmp/stress" 2>&1 &
spid=$!
pids="$pids $spid"
n=0
# (every process's: the program forks its peer)
until "$wsd" stat --waits >"$tmp/waits" 2>/dev/null &&
      grep -q '^[0-9]* stress fd [0-9]*: slept [0-9]* ms ago for ' "$tmp/waits"; do
	n=$((n + 1))
	[ $n -le 100 ] || fail "no wait shown for the stress program: $(cat "$tmp/waits" "$tmp/stress")"
	sleep 0.1
done
for l in '^  send: pos [0-9]* consumed [0-9]* zc [0-9]*/[0-9]* space_arm [0-9]*; peer' \
	 '^  receive: pos [0-9]* reported [0-9]* data_arm [0-9]*; peer' \
	 '^  doorbells: sent [0-9]* read [0-9]* announced [0-9]* ([0-9]* at the last arm); unsent [0-9]* (errno [0-9]*); peer'; do
	grep -q "$l" "$tmp/waits" || fail "wsd stat --waits lacks '$l': $(cat "$tmp/waits")"
done
"$wsd" stat --json >"$tmp/json" || fail "wsd stat --json failed"
python3 - "$tmp/json" <<'EOF' || fail "last_wait in JSON: $(cat "$tmp/json")"
import json, sys
p = json.load(open(sys.argv[1]))["processes"]
w = [x["last_wait"] for q in p if q["comm"] == "stress" for x in q["sockets"]
     if "last_wait" in x]
assert w, "no socket has last_wait"
for k in ("age_ms", "for", "tx_pos", "consumed", "rx_pos", "rx_reported",
          "data_arm", "space_arm", "bells_tx", "bells_rx", "peer_closed"):
    assert k in w[0], k
assert w[0]["for"] in (1, 2, 3) and w[0]["rx_reported"] <= w[0]["rx_pos"]
EOF
kill "$spid" 2>/dev/null
wait "$spid" 2>/dev/null
echo "ok: --waits shows each end's state at its last sleep"
echo "wsd stat: all checks passed"

#!/bin/sh
# One user (uid 65534) creates /dev/shm/wsd-stat.N for the next few
# hundred pids (plain files and a symlink), and a stale table of another
# user (uid 65533) is left under a dead pid.  A server and a client of
# uid 65533 then start under wsd run: wsd stat must list both with their
# connection, say whose name was taken and where the table is instead,
# and the stale file of their user must be gone.  (Before, such a process
# ran with no table at all, and wsd stat did not list it.)
set -u
. "${srcdir:-.}/tests/attack/priv.sh"
# stat_check.sh looks for the files under their first names: not meanwhile
exec 9>"${TMPDIR:-/tmp}/wsd-stat-names.lock"
flock 9
planted=
cleanup_planted() {
	for f in $planted; do rm -f "$f"; done
	cleanup
}
trap cleanup_planted EXIT

victim="setpriv --reuid=65533 --regid=65533 --clear-groups"
# a dead pid of the victims' user, with a table file left behind (killed, no destructor)
sh -c 'exit 0' &
dead=$!
wait "$dead"
$victim sh -c 'printf stale >"$1"' sh "/dev/shm/wsd-stat.$dead" ||
	fail "uid 65533 cannot write /dev/shm"
planted="$planted /dev/shm/wsd-stat.$dead"

next=$(( $(cat /proc/sys/kernel/ns_last_pid) + 1 ))
max=$(cat /proc/sys/kernel/pid_max)
last=$(( next + 400 ))
[ "$last" -lt "$max" ] || { echo "SKIP: pids about to wrap (pid_max $max)"; exit 77; }
i=$next
while [ "$i" -le "$last" ]; do
	planted="$planted /dev/shm/wsd-stat.$i"
	i=$((i + 1))
done
# as the other user: empty files, and a symlink for one in ten
$nobody sh -c '
i=$1
while [ "$i" -le "$2" ]; do
	if [ $((i % 10)) -eq 0 ]; then ln -s /etc/passwd "/dev/shm/wsd-stat.$i"
	else : >"/dev/shm/wsd-stat.$i"; fi
	i=$((i + 1))
done' sh "$next" "$last" || fail "could not plant the files"

$victim "$wsd" run -- "$prog" server "$tmp/port" >"$tmp/server.out" 2>"$tmp/server.err" &
server=$!
pids="$pids $server"
wait_file "$tmp/port" || fail "the server did not start"
port=$(cat "$tmp/port")
$victim "$wsd" run -- "$prog" client "$port" "$tmp/victim" "$tmp/stop" >"$tmp/victim.out" \
	2>"$tmp/victim.err" &
client=$!
pids="$pids $client"
wait_file "$tmp/victim" || fail "the client did not connect"
[ "$server" -le "$last" ] && [ "$client" -le "$last" ] ||
	fail "the pids ran past the planted names ($server, $client > $last)"
# the client's first bytes: its table and the server's both made by now
n=0
until "$wsd" stat --json "$server" "$client" >"$tmp/stat.json" 2>"$tmp/stat.err" &&
      python3 - "$tmp/stat.json" "$server" "$client" <<'PY'
import json, sys
st = json.load(open(sys.argv[1]))
procs = {p["pid"]: p for p in st["processes"]}
for pid in map(int, sys.argv[2:]):
    p = procs.get(pid)
    if not p or not any(s["peer"] for s in p["sockets"]):
        sys.exit(1)
PY
do
	n=$((n + 1))
	[ $n -le 50 ] || fail "wsd stat does not list the server and the client with a connection"
	sleep 0.1
done
python3 - "$tmp/stat.json" "$server" "$client" <<'PY' || fail "wsd stat does not say whose names were taken"
import json, sys
st = json.load(open(sys.argv[1]))
for p in st["processes"]:
    if p["pid"] in map(int, sys.argv[2:]):
        assert p.get("file_name_taken_by") == 65534, p
        assert p["file"].startswith("wsd-stat.%d." % p["pid"]), p["file"]
PY
"$wsd" stat "$server" >"$tmp/stat.txt" 2>&1
grep -q "^$server .*: wsd-stat.$server was uid 65534's; statistics in /dev/shm/wsd-stat.$server\." \
	"$tmp/stat.txt" || fail "wsd stat's table does not say where the server's statistics are"
[ ! -e "/dev/shm/wsd-stat.$dead" ] || fail "the stale table of a dead process of ours stayed"
touch "$tmp/stop"
wait "$client" || fail "the client saw a wrong answer or none"
cat "$tmp/stat.txt"
echo "PASS: both processes listed despite the planted names; the stale table removed"
exit 0

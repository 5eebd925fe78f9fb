#!/bin/sh
# Real programs under wsd run, server and client both: iperf3 (-l 128K,
# -l 1M, -R) and sockperf (ping-pong, throughput) over TCP on 127.0.0.1,
# 2 seconds each on a free port.  Each must exit 0 and report results; and
# while the data flows, `wsd stat --json` must show the data connection on
# path "shm".  A missing iperf3/sockperf/python3 skips (77): ./build.sh
# installs them.  A missing `wsd stat` fails: without it the path cannot
# be checked, and passing would claim what was not seen.  On a host without
# an RDMA device, iperf3 -l 1M once more with WSD_TRANSPORT=verbs at both
# ends: it must work and stay on path "tcp", reason "provider".
#
# `wsd stat --json` is read loosely: any JSON object with a "path" member
# is a socket; the ports it names (numbers under keys with "port" in
# them, or "host:port" strings, at any depth) say which connection it is.
set -u
TOOLS="iperf3 sockperf python3 timeout"
. "${srcdir:-.}/tests/sock/check_common.sh"

free_port() {
	python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Wait (10 s at most) until something listens on 127.0.0.1:$1: probing it
# with a connection would be taken as a client by a one-shot server.
wait_listen() {
	python3 - "$1" <<'EOF'
import sys, time
port = "%04X" % int(sys.argv[1])
for _ in range(200):
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(name).read().splitlines()[1:]
        except OSError:
            continue
        for l in lines:
            f = l.split()
            if f[1].endswith(":" + port) and f[3] == "0A":
                sys.exit(0)
    time.sleep(0.05)
sys.exit(1)
EOF
}

# stat_snapshot FILE: what wsd stat --json says now; 1 if it failed.
stat_snapshot() {
	"$wsd" stat --json >"$1" 2>"$1.err" && return 0
	rc=$?
	fail "'wsd stat --json' failed (exit $rc): $(head -n 1 "$1.err")"
	echo "      the stat command may not be there yet; without it the path of the data"
	echo "      connection cannot be checked"
	return 1
}

# check_path FILE PORT [PATH [REASON [ENDS]]]: every socket of the connection
# with local or peer port PORT takes PATH (default shm), there are at least
# ENDS of them (default 1; 2 when both ends run under wsd and must show
# their addresses), and with REASON at least one has that reason code.
check_path() {
	python3 - "$1" "$2" "${3:-shm}" "${4:-}" "${5:-1}" <<'EOF'
import json, re, sys
path, port, want, reason = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
ends = int(sys.argv[5])
try:
    data = json.load(open(path))
except ValueError as e:
    print("wsd stat --json did not print JSON: %s" % e)
    sys.exit(1)

def ports(o, key=""):
    if isinstance(o, dict):
        for k, v in o.items():
            yield from ports(v, k)
    elif isinstance(o, list):
        for v in o:
            yield from ports(v, key)
    elif isinstance(o, bool):
        return
    elif isinstance(o, int) and "port" in key.lower():
        yield o
    elif isinstance(o, str):
        m = re.search(r":(\d+)$", o)
        if m:
            yield int(m.group(1))

found = []
def walk(o):
    if isinstance(o, dict):
        if "path" in o and port in set(ports(o)):
            found.append(o)
        for v in o.values():
            walk(v)
    elif isinstance(o, list):
        for v in o:
            walk(v)
walk(data)
if not found:
    print("no socket with port %d in wsd stat --json" % port)
    sys.exit(1)
if len(found) < ends:
    for s in found:
        print("  %s" % json.dumps(s, sort_keys=True)[:300])
    print("%d socket(s) with port %d in wsd stat --json, not the %d ends" % (len(found), port, ends))
    sys.exit(1)
bad = [s for s in found if s.get("path") != want]
for s in found:
    print("  %s" % json.dumps(s, sort_keys=True)[:300])
if bad:
    print("%d of %d sockets of the connection not on path %s" % (len(bad), len(found), want))
    sys.exit(1)
if reason and not [s for s in found if s.get("reason") == reason]:
    print("no socket of the connection with reason %s" % reason)
    sys.exit(1)
EOF
}

# Snapshot wsd stat until the connection on port $2 shows up on path shm,
# or the client ($3) ends, or 10 s pass: programs start their traffic late
# (sockperf warms up first) and the switch upgrades in the background.
snapshot_until() {
	n=0
	while [ $n -lt 40 ]; do
		sleep 0.25
		stat_snapshot "$1" || return $?
		check_path "$1" "$2" >/dev/null 2>&1 && return 0
		kill -0 "$3" 2>/dev/null || return 0
		n=$((n + 1))
	done
	return 0
}

iperf() {
	label=$1
	shift
	port=$(free_port)
	echo "== iperf3 $label"
	timeout 60 env $IPERF_ENV "$wsd" run -- iperf3 -s -1 -B 127.0.0.1 -p "$port" -J \
		>"$tmp/server.json" 2>"$tmp/server.err" &
	spid=$!
	pids="$pids $spid"
	wait_listen "$port" || { fail "iperf3 $label: the server is not listening"; return; }
	timeout 60 env $IPERF_ENV "$wsd" run -- iperf3 -c 127.0.0.1 -p "$port" -t 2 "$@" -J \
		>"$tmp/client.json" 2>"$tmp/client.err" &
	cpid=$!
	pids="$pids $cpid"
	# the data port is known only from the JSON at the end: look mid-run
	sleep 1.5
	stat_snapshot "$tmp/stat.json"
	have_stat=$?
	wait $cpid
	crc=$?
	wait $spid
	src=$?
	[ $crc -eq 0 ] || { fail "iperf3 $label: client exit $crc"; cat "$tmp/client.err" "$tmp/client.json"; }
	[ $src -eq 0 ] || { fail "iperf3 $label: server exit $src"; cat "$tmp/server.err"; }
	[ $crc -eq 0 ] || return
	out=$(python3 - "$tmp/client.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
r = d["end"]["sum_received"]
print(int(r["bytes"]), int(r["bits_per_second"]), d["start"]["connected"][0]["local_port"])
EOF
) || { fail "iperf3 $label: cannot read its JSON"; return; }
	set -- $out
	if [ "$1" -gt 0 ]; then
		echo "ok: iperf3 $label: $1 bytes received, $(($2 / 1000000)) Mbit/s"
	else
		fail "iperf3 $label: no bytes received"
	fi
	if [ $have_stat -eq 0 ]; then
		# both ends run under wsd: both sockets show, addresses and all
		if check_path "$tmp/stat.json" "$3" "$IPERF_PATH" "$IPERF_REASON" 2; then
			echo "ok: iperf3 $label: the data connection (port $3), both ends, on path $IPERF_PATH${IPERF_REASON:+, reason $IPERF_REASON}"
		else
			fail "iperf3 $label: the data connection (port $3) does not show both ends on path $IPERF_PATH${IPERF_REASON:+ with reason $IPERF_REASON}"
		fi
	fi
}

IPERF_ENV="" IPERF_PATH=shm IPERF_REASON=""
iperf "-l 128K" -l 128K
iperf "-l 1M" -l 1M
iperf "-R" -R
# Both ends told to use verbs on a host without an RDMA device: the
# connection stays on TCP, and the connecting side says why (its provider
# could not start: reason provider).
if ls /sys/class/infiniband/* >/dev/null 2>&1; then
	echo "skipped: iperf3 over verbs without a device (this host has one)"
else
	IPERF_ENV=WSD_TRANSPORT=verbs IPERF_PATH=tcp IPERF_REASON=provider
	iperf "-l 1M, WSD_TRANSPORT=verbs and no RDMA device" -l 1M
	IPERF_ENV="" IPERF_PATH=shm IPERF_REASON=""
fi

echo "== sockperf"
port=$(free_port)
timeout 120 "$wsd" run -- sockperf server --tcp -i 127.0.0.1 -p "$port" >"$tmp/sp-server.out" 2>&1 &
spid=$!
pids="$pids $spid"
if wait_listen "$port"; then
	# --mps: sockperf sizes its sequence table for 600K messages/s unless
	# told more, and under wsd a round trip takes well under a microsecond
	timeout 60 "$wsd" run -- sockperf ping-pong --tcp -i 127.0.0.1 -p "$port" -t 1 \
		--mps 5000000 --data-integrity >"$tmp/pp.out" 2>&1
	rc=$?
	if [ $rc -ne 0 ]; then
		fail "sockperf ping-pong: exit $rc"
		cat "$tmp/pp.out"
	elif ! grep -q "Summary: Latency is [0-9]" "$tmp/pp.out" ||
	     ! grep -q "# dropped messages = 0; # duplicated messages = 0; # out-of-order messages = 0" \
		"$tmp/pp.out"; then
		fail "sockperf ping-pong: no latency summary, or messages lost or reordered"
		cat "$tmp/pp.out"
	else
		echo "ok: sockperf ping-pong: $(grep -o 'Latency is .*' "$tmp/pp.out"), nothing lost"
	fi

	cport=$(free_port)
	timeout 60 "$wsd" run -- sockperf throughput --tcp -i 127.0.0.1 -p "$port" -t 2 -m 65000 \
		--client_port "$cport" >"$tmp/tp.out" 2>&1 &
	cpid=$!
	pids="$pids $cpid"
	snapshot_until "$tmp/sp-stat.json" "$cport" $cpid
	have_stat=$?
	wait $cpid
	rc=$?
	if [ $rc -ne 0 ]; then
		fail "sockperf throughput: exit $rc"
		cat "$tmp/tp.out"
		echo "the server's last lines:"
		tail -n 5 "$tmp/sp-server.out"
	elif ! grep -q "Summary: BandWidth is [0-9]*[1-9]" "$tmp/tp.out"; then
		fail "sockperf throughput: no bandwidth reported"
		cat "$tmp/tp.out"
	else
		echo "ok: sockperf throughput: $(grep -o 'BandWidth is .*' "$tmp/tp.out")"
	fi
	if [ $have_stat -eq 0 ]; then
		if check_path "$tmp/sp-stat.json" "$cport"; then
			echo "ok: sockperf throughput: the connection (port $cport) on path shm"
		else
			fail "sockperf throughput: the connection (port $cport) is not on path shm"
		fi
	fi
else
	fail "sockperf: the server is not listening"
fi
kill $spid 2>/dev/null
wait $spid 2>/dev/null
grep -qi "error" "$tmp/sp-server.out" && { fail "sockperf server reported an error"; cat "$tmp/sp-server.out"; }

[ $status -eq 0 ] && echo "real programs: all checks passed"
exit $status

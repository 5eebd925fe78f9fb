#!/bin/sh
# Containers on one host (libwsd(7), "Across network namespaces"): a
# client in one network namespace, a server in another and in a pid
# namespace of its own, running as another user (nobody), joined by a
# bridge; a service address that an nftables DNAT rule in the client's
# namespace sends to the server (another port too), and a rendezvous
# directory both share (WSD_RENDEZVOUS_DIR, root's, writable by the
# server's group, sticky).  Runs:
#   - the fanout streams (8 connections, 32 MiB each way, every byte
#     checked) to the server's bridge address and to the service address:
#     every connection on shm and proven at both ends (the debug lines);
#   - iperf3 -l 1M to the service address, under wsd (on shm, wsd stat)
#     and plain, both figures printed;
#   - a plain fanout server (no wsd) with a client under wsd: the streams
#     stay on TCP and arrive whole.
# Needs root, ip, nft, unshare, setpriv and iperf3; exits 77 otherwise.
set -u
. "${srcdir:-.}/tests/attack/common.sh"
b=${top_builddir:-.}
wsd=$(cd "$b" && pwd)/wsd/wsd
fanout=$(cd "$b" && pwd)/tests/fault/fanout
other=65534

[ "$(id -u)" -eq 0 ] || { echo "SKIP: needs root for namespaces"; exit 77; }
for c in ip nft unshare setpriv iperf3 python3; do
	command -v $c >/dev/null 2>&1 || { echo "SKIP: no $c"; exit 77; }
done
[ -x "$fanout" ] || { echo "FAIL: $fanout: not built"; exit 1; }
setpriv --reuid=$other --regid=$other --clear-groups test -r "$b/.libs/libwsd-preload.so" || {
	echo "SKIP: uid $other cannot read the build tree ($b)"
	exit 77
}

id=$$
A=wsdA$id B=wsdB$id H=wsdH$id
chmod 755 "$tmp"
# common.sh's clean-up (its trap), and the namespaces
cleanup() {
	for p in $pids; do kill -9 "$p" 2>/dev/null; done
	for n in $A $B $H; do ip netns del "$n" 2>/dev/null; done
	rm -rf "$tmp"
}
trap 'exit 1' INT TERM

ip netns add $A && ip netns add $B && ip netns add $H ||
	{ echo "SKIP: cannot make network namespaces"; exit 77; }
inA() { ip netns exec $A "$@"; }
inB() { ip netns exec $B "$@"; }
inH() { ip netns exec $H "$@"; }
# the bridge in a namespace of its own, so the host's network is untouched
inH ip link add br0 type bridge && inH ip link set br0 up &&
	ip link add va$id type veth peer name ha$id &&
	ip link add vb$id type veth peer name hb$id &&
	ip link set va$id netns $A && ip link set vb$id netns $B &&
	ip link set ha$id netns $H && ip link set hb$id netns $H &&
	inH ip link set ha$id master br0 && inH ip link set hb$id master br0 &&
	inH ip link set ha$id up && inH ip link set hb$id up &&
	inA ip addr add 10.77.0.1/24 dev va$id && inA ip link set va$id up &&
	inB ip addr add 10.77.0.2/24 dev vb$id && inB ip link set vb$id up &&
	inA ip link set lo up && inB ip link set lo up &&
	inA ip route add default dev va$id ||
	{ echo "SKIP: cannot build the bridge"; exit 77; }
inA unshare --pid --fork true 2>/dev/null || { echo "SKIP: no pid namespaces"; exit 77; }
svc=10.77.99.1 svcport=8000

# dnat PORT: the service address $svc:$svcport goes to the server's PORT
dnat() {
	inA nft delete table ip wsdsvc 2>/dev/null
	inA nft -f - <<EOF
table ip wsdsvc {
	chain out {
		type nat hook output priority -100;
		ip daddr $svc tcp dport $svcport dnat to 10.77.0.2:$1
	}
}
EOF
}
dnat 5201 || { echo "SKIP: nft cannot add a DNAT rule"; exit 77; }

# the shared directory: root's, the server's group may write, sticky
rdv=$tmp/rdv
mkdir "$rdv" && chgrp $other "$rdv" && chmod 1770 "$rdv"
export WSD_RENDEZVOUS_DIR="$rdv"
srv() {   # the server: network namespace B, a pid namespace, user nobody
	inB unshare --pid --fork --kill-child \
		setpriv --reuid=$other --regid=$other --clear-groups "$@"
}

fail() {
	echo "FAIL: $*"
	[ -n "${NETNS_KEEP:-}" ] && cp -r "$tmp" "$NETNS_KEEP"
	for f in "$tmp"/*.out "$tmp"/*.err; do
		[ -f "$f" ] && { echo "--- $f"; tail -n 15 "$f"; }
	done
	exit 1
}

# whole FILE N: N connection lines, each a whole 32 MiB stream both ways
whole() {
	[ "$(grep -c '^conn ' "$1")" -eq "$2" ] &&
		! grep '^conn ' "$1" | grep -qv ' tx 33554432 complete rx 33554432 complete$'
}

# stat_shm PEER: wsd stat lists a socket of ours to PEER (addr:port) on shm
stat_shm() {
	"$wsd" stat --json >"$tmp/stat.out" 2>"$tmp/stat.err" && python3 - "$tmp/stat.out" "$1" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
n = sum(1 for p in d.get("processes", []) for s in p.get("sockets", [])
        if not s.get("listening") and (s.get("peer") or "").endswith(sys.argv[2])
        and s.get("path") == "shm")
sys.exit(0 if n else 1)
EOF
}

# fan NAME ADDR PORT SERVER_WRAP: 8 streams to ADDR:PORT (fanout's port file)
fan() {
	rm -rf "$tmp/run" "$tmp"/*.out "$tmp"/*.err
	mkdir "$tmp/run" && chmod 777 "$tmp/run"
	$4 env WSD_DEBUG=1 FANOUT_LISTEN_ON=1 FAULT_LISTEN_ADDR=10.77.0.2 \
		timeout -k 5 50 \
		"$fanout" serve "$tmp/run/port" 7 8 >"$tmp/server.out" 2>"$tmp/server.err" &
	spid=$!
	pids="$pids $spid"
	wait_file "$tmp/run/port" || fail "$1: the server did not listen"
	port=$(cat "$tmp/run/port")
	dnat "$port"
	[ "$3" = svc ] && cport=$svcport || cport=$port
	inA env WSD_DEBUG=1 FANOUT_ADDR="$2" timeout -k 5 50 "$wsd" run -- \
		"$fanout" connect "$cport" 7 8 0 32 >"$tmp/client.out" 2>"$tmp/client.err" &
	cpid=$!
	pids="$pids $cpid"
	wait $cpid || fail "$1: the client exited $?"
	wait $spid || fail "$1: the server exited $?"
	whole "$tmp/client.out" 8 && whole "$tmp/server.out" 8 ||
		fail "$1: not every stream arrived whole"
}

# the server under wsd run; every connection on shm, wsd stat says so
served() { srv "$wsd" run -- "$@"; }
fan "bridge address" 10.77.0.2 port served
# each attached on shm, and each end proved its connection to the other
on_shm() {
	[ "$(grep -c 'attached (shm)' "$tmp/client.err")" -eq 8 ] &&
		[ "$(grep -c 'the peer proved the connection' "$tmp/client.err")" -eq 8 ] &&
		[ "$(grep -c 'the peer proved the connection' "$tmp/server.err")" -eq 8 ]
}
on_shm || fail "bridge address: not every connection reached shm"
echo "bridge address: 8 connections on shm, 32 MiB each way each, whole"

fan "service address (DNAT)" $svc svc served
on_shm || fail "service address: not every connection reached shm"
echo "service address (DNAT to another port): 8 connections on shm, whole"

# a plain server: every connection stays on TCP, whole
plain() { srv "$@"; }
fan "plain server" $svc svc plain
! grep -q 'attached' "$tmp/client.err" || fail "plain server: a connection left TCP"
echo "plain server across the DNAT: 8 connections on TCP, whole"

# iperf3 -l 1M to the service address, under wsd and plain
ipf() {   # ipf NAME WRAP: prints the receiver's Gbit/s
	dnat 5201
	$2 iperf3 -s -1 -B 10.77.0.2 -p 5201 >"$tmp/iperf-s.out" 2>"$tmp/iperf-s.err" &
	spid=$!
	pids="$pids $spid"
	sleep 0.5
	# shellcheck disable=SC2086
	inA env ${3:-} WSD_DEBUG=1 timeout 30 ${4:-} iperf3 -c $svc -p $svcport -l 1M -t 3 -J \
		>"$tmp/iperf-c.json" 2>"$tmp/iperf-c.err" &
	cpid=$!
	pids="$pids $cpid"
	seen=no
	while [ $seen = no ] && kill -0 $cpid 2>/dev/null; do
		stat_shm "$svc:$svcport" && seen=yes
		sleep 0.2
	done
	wait $cpid || fail "$1: iperf3 exited $?"
	wait $spid
	gbit=$(python3 -c 'import json,sys; print("%.1f" % (json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"] / 1e9))' "$tmp/iperf-c.json") ||
		fail "$1: no iperf3 result"
}
ipf "iperf3 under wsd" served "" "$wsd run --"
g_wsd=$gbit
[ $seen = yes ] || fail "iperf3: wsd stat shows no connection on shm"
ipf "iperf3 plain" plain
g_tcp=$gbit
# every entry withdrawn at its connection's upgrade or close, every socket at its listener's
left=$(ls -A "$rdv")
[ -z "$left" ] || fail "the rendezvous directory keeps: $left"
echo "iperf3 -l 1M across the DNAT: wsd $g_wsd Gbit/s (on shm, wsd stat), plain $g_tcp Gbit/s"
exit 0

#!/bin/sh
# The policy file (wsd.conf(5)) on a real program pair: a python3 echo
# server and client, both under wsd run, on a free port P of 127.0.0.1;
# the client echoes 1 MiB checked byte for byte, `wsd stat --json` is
# read, then 1 MiB more, and the server's count of bytes must be the
# client's.  Each run names its policy with WSD_CONF:
#   tcp-by-port    rules keep port P on TCP at both ends: path tcp, reason
#                  policy, at both;
#   accelerate     rules accelerate port P, "default tcp": path shm;
#   syntax-error   a misspelt keyword on line 4: each program names
#                  FILE:4 on stderr and runs, on TCP, reason policy;
#   missing-file   WSD_CONF names no file: each program says so and runs,
#                  on TCP, reason policy;
#   server-only    only the server's policy keeps P on TCP (the client's
#                  WSD_CONF is empty: no file): it refuses the client's
#                  request, and both show reason policy;
#   client-only    only the client's: it never asks, so the server's
#                  socket stays pending and its registry refused nothing;
#   program-glob   "tcp program python*": both on TCP, reason policy.
#   plain-remembered the server is plain (no wsd run): of the client's 21
#                  connections, at most 3 ask (the answer, no registry,
#                  is remembered for 1 s, then 2, 4...).
#   port-remembered the server's policy keeps its whole port on TCP, and
#                  the client makes 20 connections of 64 KiB each before
#                  the one looked at: the refusal says so, the client
#                  remembers it, and the server's registry refuses at most
#                  3 requests (one each, before).
# Skips (77) without python3.  WSD_DEBUG_POLICY=1 shows the switch's
# debug lines of both ends.
set -u
local=
TOOLS="python3 timeout"
. "${srcdir:-.}/tests/sock/check_common.sh"
# the python3 programs' shared helpers (tests/sock/echo.py)
PYTHONPATH="$(cd "${srcdir:-.}/tests/sock" && pwd)${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH
export PYTHONDONTWRITEBYTECODE=1   # nothing written beside the sources

cat >"$tmp/server.py" <<'EOF'
import socket, sys, threading
port, ready, conns = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", port))
l.listen()
open(ready, "w").write("up\n")
echoed = []

def serve(c):
    n = 0
    while True:
        b = c.recv(1 << 16)
        if not b:
            break
        c.sendall(b)
        n += len(b)
    c.close()
    echoed.append(n)

threads = []
for _ in range(conns):
    c, _ = l.accept()
    threads.append(threading.Thread(target=serve, args=(c,)))
    threads[-1].start()
for t in threads:
    t.join()
print("server echoed %d bytes" % sum(echoed))
EOF

cat >"$tmp/client.py" <<'EOF'
import os, socket, sys, time
import echo as e
from echo import echo, path, until_shm
port, tmp, want = int(sys.argv[1]), sys.argv[2], sys.argv[3]
# With a local port: a first connection is made and accelerated, so that
# the one from that port, the one looked at, is asked for on the channel
# the first made, from its connect, its first bytes written into the
# peer's ring ahead of the answer (libwsd(7), When a connection is upgraded).
local = int(sys.argv[4]) if len(sys.argv) > 4 else 0
first = None
# MORE short connections first, each past the bytes that make it ask
for _ in range(int(os.environ.get("MORE", "0"))):
    c = socket.create_connection(("127.0.0.1", port))
    echo(c, 64 << 10, 2)
    print("client: a short connection on %s" % path(c))
    c.shutdown(socket.SHUT_WR)
    if c.recv(1):
        sys.exit("bytes after the echo")
    c.close()
if local:
    first = socket.create_connection(("127.0.0.1", port))
    echo(first, 256 << 10, 5)
    until_shm(first)
    print("client: the first connection on %s" % path(first))
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", local))
    s.connect(("127.0.0.1", port))
    echo(s, 100, 4, 100)   # a first request that fits the peer's grant
else:
    s = socket.create_connection(("127.0.0.1", port))
echo(s, 1 << 20, 1)
if want == "shm":
    until_shm(s)
print("client: path %s after 1 MiB" % path(s))
open(tmp + "/ready", "w").write("%d\n" % s.getsockname()[1])
end = time.time() + 30
while not os.path.exists(tmp + "/go") and time.time() < end:
    time.sleep(0.02)
echo(s, 1 << 20, 3)
for c in (s, first):
    if c:
        c.shutdown(socket.SHUT_WR)
        if c.recv(1):
            sys.exit("bytes after the echo")
        c.close()
print("client sent and got back %d bytes" % e.sent)
EOF

# check.py STAT PORT LOCAL WANT-CLIENT WANT-SERVER REGISTRY: the two ends
# of the connection to PORT (from the client's port LOCAL, when not 0) in
# wsd stat --json must be "PATH/REASON" as WANT-CLIENT and WANT-SERVER
# say; REGISTRY "none": the server's registry refused no request, a
# reason: it refused one with that reason at least, REASON<=N: from one to
# N with that reason, "-": not looked at.
cat >"$tmp/check.py" <<'EOF'
import json, sys
stat, port, local, want_c, want_s, registry = sys.argv[1:7]
d = json.load(open(stat))
client = server = None
for p in d.get("processes", []):
    for s in p.get("sockets", []):
        here, there = s.get("local") or "", s.get("peer") or ""
        if s.get("listening"):
            continue
        if there.endswith(":" + port) and (local == "0" or here.endswith(":" + local)):
            client = (p, s)
        elif here.endswith(":" + port) and (local == "0" or there.endswith(":" + local)):
            server = (p, s)
ok = True
for name, end, want in (("client", client, want_c), ("server", server, want_s)):
    if not end:
        print("  %s: no socket of the connection in wsd stat" % name)
        ok = False
        continue
    p, s = end
    got = "%s/%s" % (s["path"], s["reason"])
    print("  %s: pid %d fd %d %s -> %s: %s (fallbacks %d)" % (
        name, p["pid"], s["fd"], s["local"], s["peer"], got, s["fallbacks"]))
    ok = ok and got == want
if server and registry != "-":
    refused = server[0].get("refused", {})
    print("  the server's registry refused: %s" % (refused or "nothing"))
    if registry == "none":
        ok = ok and not refused
    elif "<=" in registry:
        why, most = registry.split("<=")
        ok = ok and 0 < refused.get(why, 0) <= int(most)
    else:
        ok = ok and refused.get(registry, 0) > 0
sys.exit(0 if ok else 1)
EOF

free_port() {
	python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# run NAME SERVER-CONF CLIENT-CONF WANT-CLIENT WANT-SERVER [REGISTRY]: the
# server on $port, the client from $local when set (check.py says the rest).
run() {
	name=$1 sconf=$2 cconf=$3 want_c=$4 want_s=$5 registry=${6:--}
	echo "== $name"
	rm -f "$tmp/ready" "$tmp/sready" "$tmp/go"
	dbg=${WSD_DEBUG_POLICY:-0}
	timeout 60 env WSD_DEBUG="$dbg" WSD_CONF="$sconf" "$wsd" run -- \
		python3 "$tmp/server.py" "$port" "$tmp/sready" $((${local:+1} + 1 + ${MORE:-0})) \
		>"$tmp/server.out" 2>"$tmp/server.err" &
	spid=$!
	pids="$pids $spid"
	n=0
	while [ ! -s "$tmp/sready" ] && [ $n -lt 200 ]; do sleep 0.05; n=$((n + 1)); done
	[ -s "$tmp/sready" ] || { fail "$name: the server did not start"; cat "$tmp/server.err"; return; }
	# shellcheck disable=SC2086
	timeout 60 env WSD_DEBUG="$dbg" WSD_CONF="$cconf" MORE="${MORE:-0}" "$wsd" run -- \
		python3 "$tmp/client.py" "$port" "$tmp" "${want_c%%/*}" $local \
		>"$tmp/client.out" 2>"$tmp/client.err" &
	cpid=$!
	pids="$pids $cpid"
	n=0
	while [ ! -s "$tmp/ready" ] && [ $n -lt 400 ] && kill -0 $cpid 2>/dev/null; do
		sleep 0.05
		n=$((n + 1))
	done
	if [ -s "$tmp/ready" ]; then
		# a refusal comes in the background: looked at again for 5 s at most
		n=0
		until "$wsd" stat --json >"$tmp/stat.json" 2>"$tmp/stat.err" &&
			python3 "$tmp/check.py" "$tmp/stat.json" "$port" "${local:-0}" "$want_c" \
				"$want_s" "$registry" >"$tmp/check.out"; do
			n=$((n + 1))
			[ $n -lt 50 ] || break
			sleep 0.1
		done
		cat "$tmp/check.out"
		if [ $n -lt 50 ]; then
			echo "ok: $name: wsd stat: client $want_c, server $want_s"
		else
			fail "$name: wsd stat does not show client $want_c, server $want_s"
			cat "$tmp/stat.err"
		fi
	else
		fail "$name: the client did not get through its first 1 MiB"
	fi
	touch "$tmp/go"
	wait $cpid
	crc=$?
	wait $spid
	src=$?
	cat "$tmp/client.out" "$tmp/server.out"
	[ "$dbg" = 0 ] || cat "$tmp/client.err" "$tmp/server.err"
	[ $crc -eq 0 ] || { fail "$name: the client exited $crc"; cat "$tmp/client.err"; }
	[ $src -eq 0 ] || { fail "$name: the server exited $src"; cat "$tmp/server.err"; }
	sent=$(sed -n 's/^client sent and got back \([0-9]*\) bytes$/\1/p' "$tmp/client.out")
	echoed=$(sed -n 's/^server echoed \([0-9]*\) bytes$/\1/p' "$tmp/server.out")
	if [ -n "$sent" ] && [ "$sent" = "$echoed" ]; then
		echo "ok: $name: $sent bytes each way, every one checked"
	else
		fail "$name: the client sent ${sent:-?} bytes, the server echoed ${echoed:-?}"
	fi
}

# No message on stderr from the switch (a good file, or none).
quiet_run() {
	for side in client server; do
		if grep -q '^wsd: ' "$tmp/$side.err"; then
			fail "$1: the $side printed:"
			cat "$tmp/$side.err"
		fi
	done
}

# The message naming the file (and line) on each end's stderr: $1 the run, $2 the text.
said() {
	for side in client server; do
		if grep -qF "$2" "$tmp/$side.err"; then
			echo "ok: $1: the $side said: $(grep -F "$2" "$tmp/$side.err" | head -n 1)"
		else
			fail "$1: the $side did not say \"$2\" on stderr:"
			cat "$tmp/$side.err"
		fi
	done
}

port=$(free_port)
cat >"$tmp/tcp.conf" <<EOF
# the test's port stays on TCP, seen from each end
tcp peer 127.0.0.1 port $port
tcp local 127.0.0.0/8 port $((port - 1))-$port
EOF
run tcp-by-port "$tmp/tcp.conf" "$tmp/tcp.conf" tcp/policy tcp/policy
quiet_run tcp-by-port

port=$(free_port)
cat >"$tmp/accel.conf" <<EOF
accelerate peer 127.0.0.0/8 port $port
accelerate local ::ffff:127.0.0.1 port $port   # an IPv4-mapped address is the IPv4 one
default tcp
EOF
run accelerate "$tmp/accel.conf" "$tmp/accel.conf" shm/none shm/none
quiet_run accelerate

port=$(free_port)
cat >"$tmp/bad.conf" <<EOF
# accelerate the test's port ... but for a typo
accelerate local port $port

acclerate peer 127.0.0.1
EOF
run syntax-error "$tmp/bad.conf" "$tmp/bad.conf" tcp/policy tcp/policy
said syntax-error "wsd: $tmp/bad.conf:4: unknown keyword \"acclerate\""

port=$(free_port)
run missing-file "$tmp/missing.conf" "$tmp/missing.conf" tcp/policy tcp/policy
said missing-file "wsd: $tmp/missing.conf: No such file or directory"

port=$(free_port)
cat >"$tmp/server.conf" <<EOF
tcp local port $port
EOF
run server-only "$tmp/server.conf" "" tcp/policy tcp/policy policy
quiet_run server-only

port=$(free_port)
cat >"$tmp/client.conf" <<EOF
tcp peer port $port
EOF
run client-only "" "$tmp/client.conf" tcp/policy tcp/pending none
quiet_run client-only

port=$(free_port)
cat >"$tmp/glob.conf" <<EOF
accelerate program pyth0n*
tcp program python*
EOF
run program-glob "$tmp/glob.conf" "$tmp/glob.conf" tcp/policy tcp/policy
quiet_run program-glob

# Twenty connections to a port the server's policy keeps on TCP: the
# first refusal says it holds for the whole port, and the client asks no
# more (each would cost the server's registry a request, and the client a
# provider connection or a wait for its answer).
port=$(free_port)
cat >"$tmp/server.conf" <<EOF
tcp local port $port
EOF
MORE=20
run port-remembered "$tmp/server.conf" "" tcp/policy tcp/policy "policy<=3"
quiet_run port-remembered
n=$(grep -c "a short connection on tcp" "$tmp/client.out")
[ "$n" = 20 ] || fail "port-remembered: $n of 20 short connections on tcp"
MORE=0

# Twenty-one connections of 64 KiB to a plain server: the first that asks
# finds no registry, and the next ones do not ask for a while.
port=$(free_port)
echo "== plain-remembered"
rm -f "$tmp/sready" "$tmp/ready" "$tmp/go"
timeout 60 python3 "$tmp/server.py" "$port" "$tmp/sready" 21 >"$tmp/server.out" 2>&1 &
spid=$!
pids="$pids $spid"
n=0
while [ ! -s "$tmp/sready" ] && [ $n -lt 200 ]; do sleep 0.05; n=$((n + 1)); done
touch "$tmp/go"
timeout 60 env WSD_DEBUG=1 WSD_CONF= MORE=20 "$wsd" run -- \
	python3 "$tmp/client.py" "$port" "$tmp" tcp >"$tmp/client.out" 2>"$tmp/client.err"
crc=$?
wait $spid
[ $crc -eq 0 ] || { fail "plain-remembered: the client exited $crc"; cat "$tmp/client.err"; }
asked=$(grep -c "upgrade queued" "$tmp/client.err")
if [ "$asked" -ge 1 ] && [ "$asked" -le 3 ] &&
	grep -q "refuses each connection (peer-plain)" "$tmp/client.err"; then
	echo "ok: plain-remembered: $asked of 21 connections asked"
else
	fail "plain-remembered: $asked of 21 connections asked the plain server"
	grep "wsd\[" "$tmp/client.err" | head -n 20
fi

# The server's policy keeps a second connection between the two processes
# on TCP, whose client asks for it on their channel at its connect (on shm
# by the server's mailbox) and writes its first bytes into the server's
# ring before the answer: declined, they go by the stream, none lost.
port=$(free_port)
local=$(free_port)
[ "$local" != "$port" ] || local=$(free_port)
cat >"$tmp/channel.conf" <<EOF
tcp peer port $local
EOF
run on-a-channel "$tmp/channel.conf" "" tcp/policy tcp/policy policy
quiet_run on-a-channel
grep -q "the first connection on shm" "$tmp/client.out" ||
	fail "on-a-channel: the first connection did not reach shm: no channel for the second"
local=

[ $status -eq 0 ] && echo "policy: every check passed"
exit $status

#!/bin/sh
# Python's subprocess on an upgraded connection: a python3 echo server and
# client, both under wsd run.  Once the client's connection is on path shm
# (wsd_switch_path, through ctypes), it runs subprocess.run three times
# (vfork then exec in the child, through the switch's execve: the child
# must not act on the parent's sessions); the connection must still be on
# shm, as `wsd stat --json` shows for both ends, and 4 MiB more must echo
# back byte for byte.  Skips (77) without python3.  WSD_DEBUG_CLIENT=1
# shows both ends' switch debug lines.
set -u
TOOLS="python3 timeout"
. "${srcdir:-.}/tests/sock/check_common.sh"
# the python3 programs' shared helpers (tests/sock/echo.py)
PYTHONPATH="$(cd "${srcdir:-.}/tests/sock" && pwd)${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH
export PYTHONDONTWRITEBYTECODE=1   # nothing written beside the sources

cat >"$tmp/server.py" <<'EOF'
import socket, sys
l = socket.socket()
l.bind(("127.0.0.1", 0))
l.listen()
open(sys.argv[1] + ".tmp", "w").write("%d\n" % l.getsockname()[1])
import os
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
c, _ = l.accept()
while True:
    b = c.recv(1 << 16)
    if not b:
        break
    c.sendall(b)
c.close()
EOF

cat >"$tmp/client.py" <<'EOF'
import os, socket, subprocess, sys, time
from echo import echo, path as path_of, until_shm
port, tmp = int(sys.argv[1]), sys.argv[2]
s = socket.create_connection(("127.0.0.1", port))

def path():
    return path_of(s)

# the switch upgrades lazily: traffic, then wait for the move (5 s at most)
echo(s, 512 << 10, 1)
until_shm(s)
if path() != "shm":
    sys.exit("the connection is on %s before subprocess.run, not shm" % path())
print("on shm before subprocess.run, local port %d" % s.getsockname()[1])
for i in range(3):
    r = subprocess.run(["true"])
    if r.returncode:
        sys.exit("subprocess.run(true) -> %d" % r.returncode)
r = subprocess.run([sys.executable, "-c", "print('child ok')"], capture_output=True)
if r.stdout != b"child ok\n":
    sys.exit("the child printed %r" % r.stdout)
if path() != "shm":
    sys.exit("the connection is on %s after subprocess.run, not shm" % path())
echo(s, 4 << 20, 3)
print("after subprocess.run: still on shm, 4 MiB echoed")
open(tmp + "/port", "w").write("%d\n" % s.getsockname()[1])
# wsd stat is read now; then the rest
while not os.path.exists(tmp + "/go"):
    time.sleep(0.02)
echo(s, 1 << 20, 4)
s.close()
print("client done")
EOF

timeout 60 env WSD_DEBUG=${WSD_DEBUG_CLIENT:-0} "$wsd" run -- python3 "$tmp/server.py" "$tmp/sport" >"$tmp/server.out" 2>&1 &
spid=$!
pids="$pids $spid"
n=0
while [ ! -s "$tmp/sport" ] && [ $n -lt 200 ]; do sleep 0.05; n=$((n + 1)); done
[ -s "$tmp/sport" ] || { fail "the server did not start"; cat "$tmp/server.out"; exit 1; }
timeout 60 env WSD_DEBUG=${WSD_DEBUG_CLIENT:-0} "$wsd" run -- python3 "$tmp/client.py" "$(cat "$tmp/sport")" "$tmp" \
	>"$tmp/client.out" 2>&1 &
cpid=$!
pids="$pids $cpid"
n=0
while [ ! -s "$tmp/port" ] && [ $n -lt 600 ] && kill -0 $cpid 2>/dev/null; do
	sleep 0.05
	n=$((n + 1))
done
if [ -s "$tmp/port" ]; then
	port=$(cat "$tmp/port")
	if "$wsd" stat --json >"$tmp/stat.json" 2>"$tmp/stat.err"; then
		if python3 - "$tmp/stat.json" "$port" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
port = sys.argv[2]
found = [s for p in d.get("processes", []) for s in p.get("sockets", [])
         if (s.get("local") or "").endswith(":" + port) or (s.get("peer") or "").endswith(":" + port)]
for s in found:
    print("  fd %s %s -> %s: path %s, reason %s" % (s["fd"], s["local"], s["peer"], s["path"], s["reason"]))
sys.exit(0 if len(found) == 2 and all(s["path"] == "shm" for s in found) else 1)
EOF
		then
			echo "ok: wsd stat: both ends of the connection on shm after subprocess.run"
		else
			fail "wsd stat does not show both ends of the connection (port $port) on shm"
		fi
	else
		fail "'wsd stat --json' failed: $(head -n 1 "$tmp/stat.err")"
	fi
fi
touch "$tmp/go"
wait $cpid
crc=$?
wait $spid
src=$?
cat "$tmp/client.out"
[ "${WSD_DEBUG_CLIENT:-0}" = 0 ] || cat "$tmp/server.out"
[ $crc -eq 0 ] || fail "the client exited $crc"
[ $src -eq 0 ] || { fail "the server exited $src"; cat "$tmp/server.out"; }
[ $status -eq 0 ] && echo "subprocess on an upgraded connection: all checks passed"
exit $status

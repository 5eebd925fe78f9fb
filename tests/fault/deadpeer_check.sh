#!/bin/bash
# A peer killed while our sender waits for room in the ring and our receive
# is still on the kernel stream (the peer's first bytes there unread), so
# the sender's wait ticks instead of sleeping in a receive.  The server
# sends 100 kB at once (by the stream, before its switch), reads, then
# stops; the client sends for ever (slowly for its first second) and never
# reads.  Once the client waits
# for room (wsd stat: waiting, tx on the ring, rx not), the server gets
# SIGKILL, and the client's send must fail (EPIPE or ECONNRESET) within 5 s:
#
#  - reset: the server stops after 50 kB of the client's first 64 kB,
#    sent by the stream, so its kernel socket holds unread bytes and its
#    end is a reset.  Before, the sender's tick woke at once for ever (POLLHUP) and
#    never ended: chan_kill_check's "client b hangs".
#  - fin: the server reads all the stream and 100 MB of the ring, so its
#    end is a FIN, which a live peer's shutdown also sends.  Before, the
#    sender ticked for ever; now it asks the peer's kernel with a bell
#    once a second (bell_probe), which a socket no one holds answers with
#    a reset.
#
# Two rounds of each; about 15 s.
set -u
. "${srcdir:-.}/tests/attack/common.sh"
export WSD_UPGRADE_BYTES=1

cat >"$tmp/srv.py" <<'EOF'
import socket, sys, time
l = socket.socket()
l.bind(("127.0.0.1", 0))
l.listen(4)
open(sys.argv[1] + ".tmp", "w").write(str(l.getsockname()[1]))
__import__("os").rename(sys.argv[1] + ".tmp", sys.argv[1])
c, _ = l.accept()
c.sendall(b"y" * 100000)
got, want = 0, int(sys.argv[2])
while got < want:
    d = c.recv(min(65536, want - got))
    if not d:
        sys.exit("server: end of stream at %d" % got)
    got += len(d)
print("read", got, flush=True)
time.sleep(600)
EOF
cat >"$tmp/cli.py" <<'EOF'
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(open(sys.argv[1]).read())))
time.sleep(0.5)   # the server's first bytes arrive, and stay unread
n = 0
buf = b"x" * 65536
try:
    # slowly for a second: the switch moves the stream to the ring long
    # before the kernel's buffers fill, whatever the server reads
    for i in range(50):
        n += s.send(buf)
        time.sleep(0.02)
    while True:
        n += s.send(buf)
except OSError as e:
    print("send ended errno %d after %d" % (e.errno, n), flush=True)
EOF

# waiting PID: the client's socket waits for room, tx on the ring, rx not
waiting() {
	"$wsd" stat --json "$1" 2>/dev/null | python3 -c '
import json, sys
d = json.load(sys.stdin)
s = [s for p in d["processes"] for s in p["sockets"] if not s.get("listening")]
w = s[0].get("last_wait") or {} if len(s) == 1 else {}
RING = 2
ok = (w.get("for") == 2 and w.get("modes", 0) >> 8 == RING and w.get("modes", 0) & 255 != RING
      and w.get("age_ms", 10**9) < 1000)
sys.exit(0 if ok else 1)' 2>/dev/null
}

one_round() {   # NAME SERVER_READS
	local name=$1 reads=$2 spid cpid i
	rm -f "$tmp/port" "$tmp"/*.out
	"$wsd" run -- python3 "$tmp/srv.py" "$tmp/port" "$reads" >"$tmp/srv.out" 2>"$tmp/srv.err" &
	spid=$!
	pids="$pids $spid"
	wait_file "$tmp/port" || fail "$name: the server did not listen"
	"$wsd" run -- python3 "$tmp/cli.py" "$tmp/port" >"$tmp/cli.out" 2>"$tmp/cli.err" &
	cpid=$!
	pids="$pids $cpid"
	for i in $(seq 1 100); do
		waiting "$cpid" && [ -s "$tmp/srv.out" ] && break
		sleep 0.1
	done
	waiting "$cpid" ||
		fail "$name: the client never waited for room with its receive on the stream:" \
		     "$("$wsd" stat "$cpid" 2>&1)" "$(cat "$tmp/srv.out" "$tmp/srv.err" 2>/dev/null)"
	{ kill -9 "$spid"; wait "$spid"; } 2>/dev/null
	if ! wait_exit "$cpid" 5000; then
		"$wsd" stat "$cpid" >"$tmp/hung.stat" 2>&1
		stacks "$cpid" >"$tmp/hung.stacks" 2>&1
		fail "$name: the server killed, the client's send hangs:" "$(cat "$tmp/hung.stat")" \
		     "$(cat "$tmp/hung.stacks")"
	fi
	wait "$cpid"
	grep -Eq "^send ended errno ($(python3 -c 'import errno; print(errno.EPIPE, errno.ECONNRESET, sep="|")')) after [0-9]+$" \
		"$tmp/cli.out" || fail "$name: the client's end: $(cat "$tmp/cli.out" "$tmp/cli.err")"
	echo "$name: the server killed; the client's $(cat "$tmp/cli.out")"
}

for r in 1 2; do
	one_round "reset $r" 50000
	one_round "fin $r" 100000000
done
echo "PASS: a sender waiting for room saw its killed peer's reset and FIN"
exit 0

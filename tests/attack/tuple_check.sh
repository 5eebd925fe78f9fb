#!/bin/sh
# A process that is not a connection's TCP peer names that connection's
# 4-tuple to the server's switch (its own switch lies about its local port:
# forge_shim.c) and tries to take the connection over.  The server's switch
# accepts the request (the tuple matches) but the attacker cannot write the
# server's challenge on the victim's TCP stream, so the server takes nothing
# from the attacker's ring, sends it nothing, and goes on over TCP with
# reason auth.  The victim is a plain program: every answer it gets must be
# exact, before, during and after the attack; a wsd client that connects
# meanwhile is still accelerated.  Over verbs the same runs in the VM rig.
set -u
. "${srcdir:-.}/tests/attack/common.sh"
src=${srcdir:-.}/tests/attack
cc=${CC:-cc}
$cc -shared -fPIC -o "$tmp/forge.so" "$src/forge_shim.c" -ldl ||
	fail "could not build the attacker's shim"
export WSD_UPGRADE_BYTES=1 WSD_TRANSPORT=${WSD_TRANSPORT:-auto}
expect=${WSD_PAIR_PATH:-shm}

start_server

# the victim: plain, no wsd
start_client victim
victim=$client vport=$cport
sleep 0.3   # some calls before the attack

LD_PRELOAD=$tmp/forge.so WSD_FORGE_PORT=$vport \
	"$wsd" run -- "$prog" attack "$port" 127.0.0.1 4 >"$tmp/attack.out" 2>"$tmp/attack.err" &
attacker=$!
pids="$pids $attacker"
# an honest wsd client meanwhile
start_client honest wsd
honest=$client
wait_file "$tmp/attack.out" "reading" || fail "the attacker did not get to its reads"
sleep 0.5
"$wsd" stat --json "$server" "$attacker" "$honest" >"$tmp/stat.json" 2>"$tmp/stat.err" ||
	fail "wsd stat: $(cat "$tmp/stat.err")"

python3 - "$tmp/stat.json" "$server" "$attacker" "$honest" "$vport" "$(cat "$tmp/honest")" \
	"$expect" <<'PY' || fail "wsd stat does not show what it must (above)"
import json, sys
st = json.load(open(sys.argv[1]))
server, attacker, honest, vport, hport, expect = sys.argv[2:8]
procs = {str(p["pid"]): p["sockets"] for p in st["processes"]}
def port(a):
    return a and a.rsplit(":", 1)[1]
def one(pid, pred, what):
    socks = [s for s in procs.get(pid, []) if pred(s)]
    if len(socks) != 1:
        print("no single socket for", what, "in", json.dumps(procs.get(pid)))
        sys.exit(1)
    return socks[0]
bad = []
a = one(attacker, lambda s: not s["listening"] and s["peer"], "the attacker")
# the attack took place: the attacker's switch thinks it took the connection
# (whether it sent by ring before the server dropped its session is timing;
# the server's refusal count, below, says the attack reached it)
if a["path"] != expect:
    bad.append("the attack did not reach the server: %s" % a)
if a["copy_rx"] or a["zcopy_rx"]:
    bad.append("the attacker received by ring: %s" % a)
v = one(server, lambda s: port(s["peer"]) == vport, "the victim's connection")
if v["path"] != "tcp" or v["reason"] != "auth" or v["copy_tx"] or v["copy_rx"] \
   or v["zcopy_tx"] or v["zcopy_rx"]:
    bad.append("the victim's connection at the server: %s" % v)
refused = [p.get("refused") for p in st["processes"] if str(p["pid"]) == server]
if refused != [{"auth": 1}]:
    bad.append("the server's registry should count one refusal, auth: %s" % refused)
h = one(server, lambda s: port(s["peer"]) == hport, "the honest client's connection")
if h["path"] != expect or h["copy_rx"] == 0:
    bad.append("the honest client's connection is not accelerated: %s" % h)
for b in bad:
    print(b)
sys.exit(1 if bad else 0)
PY

touch "$tmp/stop"
wait "$victim" || fail "the victim saw a wrong answer or none"
wait "$honest" || fail "the honest wsd client saw a wrong answer or none"
wait "$attacker"
kill -0 "$server" 2>/dev/null || fail "the server died"
cat "$tmp/victim.out"
echo "PASS: the forged tuple got nothing; the victim's stream stayed exact (reason auth)"
exit 0

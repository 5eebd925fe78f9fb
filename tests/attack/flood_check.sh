#!/bin/sh
# A peer that floods a wsd server's registry (tests/attack/flood.c, which
# speaks the protocol through the provider) gets it to hold no more than
# its caps: a request that never sends its HELLO delays nobody else's
# upgrade (it waited on the registry's one thread for 5 s before), and of
# 100 HELLOs for connections that do not exist the registry keeps 64
# pending and answers the rest REFUSE busy at once, counted in wsd stat.
# An honest wsd client is accelerated meanwhile and its answers stay exact.
set -u
. "${srcdir:-.}/tests/attack/common.sh"
flood=${top_builddir:-.}/tests/attack/flood
export WSD_UPGRADE_BYTES=1

start_server

"$flood" silent "$port" 1 >"$tmp/silent.out" 2>"$tmp/silent.err" &
pids="$pids $!"
wait_file "$tmp/silent.out" "requests 1" || fail "the silent request was not taken"
start=$(date +%s%N)
start_client honest wsd
honest=$client hport=$cport
# accelerated while the silent request still holds its handshake (5 s)
accelerated $(( 4000 - ($(date +%s%N) - start) / 1000000 )) "$hport" ||
	fail "a silent request held up the honest client's upgrade"
echo "honest client upgraded after $(( ($(date +%s%N) - start) / 1000000 )) ms beside a silent request"

"$flood" hello "$port" 100 >"$tmp/flood.out" 2>"$tmp/flood.err" || fail "the flood failed"
busy=$(sed -n 's/^refused busy //p' "$tmp/flood.out")
made=$(sed -n 's/^requests //p' "$tmp/flood.out")
[ "$made" = 100 ] || fail "the flood made $made requests of 100"
[ "${busy:-0}" -ge 36 ] || fail "only ${busy:-0} of 100 pending HELLOs were refused busy (cap 64)"
"$wsd" stat --json "$server" >"$tmp/stat.json" 2>"$tmp/stat.err" ||
	fail "wsd stat: $(cat "$tmp/stat.err")"
python3 - "$tmp/stat.json" "$busy" <<'PY' || fail "wsd stat does not count the refusals"
import json, sys
st = json.load(open(sys.argv[1]))
refused = st["processes"][0]["refused"]
print("server registry refused:", refused)
sys.exit(0 if refused.get("busy", 0) >= int(sys.argv[2]) else 1)
PY

touch "$tmp/stop"
wait "$honest" || fail "the honest client saw a wrong answer or none"
kill -0 "$server" 2>/dev/null || fail "the server died"
cat "$tmp/flood.out" "$tmp/honest.out"
echo "PASS: the registry held at most its caps and kept upgrading honest clients"
exit 0

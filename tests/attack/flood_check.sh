#!/bin/sh
# A peer that floods a wsd server's registry (tests/attack/flood.c, which
# speaks the protocol through the provider) gets it to hold no more than
# its caps and its share of them: 40 requests that never send their HELLO,
# from one process, hold 16 of the 32 handshakes and delay nobody else's
# upgrade (one waited on the registry's one thread for 5 s before), and of
# 100 HELLOs for connections that do not exist, from one process, the
# registry keeps 32 pending (that process's share: half of the 64) and
# answers the rest REFUSE busy at once, counted peer-limit in wsd stat; a
# second process still has 16 of its own kept.
# An honest wsd client is accelerated meanwhile and its answers stay exact.
set -u
. "${srcdir:-.}/tests/attack/common.sh"
flood=${top_builddir:-.}/tests/attack/flood
export WSD_UPGRADE_BYTES=1

start_server

"$flood" silent "$port" 40 >"$tmp/silent.out" 2>"$tmp/silent.err" &
pids="$pids $!"
wait_file "$tmp/silent.out" "requests 40" || fail "the silent requests were not taken"
start=$(date +%s%N)
start_client honest wsd
honest=$client hport=$cport
# accelerated while the silent requests still hold their handshakes (5 s)
accelerated $(( 4000 - ($(date +%s%N) - start) / 1000000 )) "$hport" ||
	fail "silent requests held up the honest client's upgrade"
echo "honest client upgraded after $(( ($(date +%s%N) - start) / 1000000 )) ms beside silent requests"

"$flood" hello "$port" 100 >"$tmp/flood.out" 2>"$tmp/flood.err" || fail "the flood failed"
busy=$(sed -n 's/^refused busy //p' "$tmp/flood.out")
made=$(sed -n 's/^requests //p' "$tmp/flood.out")
[ "$made" = 100 ] || fail "the flood made $made requests of 100"
[ "${busy:-0}" -ge 68 ] ||
	fail "only ${busy:-0} of 100 HELLOs from one process were refused busy (its share 32)"
"$wsd" stat --json "$server" >"$tmp/stat.json" 2>"$tmp/stat.err" ||
	fail "wsd stat: $(cat "$tmp/stat.err")"
python3 - "$tmp/stat.json" "$busy" <<'PY' || fail "wsd stat does not count the refusals"
import json, sys
st = json.load(open(sys.argv[1]))
refused = st["processes"][0]["refused"]
print("server registry refused:", refused)
# past the process's share: told busy, counted peer-limit (with the silent ones' 24)
sys.exit(0 if refused.get("peer-limit", 0) >= int(sys.argv[2]) else 1)
PY

# the first's 32 are still kept (10 s): a second process has its share beside them
"$flood" hello "$port" 20 >"$tmp/flood2.out" 2>"$tmp/flood2.err" || fail "the second flood failed"
kept=$(sed -n 's/^no answer //p' "$tmp/flood2.out")
[ "${kept:-0}" -ge 16 ] ||
	fail "a second process had ${kept:-0} HELLOs kept beside the first's 32, not its share of 16"

touch "$tmp/stop"
wait "$honest" || fail "the honest client saw a wrong answer or none"
kill -0 "$server" 2>/dev/null || fail "the server died"
cat "$tmp/flood.out" "$tmp/flood2.out" "$tmp/honest.out"
echo "PASS: the registry held at most its caps and kept upgrading honest clients"
exit 0

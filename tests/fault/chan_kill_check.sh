#!/bin/bash
# A process killed with many live connections on channels (wsd-protocol(7),
# Channels).  A server holds 8 connections from each of two client
# processes, so two channels, every connection a checked stream both ways
# (tests/fault/fanout).  Each round, once all 16 are on shm:
#
#  - a client is killed (SIGKILL): the other client's 8 connections carry
#    their whole streams, and the server's 8 to the dead one end cleanly
#    (a byte-exact prefix, then end of stream or a reset) within 20 s;
#  - the server is killed: both clients' connections end so, within 20 s.
#
# Never a wrong byte, never a hang.  WSD_FAULT_ROUNDS (default 3) rounds of
# each; WSD_FAULT_SEED=S repeats a run.
set -u
. "${srcdir:-.}/tests/attack/common.sh"
. "${srcdir:-.}/tests/fault/fanout.sh"
rounds=${WSD_FAULT_ROUNDS:-3}
seed0=${WSD_FAULT_SEED:-$(( $(date +%s) % 100000 * 1000 ))}
export WSD_UPGRADE_BYTES=1

# ends FILE N: FILE has N connection lines, each a clean end
ends() {
	[ "$(grep -c '^conn ' "$1")" -eq "$2" ] &&
		! grep '^conn ' "$1" | grep -qv \
			'^conn [0-9]* tx [0-9]* \(complete\|EPIPE\|ECONNRESET\|EIO\) rx [0-9]* \(complete\|eof\|reset\|eio\)$'
}
# complete FILE: every connection line of FILE carried its whole stream both ways
complete() {
	! grep '^conn ' "$1" | grep -qv ' tx [0-9]* complete rx [0-9]* complete$'
}

# one_round SEED VICTIM(a|server): the clients a (1 GiB a connection, so it
# is mid-stream when killed) and b (32 MiB)
one_round() {
	local seed=$1 victim=$2 spid apid bpid
	fanout_start "$seed" 1024 err
	if ! wait_file "$tmp/a.out" "upgraded"; then
		# a loaded machine (make -j2 check) can leave some of the 16 on TCP
		# for a while: that round tests less; counted, and all rounds so is a failure
		noshm=$((noshm + 1))
		echo "round $seed: client a's 8 not all on shm within 10 s; the round is skipped"
		kill -9 "$spid" "$apid" "$bpid" 2>/dev/null
		wait "$spid" "$apid" "$bpid" 2>/dev/null
		return
	fi
	# b may be done already: its end is checked below either way.  The
	# server's view of client a is taken now and read once the victim is
	# dead: python's start beside the 16 streams took 8 s of a 9-s round.
	"$wsd" stat --json "$spid" >"$tmp/stat.json" 2>&1
	if [ "$victim" = a ]; then
		{ kill -9 "$apid"; wait "$apid"; } 2>/dev/null
	else
		{ kill -9 "$spid"; wait "$spid"; } 2>/dev/null
	fi
	python3 - "$tmp/stat.json" "$apid" <<'EOF' || fail "round $seed: the server's sockets"
import json, sys
d = json.load(open(sys.argv[1]))
socks = [s for p in d.get("processes", d if isinstance(d, list) else [])
         for s in p.get("sockets", []) if s.get("peer_pid") == int(sys.argv[2])]
chans = {s.get("channel") for s in socks}
# on shm, or moved back to the stream for a stall of both ends (reason back:
# both senders waiting for room while the readers were off their CPUs)
ok = [s for s in socks if s.get("path") == "shm" or s.get("reason") == "back"]
if (len(socks) != 8 or len(ok) != 8 or not any(s.get("path") == "shm" for s in socks) or
        len(chans) != 1 or 0 in chans):
    sys.exit("client a's 8 connections: %s" %
             [(s.get("path"), s.get("reason"), s.get("channel")) for s in socks])
# the server's channel to a, as wsd stat sums it: 8 slots, memory resident
ch = [c for p in d["processes"] for c in p.get("channels", [])
      if c.get("peer_pid") == int(sys.argv[2])]
if len(ch) != 1 or ch[0]["slots"] != 8 or ch[0]["rss_kib"] <= 0 or ch[0]["pss_kib"] <= 0:
    sys.exit("the server's channel to client a: %s" % ch)
EOF
	if [ "$victim" = a ]; then
		wait_exit "$bpid" 20000 ||
			fail "round $seed: client a killed; client b hangs: $(fanout_hung b "$bpid")" \
			     "$(fanout_hung server "$spid")"
		wait "$bpid" || fail "round $seed: client a killed; client b exited $?"
		ends "$tmp/b.out" 8 && complete "$tmp/b.out" ||
			fail "round $seed: client a killed; client b's streams"
		wait_exit "$spid" 20000 ||
			fail "round $seed: client a killed; the server hangs: $(fanout_hung server "$spid")"
		wait "$spid" || fail "round $seed: client a killed; the server exited $?"
		ends "$tmp/server.out" 16 || fail "round $seed: client a killed; the server's ends"
		grep '^conn 1[0-9][0-9] ' "$tmp/server.out" >"$tmp/server_b.out"
		[ "$(wc -l <"$tmp/server_b.out")" -eq 8 ] && complete "$tmp/server_b.out" ||
			fail "round $seed: client a killed; the server's streams with client b"
		echo "round $seed: client a killed; b's 8 complete; the server's 8 with a:" \
			"$(grep '^conn [0-7] ' "$tmp/server.out" | awk '{print $5 "/" $8}' | sort | uniq -c |
			   tr -s ' \n' ' ')"
	else
		for c in a b; do
			pid=$([ $c = a ] && echo "$apid" || echo "$bpid")
			wait_exit "$pid" 20000 ||
				fail "round $seed: the server killed; client $c hangs: $(fanout_hung $c "$pid")"
			wait "$pid" || fail "round $seed: the server killed; client $c exited $?"
			ends "$tmp/$c.out" 8 || fail "round $seed: the server killed; client $c's ends"
		done
		echo "round $seed: the server killed; the clients' 16 ended:" \
			"$(grep -h '^conn ' "$tmp/a.out" "$tmp/b.out" | awk '{print $5 "/" $8}' | sort |
			   uniq -c | tr -s ' \n' ' ')"
	fi
}

echo "chan_kill_check: $rounds rounds of each from seed $seed0"
noshm=0
for r in $(seq 0 $((rounds - 1))); do
	one_round $((seed0 + 2 * r)) a
	one_round $((seed0 + 2 * r + 1)) server
done
[ $noshm -lt $((2 * rounds)) ] || fail "no round had client a's connections on shm"
echo "PASS: $((2 * rounds)) rounds ($noshm skipped: not all on shm in time)"
exit 0

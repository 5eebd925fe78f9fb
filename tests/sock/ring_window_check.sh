#!/bin/sh
# The sender's window over shm's large rings (switch/slot.c, tx_widen in
# switch/tx.c): a connection that does not stream touches a window's worth
# of the peer's ring however many bytes it carries, and one that streams
# widens its window into the whole ring.  Measured from outside with
# `wsd stat --channels` (the channel's memory from each process's smaps)
# while each pair runs:
#  - 1 KiB round trips, hundreds of MiB in all through 8 MiB rings: at most
#    2 MiB a process (the rings' pages are the window, 256 KiB, each way,
#    in both the ring's owner and its writer; all of both rings, walked
#    whole, would be 16 MiB);
#  - a stream of 1 MiB sends: more than 4 MiB (the window grew).
set -u
TOOLS=
. "${srcdir:-.}/tests/sock/check_common.sh"
die() { fail "$*"; exit 1; }
# shm rings by default: no WSD_SWITCH_RING from the caller
unset WSD_SWITCH_RING WSD_TRANSPORT

# serve ROLE ARGS...: a server under wsd run; its port in $port
serve() {
	: >"$tmp/srv"
	"$wsd" run -- "$wsd" bench-worker "$@" >"$tmp/srv" 2>&1 &
	pids="$pids $!"
	n=0
	until grep -q '^port' "$tmp/srv"; do
		n=$((n + 1))
		[ $n -lt 100 ] || die "$1 printed no port: $(cat "$tmp/srv")"
		sleep 0.1
	done
	port=$(awk '/^port/ { print $2 }' "$tmp/srv")
}

# rss CLIENT_PID: the largest RSS-KIB of the two ends' channel rows, after
# the pair has run for a while (and at most 10 s for the row to show)
rss() {
	n=0
	while :; do
		sleep 0.5
		"$wsd" stat --channels >"$tmp/chans" 2>&1 || die "wsd stat --channels: $(cat "$tmp/chans")"
		row=$(awk -v p="$1" '$1 == p && $4 == "shm"' "$tmp/chans")
		[ -n "$row" ] && [ $n -ge 3 ] && break
		n=$((n + 1))
		[ $n -lt 20 ] || die "no shm channel row for pid $1: $(cat "$tmp/chans")"
	done
	peer=$(echo "$row" | awk '{ print $5 }')
	awk -v a="$1" -v b="$peer" '($1 == a || $1 == b) && $7 > m { m = $7 } END { print m + 0 }' \
		"$tmp/chans"
}

serve lat-srv 127.0.0.1 1024 -1
"$wsd" run -- "$wsd" bench-worker lat-cli 127.0.0.1 "$port" 1024 100000000 -1 >"$tmp/cli" 2>&1 &
cli=$!
pids="$pids $cli"
small=$(rss "$cli")
kill -9 $pids 2>/dev/null
wait 2>/dev/null
pids=
[ "$small" -gt 0 ] && [ "$small" -le 2048 ] ||
	{ cat "$tmp/chans"; die "1 KiB round trips: the channel holds $small KiB (at most 2048)"; }
echo "ok: 1 KiB round trips keep $small KiB of ring pages a process"

serve tput-srv 127.0.0.1 1 -1
"$wsd" run -- "$wsd" bench-worker tput-cli 127.0.0.1 "$port" 1048576 1 100 20000 -1 >"$tmp/cli" 2>&1 &
cli=$!
pids="$pids $cli"
big=$(rss "$cli")
[ "$big" -gt 4096 ] ||
	{ cat "$tmp/chans"; die "a stream of 1 MiB sends: the channel holds $big KiB (the window did not grow)"; }
echo "ok: a stream of 1 MiB sends widened its window: $big KiB a process"
exit $status

#!/bin/sh
# The README's main job, part 2: a real program accelerated.  iperf3 runs
# server and client under `wsd run` on 127.0.0.1; while it runs, `wsd stat`
# shows the data connection on path shm; then the same test runs plain.
set -u
b=${top_builddir:-.}
wsd=$b/wsd/wsd
command -v iperf3 >/dev/null || { echo "demo: iperf3 is missing (./build.sh installs it)"; exit 1; }

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

run() {   # run LABEL PREFIX...
	label=$1
	shift
	p=$(port)
	"$@" iperf3 -s -1 -B 127.0.0.1 -p "$p" >/dev/null 2>&1 &
	spid=$!
	sleep 0.5
	"$@" iperf3 -c 127.0.0.1 -p "$p" -t 3 -l 128K -f g >"$tmp/$label.out" 2>&1 &
	cpid=$!
	if [ "$label" = wsd ]; then
		sleep 2
		echo "wsd stat, while iperf3 runs under wsd:"
		"$wsd" stat | awk 'NR == 1 || $2 == "iperf3"'
	fi
	wait $cpid
	rc=$?
	wait $spid
	printf '%-14s %s\n' "iperf3 $label:" "$(grep receiver "$tmp/$label.out" | awk '{print $7, $8}')"
	return $rc
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
run wsd "$wsd" run -- || { cat "$tmp/wsd.out"; exit 1; }
run plain env || { cat "$tmp/plain.out"; exit 1; }

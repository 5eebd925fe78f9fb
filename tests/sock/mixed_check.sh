#!/bin/sh
# A wsd end against a plain one (tests/sock/mixed.c), as separate programs:
# plain client and server, then the server under wsd run, then the client,
# then both.  Each program's transcript must be the same in all four runs;
# a wsd end facing a plain one must stay on TCP (WSD_EXPECT_PATH=tcp).  Two
# wsd ends are only compared: whether this short exchange outlasts the lazy
# upgrade depends on the machine's load (the .pair programs check shm).
set -u
b=${top_builddir:-.}
wsd=$b/wsd/wsd
prog=$b/tests/sock/mixed
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0:detect_leaks=0"
[ -x "$prog" ] || { echo "FAIL: $prog: not built"; exit 1; }
[ -x "$wsd" ] || { echo "FAIL: $wsd: no wsd command (build it first)"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0

# run NAME SERVER-WRAPPER CLIENT-WRAPPER (each "plain", "wsd:PATH" or "wsd:")
run() {
	name=$1
	rm -f "$tmp/port"
	set -- "$2" "$3"
	for side in server client; do
		case $1 in
		plain) eval "${side}_cmd=\"env -u WSD_EXPECT_PATH timeout -k 5 120\"" ;;
		wsd:) eval "${side}_cmd=\"env -u WSD_EXPECT_PATH timeout -k 5 120 $wsd run --\"" ;;
		wsd:*) eval "${side}_cmd=\"env WSD_EXPECT_PATH=${1#wsd:} timeout -k 5 120 $wsd run --\"" ;;
		esac
		shift
	done
	# shellcheck disable=SC2154
	$server_cmd "$prog" server "$tmp/port" >"$tmp/$name.server" 2>"$tmp/$name.server.err" &
	spid=$!
	n=0
	until [ -s "$tmp/port" ]; do
		n=$((n + 1))
		[ $n -le 100 ] || { echo "FAIL: $name: the server did not start"; cat "$tmp/$name.server.err"; status=1; return; }
		sleep 0.1
	done
	# shellcheck disable=SC2154
	$client_cmd "$prog" client "$(cat "$tmp/port")" >"$tmp/$name.client" 2>"$tmp/$name.client.err"
	crc=$?
	wait $spid
	src=$?
	cat "$tmp/$name.server.err" "$tmp/$name.client.err" >&2
	if [ $crc -ne 0 ] || [ $src -ne 0 ]; then
		echo "FAIL: $name: client exit $crc, server exit $src"
		status=1
	fi
	for side in server client; do
		[ "$name" = plain ] && continue
		if ! cmp -s "$tmp/plain.$side" "$tmp/$name.$side"; then
			echo "FAIL: $name: the $side's transcript differs from the plain run's:"
			diff -u "$tmp/plain.$side" "$tmp/$name.$side" | sed '1,2d'
			status=1
		fi
	done
	echo "ok: $name ($(wc -l <"$tmp/$name.client") client lines, $(wc -l <"$tmp/$name.server") server lines)"
}

run plain plain plain
run wsd-server wsd:tcp plain
run wsd-client plain wsd:tcp
run both-wsd wsd: wsd:
[ $status -eq 0 ] && echo "mixed: a plain end sees the same bytes whichever end runs wsd"
exit $status

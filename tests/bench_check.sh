#!/bin/sh
# wsd bench, short (--quick): every section and verdict line printed, the
# wsd runs accelerated, a chart that parses as SVG; and the same through
# `wsd bench --serve` and --peer on loopback; --only runs one section, and
# the apps section only when named (its splicing proxy here: the other rows
# need outside programs and minutes).  The figures themselves are
# not judged here: ./build.sh bench prints them (targets: wsd(1)).
set -u
wsd=${top_builddir:-.}/wsd/wsd
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0:detect_leaks=0"
command -v python3 >/dev/null 2>&1 || { echo "FAIL: python3 is needed (./build.sh installs it)"; exit 1; }
tmp=$(mktemp -d)
spid=
trap '[ -n "$spid" ] && kill $spid 2>/dev/null; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

check() {   # check OUTPUT SVG
	for s in "throughput, 1 stream" "throughput, 4 streams" "1 MiB, one stream, server on cpu 0" \
		 "round trip" "short-lived"; do
		grep -q "== $s" "$1" || fail "no '$s' section: $(cat "$1")"
	done
	for v in tput_1MiB_1stream_ratio rtt_64B_one_core_p50_ratio short_lived_connections_ratio \
		 cpu_per_GiB_ratio stream_1MiB_reused_ratio stream_1MiB_cold_vs_memcpy_cold; do
		grep -Eq "^bench: $v [0-9.]+ .*(MET|MISSED)$" "$1" || fail "no verdict for $v"
	done
	# the many-connection section: its tables and verdict lines (--quick
	# leaves out 10,000 connections: those verdicts are NOT MEASURED)
	for s in "1000 and 10000 connections" "connections one after another" \
		 "requests over C connections"; do
		grep -q "== $s" "$1" || fail "no '$s' section: $(cat "$1")"
	done
	for v in scale_connection_rate_ratio scale_msgs_64B_4to64_conns_min_ratio; do
		grep -Eq "^bench: $v [0-9.]+ .*(MET|MISSED)$" "$1" || fail "no verdict for $v"
	done
	for v in scale_10k_fast_path_share scale_10k_more_fds_per_process \
		 scale_10k_more_pss_per_process; do
		grep -Eq "^bench: $v .*(MET|MISSED|NOT MEASURED)$" "$1" || fail "no verdict line for $v"
	done
	grep -Eq "^bench: scale_connections_fast_at_close [0-9]+ of [1-9][0-9]*$" "$1" ||
		fail "no count of connections fast at the close"
	# the cold stream's rows measured (a changed sum fails the run and leaves 0)
	grep -Eq "^ +256 MiB source, all read +[1-9][0-9]* +[1-9][0-9]* " "$1" ||
		fail "the cold stream was not measured: $(grep -A3 '== 1 MiB, one' "$1")"
	grep -Eq "^bench: memcpy_1MiB_one_core_MBps hot [1-9][0-9]* cold [1-9][0-9]*$" "$1" ||
		fail "no memcpy limits"
	grep -Eq "^bench: two_threads_cold_MBps one_copy [1-9][0-9]* two_copies [1-9][0-9]*$" "$1" ||
		fail "no two-thread limits"
	grep -Eq "^bench: cpu0_cpu1_round_trip_ns before [1-9][0-9]* after [1-9][0-9]*$" "$1" ||
		fail "no round trip between the two CPUs"
	grep -q "^bench: wsd_runs_not_accelerated 0$" "$1" ||
		fail "a wsd run was not accelerated: $(grep not_accelerated "$1")
$(grep "not accelerated" "${1%.out}.err")"
	python3 -c 'import sys, xml.dom.minidom as m; d = m.parse(sys.argv[1]); assert d.documentElement.tagName == "svg"; assert len(d.getElementsByTagName("rect")) == 22' "$2" ||
		fail "the chart is not an SVG with 22 bars"
}

timeout -k 5 300 "$wsd" bench --quick --svg "$tmp/a.svg" >"$tmp/a.out" 2>"$tmp/a.err" ||
	fail "wsd bench --quick failed: $(cat "$tmp/a.err")"
check "$tmp/a.out" "$tmp/a.svg"
! grep -q "== apps" "$tmp/a.out" || fail "the apps section ran without --only apps"
# 1000 connections held, both processes measured (here, not with --peer)
grep -Eq "^ +1000 +client +[0-9]+ +[0-9]+ +-?[0-9]+ +[0-9.]+ +[0-9.]+ +-?[0-9.]+ +[0-9]+ of [0-9]+$" \
	"$tmp/a.out" || fail "no measured line for 1000 connections: $(grep -A8 '== 1000' "$tmp/a.out")"
# connections kept on TCP, to a plain server and refused by policy (here, not with --peer)
for v in scale_connection_rate_to_plain_server_ratio scale_connection_rate_policy_tcp_ratio; do
	grep -Eq "^bench: $v [0-9.]+ .*(MET|MISSED)$" "$tmp/a.out" || fail "no verdict for $v"
done
grep -Eq "^   policy: tcp +[1-9][0-9]* +[1-9][0-9]* +[0-9.]+ +0 of [1-9]" "$tmp/a.out" ||
	fail "the policy row was not measured, or moved a connection: $(grep -A4 'kept on TCP' "$tmp/a.out")"
# on this host, the outside yardsticks (measured when installed: build.sh installs them)
grep -q "== iperf3 -l 1M" "$tmp/a.out" || fail "no iperf3 section"
grep -q "== UCX ucx_perftest" "$tmp/a.out" || fail "no UCX section"
# beside a busy loop (this host, two CPUs or more)
if [ "$(nproc)" -ge 2 ]; then
	grep -q "a busy loop on cpu 0" "$tmp/a.out" || fail "no busy-loop round trip section"
	grep -Eq "^bench: rtt_64B_busy_cpu_mean_us plain [0-9.]+ wsd [0-9.]+ ratio [0-9.]+$" \
		"$tmp/a.out" || fail "no measured busy-loop line: $(grep busy "$tmp/a.out")"
fi
for v in iperf3_1M_ratio stream_1MiB_reused_vs_ucx_tag_bw; do
	if command -v iperf3 >/dev/null && command -v ucx_perftest >/dev/null; then
		grep -Eq "^bench: $v [0-9.]+ .*(MET|MISSED)$" "$tmp/a.out" ||
			fail "no measured verdict for $v: $(grep "$v" "$tmp/a.out")"
	else
		grep -q "^bench: $v " "$tmp/a.out" || fail "no verdict line for $v"
	fi
done
echo "ok: wsd bench --quick; its verdicts (measured beside make check's other tests):"
grep '^bench: ' "$tmp/a.out"

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$wsd" bench --serve --port "$port" >"$tmp/serve.out" 2>&1 &
spid=$!
n=0
until grep -q serving "$tmp/serve.out"; do
	n=$((n + 1)); [ $n -le 300 ] || fail "wsd bench --serve did not start in 30 s: $(cat "$tmp/serve.out")"
	sleep 0.1
done
timeout -k 5 300 "$wsd" bench --quick --peer 127.0.0.1 --port "$port" --svg "$tmp/b.svg" \
	>"$tmp/b.out" 2>"$tmp/b.err" ||
	fail "wsd bench --peer failed: $(cat "$tmp/b.err")
its --serve said: $(cat "$tmp/serve.out")"
check "$tmp/b.out" "$tmp/b.svg"
grep -q "not measured: both processes must be on this host" "$tmp/b.out" ||
	fail "--peer measured the held connections"
echo "ok: wsd bench --peer against wsd bench --serve"

"$wsd" bench --rounds 0 >/dev/null 2>&1
[ $? -eq 2 ] || fail "--rounds 0 is not a usage error"
"$wsd" bench --transport bogus >/dev/null 2>&1
[ $? -eq 2 ] || fail "an unknown transport is not a usage error"
"$wsd" bench --only tput,bogus >/dev/null 2>&1
[ $? -eq 2 ] || fail "an unknown --only section is not a usage error"
echo "ok: usage errors"

# --only: that section and its verdicts, no chart
timeout -k 5 120 "$wsd" bench --quick --only conn --svg "$tmp/c.svg" >"$tmp/c.out" \
	2>"$tmp/c.err" || fail "wsd bench --only conn failed: $(cat "$tmp/c.err")"
grep -q "== short-lived" "$tmp/c.out" && ! grep -q "== throughput" "$tmp/c.out" &&
	grep -q "^bench: short_lived_connections_ratio " "$tmp/c.out" &&
	! grep -q "^bench: tput_" "$tmp/c.out" && ! grep -q "chart" "$tmp/c.out" &&
	[ ! -e "$tmp/c.svg" ] || fail "--only conn ran more, or less: $(cat "$tmp/c.out")"
echo "ok: wsd bench --only"

# the apps section's splicing proxy alone: both figures on its line, its verdict
timeout -k 5 60 "$wsd" bench --quick --only apps:splice >"$tmp/d.out" 2>"$tmp/d.err" ||
	fail "wsd bench --only apps:splice failed: $(cat "$tmp/d.out" "$tmp/d.err")"
grep -Eq "^apps: splice proxy .*: plain [1-9][0-9]* MB/s, wsd [1-9][0-9]* MB/s \([0-9.]+x\), on shm or verbs [0-2] of 2" \
	"$tmp/d.out" || fail "no measured splice proxy line: $(cat "$tmp/d.out")"
grep -Eq "^bench: apps_splice_proxy_ratio [0-9.]+ .*(MET|MISSED)$" "$tmp/d.out" ||
	fail "no verdict for apps_splice_proxy_ratio: $(grep apps_ "$tmp/d.out")"
! grep -Eq "^apps: (nginx|pgbench)|^bench: apps_(nginx|pgbench)" "$tmp/d.out" ||
	fail "--only apps:splice ran more rows: $(cat "$tmp/d.out")"
echo "ok: wsd bench --only apps:splice"

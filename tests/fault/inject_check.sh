#!/bin/bash
# Set-up steps that fail and shared values that go bad, one at a time, in a
# stream between two programs under wsd run with the test build of the
# library (tests/fault/libwsd_fault.la: the fault points of
# provider/fault.h, named by WSD_FAULT in one of the two).  Each case must
# end one of three ways, named in its line below:
#   tcp    the connection stays on (or goes back to) TCP, the stream arrives
#          whole and byte-exact, and wsd stat gives the connecting side's
#          reason (not none, not pending)
#   shm    it is upgraded all the same (a slower way to the same ring), and
#          the stream arrives whole and byte-exact
#   reset  a loud error: the receiver has a byte-exact prefix then
#          ECONNRESET (or EIO), the sender EPIPE or ECONNRESET, and wsd stat
#          gives reason protocol where the bad value was read (or the
#          reason the case names: provider, for a write the provider
#          refused)
# Never a wrong byte (tests/fault/stream checks each), never a hang (60 s
# a case), never a read out of bounds (the sanitizer build runs this too).
# The points are described in tests/fault/README.md.
set -u
. "${srcdir:-.}/tests/attack/common.sh"
stream=${top_builddir:-.}/tests/fault/stream
lib=${top_builddir:-.}/tests/fault/.libs/libwsd_fault.so
[ -f "$lib" ] || fail "no $lib (make check builds it)"
export WSD_LIB=$lib WSD_UPGRADE_BYTES=1 STREAM_HOLD=$tmp/go
M=1048576

# holding FILE MS: FILE says "holding" within MS milliseconds
holding() {
	local end=$(( $(now_ms) + $2 ))
	until grep -q holding "$1" 2>/dev/null; do
		[ "$(now_ms)" -lt "$end" ] || return 1
		sleep 0.05
	done
}
# sockets PID: "path reason" of each of its connections, from wsd stat
sockets() {
	"$wsd" stat --json "$1" 2>/dev/null | python3 -c '
import json, sys
for p in json.load(sys.stdin)["processes"]:
    for s in p["sockets"]:
        if s["peer"]:
            print(s["path"], s["reason"])'
}

# run_case SIDE FAULT BYTES PAUSE_US EXPECT [REASON]: SIDE s (the listening
# sender) or r (the connecting receiver) runs with WSD_FAULT=FAULT; a reset
# names REASON (protocol by default) in wsd stat
run_case() {
	local side=$1 fault=$2 bytes=$3 pause=$4 expect=$5 why=${6:-protocol} fs= fr= end st
	[ "$side" = s ] && fs=$fault || fr=$fault
	rm -f "$tmp/port" "$tmp/go" "$tmp"/*.out "$tmp"/*.err
	STREAM_PAUSE_US=$pause WSD_FAULT=$fs "$wsd" run -- "$stream" send "$tmp/port" 7 "$bytes" \
		>"$tmp/send.out" 2>"$tmp/send.err" &
	spid=$!
	pids="$pids $spid"
	wait_file "$tmp/port" || fail "$fault: the sender did not listen"
	WSD_FAULT=$fr "$wsd" run -- "$stream" recv "$(cat "$tmp/port")" 7 "$bytes" \
		>"$tmp/recv.out" 2>"$tmp/recv.err" &
	rpid=$!
	pids="$pids $rpid"
	holding "$tmp/send.out" 60000 && holding "$tmp/recv.out" 10000 ||
		fail "$fault: a side hangs"
	grep -q "wsd fault: ${fault%%[=@]*} fires" "$tmp/send.err" "$tmp/recv.err" ||
		fail "$fault: the fault point was never reached"
	grep -q "^received \(.* complete\|[0-9]* reset\|[0-9]* eio\|[0-9]* eof\)$" "$tmp/recv.out" ||
		fail "$fault: the receiver: $(cat "$tmp/recv.out")"
	case $expect in
	tcp|shm)
		grep -q "^received $bytes complete$" "$tmp/recv.out" &&
			grep -q "^sent $bytes$" "$tmp/send.out" ||
			fail "$fault: the stream did not arrive whole"
		# the connecting side's verdict, once the handshake has ended
		end=$(( $(now_ms) + 10000 ))
		while st=$(sockets "$rpid"); [ "$(now_ms)" -lt "$end" ] &&
			{ [ -z "$st" ] || [ "${st#* }" = pending ]; }; do
			sleep 0.1
		done
		if [ "$expect" = tcp ]; then
			case $st in
			"tcp pending"|"tcp none"|"") fail "$fault: no reason for TCP: '$st'" ;;
			tcp\ *) ;;
			*) fail "$fault: should be on TCP: '$st'" ;;
			esac
		else
			[ "$st" = "shm none" ] || fail "$fault: should be upgraded: '$st'"
		fi ;;
	reset)
		grep -q "^received [0-9]* \(reset\|eio\)$" "$tmp/recv.out" ||
			fail "$fault: the receiver saw no reset: $(cat "$tmp/recv.out")"
		grep -q "^sent [0-9]* error \(EPIPE\|ECONNRESET\|EIO\)$" "$tmp/send.out" ||
			fail "$fault: the sender saw no error: $(cat "$tmp/send.out")"
		st="$(sockets "$spid") $(sockets "$rpid")"
		case $st in
		*"$why"*) ;;
		*) fail "$fault: no reason $why: '$st'" ;;
		esac ;;
	esac
	touch "$tmp/go"
	wait "$spid" && wait "$rpid" || fail "$fault: a side exited non-zero"
	echo "ok: $side $fault: received $(sed -n 's/^received //p' "$tmp/recv.out"); wsd stat: $st"
}

t0=$(now_ms)
# the provider's set-up (provider/shm): region, mapping, pidfd, completion engine
run_case r shm-memfd $((256 * M)) 0 tcp
run_case r shm-mmap $((256 * M)) 0 tcp
run_case s shm-mmap $((256 * M)) 0 tcp
run_case r shm-pidfd $((256 * M)) 0 tcp
run_case s shm-pidfd $((256 * M)) 0 tcp
run_case r io-uring $((256 * M)) 0 tcp
run_case s io-uring $((256 * M)) 0 tcp
# the switch's ring region: not shared, or not mapped by the peer (RDMA writes then)
run_case s ring-memfd $((256 * M)) 0 shm
run_case r ring-pidfd $((256 * M)) 0 shm
run_case r ring-mmap $((256 * M)) 0 shm
# a slow handshake, while the stream flows (about 8 s of it): within each
# side's answer wait (5 s), the upgrade comes late and mid-stream; past it,
# or past the listener's proof deadline (1 s), it does not come
run_case r hello-delay=3000 $((64 * M)) 30000 shm
run_case s accept-delay=3000 $((64 * M)) 30000 shm
run_case r shm-delay=1500 $((64 * M)) 30000 tcp
run_case r hello-delay=6000 $((64 * M)) 30000 tcp
run_case s accept-delay=6000 $((64 * M)) 30000 tcp
# values the peer's checks must refuse, in the region the peer reads
run_case s rec-header=0@200 $((256 * M)) 0 reset
run_case s rec-header=1@200 $((256 * M)) 0 reset
run_case r ctl-word@20+ $((256 * M)) 0 reset
# a record write the provider refuses: both ends reset, the sender told
# ECONNRESET (never the provider's EFAULT), the receiver not left waiting
run_case s rec-write@200 $((256 * M)) 0 reset provider
echo "PASS: every fault ended in TCP, the ring, or a reset, in $(( ($(now_ms) - t0) / 1000 )) s"
exit 0

#!/bin/sh
# Two programs of different users under wsd run pair on shm by copy
# (libwsd(7), "Across users"): the fanout server as one user, its client
# as another, 8 connections of 32 MiB each way, every byte checked; all 8
# must reach shm (the client's debug lines say each attached) and
# carry their whole stream both ways, with the listener as the other user
# and then with the connector as the other user.  Then the server's
# wsd.conf(5) keeps them apart: "peer-users same" (the transport turns the
# client away: reason access) and "peer-users root" (the switch does:
# reason policy); the streams stay on TCP, whole.  Last, with the test
# build of the library (tests/fault/libwsd_fault.la), a ring the client
# and then the server cannot map (WSD_FAULT=ring-mmap, once): by copy
# there is no RDMA to write it by, so that connection must stay on TCP
# (reason resources at the side that could not), never be reset, and the
# streams arrive whole.  And servers that fork their workers as another
# user (nginx's root master and www-data workers): tests/sock/forksrv.pair
# with its children as nobody, every connection on shm.  Needs root to run
# a second uid (nobody), and a build tree that user can read; exits 77
# otherwise.
set -u
b=${top_builddir:-.}
wsd=$b/wsd/wsd
fanout=$b/tests/fault/fanout
other=65534
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0:detect_leaks=0"

[ "$(id -u)" -eq 0 ] || { echo "SKIP: needs root to run a process of another user"; exit 77; }
command -v setpriv >/dev/null 2>&1 || { echo "SKIP: no setpriv"; exit 77; }
[ -x "$fanout" ] || { echo "FAIL: $fanout: not built"; exit 1; }
as_other() { setpriv --reuid=$other --regid=$other --clear-groups "$@"; }
as_root() { "$@"; }
lib=$b/.libs/libwsd-preload.so
as_other test -r "${lib:-/nonexistent}" || {
	echo "SKIP: uid $other cannot read the build tree ($b)"
	exit 77
}

tmp=$(mktemp -d)
chmod 755 "$tmp"
spid=
trap '[ -n "$spid" ] && kill -9 $spid 2>/dev/null; rm -rf "$tmp"' EXIT

fail() {
	echo "FAIL: $*"
	for f in "$tmp"/*.out "$tmp"/*.err; do
		[ -f "$f" ] && { echo "--- $f"; tail -n 20 "$f"; }
	done
	exit 1
}

# whole FILE: 8 connection lines, each a whole stream both ways
whole() {
	[ "$(grep -c '^conn ' "$1")" -eq 8 ] &&
		! grep '^conn ' "$1" | grep -qv ' tx 33554432 complete rx 33554432 complete$'
}

# run NAME SERVER_AS CLIENT_AS [SERVER_CONF]: the fanout server (with
# SERVER_ENV) and its client (with CLIENT_ENV), 8 streams of 32 MiB each
# way, under wsd run as those users; both must end and carry every stream whole
run() {
	rm -rf "${tmp:?}"/*
	mkdir "$tmp/run" && chmod 777 "$tmp/run"   # the server's port file, as either user
	printf '%s\n' "${4:-}" >"$tmp/run/wsd.conf"
	$2 env ${SERVER_ENV:-} WSD_DEBUG=1 FANOUT_LISTEN_ON=1 WSD_CONF="$tmp/run/wsd.conf" \
		timeout -k 5 120 \
		"$wsd" run -- "$fanout" serve "$tmp/run/port" 7 8 \
		>"$tmp/server.out" 2>"$tmp/server.err" &
	spid=$!
	n=0
	until [ -s "$tmp/run/port" ]; do
		n=$((n + 1))
		[ $n -le 100 ] || fail "$1: the server did not listen"
		sleep 0.1
	done
	$3 env ${CLIENT_ENV:-} WSD_DEBUG=1 timeout -k 5 120 "$wsd" run -- \
		"$fanout" connect "$(cat "$tmp/run/port")" 7 8 0 32 \
		>"$tmp/client.out" 2>"$tmp/client.err" || fail "$1: the client exited $?"
	wait $spid || fail "$1: the server exited $?"
	spid=
	whole "$tmp/client.out" && whole "$tmp/server.out" ||
		fail "$1: not every stream arrived whole"
}

# pair NAME SERVER_AS CLIENT_AS [REASON [SERVER_CONF]]: on shm, or on TCP for REASON
pair() {
	run "$1" "$2" "$3" "${5:-}"
	if [ -z "${4:-}" ]; then
		# each reached shm (a stall of both ends may send one back before the
		# last upgrades, so not all at once: "upgraded" would not come)
		[ "$(grep -c 'attached (shm)' "$tmp/client.err")" -eq 8 ] ||
			fail "$1: not every connection reached shm"
		echo "$1: 8 connections on shm, 32 MiB each way each, whole"
		return
	fi
	# the first connection asks and is refused for all: the others ask no more
	! grep -q '^upgraded' "$tmp/client.out" && ! grep -q 'attached' "$tmp/client.err" &&
		grep -q "stays on TCP: $4\$" "$tmp/client.err" &&
		! grep "stays on TCP" "$tmp/client.err" | grep -qv "stays on TCP: $4\$" ||
		fail "$1: the connections did not stay on TCP for $4 alone"
	echo "$1: 8 connections on TCP ($4), 32 MiB each way each, whole"
}

pair "listener of uid $other, connector root" as_other as_root
pair "listener root, connector of uid $other" as_root as_other
pair "peer-users same at the listener" as_root as_other access "peer-users same"
pair "peer-users root at the listener" as_root as_other policy "peer-users root"

# unmapped AS NAME: one connection stayed on TCP, none was reset, the streams whole
unmapped() {
	run "$2" "$1" as_root
	grep -q 'fires' "$tmp/client.err" "$tmp/server.err" || fail "$2: the fault did not fire"
	grep -q "stays on TCP" "$tmp/client.err" || fail "$2: no connection stayed on TCP"
	! grep -q "reset" "$tmp/client.err" "$tmp/server.err" || fail "$2: a connection was reset"
	echo "$2: one connection on TCP, none reset, 32 MiB each way each, whole"
}
flib=${top_builddir:-.}/tests/fault/.libs/libwsd_fault.so
if as_other test -r "$flib"; then
	CLIENT_ENV="WSD_LIB=$flib WSD_FAULT=ring-mmap" unmapped as_other "a ring the client cannot map"
	SERVER_ENV="WSD_LIB=$flib WSD_FAULT=ring-mmap" unmapped as_other "a ring the server cannot map"
else
	echo "FAIL: no $flib (make check builds it)"
	exit 1
fi
FORKSRV_CHILD_UID=$other sh "${srcdir:-.}/tests/sock/run_pair.sh" "$b/tests/sock/forksrv.pair" \
	>"$tmp/forksrv.out" 2>&1
case $? in
0) echo "forksrv, its workers as uid $other: every connection on shm, every byte checked" ;;
77) # (the sanitizer build: its allocator is not fork-safe; the plain build runs it)
   echo "forksrv skipped here: $(grep '^SKIP' "$tmp/forksrv.out")" ;;
*) tail -n 20 "$tmp/forksrv.out"; fail "forksrv with workers as uid $other" ;;
esac
echo "PASS: pairing across users, and the policy's word on it"

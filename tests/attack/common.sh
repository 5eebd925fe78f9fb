# Shared by the attack scripts; sourced, not run.  Sets wsd and prog (the
# tuple program), a temporary folder tmp removed at exit with every pid in
# pids killed, and fail, now_ms, wait_exit, ticks, stacks and wait_file.
wsd=${top_builddir:-.}/wsd/wsd
prog=${top_builddir:-.}/tests/attack/tuple
# In a sanitizer build libwsd-preload.so carries the ASan runtime, loaded
# after the program's own (and after an attacker's shim): let it, as
# run_pair.sh does.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0:detect_leaks=0"
tmp=$(mktemp -d)
pids=
cleanup() {
	for p in $pids; do kill -9 "$p" 2>/dev/null; done
	rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
	echo "FAIL: $*"
	for f in "$tmp"/*.out "$tmp"/*.err "$tmp"/*.json "$tmp"/*.res; do
		[ -f "$f" ] && { echo "--- $f"; cat "$f"; }
	done
	exit 1
}
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
wait_exit() {   # PID MS: 0 when PID ended within MS milliseconds
	t_end=$(( $(now_ms) + $2 ))
	while kill -0 "$1" 2>/dev/null; do
		[ "$(now_ms)" -lt "$t_end" ] || return 1
		sleep 0.05
	done
}
ticks() {   # PID (or PID/task/TID): its user and system time so far, in clock ticks
	awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$1/stat" 2>/dev/null || echo 0
}

# stacks PID: each thread's state, wait channel and system call from /proc
# (which needs no debugger and works on a process in its exit), then the
# threads' stacks from gdb when there is one, or why there are none.
stacks() {
	for t in /proc/"$1"/task/*; do
		[ -r "$t/stat" ] || continue
		echo "task ${t##*/} $(cat "$t/comm" 2>/dev/null)" \
		     "state $(sed 's/^.*) //' "$t/stat" 2>/dev/null | cut -d' ' -f1)" \
		     "wchan $(cat "$t/wchan" 2>/dev/null) syscall $(cat "$t/syscall" 2>/dev/null)"
	done
	command -v gdb >/dev/null 2>&1 || { echo "stacks: no gdb"; return 0; }
	timeout -s KILL 30 gdb -p "$1" -batch -ex "thread apply all bt 16" >"$tmp/gdb.$1" 2>&1
	grep -E '^#|^Thread' "$tmp/gdb.$1" ||
		{ echo "stacks: gdb gave none:"; tail -3 "$tmp/gdb.$1"; }
	rm -f "$tmp/gdb.$1"
}
wait_file() {   # FILE [REGEX]: up to 10 s (WAIT_S seconds)
	n=0
	until [ -s "$1" ] && { [ $# -lt 2 ] || grep -q "$2" "$1"; }; do
		n=$((n + 1))
		[ $n -le $((${WAIT_S:-10} * 10)) ] || return 1
		sleep 0.1
	done
}
command -v python3 >/dev/null 2>&1 || fail "python3 is needed to read wsd stat --json"

# start_server: the echo server under wsd run; sets server (pid) and port.
start_server() {
	"$wsd" run -- "$prog" server "$tmp/port" >"$tmp/server.out" 2>"$tmp/server.err" &
	server=$!
	pids="$pids $server"
	wait_file "$tmp/port" || fail "the server did not start"
	port=$(cat "$tmp/port")
}
# start_client NAME [wsd]: a client of the server until $tmp/stop exists,
# plain or under wsd run; sets client (pid) and cport (its local port).
start_client() {
	if [ "${2:-}" = wsd ]; then
		"$wsd" run -- "$prog" client "$port" "$tmp/$1" "$tmp/stop" >"$tmp/$1.out" \
			2>"$tmp/$1.err" &
	else
		"$prog" client "$port" "$tmp/$1" "$tmp/stop" >"$tmp/$1.out" 2>"$tmp/$1.err" &
	fi
	client=$!
	pids="$pids $client"
	wait_file "$tmp/$1" || fail "the $1 client did not connect"
	cport=$(cat "$tmp/$1")
}
# accelerated MS PORT [more python]: within MS milliseconds the server's
# connection from local port PORT is on path shm (and the condition holds,
# over the socket s); 0, else 1.
accelerated() {
	t_end=$(( $(date +%s%N) / 1000000 + $1 ))
	while [ $(( $(date +%s%N) / 1000000 )) -lt "$t_end" ]; do
		"$wsd" stat --json "$server" >"$tmp/accel.json" 2>/dev/null &&
		python3 -c '
import json, sys
st = json.load(open(sys.argv[1]))
ok = any(s["peer"] and s["peer"].endswith(":" + sys.argv[2]) and s["path"] == "shm"
         and eval(sys.argv[3]) for p in st["processes"] for s in p["sockets"])
sys.exit(0 if ok else 1)' "$tmp/accel.json" "$2" "${3:-True}" && return 0
		sleep 0.05
	done
	return 1
}

#!/bin/sh
# A pre-forked echo server under wsd run (as root): the parent accepts, an
# honest worker accepts, and a third child drops to uid 65534 (as nginx's
# workers do) and attacks the page the children share (prefork.c): a, it
# takes the page's lock and never lets go; b, it fills every slot with
# garbage; c, it rewrites the head and the slots with wild values every
# millisecond.  Before the attack and after each phase, plain TCP clients
# and wsd clients (8 connections of 10 rounds each) must get every echo
# within 3 s, and the parent and the honest worker must not spin (each
# under half a core while the clients run).  Once the slots are garbage
# the server counts the requests it could not route as reason page.
set -u
. "${srcdir:-.}/tests/attack/priv.sh"
pf=${top_builddir:-.}/tests/attack/prefork

"$wsd" run -- "$pf" server "$tmp/port" "$tmp/pids" "$tmp" >"$tmp/server.out" \
	2>"$tmp/server.err" &
pids="$pids $!"
wait_file "$tmp/pids" || fail "the server did not start"
wait_file "$tmp/port" || fail "the server did not start"
port=$(cat "$tmp/port")
read -r parent worker attacker <"$tmp/pids"
pids="$pids $parent $worker $attacker"
wait_file "$tmp/server.out" "^attacker: uid 65534, [1-9]" ||
	fail "the attacker found no shared page of 256 KiB"

# hot_threads PID: each thread's CPU ticks and where it is now (to find a spin)
hot_threads() {
	for t in /proc/$1/task/*; do
		echo "thread ${t##*/}: $(ticks "$1/task/${t##*/}") ticks," \
			"syscall $(cut -d' ' -f1 "$t/syscall" 2>/dev/null), wchan $(cat "$t/wchan" 2>/dev/null)"
	done
	stacks "$1"
}

# round NAME: the clients, under wsd and then plain, at once; the server's CPU meanwhile
round() {
	p0=$(ticks "$parent") w0=$(ticks "$worker") t0=$(now_ms)
	timeout 30 "$wsd" run -- "$pf" client "$port" 8 10 >"$tmp/$1-wsd.out" 2>&1 &
	c2=$!
	sleep 0.5   # the plain clients come once the wsd ones' upgrades are in hand
	timeout 30 "$pf" client "$port" 8 10 >"$tmp/$1-plain.out" 2>&1 &
	c1=$!
	pids="$pids $c1 $c2"
	wait "$c1"; r1=$?
	wait "$c2"; r2=$?
	sleep 1   # the server's part of the upgrades that came late
	p1=$(ticks "$parent") w1=$(ticks "$worker") t1=$(now_ms)
	hz=$(getconf CLK_TCK)
	pcpu=$(( (p1 - p0) * 1000 * 100 / hz / (t1 - t0) ))
	wcpu=$(( (w1 - w0) * 1000 * 100 / hz / (t1 - t0) ))
	echo "$1: plain: $(tail -n 1 "$tmp/$1-plain.out"); wsd: $(tail -n 1 "$tmp/$1-wsd.out");" \
		"cpu: parent $pcpu%, worker $wcpu%"
	[ "$r1" = 0 ] || fail "$1: a plain TCP client got no answer, or a wrong one ($r1)"
	[ "$r2" = 0 ] || fail "$1: a wsd client got no answer, or a wrong one ($r2)"
	[ "$pcpu" -lt 50 ] || { hot_threads "$parent"; fail "$1: the parent spins: $pcpu% of a core"; }
	[ "$wcpu" -lt 50 ] || fail "$1: the honest worker spins: $wcpu% of a core"
	kill -0 "$parent" 2>/dev/null && kill -0 "$worker" 2>/dev/null ||
		fail "$1: the parent or the worker died"
}

# refused_page PID: the count of refusals with reason page in PID, one of
# the server's processes (the parent's or the honest worker's: whichever
# holds the port's registry counts them, and which one that is depends on
# the timing)
refused_page() {
	"$wsd" stat --json "$1" >"$tmp/stat-$1.json" 2>"$tmp/stat-$1.err" || { echo 0; return; }
	python3 -c '
import json, sys
st = json.load(open(sys.argv[1]))
print(sum(p.get("refused", {}).get("page", 0) for p in st["processes"]))' "$tmp/stat-$1.json"
}

round before
# PREFORK_SKIP_LOCK=1: phase a takes no lock (to see b and c alone on a switch with one)
for phase in a b c; do
	if [ "$phase" = a ] && [ -n "${PREFORK_SKIP_LOCK:-}" ]; then
		echo skip >"$tmp/a"
	else
		touch "$tmp/$phase"
	fi
	wait_file "$tmp/$phase.done" || fail "the attacker did not do phase $phase"
	echo "phase $phase: $(cat "$tmp/$phase.done")"
	round "$phase"
done
np=$(refused_page "$parent") nw=$(refused_page "$worker")
n=$((np + nw))
echo "requests the page could not route (reason page): $n (parent $np, worker $nw)"
[ "$n" -gt 0 ] || fail "no request was counted as reason page"
echo "PASS: the parent and the honest worker kept answering, without spinning, through the attack"
exit 0

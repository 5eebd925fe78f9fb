#!/bin/sh
# Short-lived connection rate, kernel TCP and under `wsd run`, in turns
# (A B A B ...), five rounds; prints each round and the ratio of medians.
set -eu
b=${top_builddir:-.}
prog=$b/tests/sock/connrate
n=${1:-3000}
plain="" wsd=""
for i in 1 2 3 4 5; do
	p=$("$prog" "$n")
	w=$("$b/wsd/wsd" run -- "$prog" "$n")
	echo "round $i: plain $p connections/s, wsd run $w connections/s"
	plain="$plain $p"
	wsd="$wsd $w"
done
median() { echo "$@" | tr ' ' '\n' | sed '/^$/d' | sort -n | sed -n 3p; }
mp=$(median $plain)
mw=$(median $wsd)
echo "bench: short-lived connections (connect, 64 B each way, close): plain $mp/s, wsd run $mw/s, ratio $(echo "$mw $mp" | awk '{printf "%.2f", $1 / $2}') (target >= 0.83, i.e. at most 1.2x the cost)"

# Sourced by the tests/sock check scripts that run real programs under wsd
# run: needs TOOLS (the programs to skip without, 77) set first; gives b,
# wsd, a temporary directory $tmp removed at exit with the processes in
# $pids killed, and fail (notes a failure in $status, goes on).
b=${top_builddir:-.}
wsd=$b/wsd/wsd
for t in $TOOLS; do
	command -v $t >/dev/null 2>&1 || {
		echo "SKIP: $t is not installed (./build.sh installs it)"
		exit 77
	}
done
[ -x "$wsd" ] || { echo "FAIL: $wsd: no wsd command (build it first)"; exit 1; }
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0:detect_leaks=0"

tmp=$(mktemp -d)
pids=""
cleanup() {
	for p in $pids; do kill "$p" 2>/dev/null; done
	rm -rf "$tmp"
}
trap cleanup EXIT
status=0
fail() { echo "FAIL: $*"; status=1; }

#!/bin/sh
# The Debian packages that `./build.sh deb` leaves in _build-deb/, installed
# with apt-get and used from /usr as an operator and an integrator would:
# the demo, iperf3 under `wsd run` on shm, the policy file, the man pages,
# and a program built with `pkg-config --cflags --libs wsd`.  The packages
# are purged again at the end.  Not part of `make check` (it installs into
# the system): CI runs it after ./build.sh deb.
set -u
cd "$(dirname "$0")/.."
src=$(pwd)
debs=_build-deb
[ "$(id -u)" -eq 0 ] || { echo "SKIP: installing packages needs root"; exit 77; }
ls "$debs"/libwsd0_*.deb "$debs"/libwsd-hooks0_*.deb "$debs"/libwsd-dev_*.deb \
	"$debs"/wsd_*.deb >/dev/null 2>&1 ||
	{ echo "FAIL: no packages in $debs (run ./build.sh deb first)"; exit 1; }
for p in wsd libwsd-dev libwsd-hooks0 libwsd0; do
	if dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q "install ok installed"; then
		echo "FAIL: $p is installed already: this test would remove it"
		exit 1
	fi
done

tmp=$(mktemp -d)
fail=0
bad() { echo "FAIL: $*"; fail=1; }
cleanup() {
	DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq wsd libwsd-dev libwsd-hooks0 libwsd0 \
		>/dev/null 2>&1
	rm -rf "$tmp"
}
trap cleanup EXIT

DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	./"$debs"/libwsd0_*.deb ./"$debs"/libwsd-hooks0_*.deb ./"$debs"/libwsd-dev_*.deb \
	./"$debs"/wsd_*.deb >"$tmp/apt" 2>&1 ||
	{ cat "$tmp/apt"; echo "FAIL: apt-get install"; exit 1; }

# far from the build tree, so that nothing of it is found by accident
cd "$tmp"
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
preload=/usr/lib/$multiarch/wsd/libwsd-preload.so
[ "$(command -v wsd)" = /usr/bin/wsd ] || bad "wsd is not /usr/bin/wsd: $(command -v wsd)"
[ -f "$preload" ] || bad "no $preload"
[ -f /etc/wsd.conf ] || bad "no /etc/wsd.conf"
used=$(wsd run -- sh -c 'echo "$LD_PRELOAD"')
case "$used" in
*"$preload"*) ;;
*) bad "wsd run preloads '$used', not $preload" ;;
esac

# the operator's side: the demo, and iperf3 accelerated
if wsd demo >"$tmp/demo" 2>&1; then
	echo "ok: wsd demo"
else
	cat "$tmp/demo"
	bad "wsd demo"
fi
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
wsd run -- iperf3 -s -1 -B 127.0.0.1 -p "$port" >"$tmp/srv" 2>&1 &
spid=$!
sleep 0.5
wsd run -- iperf3 -c 127.0.0.1 -p "$port" -t 3 -l 128K -f g >"$tmp/cli" 2>&1 &
cpid=$!
sleep 2
wsd stat >"$tmp/stat" 2>&1
wait $cpid || { cat "$tmp/cli"; bad "iperf3 client under wsd run"; }
wait $spid || { cat "$tmp/srv"; bad "iperf3 server under wsd run"; }
if awk '$2 == "iperf3" && $6 == "shm"' "$tmp/stat" | grep -q .; then
	echo "ok: iperf3 under wsd run, on shm: $(grep receiver "$tmp/cli" | awk '{print $7, $8}')"
else
	cat "$tmp/stat"
	bad "no iperf3 connection on shm in wsd stat"
fi

# the policy file the package installed is the one in force
wsd info >"$tmp/info" 2>&1
grep -q "/etc/wsd.conf" "$tmp/info" || { cat "$tmp/info"; bad "wsd info does not name /etc/wsd.conf"; }

# the manual
for page in wsd.1 wsd.conf.5 libwsd.7 wsd-protocol.7 WSPRdmaRead.3 nd_ep_read.3; do
	man -w "${page%.*}" >/dev/null 2>&1 || [ -f "/usr/share/man/man${page##*.}/$page.gz" ] ||
		bad "man page $page not installed"
done

# the integrator's side: a program built against the installed files alone
if [ -f "$src/tests/integrator.c" ]; then
	if cc -o "$tmp/integrator" "$src/tests/integrator.c" \
		$(pkg-config --cflags --libs wsd) 2>"$tmp/cc"; then
		"$tmp/integrator" >"$tmp/int" 2>&1 || { cat "$tmp/int"; bad "the integrator program"; }
		# (merged /usr: the loader may name it by /lib)
		ldd "$tmp/integrator" | grep -Eq "libwsd.so.0 => (/usr)?/lib/$multiarch/libwsd.so.0" ||
			bad "the integrator program did not load the installed libwsd.so.0"
		echo "ok: a program built with pkg-config --cflags --libs wsd: $(tail -n 1 "$tmp/int")"
	else
		cat "$tmp/cc"
		bad "building against the installed headers with pkg-config"
	fi
else
	bad "tests/integrator.c is missing"
fi

[ $fail -eq 0 ] && echo "PASS: the packages install, run from /usr and build a program"
exit $fail

# Shared by the attack scripts that run processes as another user
# (access_check.sh, squat_check.sh); sourced, not run.  What common.sh
# sets, tmp writable by uid 65534, nobody (the command prefix that drops
# to it), and stays_tcp below.  Skips (77) unless root with setpriv.
if [ "$(id -u)" != 0 ]; then
	echo "SKIP: needs root, to run the attacker and victims as uid 65534"
	exit 77
fi
if ! command -v setpriv >/dev/null 2>&1; then
	echo "SKIP: needs setpriv (util-linux) to drop to uid 65534"
	exit 77
fi
if [ "${WSD_PAIR_PATH:-shm}" != shm ]; then
	echo "SKIP: the registry checks of the shm transport; this run is ${WSD_PAIR_PATH}"
	exit 77
fi
nobody="setpriv --reuid=65534 --regid=65534 --clear-groups"
# wsd stat reads what each process publishes in /dev/shm: a root made by
# debootstrap, without a tmpfs mounted there, leaves it root's alone
if ! $nobody test -w /dev/shm; then
	echo "SKIP: uid 65534 cannot write /dev/shm (mount a tmpfs there, mode 1777): wsd stat could not see its processes"
	exit 77
fi
for f in "${top_builddir:-.}/wsd/wsd" "${top_builddir:-.}/tests/attack/tuple"; do
	if ! $nobody test -x "$f"; then
		echo "SKIP: uid 65534 cannot run $f (a build tree it may not enter)"
		exit 77
	fi
done
. "${srcdir:-.}/tests/attack/common.sh"
chmod 1777 "$tmp"   # the processes of uid 65534 write their files here
# Only shm has the registry these scripts attack; upgrade at the first byte.
export WSD_TRANSPORT=shm WSD_UPGRADE_BYTES=1

# stays_tcp NAME PID PORT REASON: PID's connection to PORT settles (up to
# 10 s) on TCP with REASON, having moved nothing by ring (wsd stat as root).
stays_tcp() {
	n=0
	while :; do
		"$wsd" stat --json "$2" >"$tmp/$1.json" 2>"$tmp/$1-stat.err" ||
			fail "$1: wsd stat: $(cat "$tmp/$1-stat.err")"
		python3 - "$tmp/$1.json" "$2" "$3" "$4" <<'PY'
import json, sys
st = json.load(open(sys.argv[1]))
pid, port, reason = sys.argv[2:5]
socks = [s for p in st["processes"] if str(p["pid"]) == pid for s in p["sockets"]
         if s["peer"] and s["peer"].rsplit(":", 1)[1] == port and not s["listening"]]
if len(socks) != 1 or socks[0]["reason"] == "pending":
    sys.exit(2)                      # not yet
s = socks[0]
if s["path"] != "tcp" or s["reason"] != reason or s["copy_tx"] or s["copy_rx"] \
   or s["zcopy_tx"] or s["zcopy_rx"]:
    print("want tcp, reason %s, nothing by ring: %s" % (reason, json.dumps(s)))
    sys.exit(1)
PY
		case $? in
		0) return 0 ;;
		2) n=$((n + 1)); [ $n -le 100 ] || fail "$1: no settled connection to port $3 in 10 s"
		   sleep 0.1 ;;
		*) fail "$1: the connection to port $3 (above)" ;;
		esac
	done
}

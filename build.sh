#!/bin/sh
# One entry point for a fresh Debian 12 machine:
#   ./build.sh demo    install what is missing, build, run the demo (the main job)
#   ./build.sh check   install what is missing, build, run the whole test suite
#   ./build.sh asan    the same tests in a separate AddressSanitizer/UBSan build
#   ./build.sh bench [OPTION...]  build and print the benchmarks' figures (bench_nd,
#                      wsd bench, given the OPTIONs: --quick, --only SECTION, ...)
#   ./build.sh deb     build the Debian packages (libwsd0, libwsd-dev, wsd) into
#                      _build-deb/ and check them with lintian
set -eu
cd "$(dirname "$0")"

# qemu-system-x86 runs the RDMA VM rig (tests/vm), part of `make check`;
# iperf3, sockperf and python3 (to read iperf3's JSON) run real programs
# under `wsd run` (tests/sock); ucx-utils' ucx_perftest is wsd bench's
# yardstick for shared-memory messaging; clang and its libFuzzer runtime
# build the fuzz targets (tests/fuzz/run.sh); iproute2 and nftables build
# the namespaces, bridge and DNAT rule of tests/sock/netns_check.sh.
PACKAGES="build-essential autoconf automake libtool pkg-config libibverbs-dev librdmacm-dev
liburing-dev check qemu-system-x86 iperf3 sockperf python3 ucx-utils clang libclang-rt-14-dev
iproute2 nftables"

install_missing() {   # [PACKAGE...]: these, else $PACKAGES
	missing=""
	for p in ${*:-$PACKAGES}; do
		dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q "install ok installed" ||
			missing="$missing $p"
	done
	[ -z "$missing" ] && return 0
	echo "build.sh: installing:$missing"
	if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $missing
}

apps_named() {   # ARG...: a --only among them runs wsd bench's nginx or pgbench row
	while [ $# -ge 2 ]; do
		if [ "$1" = --only ]; then
			case ",$2," in *,apps,* | *,apps:nginx,* | *,apps:pgbench,*) return 0 ;; esac
		fi
		shift
	done
	return 1
}

build() {
	[ -x configure ] && [ configure -nt configure.ac ] || autoreconf -fi
	[ -f Makefile ] || ./configure
	make -j"$(nproc)"
}

case "${1:-}" in
demo)
	install_missing
	build
	./wsd/wsd demo
	./wsd/demo-iperf3.sh
	;;
check)
	install_missing
	build
	make -j"$(nproc)" check
	;;
asan)
	install_missing
	install_missing git   # the build is a clean clone of what is committed
	dir=_build-asan
	rm -rf "$dir"
	git clone -q . "$dir"
	# the VM rig's stress over the wire moves 4 GiB each way (five minutes under
	# TCG) in the plain build; this build checks memory errors, not volume
	(cd "$dir" && autoreconf -fi >/dev/null && ./configure -q --enable-sanitizers &&
	 make -j"$(nproc)" &&
	 WSD_VM_STRESS_BYTES=${WSD_VM_STRESS_BYTES:-256M} make -j"$(nproc)" check)
	;;
deb)
	install_missing
	install_missing debhelper dpkg-dev fakeroot lintian git
	dir=_build-deb
	rm -rf "$dir"
	mkdir "$dir"
	# from a clean clone of what is committed, as asan builds
	git clone -q . "$dir/wsd"
	(cd "$dir/wsd" && dpkg-buildpackage -us -uc -b -j"$(nproc)")
	lintian --fail-on error --info "$dir"/wsd_*.changes
	ls -l "$dir"/*.deb
	;;
bench)
	shift
	install_missing
	# the apps section's real programs, only when it runs (Debian 12's
	# postgresql-15, which postgresql pulls in, holds pgbench)
	if apps_named "$@"; then
		install_missing nginx wrk postgresql
	fi
	build
	make -j"$(nproc)" tests/bench_nd tests/sock/connrate
	./tests/bench_nd
	./tests/sock/connrate_bench.sh
	./wsd/wsd bench --svg wsd-bench.svg "$@"
	;;
*)
	echo "usage: ./build.sh demo|check|asan|bench|deb" >&2
	exit 2
	;;
esac

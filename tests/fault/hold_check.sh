#!/bin/sh
# First bytes held for an OPEN message's answer (wsd-protocol(7), "First
# bytes"): where no mailbox takes them (verbs), the sends a connection
# makes right after its OPEN went by message wait in the switch for the
# answer, up to 2 ms, and then go into the peer's ring, not on the stream.
# This machine has no verbs; the test build of the library
# (tests/fault/libwsd_fault.la) holds them on shm too when WSD_FAULT names
# hold-shm, which also keeps the connecting side from the mailbox.  The
# program is first.pair (every byte checked at both ends, plain and under
# wsd run), which here must find at least FIRST_MIN_RING of its 24 short
# connections with no byte on the stream: without the hold about one in
# 24 is, the requests going by TCP before the answer.  The VM rig runs the
# same program over verbs (tests/vm/init).
set -u
top=${top_builddir:-.}
lib=$top/tests/fault/.libs/libwsd_fault.so
[ -f "$lib" ] || { echo "FAIL: no $lib (make check builds it)"; exit 1; }
WSD_LIB=$lib WSD_FAULT='hold-shm@1+' FIRST_MIN_RING=${FIRST_MIN_RING:-8} \
	sh "${srcdir:-.}/tests/sock/run_pair.sh" "$top/tests/sock/first.pair"

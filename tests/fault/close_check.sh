#!/bin/sh
# A close that races the peer's switch (wsd-protocol(7), Closing): the
# program tests/sock/echopost.pair (an HTTP/1.0 POST echoed as it is read,
# the server closing once it read the body) run plain and under wsd run
# with the test build of the library (tests/fault/libwsd_fault.la), where
# proof-delay holds every connecting side's proof 50 ms after its SWITCH
# record went into the peer's ring, so that the server's program closes in
# between.  A proof that reached the server's socket after its close made
# its kernel reset the connection, and the client lost the end of the echo
# (ECONNRESET) in most rounds; TCP never does that here.  It must give the
# plain transcript.
set -u
top=${top_builddir:-.}
lib=$top/tests/fault/.libs/libwsd_fault.so
[ -f "$lib" ] || { echo "FAIL: no $lib (make check builds it)"; exit 1; }
rc=0
for f in 'proof-delay=50@1+'; do
	echo "== WSD_FAULT=$f"
	WSD_LIB=$lib WSD_FAULT=$f sh "${srcdir:-.}/tests/sock/run_pair.sh" \
		"$top/tests/sock/echopost.pair" || rc=1
done
exit $rc

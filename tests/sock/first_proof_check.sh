#!/bin/sh
# tests/sock/first.pair once more, on the way where the listening side
# cannot see the connecting side's socket (the test build of the library,
# WSD_FAULT=box-held): every connection's first bytes then wait for the
# peer's proof on the stream (wsd-protocol(7), "Proof"), as they do where
# pidfd_getfd is refused.  The default way (no proof, WSD_OPENED_HELD) is
# first.pair's own run.
set -u
lib=${top_builddir:-.}/tests/fault/.libs/libwsd_fault.so
[ -f "$lib" ] || { echo "FAIL: no $lib (make check builds it)"; exit 1; }
WSD_LIB=$lib WSD_FAULT='box-held@1+' exec sh "${srcdir:-.}/tests/sock/run_pair.sh" \
	"${top_builddir:-.}/tests/sock/first.pair"

#!/bin/sh
# tests/sock/first.pair once more, on the way where the listening side
# cannot see the connecting side's socket (the test build of the library,
# WSD_FAULT=box-held): every connection's first bytes then wait for the
# peer's proof on the stream (wsd-protocol(7), "Proof"), as they do where
# pidfd_getfd is refused.  The default way (no proof, WSD_OPENED_HELD) is
# first.pair's own run.  The fault library must say the point fired: a run
# that took the default way after all would prove nothing here.
exec sh "${srcdir:-.}/tests/sock/fault_pair.sh" first.pair 'box-held@1+'

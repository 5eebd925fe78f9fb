#!/bin/sh
# tests/sock/waitup.pair once more, with the listening side's switch slow
# to finish saying it is ready (the test build of the library,
# WSD_FAULT=rx-ready-late=200): its RX_READY is out, so the client switches
# and writes its proof on the stream while the server's wait (each of
# waitup's five calls), begun on a plain socket, still sleeps, and the
# thread that published it has not yet returned.  The wait must take that
# proof for what it is (poll.c, woke_by_switch; epoll_wait.c, harvest's
# requeue) and end only with the client's byte.  The fault library
# must say the point fired: a run that never slowed proves nothing here.
exec sh "${srcdir:-.}/tests/sock/fault_pair.sh" waitup.pair 'rx-ready-late=200@1+'

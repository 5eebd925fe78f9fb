# SPDX-License-Identifier: MIT
# What the python3 programs of tests/sock's scripts share (they import it
# with tests/sock on their PYTHONPATH): an echo checked byte for byte, and
# the switch's path for a socket (wsd_switch_path, through ctypes).
import ctypes, sys, time

sent = 0        # bytes echoed so far, by every call: the pattern runs on
_path_of = None

def echo(s, n, seed, piece=1 << 16):
    """n bytes to the echo server on s and back, in pieces: a whole large
    send before reading would fill both ends' buffers."""
    global sent
    for off in range(0, n, piece):
        data = bytes((i * 7 + seed + sent) & 0xff for i in range(min(piece, n - off)))
        s.sendall(data)
        got = bytearray()
        while len(got) < len(data):
            b = s.recv(len(data) - len(got))
            if not b:
                sys.exit("the server ended the stream early")
            got += b
        if bytes(got) != data:
            sys.exit("the echo differs from what was sent")
        sent += len(data)

def path(s):
    """s's path as the preloaded switch says it (shm, verbs, tcp...)."""
    global _path_of
    if _path_of is None:
        _path_of = ctypes.CDLL(None).wsd_switch_path
        _path_of.restype = ctypes.c_char_p
        _path_of.argtypes = [ctypes.c_int]
    p = _path_of(s.fileno())
    return p.decode() if p else None

def until_shm(s, secs=5):
    """The switch upgrades in the background: traffic until s is on shm."""
    end = time.time() + secs
    while path(s) != "shm" and time.time() < end:
        echo(s, 4096, 2)
        time.sleep(0.01)

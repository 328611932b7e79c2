"""Round trips and a bulk transfer between two ranks: `server ADDR` in one namespace, `client ADDR N` in another.

The client prints one JSON line: median and minimum round-trip time of 1-byte pings (s), and the seconds
to move N bytes until the server acknowledges the last one.
"""

from __future__ import annotations

import json
import socket
import statistics
import sys
import time

PORT = 5555


def serve(addr: str) -> None:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, PORT))
    s.listen(1)
    c, _ = s.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    expect = 0
    while True:
        head = c.recv(9, socket.MSG_WAITALL)
        if len(head) < 9:
            return
        kind, n = head[:1], int.from_bytes(head[1:], "big")
        if kind == b"b":  # bulk: read n bytes, then acknowledge
            expect = n
            while expect:
                expect -= len(c.recv(min(expect, 1 << 20)))
        c.sendall(b"y")


def client(addr: str, nbytes: int) -> None:
    for _ in range(100):
        try:
            c = socket.create_connection((addr, PORT), timeout=10)
            break
        except OSError:
            time.sleep(0.1)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rtts = []
    for _ in range(20):
        t = time.perf_counter()
        c.sendall(b"p" + (0).to_bytes(8, "big"))
        c.recv(1)
        rtts.append(time.perf_counter() - t)
    t = time.perf_counter()
    c.sendall(b"b" + nbytes.to_bytes(8, "big") + bytes(nbytes))
    c.recv(1)
    bulk = time.perf_counter() - t
    print(json.dumps({"rtt": statistics.median(rtts), "rtt_min": min(rtts), "bulk_s": bulk}))


if __name__ == "__main__":
    serve(sys.argv[2]) if sys.argv[1] == "server" else client(sys.argv[2], int(sys.argv[3]))

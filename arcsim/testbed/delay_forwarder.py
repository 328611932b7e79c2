"""The emulated cluster's user-space link: one TUN device per rank, packets held for a one-way delay.

netem is missing from this kernel, so added latency is done here. The forwarder runs in the cluster's hub
namespace and opens one TUN device per rank; ``cluster.py`` then moves each device into its rank's
namespace as ``eth0`` (the open file keeps working across the move). Every IPv4 packet a rank sends comes
out of its device's file here, is held until ``arrival + delay``, then serialised at the receiver's link
rate (the receive-side shaping; the sender's ``eth0`` has a tbf for the send side) and written into the
destination rank's device. Anything that is not IPv4 to a rank on the subnet is dropped.

    python -m arcsim.testbed.delay_forwarder --ranks 4 --delay 0.0005 --rate 12500000 --subnet 10.77.0

It prints ``ready`` once the devices exist and runs until killed (tear-down kills it with the namespace).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import heapq
import os
import select
import struct
import time

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
MAX_PACKET = 65536


def open_tun(name: str) -> int:
    """Create TUN device ``name`` (layer 3, no packet-info header) and return its non-blocking file."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def destination(packet: bytes, subnet: bytes, ranks: int) -> int | None:
    """The rank an IPv4 packet is addressed to (address ``subnet.(rank+1)``), or None to drop it."""
    if len(packet) < 20 or packet[0] >> 4 != 4 or packet[16:19] != subnet:
        return None
    rank = packet[19] - 1
    return rank if 0 <= rank < ranks else None


class Link:
    """Hold each packet ``delay`` seconds, then serialise it on the receiver's link at ``rate`` bytes/s."""

    def __init__(self, ranks: int, delay: float, rate: float) -> None:
        self.delay, self.rate = delay, rate
        self.free_at = [0.0] * ranks  # when each receiver's link is next idle
        self.queue: list[tuple[float, int, int, bytes]] = []  # (due, order, rank, packet)
        self._order = 0

    def push(self, now: float, rank: int, packet: bytes) -> None:
        start = max(now + self.delay, self.free_at[rank])
        due = start + (len(packet) / self.rate if self.rate > 0 else 0.0)
        self.free_at[rank] = due
        heapq.heappush(self.queue, (due, self._order, rank, packet))
        self._order += 1

    def pop_due(self, now: float) -> list[tuple[int, bytes]]:
        out = []
        while self.queue and self.queue[0][0] <= now:
            _, _, rank, packet = heapq.heappop(self.queue)
            out.append((rank, packet))
        return out

    def wait(self, now: float) -> float | None:
        """Seconds until the next packet is due (None when nothing is queued)."""
        return max(0.0, self.queue[0][0] - now) if self.queue else None


def serve(fds: list[int], link: Link, subnet: bytes) -> None:
    """Forward forever: read what ranks send, write what is due."""
    ranks = len(fds)
    rank_of = {fd: r for r, fd in enumerate(fds)}
    while True:
        readable, _, _ = select.select(fds, [], [], link.wait(time.monotonic()))
        now = time.monotonic()
        for fd in readable:
            while True:
                try:
                    packet = os.read(fd, MAX_PACKET)
                except BlockingIOError:
                    break
                dst = destination(packet, subnet, ranks)
                if dst is not None and dst != rank_of[fd]:
                    link.push(now, dst, packet)
        for rank, packet in link.pop_due(time.monotonic()):
            with contextlib.suppress(OSError):  # the receiver's queue is full: a lost packet, as on a wire
                os.write(fds[rank], packet)


def main(argv: list[str] | None = None) -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--ranks", type=int, required=True)
    args.add_argument("--delay", type=float, required=True, help="one-way delay, seconds")
    args.add_argument("--rate", type=float, default=0.0, help="receive rate per rank, bytes/s (0: unshaped)")
    args.add_argument("--subnet", default="10.77.0", help="first three octets of the ranks' addresses")
    args.add_argument("--name", default="tun", help="device name prefix: <name><rank>")
    opts = args.parse_args(argv)
    fds = [open_tun(f"{opts.name}{r}") for r in range(opts.ranks)]
    print("ready", flush=True)
    serve(fds, Link(opts.ranks, opts.delay, opts.rate), bytes(int(o) for o in opts.subnet.split(".")))


if __name__ == "__main__":
    main()

"""gloo as PyTorch's ProcessGroupGloo runs it over TCP (gloo/allreduce.cc, allgather.cc, broadcast.cc).

All-reduce: ring by default (gloo's reduce-scatter + all-gather ring); halving-doubling is offered.
Reduce-scatter: PyTorch's ProcessGroupGloo all-reduces the whole input and keeps its rank's chunk, so it costs an
all-reduce of the input (measured on the emulated cluster: 0.38–0.39 s for 4 MiB over 100 Mbit/s, an all-reduce of
it 0.37 s, a ring reduce-scatter's price 0.19 s; docs/sharding.md).
All-gather: ring. All-to-all: the pairwise exchange. At 2 ranks both run one direction after the other (SERIAL_AT_TWO,
below). Broadcast: a
binomial tree in which every rank posts all its sends at once (gloo's sends are asynchronous), so a rank's
children share its uplink: 3·S/B at p = 4 (measured ≈ 3·S/B on the emulated cluster), 6·S/B at 8, against
log2 p · S/B for a binomial tree sent one child at a time.

Transport: each ring step is a TCP send the receiver must post a buffer for, so a step costs about a
round trip (2 × the one-way latency) plus gloo's software time, and TCP/IP and Ethernet headers leave 1448 of
every 1514 bytes on the wire to the payload.
"""

from __future__ import annotations

import dataclasses

from arcsim.collectives.libraries.base import Choice, Library, Protocol
from arcsim.topology import Topology

# Software time per step: a 2-rank all-reduce of one float takes 135 µs and a broadcast 86 µs over loopback
# (median of 200, this 2-core machine, torch 2.13 gloo): ≈ 60 µs per step once the ~10 µs round trip is out.
STEP_OVERHEAD_S = 60e-6
EFFICIENCY = 1448 / 1514  # a full frame's TCP payload: 1448 of the 1514 bytes a NIC (and a tbf) counts. Measured
#   on the emulated cluster from 64 KiB (benchmarks/results/small_band, 2 ranks at 1 Gbit/s, 100 Mbit/s, 100 Mbit/s +
#   1 ms): MAPE 10.1 % with the earlier 0.9, 8.5 % with this; 4 ranks at 100 Mbit/s 13.9 → 13.0 %
TCP = Protocol("tcp", latency_scale=2.0, step_overhead_s=STEP_OVERHEAD_S, efficiency=EFFICIENCY)

# gloo's unbound-buffer sends wait for the receiver's ready notice (gloo/transport/tcp/pair.cc: Pair::send sends at once
# only when the peer's recv is already posted, else announces itself and waits). At 2 ranks both directions of an
# all-gather or all-to-all share one TCP connection: a rank arriving after the other's notice sends its data at once and
# its own notice queues behind that data, so the early rank's data follows it. The early rank then finishes first (its
# recv is done when the late rank's data lands; a send is done once handed to the kernel) and is early again at the next
# collective: back to back, as in a training step, every exchange runs in turn; alone after a barrier, about half do.
# Measured on the emulated cluster (2 ranks, 100 Mbit/s): an all-to-all of 533 kB each way 45 or 88–89 ms, FSDP2's
# all-gathers 0.18–0.21 s alone in the fast mode and a median 0.26–0.28 s back to back in its step (docs/sharding.md).
# All-to-all: the two directions in turn (2×); the ring all-gather 1.5× (as read, its two half chunks: the late rank's
# first, then the whole of the early rank's). A ring of 3 or more sends and receives on different connections. The
# all-reduce (and the reduce-scatter that runs as one) is not priced in turn: alone 0.36–0.47 s against 0.35 priced,
# in FSDP2's step 0.39–0.40 s (its modes not examined). A late rank's wait is not run in turn (Protocol.time_s).
SERIAL_AT_TWO = {"alltoall": 2.0, "allgather": 1.5}
TCP_AT_TWO = {op: dataclasses.replace(TCP, serial_scale=scale) for op, scale in SERIAL_AT_TWO.items()}

OFFERED = {"allreduce": ("ring", "rhd"), "allgather": ("ring",), "reducescatter": ("ring",),
           "broadcast": ("eager",), "alltoall": ("pairwise",)}


class Gloo(Library):
    name = "gloo"
    summary = "gloo over TCP: ring all-reduce and all-gather, eager binomial broadcast; a round trip + software a step"
    offered = OFFERED
    source = "facebookincubator/gloo (allreduce.cc, allgather.cc, broadcast.cc); per-step costs measured here"

    def choices(self, op: str, algo: str | None, nbytes: float, topo: Topology) -> list[Choice]:
        if op == "reducescatter":  # PyTorch's ProcessGroupGloo all-reduces the whole input and keeps its chunk
            return [Choice(algo or "ring", TCP, runs_as="allreduce")]
        protocol = TCP_AT_TWO.get(op, TCP) if topo.ranks == 2 else TCP
        return [Choice(algo or self.offered[op][0], protocol)]

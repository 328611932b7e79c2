"""gloo as PyTorch's ProcessGroupGloo runs it over TCP (gloo/allreduce.cc, allgather.cc, broadcast.cc).

All-reduce: ring by default (gloo's reduce-scatter + all-gather ring); halving-doubling is offered.
Reduce-scatter: PyTorch's ProcessGroupGloo all-reduces the whole input and keeps its rank's chunk, so it costs an
all-reduce of the input (measured on the emulated cluster: 0.38–0.39 s for 4 MiB over 100 Mbit/s, an all-reduce of
it 0.37 s, a ring reduce-scatter's price 0.19 s; docs/sharding.md).
All-gather: ring. All-to-all: priced as the pairwise exchange (an estimate, not measured here). Broadcast: a
binomial tree in which every rank posts all its sends at once (gloo's sends are asynchronous), so a rank's
children share its uplink: 3·S/B at p = 4 (measured ≈ 3·S/B on the emulated cluster), 6·S/B at 8, against
log2 p · S/B for a binomial tree sent one child at a time.

Transport: each ring step is a TCP send the receiver must post a buffer for, so a step costs about a
round trip (2 × the one-way latency) plus gloo's software time, and TCP/IP and Ethernet headers leave 1448 of
every 1514 bytes on the wire to the payload.
"""

from __future__ import annotations

from arcsim.collectives.libraries.base import Choice, Library, Protocol
from arcsim.topology import Topology

# Software time per step: a 2-rank all-reduce of one float takes 135 µs and a broadcast 86 µs over loopback
# (median of 200, this 2-core machine, torch 2.13 gloo): ≈ 60 µs per step once the ~10 µs round trip is out.
STEP_OVERHEAD_S = 60e-6
EFFICIENCY = 1448 / 1514  # a full frame's TCP payload: 1448 of the 1514 bytes a NIC (and a tbf) counts. Measured
#   on the emulated cluster from 64 KiB (benchmarks/results/small_band, 2 ranks at 1 Gbit/s, 100 Mbit/s, 100 Mbit/s +
#   1 ms): MAPE 10.1 % with the earlier 0.9, 8.5 % with this; 4 ranks at 100 Mbit/s 13.9 → 13.0 %
TCP = Protocol("tcp", latency_scale=2.0, step_overhead_s=STEP_OVERHEAD_S, efficiency=EFFICIENCY)

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
        return [Choice(algo or self.offered[op][0], TCP)]

"""What a communication library decides for a collective, and how its transport changes the links' cost.

A :class:`Library` answers, for an (op, message size, topology): which algorithms it offers, which one it
runs (its own selection rule), and with which :class:`Protocol`. A protocol is how the library's
transport pays for a step of the algorithm: a fixed cost per collective, a per-step latency in place of
the bare link latency, and the fraction of link bandwidth the payload gets. Inside a node a GPU
library's per-hop latency replaces the link's (it is set by the protocol's synchronisation, not a
wire); between nodes the link's latency counts when it is larger (a long or shaped network). The step
schedule itself is the algorithm's one description in :mod:`arcsim.collectives`, priced by either
engine on the links as the protocol sees them (:meth:`Protocol.links`).
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

from arcsim.topology import Topology


@dataclass(frozen=True)
class Protocol:
    name: str                  # "Simple", "LL", "LL128", "tcp", "" (the bare links)
    base_s: float = 0.0        # paid once per collective (launch, setup)
    hop_intra_s: float | None = None  # latency of one step inside a node, in place of the link's (None: keep it)
    hop_inter_s: float = 0.0   # least latency of one step between nodes (the link's when larger)
    latency_scale: float = 1.0  # × the link's latency per step (2: a round trip)
    step_overhead_s: float = 0.0  # software time added to every step
    efficiency: float = 1.0    # fraction of the link bandwidth the payload gets
    intra_efficiency: float = 1.0  # and inside a node, × that (NCCL's NVLink figure under the line rate)
    chunk_bytes: float = 0.0   # pipelined algorithms: bytes per piece (0: the count the closed form prefers)
    ceiling_Bps: float = math.inf  # the most bytes/s of the collective's size its kernels reach (NCCL's channels)
    per_message_s: float = 0.0  # paid once per collective: the transport's per-message work (NCCL's proxy)
    serial_scale: float = 1.0  # × the schedule's time: an exchange whose two directions run in turn (gloo at 2 ranks)

    def time_s(self, schedule_s: float, nbytes: float, waited_s: float = 0.0) -> float:
        """The collective's time from its schedule's: the fixed costs, and never faster than the ceiling.
        ``waited_s``: the part of ``schedule_s`` spent waiting for the last rank to arrive (run once, not in turn)."""
        in_turn = (schedule_s - waited_s) * (self.serial_scale - 1)
        return self.base_s + self.per_message_s + max(schedule_s + in_turn, nbytes / self.ceiling_Bps)

    def links(self, topo: Topology) -> Topology:
        """The topology as this protocol's steps see it: latencies and bandwidths replaced, nothing else."""
        if self == BARE:
            return topo

        def latency(link: float, floor: float) -> float:
            return max(floor, self.latency_scale * link + self.step_overhead_s)

        intra_latency = latency(topo.intra.latency, 0.0) if self.hop_intra_s is None else self.hop_intra_s
        intra = dataclasses.replace(topo.intra, latency=intra_latency,
                                    bandwidth=topo.intra.bandwidth * self.efficiency * self.intra_efficiency)
        net = dataclasses.replace(topo.network, latency=latency(topo.network.latency, self.hop_inter_s),
                                  bandwidth_per_nic=topo.network.bandwidth_per_nic * self.efficiency)
        return dataclasses.replace(topo, intra=intra, network=net)

    def chunks(self, nbytes: float, pieces_of: float = 1.0) -> int | None:
        """The piece count of a pipelined algorithm moving ``nbytes`` (split ``pieces_of`` ways first)."""
        from arcsim.collectives.tree import MAX_CHUNKS

        if self.chunk_bytes <= 0:
            return None
        return min(MAX_CHUNKS, max(1, math.ceil(nbytes / pieces_of / self.chunk_bytes)))


BARE = Protocol("")


@dataclass(frozen=True)
class Choice:
    """One way the library may run a collective."""

    algo: str
    protocol: Protocol
    chunks: int | None = None
    schedule: str = ""  # the catalogue's steps it runs on, when not its own name's (NCCL's NVLS: hierarchical)
    runs_as: str = ""   # the op whose steps it runs, when not its own (gloo's reduce-scatter: an all-reduce)

    @property
    def steps(self) -> str:
        return self.schedule or self.algo


class Library(ABC):
    name: str
    summary: str  # one line: what it models
    source: str   # where its rules come from
    offered: dict[str, tuple[str, ...]]  # op → the algorithms it implements, its default first (or override
    #                                       algorithms(), as ideal does with the whole catalogue)

    def algorithms(self, op: str) -> tuple[str, ...]:
        """The algorithms it offers for ``op`` (normalised op name)."""
        return self.offered[op]

    def available(self, op: str, topo: Topology) -> tuple[str, ...]:
        """The algorithms it can run for ``op`` on ``topo`` (some need hardware: NCCL's NVLS an NVSwitch)."""
        return self.algorithms(op)

    @abstractmethod
    def choices(self, op: str, algo: str | None, nbytes: float, topo: Topology) -> list[Choice]:
        """The ways it may run ``op`` of ``nbytes``: one when its rule decides, several when it picks the cheapest
        by its own cost model (NCCL). ``algo`` pins the algorithm (None: the library's own choice)."""

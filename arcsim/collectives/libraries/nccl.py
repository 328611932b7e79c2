"""NCCL as its tuner runs it (NCCL 2.30.7, src/graph/tuning.cc and src/include/device.h).

Algorithms: all-reduce by ring or tree (NCCL's tree: chains inside nodes under a double binary tree of
nodes), all-gather and reduce-scatter by ring, broadcast by a pipelined ring (a chain from the root).
Protocols: LL (8-byte flag + 8-byte data lines: half the bandwidth, lowest latency), LL128 (120 of every
128 bytes carry data) and Simple (full bandwidth, memory fences per step). NCCL prices every enabled
(algorithm, protocol) with its model and runs the cheapest; arcsim prices the same pairs on its step
schedules with NCCL's constants and takes the cheapest the same way. CollNet, NVLS and PAT need hardware
or settings arcsim does not model (SHARP switches, NVLink SHARP, one GPU per node) and are left out.
"""

from __future__ import annotations

import dataclasses

from arcsim.collectives import tree_channels
from arcsim.collectives.libraries.base import Choice, Library, Protocol
from arcsim.collectives.tree import node_tree_depth
from arcsim.topology import Topology

PROTOCOLS = ("LL", "LL128", "Simple")
# tuning.cc, ncclTunerConstantsDefaults (µs): base latency per collective, and per-hop latency by link kind
BASE_US = {"ring": (6.6, 14.0, 8.4), "tree": (6.8, 14.0, 8.4)}
HOP_US = {
    "nvlink": {"ring": (0.6, 1.9, 3.4), "tree": (0.6, 1.25, 4.0)},
    "pcie": {"ring": (1.0, 2.5, 5.7), "tree": (1.0, 1.9, 4.0)},
    "net": {"ring": (2.7, 4.0, 14.0), "tree": (5.0, 8.5, 14.0)},
}
NET_OVERHEAD_US = 1.0  # getNetOverhead (x86 Intel): every step of a ring that spans nodes, ×3 for Simple
# Bus-bandwidth factors (tuning.cc "model refinements"): ring LL ×0.5, LL128 ×0.92; tree all-reduce ×0.92
# and then LL ×1/3.8, LL128 ×120/128 across nodes (7/9 in one node)
RING_EFFICIENCY = (0.5, 0.92, 1.0)
# device.h: the data one pipeline step carries — LL 8 lines × 512 threads × 8 data bytes; LL128 120 elements
# × 640 threads × 8 bytes × 120/128; Simple the 4 MiB buffer over NCCL_STEPS = 8
STEP_BYTES = (8 * 512 * 8, 120 * 640 * 8 * 120 / 128, 4 * 2**20 / 8)

OFFERED = {"allreduce": ("ring", "tree"), "allgather": ("ring",), "reducescatter": ("ring",),
           "broadcast": ("chain",)}


def _intra_kind(topo: Topology) -> str:
    return "nvlink" if topo.intra.kind.lower() in ("nvlink", "nvswitch") else "pcie"


def protocol(algo: str, proto: int, topo: Topology) -> Protocol:
    """NCCL's cost terms for one (algorithm, protocol) on ``topo``, as link overrides."""
    family = "ring" if algo in ("ring", "chain") else "tree"
    multi_node = topo.nodes > 1
    intra = HOP_US[_intra_kind(topo)][family][proto]
    # one GPU per node exposes the network latency fully: NCCL uses the tree's network figure then
    inter = HOP_US["net"]["tree" if topo.gpus_per_node == 1 else family][proto]
    if family == "ring" and multi_node:
        intra = max(intra, NET_OVERHEAD_US * (3 if PROTOCOLS[proto] == "Simple" else 1))
    if family == "ring":
        efficiency = RING_EFFICIENCY[proto]
    else:
        # (NCCL's treeCorrectionFactor, 0.4–0.9 at mid sizes, corrects its closed form for the pipeline fill
        # it leaves out; arcsim's step schedule has the fill, so the factor is not applied again)
        efficiency = 0.92 * (1 / 3.8, 120 / 128 if multi_node else 7 / 9, 1.0)[proto]
    return Protocol(PROTOCOLS[proto], base_s=BASE_US[family][proto] * 1e-6, hop_intra_s=intra * 1e-6,
                    hop_inter_s=inter * 1e-6, efficiency=efficiency, chunk_bytes=STEP_BYTES[proto])


def ring_steps(op: str, topo: Topology) -> tuple[int, int]:
    """(steps, steps that cross nodes) of NCCL's ring latency term (tuning.cc: nsteps and nInterSteps)."""
    p, n = topo.ranks, topo.nodes
    if op == "allreduce":
        return 2 * (p - 1), 2 * n if n > 1 else 0
    return p - 1, n - 1  # all-gather, reduce-scatter


def ring_chain(proto: Protocol, op: str, topo: Topology) -> Protocol:
    """A ring over nodes of several GPUs, as NCCL's ring runs: each rank forwards a piece as soon as it
    arrives (up to NCCL_STEPS pieces in flight), so a small message pays the network's latency only on the
    hops of its way round that cross nodes and the in-node hop latency on the others — not the slowest hop
    at every step, as lock-step steps would (on 8 GPUs per node that charges the network 7 times too often).
    Every step is given the mean hop latency of that way round, which sums to NCCL's own ring latency term:
    crossing steps × max(network hop, link latency) + the other steps × in-node hop."""
    steps, crossing = ring_steps(op, topo)
    if topo.nodes < 2 or topo.gpus_per_node < 2 or steps == 0:
        return proto
    share, intra = min(1.0, crossing / steps), proto.hop_intra_s or 0.0
    floor = share * proto.hop_inter_s + (1 - share) * intra
    return dataclasses.replace(proto, hop_intra_s=floor, hop_inter_s=floor,
                               latency_scale=share * proto.latency_scale, step_overhead_s=(1 - share) * intra)


PIPELINE_DEPTH = {  # hops from the root to the farthest rank
    "tree": lambda t: node_tree_depth(t.nodes, t.gpus_per_node),
    "chain": lambda t: t.ranks - 1,
}


def pipelined(proto: Protocol, depth: int, chunks: int) -> Protocol:
    """NCCL pays a hop's latency (its own and the wire's) once per pipeline, filling it, not once per chunk:
    each phase's chunks + depth − 1 steps share depth hop latencies, which is NCCL's own latency term for
    its tree."""
    share = depth / (chunks + depth - 1) if depth > 0 else 1.0
    return dataclasses.replace(proto, hop_intra_s=(proto.hop_intra_s or 0.0) * share,
                               hop_inter_s=proto.hop_inter_s * share, latency_scale=share)


class Nccl(Library):
    name = "nccl"
    summary = "NCCL 2.30: ring or tree all-reduce, ring all-gather, pipelined-ring broadcast; LL/LL128/Simple"
    offered = OFFERED
    source = "NVIDIA/nccl v2.30.7 src/graph/tuning.cc (latencies, bandwidth factors), src/include/device.h"

    def choices(self, op: str, algo: str | None, nbytes: float, topo: Topology) -> list[Choice]:
        algos = self.algorithms(op) if algo is None else (algo,)
        out = []
        for a in algos:
            for p in range(len(PROTOCOLS)):
                proto = protocol(a, p, topo)
                if a in PIPELINE_DEPTH:
                    chunks = proto.chunks(nbytes, 2.0 * tree_channels(topo) if a == "tree" else 1.0) or 1
                    proto = pipelined(proto, PIPELINE_DEPTH[a](topo), chunks)
                    out.append(Choice(a, proto, chunks))
                else:
                    out.append(Choice(a, ring_chain(proto, op, topo) if a == "ring" else proto))
        return out

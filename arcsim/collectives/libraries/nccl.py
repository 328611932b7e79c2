"""NCCL as its tuner runs it (NCCL 2.30.7, src/graph/tuning.cc and src/include/device.h).

Algorithms: all-reduce by ring, tree (NCCL's tree: chains inside nodes under a double binary tree of
nodes) or NVLS (NVLink SHARP on Hopper and Blackwell NVSwitch nodes; NVLS-tree across nodes), all-gather and
reduce-scatter by ring or, with one GPU a node, PAT (parallel aggregated trees: log2 p steps, priced on the
catalogue's recursive-doubling steps), broadcast by a pipelined ring (a chain from the root), all-to-all as grouped
send/recv to every peer at once (``direct``: one step, the peers sharing the ports; ``pairwise`` offered) with the
Simple protocol's ring constants (an estimate, not fitted to published all-to-all tables). Size-dependent
terms (channels in use, the tree's correction, NVLS's pipeline) and the proxy's cost per network crossing:
:mod:`nccl_tuning`.
Protocols: LL (8-byte flag + 8-byte data lines: half the bandwidth, lowest latency), LL128 (120 of every
128 bytes carry data) and Simple (full bandwidth, memory fences per step). NCCL prices every enabled
(algorithm, protocol) with its model and runs the cheapest; arcsim prices the same pairs on its step
schedules with NCCL's constants and takes the cheapest the same way. CollNet and PAT need hardware or
settings arcsim does not model (SHARP switches) and are left out.
"""

from __future__ import annotations

import dataclasses
import math

from arcsim.collectives import tree_channels
from arcsim.collectives.libraries import nccl_tuning as tuning
from arcsim.collectives.libraries.base import Choice, Library, Protocol
from arcsim.collectives.tree import node_tree_depth
from arcsim.errors import CollectiveError
from arcsim.topology import Topology

PROTOCOLS = ("LL", "LL128", "Simple")
# tuning.cc, ncclTunerConstantsDefaults (µs): base latency per collective, and per-hop latency by link kind
BASE_US = {"ring": (6.6, 14.0, 8.4), "tree": (6.8, 14.0, 8.4)}
HOP_US = {
    "nvlink": {"ring": (0.6, 1.9, 3.4), "tree": (0.6, 1.25, 4.0)},
    "pcie": {"ring": (1.0, 2.5, 5.7), "tree": (1.0, 1.9, 4.0)},
    "net": {"ring": (2.7, 4.0, 14.0), "tree": (5.0, 8.5, 14.0)},
}
UNBOUND = 1e3  # × the links' bandwidth: steps that contribute their latencies only (the ceiling prices the bytes)
NVLS_US, NVLS_TREE_NET_US = 25.0, 20.9  # hwLatencies: NVLink NVLS Simple; NET NVLS-tree Simple
# PAT (tuning.cc): base 8 µs, then log2(nodes) × the NET PAT latency (14 µs) / 3.5 and a linear 2.8 µs per rank;
# its bus bandwidth × 0.75; Simple only; one GPU a node, and no network offload (GPUDirect-TCPX/O)
PAT_BASE_US, PAT_NET_US, PAT_PER_RANK_US, PAT_EFFICIENCY = 8.0, 14.0 / 3.5, 2.8, 0.75
# fitted (µs per network crossing on all channels, by transport): benchmarks/published_collectives.py --fit; RDMA
# without the flush is 0 by NCCL's own latencies (2 × 8 H100 over 8 × 400 Gb/s IB: 13 % MAPE in the mid band), and
# plain sockets 0 too: no published table of NCCL over kernel TCP was found to fit one on
NET_STEP_US = {"rdma": 0.0, "rdma+flush": 11.5, "efa": 20.5, "efa+flush": 87.5, "tcpx": 64.0, "tcp": 0.0}
NET_OVERHEAD_US = 1.0  # getNetOverhead (x86 Intel): every step of a ring that spans nodes, ×3 for Simple
# Bus-bandwidth factors (tuning.cc "model refinements"): ring LL ×0.5, LL128 ×0.92; tree all-reduce ×0.92
# and then LL ×1/3.8, LL128 ×120/128 across nodes (7/9 in one node)
RING_EFFICIENCY = (0.5, 0.92, 1.0)
# device.h: the data one pipeline step carries — LL 8 lines × 512 threads × 8 data bytes; LL128 120 elements
# × 640 threads × 8 bytes × 120/128; Simple the 4 MiB buffer over NCCL_STEPS = 8
STEP_BYTES = (8 * 512 * 8, 120 * 640 * 8 * 120 / 128, 4 * 2**20 / 8)

OFFERED = {"allreduce": ("ring", "tree", "nvls"), "allgather": ("ring", "pat"), "reducescatter": ("ring", "pat"),
           "broadcast": ("chain",), "alltoall": ("direct", "pairwise")}


def _intra_kind(topo: Topology) -> str:
    return "nvlink" if topo.intra.kind.lower() in ("nvlink", "nvswitch") else "pcie"


def protocol(op: str, algo: str, proto: int, topo: Topology, nbytes: float) -> Protocol:
    """NCCL's cost terms for one (algorithm, protocol) on ``topo`` moving ``nbytes``: link overrides at that size,
    a throughput ceiling (the tree's per-channel caps; NVLS's bandwidth) and the proxy's cost (:mod:`nccl_tuning`)."""
    nvlink = tuning.nvlink_efficiency(topo)
    calibrated = topo.network.efficiency if topo.nodes > 1 else 1.0  # a calibrated cluster's share of the network
    if algo == "pat":
        return Protocol("Simple", base_s=(PAT_BASE_US + PAT_PER_RANK_US * topo.ranks) * 1e-6, hop_intra_s=0.0,
                        hop_inter_s=PAT_NET_US * 1e-6, chunk_bytes=STEP_BYTES[2],
                        efficiency=PAT_EFFICIENCY * tuning.network_efficiency(topo) * calibrated,
                        per_message_s=proxy_s(op, algo, proto, topo, nbytes))
    if algo == "nvls":
        # NCCL's own formula: its latency (25 µs, and 2·log2(nodes) × 20.9 µs between nodes) and its bandwidth (476,
        # 462 and 364 GB/s bus bandwidth on 1, 2 and 4 nodes of 8 H100; measured 479, 469 and 366) as the ceiling,
        # filled as its chunk pipeline fills. The steps (the hierarchical ones) are made fast enough not to bind:
        # NVLS-tree pipelines the switch's reduction with the rails, which the steps would run one after the other
        latency = NVLS_US + 2 * int(math.log2(topo.nodes)) * max(NVLS_TREE_NET_US, topo.network.latency * 1e6)
        return Protocol("Simple", base_s=latency * 1e-6, hop_intra_s=0.0, latency_scale=0.0, efficiency=UNBOUND,
                        ceiling_Bps=tuning.nvls_ceiling(topo, op, nbytes) * calibrated,
                        per_message_s=proxy_s(op, algo, proto, topo, nbytes))

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
        efficiency = 0.92 * (1 / 3.8, 120 / 128 if multi_node else 7 / 9, 1.0)[proto]
    efficiency *= tuning.size_factor(topo, op, algo, proto, nbytes)
    net = tuning.network_efficiency(topo) * calibrated  # the NICs as NCCL's channels fill them; inside the node,
    # NVLink's
    return Protocol(PROTOCOLS[proto], base_s=BASE_US[family][proto] * 1e-6, hop_intra_s=intra * 1e-6,
                    hop_inter_s=inter * 1e-6, efficiency=efficiency * net, chunk_bytes=STEP_BYTES[proto],
                    intra_efficiency=nvlink / net, per_message_s=proxy_s(op, algo, proto, topo, nbytes),
                    ceiling_Bps=tuning.tree_ceiling(topo, op, proto, nbytes) * calibrated if family == "tree"
                    else math.inf)


def network_hops(op: str, algo: str, topo: Topology) -> int:
    """Network crossings on a collective's critical path: a tree's (or NVLS-tree's) way up and down, a ring's
    crossings of node boundaries."""
    n = topo.nodes
    if n < 2:
        return 0
    if algo in ("tree", "nvls"):
        return 2 * math.ceil(math.log2(n))
    if algo == "pat":
        return math.ceil(math.log2(n))
    return 2 * (n - 1) if op == "allreduce" else n - 1


def proxy_crossings(op: str, algo: str, proto: int, topo: Topology, nbytes: float) -> float:
    """Network crossings × the share of its channels the collective runs on: one proxy thread per GPU serves every
    channel in use in turn, so a crossing costs the proxy's turn once per channel (a small message on one channel
    next to nothing, a mid-size one on all of them the full cost)."""
    return network_hops(op, algo, topo) * tuning.channels_in_use(topo, op, algo, proto, nbytes)


def proxy_s(op: str, algo: str, proto: int, topo: Topology, nbytes: float) -> float:
    """What NCCL's tuning constants leave out of a network crossing: its proxy thread's turns between the GPUs and
    the NICs (the GPU's flag, the post, the completion, the receiver's flush on GPUs before Hopper) and the
    transport's own per-message cost, on all channels. Fitted per transport on published nccl-tests tables
    (benchmarks/published_collectives.py --fit)."""
    per_crossing = topo.network.crossing_us if topo.network.crossing_us is not None else NET_STEP_US[transport(topo)]
    return proxy_crossings(op, algo, proto, topo, nbytes) * per_crossing * 1e-6


def transport(topo: Topology) -> str:
    """How NCCL's proxy reaches the network, for its per-crossing cost: RDMA (InfiniBand, RoCE), EFA, Google's
    GPUDirect-TCPX/O (network kind gpudirect-tcpx or -tcpxo) or plain TCP sockets (ethernet); "+flush" where the
    receiver flushes GPUDirect writes (GPUs before Hopper: ncclTopoNeedFlush)."""
    kind = topo.network.kind.lower()
    if kind.startswith("gpudirect-tcp"):
        return "tcpx"
    base = "rdma" if kind in ("infiniband", "roce") else "efa" if kind == "efa" else "tcp"
    return f"{base}+flush" if base in ("rdma", "efa") and tuning.arch(topo) == "sm80" else base


def enabled_protocols(topo: Topology) -> tuple[int, ...]:
    """The protocols NCCL enables: not LL128 across nodes over sockets (its lines would reach the NIC through host
    memory, a path past PXB: tuning.cc zeroes LL128's bandwidth there)."""
    if topo.nodes > 1 and tuning.sockets(topo):
        return (0, 2)
    return tuple(range(len(PROTOCOLS)))


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


SCHEDULES = {"nvls": "hierarchical", "pat": "rd"}  # the catalogue steps NVLS and PAT are priced on


def pat_supported(topo: Topology) -> bool:
    """ncclPatEnable: one GPU a node (nodes == ranks), more than one node, a host network (no TCPX/O offload)."""
    return topo.gpus_per_node == 1 and topo.nodes > 1 and transport(topo) != "tcpx"


class Nccl(Library):
    name = "nccl"
    summary = ("NCCL 2.30: ring, tree or NVLS all-reduce, ring or PAT all-gather and reduce-scatter, pipelined-ring "
               "broadcast; LL/LL128/Simple; sockets where there is no RDMA")
    offered = OFFERED
    source = "NVIDIA/nccl v2.30.7 src/graph/tuning.cc (latencies, bandwidth factors), src/include/device.h"

    def available(self, op: str, topo: Topology) -> tuple[str, ...]:
        return tuple(a for a in self.algorithms(op) if (a != "nvls" or tuning.nvls_supported(topo))
                     and (a != "pat" or pat_supported(topo)))

    def choices(self, op: str, algo: str | None, nbytes: float, topo: Topology) -> list[Choice]:
        if algo == "pat" and not pat_supported(topo):
            raise CollectiveError("NCCL runs PAT only with one GPU a node across nodes, and not over GPUDirect-TCPX/O "
                                  "(its network offload); pick ring, or single-GPU nodes (e.g. 8x1-ib100)")
        if algo == "nvls" and not tuning.nvls_supported(topo):
            raise CollectiveError("NCCL runs NVLS (NVLink SHARP) only on Hopper or newer GPUs on an NVSwitch, more "
                                  "than two to a node; pick ring or tree, or a topology with such GPUs (-h100, -b200)")
        algos = self.available(op, topo) if algo is None else (algo,)
        out = []
        for a in algos:
            if a in ("nvls", "pat"):
                out.append(Choice(a, protocol(op, a, 2, topo, nbytes), schedule=SCHEDULES[a]))
                continue
            if a in ("direct", "pairwise"):  # grouped send/recv: Simple, with the ring's per-step constants
                out.append(Choice(a, protocol(op, "ring", 2, topo, nbytes)))
                continue
            for p in enabled_protocols(topo):
                proto = protocol(op, a, p, topo, nbytes)
                if a in PIPELINE_DEPTH:
                    chunks = proto.chunks(nbytes, 2.0 * tree_channels(topo) if a == "tree" else 1.0) or 1
                    proto = pipelined(proto, PIPELINE_DEPTH[a](topo), chunks)
                    out.append(Choice(a, proto, chunks))
                else:
                    out.append(Choice(a, ring_chain(proto, op, topo) if a == "ring" else proto))
        return out

"""NCCL's own tuning tables and bus-bandwidth model (NCCL 2.30.7: src/graph/tuning.cc, search.cc, topo.h,
src/enqueue.cc), and what it leaves out in the mid band: the channels a collective really runs on.

NCCL prices each (algorithm, protocol) as ``latency + bytes / algBw`` with ``algBw`` from the channels its
topology search found (``graph channels × per-channel bandwidth``), each protocol's refinements and per-channel
caps (the ``perChMax*`` tables, measured by NVIDIA per GPU generation), and, for its tree, a correction per
message size. arcsim keeps its own step schedules for the latency and the links' contention, and takes from
this module what bounds them: the links as NCCL's channels fill them (NVLink, NICs), the share of channels in
use at a size, the tree's size correction and per-channel caps, and NVLS's bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from arcsim.topology import Topology

GB = 1e9  # GPU generations: sm80 (Ampere, and older priced as Ampere), sm90 (Hopper), sm100 (Blackwell)

# topo.h ncclTopoNVLinkBw: GB/s per NVLink as NCCL counts it, and the links per GPU (A100 12, H100/B200 18)
NVLINK_GBPS = {"sm80": 20.0, "sm90": 20.6, "sm100": 40.1}
NVLINKS = {"sm80": 12, "sm90": 18, "sm100": 18}
# search.cc: per-channel speeds tried (GB/s), highest first, between nodes
INTER_SPEEDS = {"sm80": (48, 30, 28, 24, 20, 18, 15, 12, 10, 9, 7, 6, 5, 4, 3, 2.4, 1.2, 0.24, 0.12),
                "sm90": (48, 45, 42, 40, 30, 24, 22, 20, 17.5, 15, 12, 6, 3, 2.4, 1.2, 0.24, 0.12),
                "sm100": (96, 86, 80, 48, 45.1, 42, 40, 30, 24, 22, 20, 17.5, 15, 12, 6, 3, 2.4, 1.2, 0.24, 0.12)}
INTRA_SPEEDS = {"sm80": (40, 30, 20, 18, 15, 12, 10, 9, 7, 6, 5, 4, 3),
                "sm90": (60, 50, 40, 30, 24, 20, 15, 12, 11, 6, 3),
                "sm100": (90, 80, 70, 60, 50, 45, 40, 30, 24, 20, 19, 18)}
PCIE_GBPS = {"sm80": 24.0, "sm90": 48.0, "sm100": 48.0}  # GPU–NIC path: PCIe Gen4 ×16, Gen5 ×16 as topo.cc counts
# tuning.cc tables, [1 node, 2 nodes, ≥ 3 nodes], GB/s per graph channel
LL_MAX = {"sm80": (87.7, 39.0, 20.4), "sm90": (141.0, 39.0, 20.4), "sm100": (282.0, 39.0, 20.4)}  # x86 Intel row
TREE_LL128_CAP = {"sm80": (20, 20, 20), "sm90": (36.7, 36.7, 29.0), "sm100": (55.6, 31.67, 20.0)}
TREE_CAP = {"sm80": (24.0, 23.6, 17.8), "sm90": (38.7, 41.4, 36.0), "sm100": (70.0, 42.8, 24.0)}
NVLS_TREE_CAP = {"sm90": (0.0, 57.7, 45.5), "sm100": (0.0, 96.0, 80.0)}
MAX_NVLS_HEADS = 32  # NCCL_MAX_NVLS_ARITY
NVLS_CHANNELS = {"sm90": (16, 16), "sm100": (24, 32)}  # NVLS_NCHANNELS_SM90, _SM100_NVL (one node), _SM100
NVLS_CHUNK = 128 * 1024  # NCCL_NVLS_CHUNKSIZE
NVLS_EFFICIENCY = {"sm90": 0.85, "sm100": 0.74}
# treeCorrectionFactor[proto][log2(bytes / 64)], 64 B … 256 MiB
TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
)
# enqueue.cc: threads per channel and bytes per thread before NCCL adds a channel; a channel gets ≥ 32 KiB of traffic
MAX_THREADS = {("ring", 0): 512, ("ring", 1): 640, ("ring", 2): 512, ("tree", 0): 512, ("tree", 1): 640,
               ("tree", 2): 512}
THREAD_THRESHOLD = (8, 8, 64)
MIN_TRAFFIC_PER_CHANNEL = 32 * 1024


def arch(topo: Topology) -> str:
    """The GPU generation NCCL tunes for: from the topology's GPU, else from its NVLink bandwidth."""
    gpu = (topo.gpu or "").lower()
    if gpu.startswith("b"):
        return "sm100"
    if gpu.startswith(("h100", "h200", "h800", "h20", "gh")):
        return "sm90"
    if gpu:
        return "sm80"
    nvlink = topo.intra.kind.lower() in ("nvlink", "nvswitch")
    return "sm100" if nvlink and topo.intra.bandwidth >= 900e9 else "sm90" if nvlink and topo.intra.bandwidth >= 450e9 \
        else "sm80"


def nvlink_efficiency(topo: Topology) -> float:
    """The fraction of the NVLink line rate NCCL's channels reach: its per-link figure over the line rate per link
    (A100 20 of 25 GB/s, H100 20.6 of 25, B200 40.1 of 50) — measured: 8 × H100 ring all-reduce 368 GB/s bus
    bandwidth at 8 GiB of 450 GB/s."""
    if topo.intra.kind.lower() not in ("nvlink", "nvswitch"):
        return 1.0
    a = arch(topo)
    return min(1.0, NVLINK_GBPS[a] * NVLINKS[a] * GB / topo.intra.bandwidth)


def network_efficiency(topo: Topology) -> float:
    """The fraction of the NICs' line rate NCCL's channels carry: its graph's channels × their speed (the
    fastest of its per-channel speeds the NIC and the GPU's PCIe path both carry: 48 GB/s on a 50 GB/s NDR NIC);
    over sockets, what TCP through the host carries (:func:`socket_bandwidth`)."""
    if topo.nodes < 2:
        return 1.0
    line = topo.network.physical_nics * topo.network.bandwidth_per_physical_nic / GB
    if sockets(topo):
        return socket_bandwidth(topo) / line
    return min(1.0, ring_graph(topo).bus / line)


def sockets(topo: Topology) -> bool:
    """Whether NCCL reaches the network through its socket transport (Ethernet without RDMA: kernel TCP)."""
    return topo.network.kind.lower() in ("ethernet", "eth", "tcp")


# Socket transport (net_socket.cc, net.cc, search.cc): no GPUDirect, so each channel's data waits in pinned host
# memory for the proxy thread of the GPU where the ring leaves the node; one search channel at the speed-array step
# under the NIC's speed, doubled to two by ncclTopoPostset; up to NCCL_STEPS × 512 KiB = 4 MiB in flight per channel.
SOCKET_CHANNELS = 2
SOCKET_IN_FLIGHT = 8 * 512 * 1024
ETHERNET_FRAMING = 38  # bytes per frame outside the IP packet: header 14, FCS 4, preamble 8, inter-frame gap 12
TCP_IP_HEADERS = 52  # inside the packet: IPv4 20, TCP 20, the timestamps option 12 (Linux's default)
# What one node's boundary proxy moves through the kernel's TCP stack per direction, GB/s: fitted on nccl#398 (AWS
# p3dn, 1 GPU a node over 100 GbE, 4.7 GB/s bus bandwidth, "more socket threads did not help"); held out: nccl#450
# (4 × 8 V100 over 100 GbE), the 32 GbE tables of nccl#209 (benchmarks/published_collectives.py)
SOCKET_PROXY_GBPS = 4.7


def tcp_goodput(mtu: int) -> float:
    """TCP's payload share of an Ethernet link's line rate: 0.94 at MTU 1500, 0.99 with jumbo frames."""
    return (mtu - TCP_IP_HEADERS) / (mtu + ETHERNET_FRAMING)


def socket_bandwidth(topo: Topology) -> float:
    """GB/s per direction NCCL's socket transport carries between nodes: the NICs' TCP payload rate, at most what
    each rail's boundary proxy (one GPU's process, whatever NICs its rail stripes) moves through the kernel
    (SOCKET_PROXY_GBPS), and at most what its channels keep in flight over one round trip (4 MiB each: a 1 ms link
    carries 4.2 GB/s on two channels, whatever its rate)."""
    net = topo.network
    wire = net.physical_nics * net.bandwidth_per_physical_nic / GB * tcp_goodput(net.mtu)
    rails = net.nics_per_node
    window = rails * SOCKET_CHANNELS * SOCKET_IN_FLIGHT / (2 * net.latency) / GB if net.latency > 0 else math.inf
    return min(wire, rails * SOCKET_PROXY_GBPS, window)


def _scale(topo: Topology) -> int:
    return min(topo.nodes, 3) - 1


@dataclass(frozen=True)
class Graph:
    """What NCCL's topology search finds: channels and each one's bandwidth (GB/s)."""

    channels: int
    bandwidth: float

    @property
    def bus(self) -> float:
        return self.channels * self.bandwidth


def ring_graph(topo: Topology) -> Graph:
    """The ring/tree graph: inside one node, NVLink's NCCL bandwidth in channels of the intra speeds (duplicated
    into twice as many of half the speed); across nodes, the per-channel speed each GPU's NIC path (NIC or PCIe, the
    slower) carries best in as many channels as the NICs hold — the first that fits, or a lower one down to half of
    it where more channels carry more (search.cc tries them while speed / best > 0.49)."""
    a = arch(topo)
    if topo.nodes == 1:
        total = NVLINK_GBPS[a] * NVLINKS[a] if topo.intra.kind.lower() in ("nvlink", "nvswitch") \
            else min(topo.intra.bandwidth / GB, PCIE_GBPS[a])
        channels = max(1, min(16, round(total / 30)))
        return Graph(2 * channels, total / (2 * channels))
    # a rail that is a share of a NIC (one GPU's group over a NIC its node's GPUs share) is a whole NIC to NCCL
    nic, nics = topo.network.bandwidth_per_physical_nic / GB, max(1, round(topo.network.physical_nics *
                                                                           topo.network.nic_share))
    fitting = [s for s in INTER_SPEEDS[a] if s <= min(nic, PCIE_GBPS[a])] or [INTER_SPEEDS[a][-1]]
    # the first speed the path carries, or a lower one (down to half of it) whose more channels carry more
    speed = max((s for s in fitting if s > 0.49 * fitting[0]), key=lambda s: min(32, nics * max(1, int(nic // s))) * s)
    channels = min(32, nics * max(1, int(nic // speed)))
    if speed >= 25 and not (a != "sm80" and speed < 50 and channels > 4):  # ncclTopoDupChannels
        channels, speed = min(32, 2 * channels), speed / 2
    return Graph(channels, speed)


def nvls_supported(topo: Topology) -> bool:
    """NVLink SHARP: Hopper or newer GPUs on an NVSwitch (an NVLink node of more than two GPUs)."""
    return arch(topo) in NVLS_EFFICIENCY and topo.gpus_per_node > 2 and \
        topo.intra.kind.lower() in ("nvlink", "nvswitch")


def nvls_bus_bandwidth(topo: Topology) -> float:
    """NVLS (one node) or NVLS-tree (several) all-reduce bus bandwidth: one channel per head GPU (per NIC across
    nodes), each at min(intra × NVLS efficiency × (heads − 1)/heads × 2, inter[, cap]); the intra speed is the
    fastest the NVSwitch ports carry for heads + 1 channels (H100: 40 GB/s, B200: 80); at most 32 heads. Across
    nodes the NVLink domain's own reduction still carries every byte, so NVLS-tree never exceeds NVLS in one node
    (a rack of 72 GPUs is one NVLink domain, not a node of 72 heads)."""
    a, g = arch(topo), min(topo.gpus_per_node, MAX_NVLS_HEADS)
    speeds = INTRA_SPEEDS[a]
    total = NVLINK_GBPS[a] * NVLINKS[a]
    intra = next((s for s in speeds if s * (g + 1) <= total), speeds[-1])
    per = intra * NVLS_EFFICIENCY[a] * (g - 1) / g * 2
    domain = g * min(per, min(2 * intra, speeds[0]))
    if topo.nodes == 1:
        return domain
    heads = min(topo.network.nics_per_node, MAX_NVLS_HEADS)  # one per NIC rail (p5's four EFA per GPU striped)
    inter = ring_graph(topo).bus / heads * (2 if topo.nodes <= 2 else 1)
    return min(domain, heads * min(per, inter, NVLS_TREE_CAP[a][_scale(topo)]))


def nvls_pipeline(topo: Topology, nbytes: float) -> float:
    """The share of NVLS's bandwidth a message fills its pipeline to: k chunks of 128 KiB (NCCL_NVLS_CHUNKSIZE) on
    each of its channels (16 on Hopper; 24 on one Blackwell node, 32 across), through D stages (the switch's
    reduction and multicast; across nodes also the send and the receive): k / (k + D − 1). On 2 × 8 H100 it gives
    0.57, 0.84 and 0.96 at 8, 32 and 128 MiB, where nccl-tests#309's increments show 0.45, 0.83 and 0.97."""
    channels = NVLS_CHANNELS[arch(topo)][topo.nodes > 1]
    chunks = max(nbytes / (channels * NVLS_CHUNK), 1e-9)
    stages = 4 if topo.nodes > 1 else 2
    return chunks / (chunks + stages - 1)


def tree_correction(proto: int, nbytes: float) -> float:
    i = int(math.log2(max(nbytes, 64) / 64))
    table = TREE_CORRECTION[proto]
    return table[min(i, len(table) - 1)]


def channels_in_use(topo: Topology, op: str, algo: str, proto: int, nbytes: float) -> float:
    """The fraction of its channels NCCL runs a collective of ``nbytes`` (its size as nccl-tests counts it) on: one
    fewer while the bytes would give each thread less than its threshold (ring LL: × ranks), and none with under
    32 KiB of traffic (all-reduce: twice its bytes; LL: × 4)."""
    graph = ring_graph(topo)
    full = 2 * graph.channels if topo.nodes > 1 else graph.channels
    if algo == "nvls":
        return 1.0
    key = ("ring" if algo != "tree" else "tree", proto)
    threshold = THREAD_THRESHOLD[proto] * (topo.ranks if key == ("ring", 0) else 1)
    by_threads = nbytes // (MAX_THREADS[key] * threshold)
    traffic = (2 if op == "allreduce" else 1) * nbytes * (4 if proto == 0 else 1)
    by_traffic = math.ceil(traffic / MIN_TRAFFIC_PER_CHANNEL)
    return max(1.0, min(full, by_threads, by_traffic)) / full


def size_factor(topo: Topology, op: str, algo: str, proto: int, nbytes: float) -> float:
    """What a collective of ``nbytes`` gets of the bandwidth it would at large sizes: the channels in use, and for
    the tree NCCL's own correction at that size (treeCorrectionFactor, NVIDIA's measurements of its mid band;
    1 at 128 MiB and beyond for LL and LL128, 0.9 for Simple, taken relative to that)."""
    factor = channels_in_use(topo, op, algo, proto, nbytes)
    if algo == "tree":
        factor *= tree_correction(proto, nbytes) / TREE_CORRECTION[proto][-1]
    return factor


def tree_ceiling(topo: Topology, op: str, proto: int, nbytes: float) -> float:
    """Bytes/s NCCL's tree all-reduce reaches at most: its graph channels × the per-channel cap of the protocol
    (perChMaxTreeBws, perChMaxTreeLL128Bws; LL: llMaxBws), the tree's bus-to-algorithm factor ½, at the size's
    channels and correction. Measured on 2 × 8 A100 over 8 × 200 Gb/s: 188 GB/s bus bandwidth, the cap 189."""
    a, n, g = arch(topo), _scale(topo), ring_graph(topo)
    cap = (LL_MAX[a][n], g.channels * TREE_LL128_CAP[a][n], g.channels * TREE_CAP[a][n])[proto]
    return cap * 0.5 * GB * size_factor(topo, op, "tree", proto, nbytes)


def nvls_ceiling(topo: Topology, op: str, nbytes: float) -> float:
    """Bytes/s an NVLS (NVLS-tree across nodes) all-reduce of ``nbytes`` reaches: NCCL's bus bandwidth as its
    chunk pipeline fills, over the op's bus factor (NVLS-tree on Blackwell also takes the tree's size table, as
    tuning.cc applies it on x86 hosts)."""
    bus = nvls_bus_bandwidth(topo) * nvls_pipeline(topo, nbytes)
    if arch(topo) == "sm100" and topo.nodes > 1:
        bus *= tree_correction(2, nbytes)
    p = topo.ranks
    if p < 2:
        return math.inf
    ratio = {"allreduce": p / (2 * (p - 1)), "allgather": p / (p - 1), "reducescatter": p / (p - 1)}.get(op, 1.0)
    return bus * ratio * GB

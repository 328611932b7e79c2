"""Cluster topologies: nodes × GPUs, intra-node links, NICs and the switch fabric.

A topology comes from a YAML file (a path, or a preset name under ``topologies/``) or from the name
grammar ``NxG-<fabric><Gbps>[x<NICs>]`` (see :func:`from_name`). Bandwidths are per direction.

The network seen by a message, as resources with a bandwidth each:
- inside a node, every GPU has a port to the node's switch (NVLink/NVSwitch or PCIe): ``gtx``/``grx``;
- between nodes, GPU ``g`` uses NIC ``g mod nics_per_node`` (rail mapping): ``ntx``/``nrx``;
- in a two-level fat-tree, leaves hold ``nodes_per_leaf`` nodes each and a message between leaves also
  crosses the source leaf's uplink (``up``) and the destination leaf's downlink (``down``), whose
  bandwidth is the leaf's total NIC bandwidth divided by the oversubscription ratio.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from arcsim.catalog import LIBRARY_NAMES, unknown_library
from arcsim.errors import TopologyError, UnitError
from arcsim.files import packaged, read_yaml
from arcsim.units import (
    parse_duration,
    parse_rate,
    parse_size,
)

FABRICS = ("switch", "fat-tree")
DEFAULT_TOPOLOGY = "8x8-ib100"  # what every command prices on when none is named
GRAMMAR = ("NxG-<fabric><Gbps>[x<NICs>][-<gpu>][-<link>]  (fabric: ib, roce, eth or tcp (NCCL over sockets); gpu: "
           "a catalogue device; link inside the node: nvlink, pcie — default nvlink for ib and roce, pcie for eth and "
           "tcp; e.g. 8x8-ib100, "
           "8x8-ib400x8-h100, 8x1-eth10, 4x8-eth25-a100-nvlink)")
INSTANCE_GRAMMAR = "<N>x<instance>, e.g. 4xp5, 2xdgx-h100, 16xnd-h100-v5"
_INSTANCE_RE = re.compile(r"^(?P<n>\d+)x(?P<instance>[a-z][a-z0-9.-]*)$", re.IGNORECASE)
_NAME_RE = re.compile(r"^(?P<n>\d+)x(?P<g>\d+)-(?P<fab>ib|roce|eth|tcp)(?P<gbps>\d+(?:\.\d+)?)(?:x(?P<nics>\d+))?"
                      r"(?P<suffixes>(?:-[a-z][a-z0-9]*){0,2})$", re.IGNORECASE)
INTRA_LINKS = ("nvlink", "pcie")
MAX_EFFICIENCY = 2.0  # a calibrated network carries at most twice what the model says (a bad fit past it)
MAX_RANKS = 131_072  # past the largest GPU clusters built (~100,000 GPUs); per-rank state must fit in memory

ResourceKey = tuple  # ("gtx", rank) | ("grx", rank) | ("ntx", node, nic) | ("nrx", node, nic) | ("up"|"down", leaf)


@dataclass(frozen=True)
class IntraLink:
    """Each GPU's port to the node's switch; bandwidth per direction."""

    kind: str
    bandwidth: float  # bytes/s
    latency: float  # s


@dataclass(frozen=True)
class Network:
    """The inter-node network: NICs per node, their bandwidth, and the fabric joining them."""

    kind: str
    nics_per_node: int
    bandwidth_per_nic: float  # bytes/s, per direction
    latency: float  # s, end to end
    fabric: str = "switch"
    nodes_per_leaf: int = 0  # fat-tree only
    oversubscription: float = 1.0  # fat-tree only: leaf down-bandwidth / up-bandwidth
    nics_per_rail: int = 1  # physical NICs striped into each of the nics_per_node rails (p5: 4 EFA per GPU)
    nic_share: float = 1.0  # the share of a physical NIC each rail is (a group's rail over a NIC shared by G GPUs)
    # what `arcsim calibrate --nccl-tests` fits on a cluster's own tables, on top of the library's model: the share
    # of the modelled network bandwidth the cluster carries, and the cost of one network crossing on all channels
    # (µs; None: the transport's own, arcsim.collectives.libraries.nccl.NET_STEP_US)
    efficiency: float = 1.0
    crossing_us: float | None = None
    mtu: int = 1500  # bytes per IP packet on an Ethernet without RDMA (9000: jumbo frames): TCP's payload share

    @property
    def physical_nics(self) -> int:
        return self.nics_per_node * self.nics_per_rail

    @property
    def bandwidth_per_physical_nic(self) -> float:
        return self.bandwidth_per_nic / self.nics_per_rail / self.nic_share


def rails(nics: int, bandwidth_per_nic: float, gpus: int, where: str) -> tuple[int, float, int]:
    """NICs as arcsim prices them: (rails, bandwidth per rail, NICs per rail). Up to one NIC per GPU each NIC is a
    rail; more NICs than GPUs (a p5 node's 32 × 100 Gb/s EFA for 8 GPUs) are striped, ``NICs / GPUs`` to each GPU's
    rail, as NCCL spreads a GPU's channels over the NICs next to it — so their bandwidths add, and only whole
    multiples of the GPUs are accepted."""
    if gpus < 1:
        raise TopologyError(f"{where}: gpus_per_node must be a whole number ≥ 1 (got {gpus})")
    if nics <= gpus:
        return nics, bandwidth_per_nic, 1
    if nics % gpus:
        raise TopologyError(f"{where}: nics_per_node {nics} for {gpus} GPUs per node: more NICs than GPUs must be a "
                            f"whole number per GPU (e.g. {gpus * (nics // gpus)} or {gpus * (nics // gpus + 1)})")
    return gpus, bandwidth_per_nic * (nics // gpus), nics // gpus


@dataclass(frozen=True)
class Effects:
    """What a synchronous data-parallel step pays beyond its collectives' own schedule, and what grows with the
    rank count where the schedule's terms do not (arcsim/run/effects.py prices them; docs/run.md says whence each):

    - ``compute_cv``: σ/μ of one rank's compute time per step. Every bucket's all-reduce waits for the slowest rank,
      so the step's compute is the expected maximum of p draws: μ (1 + cv · E[max of p standard normals]).
    - ``step_jitter_s``: the mean extra time (exponential) of one network crossing in one step of a collective
      over TCP (retransmits, interrupt coalescing, socket wake-ups). A ring step ends when its slowest crossing
      does, so a collective over N nodes pays steps × H_N × this (H_N: the N-th harmonic number, E[max of N
      exponentials]); 2(p − 1) steps for a ring all-reduce.
    - ``interference``: backward slowed by this fraction of the communication it overlaps (the collective's
      kernels take SMs and memory bandwidth; over sockets the host copies through pinned buffers too).
    """

    compute_cv: float = 0.0
    step_jitter_s: float = 0.0
    interference: float = 0.0

    @property
    def none(self) -> bool:
        return self.compute_cv == 0 and self.step_jitter_s == 0 and self.interference == 0

    def to_dict(self) -> dict[str, float]:
        return {"compute_cv": self.compute_cv, "step_jitter_s": self.step_jitter_s, "interference": self.interference}


NO_EFFECTS = Effects()
# Ethernet (TCP) clusters by default: fitted by benchmarks/published_scaling.py --fit on the dense-scaling series
# of benchmarks/published/dense_scaling.csv marked fit=1 (held-out error printed there and in docs/run.md)
ETH_EFFECTS = Effects(compute_cv=0.03, step_jitter_s=0.0, interference=0.2)


@dataclass(frozen=True)
class Band:
    """A measured line for collectives of at most ``up_to`` bytes (the small-message regime)."""

    up_to: float        # bytes, as nccl-tests count the size
    latency: float      # s
    bandwidth: float    # bytes/s


@dataclass(frozen=True)
class Calibrated:
    """A measured collective: time = latency + size / bandwidth (size as nccl-tests count it), with its own
    line for small messages when they were measured apart (``small``)."""

    latency: float      # s
    bandwidth: float    # bytes/s
    r2: float = 1.0     # fit quality
    ranks: int = 0      # rank count it was measured at
    library: str = ""   # the library that ran the measured collectives (calibrate: gloo)
    small: Band | None = None
    # (size, seconds) measured, sizes increasing and times not decreasing: priced between them by interpolation
    measured: tuple[tuple[float, float], ...] = ()
    burst: float = 0.0  # bytes the line carries at no cost (a token bucket's burst): latency + (size − burst)⁺ / bw

    def scaled(self, bandwidth: float = 1.0, latency: float = 1.0) -> Calibrated:
        """The same fits on a network ``bandwidth`` times as fast and with ``latency`` times the latency; each
        measured point moves as the lines do at its size (its distance from them kept as a ratio)."""
        small = None if self.small is None else Band(self.small.up_to, self.small.latency * latency,
                                                     self.small.bandwidth * bandwidth)
        out = dataclasses.replace(self, latency=self.latency * latency, bandwidth=self.bandwidth * bandwidth,
                                  small=small, measured=())
        return dataclasses.replace(out, measured=tuple((n, t * out.line(n) / self.line(n)) for n, t in self.measured))

    def line(self, nbytes: float) -> float:
        """The fitted model: latency + (size − burst)⁺ / bandwidth, the small band's line up to its size."""
        if self.small is not None and nbytes <= self.small.up_to:
            return self.small.latency + nbytes / self.small.bandwidth
        return self.latency + max(0.0, nbytes - self.burst) / self.bandwidth

    def time(self, nbytes: float) -> float:
        """The fitted model through the measured points: at a measured size its time; between two, straight
        from one to the other in the model's time (the model gives the shape — a burst's knee, say — and the
        points the level; monotone as both are); beyond them the model scaled to meet the nearest point;
        without points the model."""
        pts = self.measured
        if len(pts) < 2:
            return self.line(nbytes)
        if nbytes <= pts[0][0] or nbytes >= pts[-1][0]:
            n, t = pts[0] if nbytes <= pts[0][0] else pts[-1]
            return t * self.line(nbytes) / self.line(n)
        hi = next(i for i, (n, _) in enumerate(pts) if n >= nbytes)
        (n0, t0), (n1, t1) = pts[hi - 1], pts[hi]
        u0, u1 = self.line(n0), self.line(n1)
        along = (self.line(nbytes) - u0) / (u1 - u0) if u1 > u0 else (nbytes - n0) / (n1 - n0)
        return t0 + (t1 - t0) * along


@dataclass(frozen=True)
class Topology:
    name: str
    nodes: int
    gpus_per_node: int
    intra: IntraLink
    network: Network
    gamma: float = 0.0  # s per byte reduced
    stragglers: Mapping[int, float] = field(default_factory=dict)  # rank -> compute slowdown (>= 1)
    jitter: float = 0.0  # mean extra latency per message, as a fraction of the link latency
    effects: Effects = NO_EFFECTS  # stragglers by distribution, TCP step jitter, interference (arcsim.strategy.effects)
    description: str = ""
    source: str = ""
    calibration: Mapping[str, Calibrated] = field(default_factory=dict)  # op → measured fit (arcsim calibrate)
    # group (node: one node's ranks; inter: one rail of one rank per node, all rails at once) → op → measured fit
    group_calibration: Mapping[str, Mapping[str, Calibrated]] = field(default_factory=dict)
    gpu: str | None = None  # the catalogue device its ranks are (devices/*.yaml); None: compute measured here
    library: str = "ideal"  # the communication library (arcsim.collectives.libraries): nccl, gloo, mpi, ideal

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def node_bandwidth(self) -> float:
        return self.network.nics_per_node * self.network.bandwidth_per_nic

    @property
    def uplink_bandwidth(self) -> float:
        net = self.network
        return net.nodes_per_leaf * self.node_bandwidth / net.oversubscription

    @property
    def is_homogeneous(self) -> bool:
        """True when every node behaves alike (no stragglers, no jitter)."""
        return not self.stragglers and self.crossing_jitter_s == 0.0

    @property
    def crossing_jitter_s(self) -> float:
        """The one jitter model: the mean extra delay, exponential, of one message crossing nodes — the effects'
        ``step_jitter`` (seconds) plus the file's ``jitter`` × the network latency. The DES draws it for every
        crossing message; the closed form adds its expectation over a collective's steps (arcsim.strategy.effects)."""
        return self.effects.step_jitter_s + self.jitter * self.network.latency if self.nodes > 1 else 0.0

    def slowdown(self, rank: int) -> float:
        return float(self.stragglers.get(rank, 1.0))

    def leaf_of_node(self, node: int) -> int:
        return node // self.network.nodes_per_leaf if self.network.fabric == "fat-tree" else 0

    def with_overrides(self, bandwidth: float | None = None, latency: float | None = None,
                       library: str | None = None, nodes: int | None = None, gpu: str | None = None) -> Topology:
        """This topology with the network's per-NIC bandwidth and one-way latency, its library, node count or GPU
        replaced; measured fits (calibration) scale with the bandwidth and latency they were measured at."""
        from arcsim.devices.catalog import priced_gpu

        net, calib, rail = self.network, dict(self.calibration), dict(self.group_calibration.get("inter", {}))
        if bandwidth is not None:
            scale = bandwidth / net.bandwidth_per_nic
            net = dataclasses.replace(net, bandwidth_per_nic=bandwidth)
            calib, rail = ({op: c.scaled(bandwidth=scale) for op, c in fits.items()} for fits in (calib, rail))
        if latency is not None:
            scale = latency / net.latency if net.latency > 0 else 1.0
            net = dataclasses.replace(net, latency=latency)
            calib, rail = ({op: c.scaled(latency=scale) for op, c in fits.items()} for fits in (calib, rail))
        groups = {**self.group_calibration, **({"inter": rail} if rail else {})}  # the node's own links stay
        return dataclasses.replace(self, network=net, calibration=calib, group_calibration=groups,
                                   nodes=nodes or self.nodes, gpu=priced_gpu(gpu, self.gpu),
                                   library=library or self.library)

    # -- paths, vectorised for the closed-form engine ------------------------------------------------
    def link_arrays(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For each message: (same_node flag, latency s, bandwidth of its path when alone on it)."""
        g = self.gpus_per_node
        src_node, dst_node = src // g, dst // g
        same = src_node == dst_node
        latency = np.where(same, self.intra.latency, self.network.latency)
        inter_bw: Any = self.network.bandwidth_per_nic
        if self.network.fabric == "fat-tree":
            npl = self.network.nodes_per_leaf
            cross_leaf = (src_node // npl) != (dst_node // npl)
            inter_bw = np.where(cross_leaf, min(inter_bw, self.uplink_bandwidth), inter_bw)
        bandwidth = np.where(same, self.intra.bandwidth, inter_bw)
        return same, latency.astype(float), np.asarray(bandwidth, dtype=float)

    # -- paths as shared resources, for the discrete-event engine -----------------------------------
    def path(self, src: int, dst: int) -> tuple[tuple[ResourceKey, ...], float]:
        """Resources a message from ``src`` to ``dst`` crosses, and its latency."""
        g = self.gpus_per_node
        src_node, dst_node = src // g, dst // g
        if src_node == dst_node:
            return (("gtx", src), ("grx", dst)), self.intra.latency
        nics = self.network.nics_per_node
        keys: list[ResourceKey] = [("ntx", src_node, (src % g) % nics)]
        if self.network.fabric == "fat-tree":
            src_leaf, dst_leaf = self.leaf_of_node(src_node), self.leaf_of_node(dst_node)
            if src_leaf != dst_leaf:
                keys += [("up", src_leaf), ("down", dst_leaf)]
        keys.append(("nrx", dst_node, (dst % g) % nics))
        return tuple(keys), self.network.latency

    def capacity(self, key: ResourceKey) -> float:
        kind = key[0]
        if kind in ("gtx", "grx"):
            return self.intra.bandwidth
        if kind in ("ntx", "nrx"):
            return self.network.bandwidth_per_nic
        return self.uplink_bandwidth

    def translation_period(self) -> int:
        """Smallest node shift that maps this topology onto itself (``nodes`` when none smaller does)."""
        if not self.is_homogeneous:
            return self.nodes
        if self.network.fabric == "fat-tree":
            npl = self.network.nodes_per_leaf
            return npl if self.nodes % npl == 0 else self.nodes
        return 1

    def canonical_key(self, key: ResourceKey, period: int) -> ResourceKey:
        """The resource ``key`` maps to when nodes are shifted back into the first ``period`` nodes."""
        kind = key[0]
        if kind in ("gtx", "grx"):
            return (kind, key[1] % (period * self.gpus_per_node))
        if kind in ("ntx", "nrx"):
            return (kind, key[1] % period, key[2])
        leaves = max(1, period // max(1, self.network.nodes_per_leaf))
        return (kind, key[1] % leaves)

    def rotation_period(self) -> int:
        """Smallest shift of the GPU index inside every node at once (GPU i → i + shift mod g, NIC with it) that maps
        this topology onto itself: 1 when the NICs divide the GPUs, else ``gpus_per_node`` (none smaller does)."""
        if not self.is_homogeneous or self.gpus_per_node % self.network.nics_per_node:
            return self.gpus_per_node
        return 1

    def rotated_key(self, key: ResourceKey, rotation: int) -> tuple[ResourceKey, int]:
        """The resource ``key`` maps to when GPU indices are rotated back below ``rotation`` (a multiple of
        :meth:`rotation_period` dividing g), and how many of the g / rotation rotations leave it in place: a GPU's
        ports 1, a NIC (g / rotation) / (its orbit's size), the fabric's up- and downlinks all of them."""
        g, kind = self.gpus_per_node, key[0]
        if kind in ("gtx", "grx"):
            return (kind, key[1] - key[1] % g + key[1] % g % rotation), 1
        if kind in ("ntx", "nrx"):
            nics = self.network.nics_per_node
            orbit = math.gcd(rotation, nics)
            return (kind, key[1], key[2] % orbit), (g // rotation) // (nics // orbit)
        return key, g // rotation

    # -- rendering -----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        net = self.network
        out: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "source": self.source,
            "ranks": self.ranks,
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "gpu": self.gpu,
            "library": self.library,
            "intra": {"kind": self.intra.kind, "bandwidth_Bps": self.intra.bandwidth,
                      "latency_s": self.intra.latency},
            "network": {
                "kind": net.kind,
                "nics_per_node": net.physical_nics,
                "bandwidth_per_nic_Bps": net.bandwidth_per_physical_nic,
                "rails_per_node": net.nics_per_node,
                "bandwidth_per_rail_Bps": net.bandwidth_per_nic,
                "bandwidth_per_node_Bps": self.node_bandwidth,
                "latency_s": net.latency,
                "fabric": net.fabric,
            },
            "gamma_s_per_byte": self.gamma,
            "stragglers": {str(k): v for k, v in sorted(self.stragglers.items())},
            "jitter": self.jitter,
            "effects": self.effects.to_dict(),
        }
        if self.calibration:
            out["calibration"] = _fits_dict(self.calibration)
        if self.group_calibration:
            out["calibration_groups"] = {group: _fits_dict(fits) for group, fits in self.group_calibration.items()}
        if net.fabric == "fat-tree":
            out["network"]["nodes_per_leaf"] = net.nodes_per_leaf
            out["network"]["oversubscription"] = net.oversubscription
            out["network"]["uplink_bandwidth_per_leaf_Bps"] = self.uplink_bandwidth
        if net.efficiency != 1.0 or net.crossing_us is not None:
            out["network"].update(efficiency=net.efficiency, crossing_us=net.crossing_us)
        if net.mtu != 1500:
            out["network"]["mtu"] = net.mtu
        return out


def splits_into_nodes(ranks: int, per_node: int) -> bool:
    """Whether ``ranks`` numbered node by node make two or more whole nodes of ``per_node``."""
    return per_node >= 1 and ranks % per_node == 0 and ranks // per_node >= 2


def _validate(t: Topology) -> None:
    where = f" in topology {t.name!r}" + (f" ({t.source})" if t.source else "")

    def bad(msg: str) -> TopologyError:
        return TopologyError(msg + where)

    if t.nodes < 1 or t.gpus_per_node < 1:
        raise bad(f"nodes and gpus_per_node must be ≥ 1 (got {t.nodes} and {t.gpus_per_node})")
    if t.ranks > MAX_RANKS:
        raise bad(f"{t.nodes:,} nodes × {t.gpus_per_node:,} GPUs is {t.ranks:,} ranks; arcsim models at most "
                  f"{MAX_RANKS:,} (the largest GPU clusters built hold about 100,000)")
    if t.ranks < 2:
        raise bad("a cluster needs at least 2 ranks for a collective; raise nodes or gpus_per_node")
    net = t.network
    for label, value in (("intra.bandwidth", t.intra.bandwidth), ("network.bandwidth_per_nic", net.bandwidth_per_nic)):
        if not (value > 0 and math.isfinite(value)):
            raise bad(f"{label} must be a positive bandwidth such as '100Gbps' (got {value:g} B/s)")
    for label, value in (("intra.latency", t.intra.latency), ("network.latency", net.latency)):
        if not (value >= 0 and math.isfinite(value)):
            raise bad(f"{label} must be a non-negative duration such as '5us'")
    if net.nics_per_node < 1 or net.nics_per_node > t.gpus_per_node:
        raise bad(f"network.nics_per_node must be between 1 and gpus_per_node={t.gpus_per_node} "
                  f"(got {net.nics_per_node})")
    if net.fabric not in FABRICS:
        raise bad(f"network.fabric must be one of {', '.join(FABRICS)} (got {net.fabric!r})")
    if net.fabric == "fat-tree":
        if net.nodes_per_leaf < 1:
            raise bad("a fat-tree needs network.nodes_per_leaf ≥ 1")
        if not (math.isfinite(net.oversubscription) and net.oversubscription >= 1.0):
            raise bad(f"network.oversubscription must be ≥ 1 (got {net.oversubscription:g})")
    if not 576 <= net.mtu <= 9216:
        raise bad(f"network.mtu is the IP packet size in bytes: 1500 on most Ethernet, 9000 with jumbo frames "
                  f"(between 576 and 9216; got {net.mtu})")
    if not (math.isfinite(net.efficiency) and 0 < net.efficiency <= MAX_EFFICIENCY):
        raise bad(f"network.efficiency is the share of the modelled bandwidth the network carries: give a number "
                  f"in (0, {MAX_EFFICIENCY:g}] (got {net.efficiency:g})")
    if net.crossing_us is not None and not (math.isfinite(net.crossing_us) and net.crossing_us >= 0):
        raise bad(f"network.crossing_us must be a finite number of µs ≥ 0 (got {net.crossing_us:g})")
    for label, value in (("gamma", t.gamma), ("jitter", t.jitter)):
        if not (math.isfinite(value) and value >= 0):
            raise bad(f"{label} must be a finite number ≥ 0 (got {value:g})")
    for label, value in t.effects.to_dict().items():
        if not (math.isfinite(value) and value >= 0):
            raise bad(f"effects.{label} must be a finite number ≥ 0 (got {value:g})")
    for rank, slow in t.stragglers.items():
        if not 0 <= rank < t.ranks:
            raise bad(f"straggler rank {rank} is outside 0..{t.ranks - 1}")
        if not (math.isfinite(slow) and slow >= 1.0):
            raise bad(f"straggler slowdown for rank {rank} must be a finite number ≥ 1, as a rank that never "
                      f"arrives stalls every collective (got {slow:g})")
    if t.library not in LIBRARY_NAMES:
        raise bad(unknown_library(t.library))


# -- presets and lookup ------------------------------------------------------------------------------
def preset_dirs() -> list[Path]:
    """Where preset names are looked up: the folders of $ARCSIM_TOPOLOGY_PATH (separated as PATH is), then the
    presets shipped in the package. The working directory is never searched: name a YAML file by its path."""
    user = [Path(d) for d in os.environ.get("ARCSIM_TOPOLOGY_PATH", "").split(os.pathsep) if d]
    for d in user:
        if not d.is_dir():
            raise TopologyError(f"$ARCSIM_TOPOLOGY_PATH names {str(d)!r}, which is not a folder; fix or unset it")
    return [*user, packaged("topologies")]


def preset_names() -> list[str]:
    names = {p.stem for d in preset_dirs() for p in d.glob("*.yaml")}
    if not names:
        raise TopologyError(f"the preset topologies are missing from the package ({packaged('topologies')}); "
                            "reinstall arcsim")
    return sorted(names, key=_preset_sort_key)


def _preset_sort_key(name: str) -> tuple:
    m = re.match(r"^(\d+)x(\d+)", name)
    return (int(m[1]) * int(m[2]), name) if m else (1 << 30, name)


def load_topology(spec: str) -> Topology:
    """A topology from a YAML path, a preset name, or the name grammar."""
    if not spec.strip():
        raise TopologyError(f"the topology is empty; give a preset ({', '.join(preset_names()[:3])}, …), a YAML "
                            "file or a name such as 8x8-ib100")
    path = Path(spec)
    if path.is_dir():
        raise TopologyError(f"topology {spec!r} is a directory; give a topology YAML file, a preset or a name "
                            f"such as 8x8-ib100")
    if spec.endswith((".yaml", ".yml")) or path.is_file():
        if not path.is_file():
            raise TopologyError(f"topology file {spec!r} does not exist")
        return load_yaml(path)
    preset = preset_file(spec)
    if preset is not None:
        return load_yaml(preset)
    if _NAME_RE.match(spec):
        return from_name(spec)
    m = _INSTANCE_RE.match(spec)
    if m:
        return from_instance(int(m["n"]), m["instance"].lower(), spec)
    raise TopologyError(
        f"unknown topology {spec!r}; presets: {', '.join(preset_names())}; instances ({INSTANCE_GRAMMAR}): "
        f"{', '.join(instance_names())}; or a YAML path; or the grammar {GRAMMAR}"
    )


def preset_file(name: str) -> Path | None:
    """The YAML file of preset ``name``: the first found on $ARCSIM_TOPOLOGY_PATH, then among the shipped ones."""
    return next((d / f"{name}.yaml" for d in preset_dirs() if (d / f"{name}.yaml").is_file()), None)


def instance_file(instance: str) -> Path | None:
    """The YAML file of a node type (``instances/<instance>.yaml`` in the first preset folder that has it)."""
    return next((d / "instances" / f"{instance}.yaml" for d in preset_dirs()
                 if (d / "instances" / f"{instance}.yaml").is_file()), None)


def topology_files(spec: str) -> list[Path]:
    """The files :func:`load_topology` reads for ``spec`` (none for a name of the grammar)."""
    if not spec or Path(spec).is_dir():
        return []
    if spec.endswith((".yaml", ".yml")) or Path(spec).is_file():
        return [Path(spec)]
    preset = preset_file(spec)
    if preset is not None:
        return [preset]
    m = None if _NAME_RE.match(spec) else _INSTANCE_RE.match(spec)
    found = instance_file(m["instance"].lower()) if m else None
    return [found] if found is not None else []


def instance_names() -> list[str]:
    """The node types of clouds and vendors arcsim knows (``<N>x<instance>``, e.g. 4xp5)."""
    return sorted({p.stem for d in preset_dirs() for p in (d / "instances").glob("*.yaml")})


def from_instance(nodes: int, instance: str, name: str) -> Topology:
    """``nodes`` nodes of a known instance type (topologies/instances/<instance>.yaml: one node, with its sources)."""
    if nodes < 1:
        raise TopologyError(f"topology {name!r} has {nodes} nodes; give at least 1 ({INSTANCE_GRAMMAR})")
    path = instance_file(instance)
    if path is None:
        raise TopologyError(f"unknown instance type {instance!r} in {name!r}; known: {', '.join(instance_names())} "
                            f"({INSTANCE_GRAMMAR})")
    raw = read_yaml(path, "instance file", TopologyError)
    if not isinstance(raw, dict):
        raise TopologyError(f"{path}: expected a mapping with gpus_per_node, intra, network")
    if "nodes" in raw:
        raise TopologyError(f"{path}: an instance describes one node; remove its field 'nodes'")
    source = raw.pop("source", "")
    topo = from_dict({**raw, "nodes": nodes, "name": name}, str(path))
    return dataclasses.replace(topo, source=f"{source} ({path.name})" if source else str(path))


def from_name(name: str) -> Topology:
    """Build a topology from ``NxG-<fabric><Gbps>[x<NICs>][-<gpu>][-<link>]`` (case-insensitive).

    ``Gbps`` is the bandwidth of ONE NIC (per direction); ``xNICs`` the NICs per node (default 1).
    Defaults by fabric: ib 5 µs, roce 7 µs, eth and tcp (the same: Ethernet without RDMA, NCCL over its socket
    transport) 30 µs end-to-end latency. Inside a node: NVLink for ib and roce, PCIe for eth and tcp, unless
    ``-nvlink`` or ``-pcie`` says otherwise; NVLink carries the named GPU's
    generation (V100 150 GB/s per GPU per direction, A100 300, H100/H200 450, B200 900), else 450 GB/s when each
    GPU's NICs carry ≥ 400 Gb/s and 300 below; PCIe 4.0 ×16 25 GB/s (a V100's 3.0: 12.5); 3 µs. More NICs
    than GPUs are striped, a whole number to each GPU (:func:`rails`).
    """
    m = _NAME_RE.match(name)
    if not m:
        raise TopologyError(f"topology name {name!r} does not follow the grammar {GRAMMAR}")
    nodes, gpus, gbps = int(m["n"]), int(m["g"]), float(m["gbps"])
    nics = int(m["nics"] or 1)
    rail_count, rail_bandwidth, per_rail = rails(nics, gbps * 1e9 / 8, gpus, f"topology name {name!r}")
    fab = m["fab"].lower()
    fab = "eth" if fab == "tcp" else fab
    fabric_kind = {"ib": "infiniband", "roce": "roce", "eth": "ethernet"}[fab]
    latency = {"ib": 5e-6, "roce": 7e-6, "eth": 30e-6}[fab]
    suffixes = [x.lower() for x in m["suffixes"].split("-")[1:]]
    links = [x for x in suffixes if x in INTRA_LINKS]
    gpu_names = [x for x in suffixes if x not in INTRA_LINKS]
    if len(links) > 1 or len(gpu_names) > 1:
        raise TopologyError(f"topology name {name!r} names {' and '.join(links if len(links) > 1 else gpu_names)}; "
                            f"give at most one gpu and one link ({GRAMMAR})")
    link = links[0] if links else ("pcie" if fab == "eth" else "nvlink")
    gpu_name = gpu_names[0] if gpu_names else None
    if link == "pcie":
        intra = IntraLink("pcie", PCIE3_GPUS.get(gpu_name or "", PCIE_BANDWIDTH), 3e-6)
    else:
        intra = IntraLink("nvlink", _nvlink_bandwidth(gpu_name, rail_bandwidth), 3e-6)
    return Topology(
        name=name,
        nodes=nodes,
        gpus_per_node=gpus,
        intra=intra,
        network=Network(fabric_kind, rail_count, rail_bandwidth, latency, nics_per_rail=per_rail),
        description=f"{nodes} nodes × {gpus} GPUs, {nics} × {gbps:g} Gb/s {fabric_kind} NIC(s) per node; "
                    f"GPUs in a node on {_link_words(link, gpu_name)} (built from the name grammar)",
        source="name grammar",
        gpu=_gpu(gpu_name, name),
        library="nccl",
        effects=ETH_EFFECTS if fab == "eth" else NO_EFFECTS,
    )


# NVLink per GPU per direction: NVLink 2 (V100 SXM2: 6 links × 25 GB/s), 3, 4, 5
NVLINK_BY_GPU = {"v100": 150e9, "a100": 300e9, "h100": 450e9, "h200": 450e9, "b200": 900e9}
# PCIe ×16 as NCCL sees it: 4.0 (25 GB/s, ≈ 80 % of its 31.5 raw), and 3.0 for the GPUs that have only that (the same
# share of 15.75 GB/s)
PCIE_BANDWIDTH = 25e9
PCIE3_GPUS = {"v100": 12.5e9}


def _link_words(link: str, gpu: str | None) -> str:
    if link == "nvlink":
        return "NVLink"
    return "PCIe 3.0 ×16" if (gpu or "") in PCIE3_GPUS else "PCIe 4.0 ×16"


def _nvlink_bandwidth(gpu: str | None, rail_bandwidth: float) -> float:
    """NVLink per GPU per direction: the GPU's generation when the name gives one (NVLINK_BY_GPU), else 450 GB/s
    where each GPU's NICs carry ≥ 400 Gb/s (H100-class nodes), 300 GB/s below (A100-class)."""
    if gpu and gpu.lower() in NVLINK_BY_GPU:
        return NVLINK_BY_GPU[gpu.lower()]
    return 450e9 if rail_bandwidth * 8 / 1e9 >= 400 else 300e9


def load_yaml(path: Path) -> Topology:
    raw = read_yaml(path, "topology file", TopologyError)
    if not isinstance(raw, dict):
        raise TopologyError(f"{path}: expected a mapping with nodes, gpus_per_node, intra, network")
    return from_dict(raw, source=str(path), default_name=path.stem)


def from_dict(raw: Mapping[str, Any], source: str = "", default_name: str = "custom") -> Topology:
    reader = _FieldReader(raw, source)
    intra_raw = reader.mapping("intra", required=False) or {}
    net_raw = reader.mapping("network")
    intra_reader = _FieldReader(intra_raw, source, "intra.")
    net_reader = _FieldReader(net_raw or {}, source, "network.")
    gpus = reader.count("gpus_per_node")
    if gpus > 1 and not intra_raw:
        raise TopologyError(f"{source}: field 'intra' is missing (needed when gpus_per_node > 1)")
    intra = IntraLink(
        kind=intra_reader.text("kind", default="none"),
        bandwidth=intra_reader.quantity("bandwidth", parse_rate, default=1e12),
        latency=intra_reader.quantity("latency", parse_duration, default=0.0),
    )
    fabric = net_reader.text("fabric", default="switch")
    rail_count, rail_bandwidth, per_rail = rails(net_reader.count("nics_per_node", default=1),
                                                 net_reader.quantity("bandwidth_per_nic", parse_rate), gpus, source)
    network = Network(
        kind=net_reader.text("kind"),
        nics_per_node=rail_count,
        bandwidth_per_nic=rail_bandwidth,
        nics_per_rail=per_rail,
        latency=net_reader.quantity("latency", parse_duration),
        fabric=fabric,
        nodes_per_leaf=net_reader.count("nodes_per_leaf", default=0 if fabric != "fat-tree" else None),
        oversubscription=net_reader.number("oversubscription", default=1.0),
        efficiency=net_reader.number("efficiency", default=1.0),
        crossing_us=net_reader.number("crossing_us") if "crossing_us" in (net_raw or {}) else None,
        mtu=net_reader.count("mtu", default=1500),
    )
    stragglers_raw = reader.mapping("stragglers", required=False) or {}
    try:
        stragglers = {int(k): float(v) for k, v in stragglers_raw.items()}
    except (TypeError, ValueError) as exc:
        raise TopologyError(f"{source}: field 'stragglers' must map rank numbers to slowdown factors") from exc
    calibration = _calibration(reader.mapping("calibration", required=False) or {}, source)
    groups = reader.mapping("calibration_groups", required=False) or {}
    unknown_groups = [g for g in groups if g not in CALIBRATED_GROUPS]
    if unknown_groups:
        raise TopologyError(f"{source}: calibration_groups has {', '.join(map(str, unknown_groups))}; measured groups "
                            f"are {', '.join(CALIBRATED_GROUPS)}")
    group_calibration = {g: _calibration(fits or {}, source, f"calibration_groups.{g}.") for g, fits in groups.items()}
    effects_raw = reader.mapping("effects", required=False)
    effects_reader = _FieldReader(effects_raw or {}, source, "effects.")
    base = ETH_EFFECTS if network.kind.lower() in ("ethernet", "eth", "tcp") else NO_EFFECTS
    effects = Effects(compute_cv=effects_reader.number("compute_cv", default=base.compute_cv),
                      step_jitter_s=effects_reader.quantity("step_jitter", parse_duration, default=base.step_jitter_s),
                      interference=effects_reader.number("interference", default=base.interference))
    effects_reader.reject_unknown({"compute_cv", "step_jitter", "interference"})
    reader.reject_unknown({"name", "description", "nodes", "gpus_per_node", "intra", "network", "gamma",
                           "stragglers", "jitter", "effects", "calibration", "calibration_groups", "gpu",
                           "library"})
    intra_reader.reject_unknown({"kind", "bandwidth", "latency"})
    net_reader.reject_unknown({"kind", "nics_per_node", "bandwidth_per_nic", "latency", "fabric",
                               "nodes_per_leaf", "oversubscription", "efficiency", "crossing_us", "mtu"})
    return Topology(
        name=reader.text("name", default=default_name),
        nodes=reader.count("nodes"),
        gpus_per_node=gpus,
        intra=intra,
        network=network,
        gamma=reader.number("gamma", default=0.0),
        stragglers=stragglers,
        jitter=reader.number("jitter", default=0.0),
        effects=effects,
        description=reader.text("description", default=""),
        source=source,
        calibration=calibration,
        group_calibration=group_calibration,
        gpu=_gpu(reader.text("gpu", default="") or None, source),
        library=reader.text("library", default="ideal"),
    )


def topology_yaml(topo: Topology, header: str) -> str:
    """``topo`` as a topology file (what :func:`arcsim.topology.load_yaml` reads back to an equal topology, its
    source aside), under the comment ``header``; measured fits are not written (:func:`check_base` refuses them)."""
    import yaml

    net, effects = topo.network, topo.effects
    network: dict[str, object] = {"kind": net.kind, "nics_per_node": net.physical_nics,
                                  "bandwidth_per_nic": f"{net.bandwidth_per_physical_nic!r}B/s",
                                  "latency": f"{net.latency!r}s", "fabric": net.fabric}
    if net.fabric == "fat-tree":
        network.update(nodes_per_leaf=net.nodes_per_leaf, oversubscription=net.oversubscription)
    if net.mtu != Network.mtu:
        network["mtu"] = net.mtu
    network["efficiency"] = net.efficiency
    if net.crossing_us is not None:
        network["crossing_us"] = net.crossing_us
    fields = {"name": topo.name, "description": topo.description, "nodes": topo.nodes,
              "gpus_per_node": topo.gpus_per_node, **({"gpu": topo.gpu} if topo.gpu else {}), "library": topo.library,
              "intra": {"kind": topo.intra.kind, "bandwidth": f"{topo.intra.bandwidth!r}B/s",
                        "latency": f"{topo.intra.latency!r}s"},
              "network": network, "gamma": topo.gamma, "stragglers": dict(topo.stragglers), "jitter": topo.jitter,
              "effects": {"compute_cv": effects.compute_cv, "step_jitter": f"{effects.step_jitter_s!r}s",
                          "interference": effects.interference}}
    comment = "".join(f"# {line}\n" for line in header.splitlines())
    return comment + yaml.safe_dump(fields, sort_keys=False, allow_unicode=True, width=120)


def _gpu(name: str | None, where: str) -> str | None:
    """A catalogue device name, checked (one error line listing them), or None."""
    if name is None:
        return None
    from arcsim.devices.catalog import devices

    if name.lower() not in devices():
        raise TopologyError(f"{where}: unknown gpu {name!r}; choose one of: {', '.join(devices())}")
    return name.lower()


CALIBRATED_OPS = ("allreduce", "allgather", "broadcast", "reducescatter")
CALIBRATED_GROUPS = ("node", "inter")


def _fits_dict(fits: Mapping[str, Calibrated]) -> dict[str, dict[str, Any]]:
    return {op: {"latency_s": c.latency, "bandwidth_Bps": c.bandwidth, "r2": c.r2, "ranks": c.ranks,
                 "library": c.library, "small": None if c.small is None else dataclasses.asdict(c.small),
                 "measured": [list(p) for p in c.measured], "burst_B": c.burst}
            for op, c in fits.items()}


def _calibration(raw: Mapping[str, Any], source: str, where: str = "calibration.") -> dict[str, Calibrated]:
    out = {}
    for op, fields in raw.items():
        if op not in CALIBRATED_OPS:
            raise TopologyError(f"{source}: {where}{op} is not a measured op; they are {', '.join(CALIBRATED_OPS)}")
        r = _FieldReader(fields, source, f"{where}{op}.")
        small_raw = r.mapping("small", required=False)
        small = None
        if small_raw is not None:
            b = _FieldReader(small_raw, source, f"{where}{op}.small.")
            small = Band(b.quantity("up_to", parse_size), b.quantity("latency", parse_duration),
                         _fitted_rate(b))
            b.reject_unknown({"up_to", "latency", "bandwidth"})
        out[op] = Calibrated(r.quantity("latency", parse_duration), _fitted_rate(r),
                             r.number("r2", default=1.0), r.count("ranks", default=0),
                             r.text("library", default=""), small, _measured_points(r, fields),
                             r.quantity("burst", parse_size, default=0.0))
        r.reject_unknown({"latency", "bandwidth", "r2", "ranks", "library", "small", "measured", "burst"})
    return out


def _measured_points(reader: _FieldReader, fields: Any) -> tuple[tuple[float, float], ...]:
    """``measured: [[bytes, seconds], …]``: sizes increasing, times positive and not decreasing."""
    raw = fields.get("measured") if isinstance(fields, Mapping) else None
    if raw is None:
        return ()
    try:
        points = tuple((float(n), float(t)) for n, t in raw)
    except (TypeError, ValueError):
        raise reader.error("measured", "must list [bytes, seconds] pairs, e.g. [[1024, 0.0002], [4096, 0.0003]]") \
            from None
    ok = all(math.isfinite(n) and math.isfinite(t) and n > 0 and t > 0 for n, t in points) and all(
        n1 > n0 and t1 >= t0 for (n0, t0), (n1, t1) in itertools.pairwise(points))
    if not ok:
        raise reader.error("measured", "needs positive sizes in increasing order with times that do not decrease")
    return points


def _fitted_rate(reader: _FieldReader) -> float:
    rate = reader.quantity("bandwidth", parse_rate)
    if not rate > 0:
        raise reader.error("bandwidth", "must be a positive bandwidth such as '10Gbit' (a fitted bandwidth of 0 "
                           "would make every message take forever)")
    return rate


_MISSING = object()


class _FieldReader:
    """Reads typed fields from a YAML mapping, naming the field and file in every error."""

    def __init__(self, raw: Mapping[str, Any], source: str, prefix: str = "") -> None:
        if not isinstance(raw, Mapping):
            raise TopologyError(f"{source}: field '{prefix.rstrip('.')}' must be a mapping")
        self.raw, self.source, self.prefix = raw, source, prefix

    def _get(self, key: str, default: Any) -> Any:
        if key in self.raw and self.raw[key] is not None:
            return self.raw[key]
        if default is _MISSING or default is None:
            raise TopologyError(f"{self.source}: field '{self.prefix}{key}' is missing")
        return default

    def error(self, key: str, what: str) -> TopologyError:
        return TopologyError(f"{self.source}: field '{self.prefix}{key}' {what}")

    def text(self, key: str, default: Any = _MISSING) -> str:
        value = self._get(key, default)
        if not isinstance(value, str):
            raise self.error(key, f"must be text (got {value!r})")
        return value

    def integer(self, key: str, default: Any = _MISSING) -> int:
        value = self._get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, f"must be a whole number (got {value!r})")
        return value

    def count(self, key: str, default: Any = _MISSING) -> int:
        """A count (nodes, GPUs, NICs, ranks): a whole number ≥ 1; ``default`` only when the field is absent."""
        value = self.integer(key, default)
        if value < 1 and self.raw.get(key) is not None:
            raise self.error(key, f"must be a whole number ≥ 1 (got {value!r})")
        return value

    def number(self, key: str, default: Any = _MISSING) -> float:
        value = self._get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.error(key, f"must be a finite number (got {value!r})")
        return float(value)

    def quantity(self, key: str, parse: Any, default: Any = _MISSING) -> float:
        value = self._get(key, default)
        if isinstance(value, float) and value is default:
            return value
        try:
            return parse(value)
        except UnitError as exc:
            raise self.error(key, f"is invalid: {exc}") from exc

    def mapping(self, key: str, required: bool = True) -> Mapping[str, Any] | None:
        if key not in self.raw or self.raw[key] is None:
            if required:
                raise TopologyError(f"{self.source}: field '{self.prefix}{key}' is missing")
            return None
        value = self.raw[key]
        if not isinstance(value, Mapping):
            raise self.error(key, "must be a mapping")
        return value

    def reject_unknown(self, known: set[str]) -> None:
        unknown = sorted(set(self.raw) - known)
        if unknown:
            raise TopologyError(
                f"{self.source}: unknown field '{self.prefix}{unknown[0]}'; known fields: {', '.join(sorted(known))}"
            )

"""Compression on a GPU: passes over memory and kernel launches per compressor, priced by the device.

One bucket of ``numel`` fp32 elements in ``layers`` layers, ``k`` of them selected, costs

    (passes × numel + per_selected × k) × 4 B / memory bandwidth + (per_layer × layers + fixed) × launch cost

and a compressor whose values are all-gathered (Top-K, Gaussian-K) scatters every peer's k values back into
its bucket: the calls were measured with P_MEASURED peers, so p peers add (p − P_MEASURED) × k × gathered passes
(an index_add of p·k values, measured on its own: ``benchmarks/gpu_session.py --parts work``). The counts
(passes, per_layer, fixed, per_selected) of each (compressor, scope) are fitted by non-negative least squares
to kernel times measured on a GPU (``benchmarks/gpu_measure.py --parts compress`` → compress_times.json;
``benchmarks/kernel_table.py`` turns that into ``devices/kernels/<device>.json``, with the device and torch
version). A device with its own table is priced from its own counts (measured); any other from the H100's
counts and its own datasheet bandwidth and launch cost (estimated). STAR's and VAR's leader does the
selection, so the leader's time (on every rank's critical path) is the one used.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from arcsim.devices.catalog import DEVICE_DIR, Device
from arcsim.errors import ArcsimError

KERNEL_DIR = DEVICE_DIR / "kernels"
ANCHOR = "h100"
# the quantisers and sign methods send every element: priced whole, from the passes their steps measured
# (WORK_STEPS), each peer's payload decoded and summed on every rank; compressor: (its steps, its per-peer decode)
WORK_STEPS: dict[str, tuple[tuple[str, ...], str | None]] = {
    "qsgd": (("qsgd",), "qsgd sum peers"),
    "terngrad": (("terngrad",), "qsgd sum peers"),
    "natural": (("natural",), "qsgd sum peers"),
    "signsgd": (("sign pack",), "majority vote"),
    "signum": (("sign pack", "copy"), "majority vote"),        # + the momentum's update: one pass (estimated)
    "efsignsgd": (("efsign scale+pack",), "majority vote"),
    # the worker compresses n, and decodes twice (its chunk from p peers, then p chunks): n each, whatever p; the
    # server's compression is of its chunk alone (SHARE_STEPS)
    "onebit": (("efsign scale+pack", "sign unpack", "sign unpack"), None),
    # the quantised reduce-scatters (compressors/sharded.py): the sender encodes n, the owner decodes its P chunks of
    # n/P and sums them (n, whatever P); blockwise int8/int4 priced by QSGD's quantise (a scale, a rounding, a cast:
    # its random draw makes it an upper bound) and dequantise, a bf16 cast by fp16's (estimated); the ring's P−1
    # hops each decode, add and encode n/P (n in all); qgZ's second level runs on its 1/G shard (SHARE_STEPS, priced
    # on 1/peers of the bucket); the fp32 all-gather of the shards does no work
    "rs-bf16": (("fp16 cast", "fp16 cast", "read (sum)"), None),
    "rs-int8": (("qsgd", "qsgd dequantise", "read (sum)"), None),
    "qgz": (("qsgd", "qsgd dequantise", "read (sum)"), None),
    "rs-int8-ring": (("qsgd", "qsgd dequantise", "read (sum)"), None),
    "qgz4": (("qsgd", "qsgd dequantise", "read (sum)"), None),
}
# steps a compressor runs on its 1/p share of the bucket only: 1-bit Adam's server compresses the chunk it serves
SHARE_STEPS: dict[str, tuple[str, ...]] = {"onebit": ("efsign scale+pack",),
                                           "qgz": ("qsgd", "qsgd dequantise", "read (sum)"),
                                           "qgz4": ("qsgd", "qsgd dequantise", "read (sum)")}
SCOPE_FREE = ("dense", "fp16", "bf16", "powersgd", *WORK_STEPS)
# adaptive's default inner selector does its kernel work; a bf16 cast moves the bytes an fp16 cast does; DGC's
# sampled threshold measured under torch.topk's time (0.31-0.37 against 0.60-0.64 ms on 25.6 M, H200), its
# momentum correction a few passes more: priced as Top-K (estimated)
PRICED_AS = {"adaptive": "topk", "bf16": "fp16", "dgc": "topk"}


# selections whose work grows with k (Rand-K's host-side draw is arcsim's, not a framework's: passes only)
SELECTING = ("top-k", "leader", "sketch")
P_MEASURED = 8  # peers whose payloads the measured calls decompress (SoloComm(8) in benchmarks/gpu_measure.py)


@dataclass(frozen=True)
class KernelCounts:
    passes: float              # fp32 passes over the bucket's elements
    per_layer: float           # launches per layer in the bucket
    fixed: float               # launches per call
    per_selected: float = 0.0  # fp32 passes per selected element (written, gathered, scattered back)
    per_peer: float = 0.0      # fp32 passes per element per peer whose whole payload is decoded (quantisers, signs)
    per_share: float = 0.0     # fp32 passes over a 1/peers share of the elements (1-bit Adam's server chunk)

    def seconds(self, numel: int, layers: int, device: Device, selected: int = 0, peers: int = P_MEASURED) -> float:
        return ((self.passes * numel + self.per_selected * selected + self.per_peer * numel * peers
                 + self.per_share * numel / max(1, peers))
                * 4 / device.bandwidth + (self.per_layer * layers + self.fixed) * device.launch_us * 1e-6)


def _key(compressor: str, scope: str | None) -> str:
    return compressor if compressor in SCOPE_FREE or scope is None else f"{compressor}/{scope}"


def selected_of(numel: int, density: float | None) -> int:
    """Elements a call selects: k = ρ·numel (none for a density-free compressor or an unknown ρ)."""
    return 0 if density is None else max(1, round(numel * density))


def fit_counts(rows: list[dict], device: Device,
               per_selected: dict[str, float] | None = None) -> dict[str, KernelCounts]:
    """Counts per (compressor, scope) from measured rows (numel, layers, compressor, variant, scope, density,
    ms); a flat vector (one layer) counts for both scopes; STAR's non-leader rows are left out. ``per_selected``:
    that count held at these values (another GPU's fit, for a table measured at low densities only)."""
    from scipy.optimize import nnls

    groups: dict[str, list[dict]] = {}
    for r in rows:
        if "other" in (r.get("variant") or ""):
            continue
        scopes = [r["scope"]] if r["scope"] else [None] if r["compressor"] in SCOPE_FREE else ["tensor", "bucket"]
        for scope in scopes:
            groups.setdefault(_key(r["compressor"], scope), []).append(r)
    from arcsim.catalog import INFO

    out = {}
    for key, group in sorted(groups.items()):
        selects = INFO[key.split("/")[0]].selection in SELECTING
        a = np.array([[r["numel"] * 4 / device.bandwidth, r["layers"] * device.launch_us * 1e-6,
                       device.launch_us * 1e-6,
                       selected_of(r["numel"], r.get("density")) * 4 / device.bandwidth if selects else 0.0]
                      for r in group])
        t = np.array([r["ms"] * 1e-3 for r in group])
        weights = 1 / t  # relative error: small buckets count as much as large ones
        held = (per_selected or {}).get(key)
        if held is not None:
            x, _ = nnls(a[:, :3] * weights[:, None], (t - held * a[:, 3]) * weights)
            out[key] = KernelCounts(float(x[0]), float(x[1]), float(x[2]), per_selected=held)
        else:
            x, _ = nnls(a * weights[:, None], t * weights)
            out[key] = KernelCounts(*(float(v) for v in x))
    return out


def fitted_rows(rows: list[dict]) -> list[dict]:
    """The measured calls a table is fitted to: Rand-K above ρ 0.1 left out (arcsim draws its indices on the host,
    numpy, the same on every device; there that draw, not GPU work any framework pays, is what the events time)."""
    return [r for r in rows if not (r["compressor"] == "randk" and (r.get("density") or 0) > 0.1)]


def relative_errors(rows: list[dict], counts: dict[str, KernelCounts], device: Device) -> list[float]:
    """predicted / measured − 1 of each measured call (STAR's non-leader calls left out)."""
    out = []
    for r in rows:
        if "other" in (r.get("variant") or ""):
            continue
        scope = None if r["compressor"] in SCOPE_FREE else r["scope"] or "bucket"
        key = _key(r["compressor"], scope)
        selected = selected_of(r["numel"], r.get("density")) if scope is not None else 0
        out.append(counts[key].seconds(r["numel"], r["layers"], device, selected) / (r["ms"] * 1e-3) - 1)
    return out


def work_counts(rows: list[dict], device: Device) -> dict[str, KernelCounts]:
    """Counts of the quantisers and sign methods from their steps' measured times (``gpu_session.py --parts work``):
    passes and launches from the two sizes (the steps on the whole bucket, and apart those on a 1/p share of it:
    SHARE_STEPS), passes per element per peer from the decode's growth with the peers."""
    def ms(op: str, numel: int, peers: int | None = None) -> float:
        return next(r["ms"] for r in rows if r["op"] == op and r["numel"] == numel and r.get("peers") == peers)

    def passes_and_small(steps: tuple[str, ...]) -> tuple[float, float]:
        t_small, t_large = (sum(ms(op, n) for op in steps) * 1e-3 for n in (small, large))
        return max(0.0, (t_large - t_small) * device.bandwidth / (4 * (large - small))), t_small

    small, large = sorted({r["numel"] for r in rows if r["kind"] == "quantise"})
    out = {}
    for name, (steps, decode) in WORK_STEPS.items():
        (passes, t_small), (share, share_small) = passes_and_small(steps), passes_and_small(SHARE_STEPS.get(name, ()))
        fixed = max(0.0, t_small + share_small - (passes + share) * 4 * small / device.bandwidth) / (
            device.launch_us * 1e-6)
        by_peers = sorted((r["peers"], r["ms"] * 1e-3) for r in rows if r["op"] == decode and r["numel"] == large)
        slope = np.polyfit([p for p, _ in by_peers], [t for _, t in by_peers], 1)[0] if by_peers else 0.0
        out[name] = KernelCounts(passes, 0.0, fixed, per_peer=max(0.0, float(slope)) * device.bandwidth / (4 * large),
                                 per_share=share)
    return out


def fit_gathered(rows: list[dict], device: Device) -> float:
    """fp32 passes per gathered element of decompression (one index_add of p·k values into the bucket), from
    ``benchmarks/gpu_session.py --parts work`` rows: the slope of time over p·k, least squares, relative."""
    scatter = [r for r in rows if r["kind"] == "decompress" and r["op"] == "index_add all peers"]
    gathered = np.array([r["peers"] * selected_of(r["numel"], r["density"]) for r in scatter], dtype=float)
    t = np.array([r["ms"] * 1e-3 for r in scatter])
    a = np.stack([gathered * 4 / device.bandwidth, np.ones_like(t)], axis=1)
    x, *_ = np.linalg.lstsq(a / t[:, None], np.ones_like(t), rcond=None)
    return float(x[0])


def table_path(device_name: str) -> Path:
    return KERNEL_DIR / f"{device_name}.json"


@lru_cache(maxsize=16)
def load_counts(device_name: str) -> tuple[dict[str, KernelCounts], dict]:
    data = json.loads(table_path(device_name).read_text())
    counts = {**data["counts"], **data.get("work_counts", {})}
    return {k: KernelCounts(**v) for k, v in counts.items()}, data


@lru_cache(maxsize=16)
def counts_for(device_name: str) -> tuple[dict[str, KernelCounts], dict, bool]:
    """The table a device is priced from: its own if measured (True), else the anchor's."""
    own = table_path(device_name).exists()
    return (*load_counts(device_name if own else ANCHOR), own)


def compress_seconds(compressor: str, scope: str, numel: int, layers: int, device: Device,
                     density: float | None = None, peers: int = P_MEASURED) -> float:
    """Local compression work of one bucket on ``device``: ``density`` k/d (None: density-free or unknown),
    ``peers`` the ranks whose all-gathered values it scatters back."""
    from arcsim.catalog import INFO

    counts, data, _ = counts_for(device.name)
    key = _key(PRICED_AS.get(compressor, compressor), scope)
    if key not in counts:
        raise ArcsimError(f"no kernel counts for {key} on {device.name}; rerun benchmarks/gpu_measure.py --parts "
                          "compress on a GPU and benchmarks/kernel_table.py")
    c = counts[key]
    selected = 0 if INFO[compressor].density_free else selected_of(numel, density)
    seconds = c.seconds(numel, layers, device, selected, peers)
    if INFO[compressor].family == "all-gather" and selected and peers != P_MEASURED:
        extra = (peers - P_MEASURED) * selected * data.get("gathered_passes", 0.0) * 4 / device.bandwidth
        seconds = max(seconds + extra, c.seconds(0, layers, device))  # fewer peers: never below the launches
    return seconds


def kernel_source(device: Device) -> str:
    """Where ``device``'s compression counts come from, for the output."""
    _, data, own = counts_for(device.name)
    if own:
        return f"measured on {data['device_name']} (torch {data['torch']})"
    return f"estimated: {data['device_name']}'s counts priced by {device.name}'s datasheet bandwidth and launch cost"

"""`arcsim calibrate --nccl-tests`: a cluster's network fitted from its own nccl-tests logs, on top of a topology.

Two constants of the topology's network, the ones NCCL's model cannot know for a given cluster
(:class:`arcsim.topology.Network`): ``efficiency``, the share of the modelled network bandwidth the cluster carries
(its NICs, switches, PCIe path and NCCL's channels as they really run), and ``crossing_us``, the proxy's cost of one
network crossing on all channels (arcsim.collectives.libraries.nccl.proxy_s; the transport's NET_STEP_US unless
fitted). Every other term stays NCCL's (its latencies, protocols, channels in use, the tree's correction).

The fit: for each efficiency on a grid of 1 % steps (searched every 10 steps, then around the best), every way NCCL
may run each size (algorithm × protocol) is priced on the links at that efficiency, split into its time without
the crossing cost and its network crossings; NCCL runs the cheapest, so at crossing cost c a size takes
min(time + crossings · c), and c is searched on a 0.5 µs grid. The pair kept minimises the mean |log| of
predicted / measured time over the sizes fitted: from 64 KiB up. Smaller sizes are launch and latency bound (NCCL's
base and per-hop latencies, which neither constant is): fitting them moved the crossing cost to make up for those
and made the mid band worse held out (benchmarks/calibrate_nccl_tests.py), so they are priced, not fitted.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from arcsim.errors import ArcsimError
from arcsim.pricing import plan, plans
from arcsim.testbed.nccl_tests import NcclTestsLog
from arcsim.topology import MAX_EFFICIENCY, Topology
from arcsim.units import format_size

BANDS = ("< 64 KiB", "64 KiB – 64 MiB", "≥ 64 MiB")
FIT_FROM_BYTES = 64 * 1024  # sizes from here up are fitted; below, launch and latency bound (priced, not fitted)
STEPS = 70  # efficiency grid points per doubling (1 %)
K_RANGE = (round(STEPS * math.log2(0.05)), round(STEPS * math.log2(MAX_EFFICIENCY)))  # efficiency 0.05 … 2
COARSE = 10  # grid points skipped in the first pass
CROSSING_US = np.arange(0.0, 400.5, 0.5)
MIN_FITTED_SIZES = 3
T = TypeVar("T")


def band(nbytes: float) -> str:
    return BANDS[0] if nbytes < 2**16 else BANDS[1] if nbytes < 2**26 else BANDS[2]


def efficiency_at(k: int) -> float:
    return float(2.0 ** (k / STEPS))


@dataclass(frozen=True)
class Row:
    """One size of one log."""

    log: NcclTestsLog
    nbytes: int
    measured_us: float

    @property
    def fitted(self) -> bool:
        return self.nbytes >= FIT_FROM_BYTES


def rows_of(logs: Sequence[NcclTestsLog]) -> list[Row]:
    return [Row(log, n, t) for log in logs for n, t in zip(log.sizes, log.times_us, strict=True)]


class Terms:
    """Each row priced on ``base`` at efficiency 2^(k/STEPS), per way NCCL may run it: (µs without the crossing
    cost, network crossings × channels in use), memoised by (k, row)."""

    def __init__(self, base: Topology, rows: Sequence[Row]) -> None:
        self.base, self.rows = base, list(rows)
        self.measured = np.array([r.measured_us for r in self.rows])
        self._memo: dict[tuple[int, int], list[tuple[float, float]]] = {}
        self._error_memo: dict[tuple[int, int], np.ndarray] = {}

    def topology(self, k: int, crossing_us: float) -> Topology:
        network = dataclasses.replace(self.base.network, efficiency=efficiency_at(k), crossing_us=crossing_us)
        return dataclasses.replace(self.base, network=network)

    def _ways(self, k: int, i: int) -> list[tuple[float, float]]:
        if (k, i) not in self._memo:
            row, topo = self.rows[i], self.topology(k, 1.0)  # 1 µs per crossing: per_message_s is the crossings
            self._memo[(k, i)] = [(1e6 * (p.analytic_s - p.choice.protocol.per_message_s),
                                   1e6 * p.choice.protocol.per_message_s)
                                  for p in plans(topo, row.log.op, row.log.algo, row.nbytes)]
        return self._memo[(k, i)]

    def arrays(self, k: int, which: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(µs without the crossing cost, crossings) for rows ``which``: rows × ways (padded: never the cheapest)."""
        ways = [self._ways(k, int(i)) for i in which]
        width = max(len(w) for w in ways)
        base, crossings = np.full((len(ways), width), np.inf), np.zeros((len(ways), width))
        for j, w in enumerate(ways):
            base[j, :len(w)], crossings[j, :len(w)] = np.array(w).T
        return base, crossings

    def predict(self, k: int, crossing_us: float, which: np.ndarray) -> np.ndarray:
        base, crossings = self.arrays(k, which)
        return (base + crossings * crossing_us).min(axis=1)

    def _errors(self, k: int, i: int) -> np.ndarray:
        """|log(predicted / measured)| of row ``i`` at every crossing cost of the grid, memoised by (k, row): the
        held-out fits search the same k over nearly the same rows."""
        if (k, i) not in self._error_memo:
            ways = np.array(self._ways(k, i))
            predicted = (ways[None, :, 0] + ways[None, :, 1] * CROSSING_US[:, None]).min(axis=1)
            self._error_memo[(k, i)] = np.abs(np.log(predicted / self.measured[i]))
        return self._error_memo[(k, i)]

    def loss(self, k: int, which: np.ndarray) -> np.ndarray:
        """Mean |log(predicted / measured)| over rows ``which`` at every crossing cost of the grid."""
        return np.stack([self._errors(k, int(i)) for i in which], axis=1).mean(axis=1)


@dataclass(frozen=True)
class Constants:
    k: int  # efficiency 2^(k/STEPS)
    crossing_us: float

    @property
    def efficiency(self) -> float:
        return efficiency_at(self.k)

    def at_edge(self) -> list[str]:
        """The bounds of the search this fit lies on (the cluster may lie beyond)."""
        out = [f"efficiency at its bound {self.efficiency:.3g}"] if self.k in K_RANGE else []
        return out + ([f"crossing cost at its bound {self.crossing_us:g} µs"] if self.crossing_us == CROSSING_US[-1]
                      else [])


def search(score: Callable[[int], tuple[float, T]]) -> T:
    """What ``score(k)`` = (loss, what) gives at the least loss over the efficiency grid: every COARSE-th k, then
    every k around the best of those."""
    def best(ks: Iterable[int]) -> tuple[float, T]:
        return min((score(k) for k in ks), key=lambda s: s[0])

    low, high = K_RANGE
    coarse = {k: best([k]) for k in [*range(low, high, COARSE), high]}
    k0 = min(coarse, key=lambda k: coarse[k][0])
    return best(range(max(low, k0 - COARSE + 1), min(high, k0 + COARSE - 1) + 1))[1]


def fit(terms: Terms, which: np.ndarray) -> Constants:
    """The grid's (efficiency, crossing cost) minimising the mean |log| error over rows ``which``."""
    def score(k: int) -> tuple[float, Constants]:
        loss = terms.loss(k, which)
        j = int(np.argmin(loss))
        return float(loss[j]), Constants(k, float(CROSSING_US[j]))

    return search(score)


@dataclass(frozen=True)
class Calibration:
    """The fitted constants and every size's time: measured, BASE alone, the fit on every fitted size, and held out
    (fitted without that size)."""

    constants: Constants | None  # None: within one node, nothing to fit
    rows: list[Row]
    base_us: np.ndarray
    fit_us: np.ndarray
    held_out_us: np.ndarray

    def notes(self) -> list[str]:
        """What the reader of the numbers should know: what was fitted on what, and a fit at its search's edge."""
        if self.constants is None:
            return ["the logs ran within one node: only NCCL's intra-node side ran, and arcsim fits the network; "
                    "nothing fitted, every size priced by the topology alone"]
        out = [f"fitted on the sizes from {FIT_FROM_BYTES // 1024} KiB up; smaller ones are launch and latency bound "
               f"(NCCL's base and per-hop latencies, neither constant): priced, not fitted, so held out they are "
               f"priced as fitted"]
        return out + [f"{edge}: the cluster may lie beyond what the fit can say" for edge in self.constants.at_edge()]

    def samples_csv(self) -> str:
        """Every size: its log, measured and priced times (µs), and whether it was fitted."""
        lines = ["log,op,bytes,measured_us,base_us,fit_us,held_out_us,fitted"]
        lines += [f"{r.log.path},{r.log.op},{r.nbytes},{r.measured_us:.6g},{b:.6g},{f:.6g},{h:.6g},{int(r.fitted)}"
                  for r, b, f, h in zip(self.rows, self.base_us, self.fit_us, self.held_out_us, strict=True)]
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict[str, object]:
        c = self.constants
        return {"fitted": c is not None, "efficiency": None if c is None else c.efficiency,
                "crossing_us": None if c is None else c.crossing_us, "fitted_from_bytes": FIT_FROM_BYTES,
                "bands": self.bands(),
                "sizes": [{"log": r.log.path, "op": r.log.op, "bytes": r.nbytes, "measured_us": r.measured_us,
                           "base_us": float(b), "fit_us": float(f), "held_out_us": float(h), "fitted": r.fitted}
                          for r, b, f, h in zip(self.rows, self.base_us, self.fit_us, self.held_out_us, strict=True)]}

    def bands(self) -> dict[str, dict[str, float]]:
        """Per size band: sizes, and the MAPE (%) of BASE alone, the fit, and held out."""
        out = {}
        for b in BANDS:
            sel = np.array([band(r.nbytes) == b for r in self.rows])
            if sel.any():
                measured = np.array([r.measured_us for r in self.rows])[sel]
                out[b] = {"sizes": int(sel.sum()), **{name: float(100 * np.mean(np.abs(us[sel] / measured - 1)))
                                                      for name, us in (("base", self.base_us), ("fit", self.fit_us),
                                                                       ("held_out", self.held_out_us))}}
        return out


def describe(log: NcclTestsLog) -> str:
    """One line: what ran, where, over what."""
    said = [f"NCCL {log.nccl_version}" if log.nccl_version else "", f"over {log.network}" if log.network else "",
            f"{log.channels} channels" if log.channels else "", f"NCCL_ALGO {log.algo}" if log.algo != "auto" else ""]
    return (f"{log.path}: {log.op}, {log.ranks} ranks on {log.nodes} node(s) × {log.gpus_per_node}"
            + (f" {log.gpu}" if log.gpu else "") + f", {len(log.sizes)} sizes {format_size(min(log.sizes))} – "
            f"{format_size(max(log.sizes))}" + "".join(f", {s}" for s in said if s))


def check_base(base: Topology, logs: Sequence[NcclTestsLog]) -> list[str]:
    """Refuse a BASE the logs cannot be fitted on (its ranks or nodes, its library, measured fits, its transport) and
    logs with too few sizes to fit; return warnings (another GPU)."""
    from arcsim.collectives.libraries.nccl import transport

    if base.library != "nccl":
        raise ArcsimError(f"--topology {base.name} runs library {base.library}; nccl-tests measures NCCL: give a "
                          f"topology with library: nccl (presets, instances and the name grammar are)")
    if base.calibration or base.group_calibration:
        raise ArcsimError(f"--topology {base.name} holds measured fits (calibration:), which price its collectives "
                          f"in place of the network; give the topology without them")
    warnings = []
    for log in logs:
        if (log.ranks, log.nodes) != (base.ranks, base.nodes):
            raise ArcsimError(f"{log.path} ran {log.ranks} ranks on {log.nodes} node(s) ({log.gpus_per_node} per "
                              f"node); --topology {base.name} has {base.ranks} on {base.nodes} ({base.gpus_per_node} "
                              f"per node): give a topology of {log.nodes} nodes × {log.gpus_per_node} GPUs")
        family = transport(base).split("+")[0]
        if log.transport and log.nodes > 1 and log.transport != family:
            raise ArcsimError(f"{log.path}: NCCL ran over {log.network} ({log.transport}); --topology {base.name} "
                              f"prices {family} (network kind {base.network.kind}): give a topology of its transport")
        if base.gpu and log.gpu and base.gpu not in log.gpu.lower():
            warnings.append(f"{log.path} ran on {log.gpu}; --topology {base.name} has {base.gpu} (NCCL's tuning "
                            f"differs by GPU generation)")
    fitted = sum(r.fitted for r in rows_of(logs))
    if base.nodes > 1 and fitted < MIN_FITTED_SIZES:
        raise ArcsimError(f"the logs hold {fitted} size(s) of {FIT_FROM_BYTES // 1024} KiB or more; the fit needs "
                          f"at least {MIN_FITTED_SIZES}: run nccl-tests with -b 8 -e 8G -f 2")
    return warnings


def calibrate(base: Topology, logs: Sequence[NcclTestsLog],
              progress: Callable[[int, int], None] | None = None) -> Calibration:
    """Fit the network's efficiency and crossing cost on ``logs`` (sizes from 64 KiB up), on top of ``base``, and
    price every size: BASE alone, the fit, and each fitted size held out of its own fit (``progress(done, total)``
    after each fit)."""
    rows = rows_of(logs)
    base_us = np.array([1e6 * plan(base, r.log.op, r.log.algo, r.nbytes).analytic_s for r in rows])
    if base.nodes < 2:
        return Calibration(None, rows, base_us, base_us, base_us)
    fitted = np.array([i for i, r in enumerate(rows) if r.fitted])
    terms, everything = Terms(base, rows), np.arange(len(rows))
    constants = fit(terms, fitted)
    fit_us = terms.predict(constants.k, constants.crossing_us, everything)
    held_out = fit_us.copy()
    for done, i in enumerate(fitted, start=1):
        if progress is not None:
            progress(done, len(fitted) + 1)
        alone = fit(terms, fitted[fitted != i])
        held_out[i] = terms.predict(alone.k, alone.crossing_us, np.array([i]))[0]
    if progress is not None:
        progress(len(fitted) + 1, len(fitted) + 1)
    return Calibration(constants, rows, base_us, fit_us, held_out)


def calibrated_topology(base: Topology, calibration: Calibration, name: str) -> Topology:
    """``base`` with the fitted network constants (unchanged within one node), named ``name``, its description
    saying which logs it was fitted on."""
    c, logs = calibration.constants, dict.fromkeys(Path(r.log.path).name for r in calibration.rows)
    network = base.network if c is None else dataclasses.replace(base.network, efficiency=c.efficiency,
                                                                 crossing_us=c.crossing_us)
    fitted = ("nothing fitted: the logs ran within one node, where neither constant applies" if c is None else
              f"network efficiency {c.efficiency:.4g} and {c.crossing_us:g} µs per network crossing, fitted on the "
              f"sizes from {FIT_FROM_BYTES // 1024} KiB up")
    description = f"{base.name} calibrated by arcsim calibrate --nccl-tests on {', '.join(logs)}: {fitted}."
    return dataclasses.replace(base, name=name, network=network,
                               description=f"{description} {base.description}".strip())

"""How sure a speed-up of `arcsim run` is: its interval from the model's held-out errors, a verdict (faster, slower,
too close to call) and, where too close, what would tip it (docs/run.md, "How sure the speed-up is").

The errors live in one file, ``arcsim/data/speedup_errors.json``, each section written by its benchmark's
``--write-errors`` (running it again updates them):

- ``collectives``: the NCCL model's MAPE of a collective's time per size band and transport, each published source
  held out of the fit of its constant (benchmarks/published_collectives.py);
- ``frameworks``: the median error of published end-to-end speed-ups priced by arcsim, per framework
  (benchmarks/published_e2e.py).

Compute carries the device model's expected error and modelled compression its kernel table's fit error
(arcsim.devices); what was measured carries none.

How they combine. Each part's error is one factor of the cluster, moving the dense and the compressed time alike
(one cluster, one model: a published setting's held-out errors keep one sign within a size band), and the factors are
independent of each other (the sign changes between bands on some settings). A MAPE m is the mean |x| of a normal
of spread σ = m·√(π/2); a median |x| m, of σ = m / 0.6745. One σ of a factor moves ln T by D: the iteration's
timeline is re-run with that part × e^σ and × e^−σ, and D is half the difference (communication hidden behind
compute moves nothing; the exposed part carries the error). ln S = ln T_dense − ln T moves by D_dense − D, and the
parts give σ_parts = the root sum of squares. The framework's error is what whole published steps show: the median
|ln error| m of their speed-ups, as σ = m / 0.6745, spread over what the framework decides, each time's open share a
(not compute: compression and exposed communication), independently (the two times issue different work) and so
that two wholly open times carry all of it: σ_fw = σ/√2 · √(a_dense² + a²). A compute-bound pair carries little of it:
the speed-up cannot move more than its open part. It holds the parts' errors too, so it is a floor, not a further
term: σ = max(σ_parts, σ_fw). The interval is S·e^(±σ), 68 % (one σ).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from arcsim.collectives.libraries.nccl import transport
from arcsim.devices.catalog import Device
from arcsim.errors import ArcsimError
from arcsim.files import packaged, write_atomic
from arcsim.pricing import Pricer
from arcsim.run.candidates import Candidate, Context, bucket_iteration_s, candidates_for, main_op, priced_buckets
from arcsim.run.measurement import Measurement
from arcsim.topology import Topology
from arcsim.units import format_bits

ERRORS_FILE = packaged("speedup_errors.json")
ABOUT = ("Held-out errors the speed-up intervals of `arcsim run` come from (arcsim/run/doubt.py, docs/run.md). Each "
         "section is written by its benchmark's --write-errors: do not edit by hand.")
Z = 1.0                    # the interval: ±1 σ, 68 % of a normal
LEVEL = "68 %"
MAPE_SIGMA = math.sqrt(math.pi / 2)  # the σ of a normal whose mean |x| is 1
MEDIAN_SIGMA = 1 / 0.6745            # the σ of a normal whose median |x| is 1
MIN_ROWS = 3               # a transport's band held out on fewer published rows takes every transport's figure
TOO_CLOSE = "too close to call"
BASELINE = "baseline"      # dense on its fastest collective: 1 by definition, nothing to doubt
BATCH_REACH = 16           # batch tips look from 1 up to this many times the run's batch (powers of two)
BISECTIONS = 6             # a bandwidth tip is refined between two scales of the crossover's grid this many times
SECTIONS = {"collectives": "benchmarks/published_collectives.py", "frameworks": "benchmarks/published_e2e.py"}


def write_section(name: str, section: dict[str, Any]) -> Path:
    """Replace one section of the errors file (a benchmark's --write-errors), keeping the others."""
    data = json.loads(ERRORS_FILE.read_text()) if ERRORS_FILE.exists() else {}
    data = {"about": ABOUT, **data, name: section}
    load_table.cache_clear()
    return write_atomic(ERRORS_FILE, json.dumps(data, indent=1, ensure_ascii=False) + "\n")


@cache
def load_table() -> dict[str, Any]:
    """The errors file, with both sections."""
    try:
        table = json.loads(ERRORS_FILE.read_text())
    except (OSError, ValueError) as err:
        raise ArcsimError(f"cannot read the speed-up errors {ERRORS_FILE} ({err}); reinstall arcsim, or write them "
                          f"with {' and '.join(SECTIONS.values())} --write-errors") from None
    missing = [script for name, script in SECTIONS.items() if name not in table]
    if missing:
        raise ArcsimError(f"the speed-up errors {ERRORS_FILE} lack what {' and '.join(missing)} writes: run it with "
                          "--write-errors")
    return table


@dataclass(frozen=True)
class Band:
    name: str
    below_bytes: float  # the band holds collectives under this size (nccl-tests' size: an all-gather's output)
    mape: float         # held-out MAPE, %
    rows: int           # published rows it was measured on
    transport: str      # whose figure: the cluster's transport, or every transport's where it has too few rows

    @property
    def sigma(self) -> float:
        return self.mape / 100 * MAPE_SIGMA


@dataclass(frozen=True)
class Errors:
    """The σ (of ln time) of each factor of one run, and whence each."""

    bands: tuple[Band, ...]
    compute: float      # the device model's; 0: measured
    compression: float  # the kernel table's; 0: measured
    framework: float    # end to end, each time's per unit of its open share (independent): the floor
    basis: str

    @property
    def sigmas(self) -> np.ndarray:
        """Compute, compression, then each band."""
        return np.array([self.compute, self.compression, *(b.sigma for b in self.bands)])

    def band_of(self, nbytes: float) -> int:
        return next(i for i, b in enumerate(self.bands) if nbytes < b.below_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {"level": LEVEL, "bands": [{**dataclasses.asdict(b), "below_bytes": None if math.isinf(b.below_bytes)
                                           else b.below_bytes, "sigma": b.sigma} for b in self.bands],
                "compute_sigma": self.compute, "compression_sigma": self.compression,
                "framework_sigma": self.framework, "basis": self.basis}


def errors_for(topo: Topology, framework: str, compute_error: float | None, gpu: Device | None) -> Errors:
    """The errors of a run on ``topo`` under ``framework``, its compute modelled with ``compute_error`` (mean
    |relative error|; None: measured) and its compression modelled on ``gpu`` (None: measured here)."""
    table = load_table()
    coll, fws = table["collectives"], table["frameworks"]
    pools = coll["transports"]
    name = next((n for n, p in pools.items() if n != "all" and transport(topo) in p["kinds"]), "all")
    bands = []
    for b in coll["bands"]:
        own = pools[name]["bands"].get(b["name"])
        whose = name if own and own["rows"] >= MIN_ROWS else "all"
        fig = pools[whose]["bands"][b["name"]]
        bands.append(Band(b["name"], b["below_bytes"] or math.inf, fig["held_out_mape"], fig["rows"], whose))
    fw = fws["frameworks"].get(framework) or fws["frameworks"]["ddp"]
    compression = None if gpu is None else compression_error(gpu)
    parts = [f"collectives over {name}" + ("" if topo.library == "nccl" else
                                           f" (NCCL's model's errors: {topo.library}'s are not measured)") + " "
             + ", ".join(f"{b.name} {b.mape:.1f} %" + ("" if b.transport == name else " (every transport's)")
                         for b in bands) + f" MAPE ({coll['script']}, {coll['date']})",
             "compute " + ("measured" if compute_error is None else
                           f"{100 * compute_error:.0f} % (the device model's expected error)"),
             "compression " + ("measured" if compression is None else
                               f"{100 * compression:.0f} % (the kernel table's fit)"),
             "each shared by dense and the candidate (one cluster); at least what "
             f"{fw['rows']} published speed-ups under {fw['framework']} show end to end ({fws['script']}, "
             f"{fws['date']}: median |ln error| {fw['median_abs_log_error']:.2f} over the open shares"
             + ("" if fw["framework"] == framework else f"; none published for {framework}") + ")"]
    return Errors(tuple(bands), (compute_error or 0.0) * MAPE_SIGMA, (compression or 0.0) * MAPE_SIGMA,
                  fw["median_abs_log_error"] * MEDIAN_SIGMA / math.sqrt(2),
                  f"speed-up intervals ({LEVEL}, one σ) from held-out errors: " + "; ".join(parts))


def open_share(c: Candidate) -> float:
    """The share of ``c``'s iteration that is not compute (with the cluster's effects on it): its compression and
    exposed communication."""
    return 1 - c.compute_stream_s / c.iteration_s


def compression_error(gpu: Device) -> float:
    """The mean |relative error| of the kernel table ``gpu`` is priced from (its fit, in sample)."""
    from arcsim.devices.kernels import counts_for

    return float(counts_for(gpu.name)[1]["fit_mean_abs_error"])


def band_seconds(meas: Measurement, collective: str, ctx: Context, pricer: Pricer, errors: Errors) -> np.ndarray:
    """[bucket, band]: the mean seconds per step of each bucket's modelled collectives in each size band (a
    calibrated collective, measured on the cluster, is left out)."""
    out = np.zeros((len(ctx.buckets), len(errors.bands)))
    op = main_op(meas)
    for step in meas.records:
        for i, (priced, _) in enumerate(priced_buckets(step, collective, ctx, pricer, op)):
            for p in priced:
                if p.algo != "measured":
                    out[i, errors.band_of(p.bytes)] += p.time_s
    return out / len(meas.records)


def with_compute(ctx: Context, factor: float) -> Context:
    """``ctx`` with every compute time (and so every bucket's ready time) × ``factor``."""
    c = ctx.compute
    compute = dataclasses.replace(c, forward_s=c.forward_s * factor, backward_s=c.backward_s * factor,
                                  ready_s=c.ready_s * factor, after_s=c.after_s * factor)
    return dataclasses.replace(ctx, compute=compute,
                               buckets=[dataclasses.replace(b, ready_s=b.ready_s * factor) for b in ctx.buckets])


def shifts(c: Candidate, ctx: Context, pricer: Pricer, errors: Errors) -> np.ndarray:
    """How far one σ of each factor (compute, compression, each band) moves ln of ``c``'s iteration time."""
    assert c.measurement is not None, "a priced candidate keeps its measurement"
    bands = band_seconds(c.measurement, c.collective, ctx, pricer, errors)
    compress = np.asarray(c.bucket_compress_s)
    rest = np.maximum(np.asarray(c.bucket_comm_s) - bands.sum(axis=1), 0.0)
    sigmas = errors.sigmas

    def log_time(k: int, sign: float) -> float:
        f = np.ones(len(sigmas))
        f[k] = math.exp(sign * sigmas[k])
        return math.log(bucket_iteration_s(compress * f[1], rest + bands @ f[2:], with_compute(ctx, f[0])))

    return np.array([(log_time(k, 1) - log_time(k, -1)) / 2 if s else 0.0 for k, s in enumerate(sigmas)])


@dataclass(frozen=True)
class Doubt:
    speedup: float
    low: float
    high: float
    verdict: str          # faster, slower, too close to call; baseline: dense itself
    collective: str = ""  # the collective priced

    @property
    def clear(self) -> bool:
        return self.verdict in ("faster", "slower")


def doubt(speedup: float, sigma: float, collective: str = "") -> Doubt:
    """The interval S·e^(±Zσ) and its verdict: faster where it lies above 1, slower below, else too close."""
    low, high = speedup * math.exp(-Z * sigma), speedup * math.exp(Z * sigma)
    return Doubt(speedup, low, high, "faster" if low > 1 else "slower" if high < 1 else TOO_CLOSE, collective)


def ratio_text(x: float) -> str:
    """``1.42``, ``0.05``, ``38.9``, ``124``: two decimals under 10, three figures above."""
    return f"{x:.2f}" if x < 10 else f"{x:.3g}" if x < 1000 else f"{x:.0f}"


def speedup_text(speedup: float, low: float | None, high: float | None, stacked: bool = False) -> str:
    """``1.42× (1.21–1.66)``, or stacked on two lines (``1.42×`` over ``1.21–1.66``); the baseline's ``1.00×``."""
    point = f"{ratio_text(speedup)}×"
    if low is None or high is None or low == high:
        return point
    interval = f"{ratio_text(low)}–{ratio_text(high)}"
    return f"{point}\n{interval}" if stacked else f"{point} ({interval})"


UNITS = {"bandwidth": " per NIC", "density": "", "batch": " per GPU"}
SIDES = {"at_most": "≤ ", "at_least": "≥ ", "at": ""}


def value_text(axis: str, value: float) -> str:
    return format_bits(value) if axis == "bandwidth" else f"{value:g}"


def setting_text(axis: str, side: str, value: float) -> str:
    """``bandwidth ≤ 3.2 Gbit/s per NIC``, ``density 0.003``, ``batch ≥ 64 per GPU``."""
    return f"{axis} {SIDES[side]}{value_text(axis, value)}{UNITS[axis]}"


@dataclass(frozen=True)
class Tip:
    """A setting that makes a too-close verdict clear, found by re-pricing the measured compressors."""

    axis: str        # bandwidth (bytes/s per NIC), density, batch (per GPU)
    value: float
    now: float       # the run's value
    side: str        # at_most, at_least: as far as checked, the verdict holds from value on; at: there only
    verdict: str
    collective: str  # the compressor's fastest collective there
    speedup: float
    speedup_low: float
    speedup_high: float
    rel_error: float | None = None  # density: the error at that density

    @classmethod
    def of(cls, axis: str, value: float, now: float, side: str, d: Doubt, rel_error: float | None = None) -> Tip:
        return cls(axis, value, now, side, d.verdict, d.collective, d.speedup, d.low, d.high, rel_error)

    @property
    def text(self) -> str:
        error = "" if self.rel_error is None else f", error {self.rel_error:.3f}"
        return (f"clearly {self.verdict} at {setting_text(self.axis, self.side, self.value)} (now "
                f"{value_text(self.axis, self.now)}), on {self.collective}: "
                f"{speedup_text(self.speedup, self.speedup_low, self.speedup_high)}{error}")

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "text": self.text}


Setting = tuple[str, float]  # ("bandwidth", scale of the NIC's), ("batch", per GPU); BASE: the run's own
BASE: Setting = ("", 0.0)


class Judge:
    """Each candidate's interval against dense, on the run's cluster and re-priced on others (bandwidth, batch;
    densities from the measured grid): nothing is measured again."""

    def __init__(self, errors: Errors, ctx: Context, pricer: Pricer, dense: Candidate, grid: Sequence[Candidate],
                 batch: int | None = None, at_batch: Callable[[int], Context | None] | None = None) -> None:
        """``dense``: dense on its fastest collective; ``at_batch``: the run's context with compute at another
        batch per GPU (None: compute is not modelled, or ``batch`` would change the buckets)."""
        assert dense.measurement is not None
        self.errors, self.grid, self.batch, self.at_batch = errors, grid, batch, at_batch
        self.dense_meas = dense.measurement
        self._settings: dict[Setting, tuple[Context, Pricer, Candidate, np.ndarray] | None] = {
            BASE: (ctx, pricer, dense, shifts(dense, ctx, pricer, errors))}
        # (measurement, setting) → the doubt there, the same for each of a compressor's collectives (the
        # measurement kept beside it: its id stays its own)
        self._elsewhere: dict[tuple[int, Setting], tuple[Measurement, Doubt | None]] = {}

    @property
    def ctx(self) -> Context:
        base = self._settings[BASE]
        assert base is not None
        return base[0]

    def _setting(self, where: Setting) -> tuple[Context, Pricer, Candidate, np.ndarray] | None:
        """The context, pricer, dense's fastest candidate and its shifts at ``where`` (analytic, as the crossover);
        None where it cannot be priced (a batch that changes the buckets)."""
        if where not in self._settings:
            axis, value = where
            if axis == "bandwidth":
                topo = self.ctx.topo.with_overrides(bandwidth=self.ctx.topo.network.bandwidth_per_nic * value)
                ctx: Context | None = dataclasses.replace(self.ctx, topo=topo, engine="analytic")
            else:
                ctx = None if self.at_batch is None else self.at_batch(int(value))
            if ctx is None:
                self._settings[where] = None
            else:
                pricer = Pricer(ctx.topo, ctx.engine)
                dense = min(candidates_for(self.dense_meas, ctx, pricer), key=lambda c: c.iteration_s)
                self._settings[where] = (ctx, pricer, dense, shifts(dense, ctx, pricer, self.errors))
        return self._settings[where]

    def doubt(self, c: Candidate, where: Setting = BASE) -> Doubt | None:
        """``c``'s speed-up over dense, its interval and verdict: at the run's setting on ``c``'s collective,
        elsewhere on the fastest collective of ``c``'s compressor there, as dense's (None: not priced there)."""
        assert c.measurement is not None
        if where != BASE:
            key = (id(c.measurement), where)
            if key not in self._elsewhere:
                self._elsewhere[key] = (c.measurement, self._doubt(c, where))
            return self._elsewhere[key][1]
        return self._doubt(c, where)

    def _doubt(self, c: Candidate, where: Setting) -> Doubt | None:
        setting = self._setting(where)
        if setting is None:
            return None
        ctx, pricer, dense, dense_shifts = setting
        assert c.measurement is not None
        here = c if where == BASE else min(candidates_for(c.measurement, ctx, pricer), key=lambda x: x.iteration_s)
        if (here.compressor, here.collective, here.hierarchy) == (dense.compressor, dense.collective, dense.hierarchy):
            return Doubt(1.0, 1.0, 1.0, BASELINE, here.collective)
        parts = float(np.linalg.norm(dense_shifts - shifts(here, ctx, pricer, self.errors)))
        end_to_end = self.errors.framework * math.hypot(open_share(dense), open_share(here))
        return doubt(dense.iteration_s / here.iteration_s, max(parts, end_to_end), here.collective)

    def mark(self, c: Candidate, tips: bool = True) -> None:
        """Set ``c``'s interval, verdict and, where too close to call (and ``tips``), its tips."""
        d = self.doubt(c)
        assert d is not None
        c.speedup_low, c.speedup_high, c.verdict = d.low, d.high, d.verdict
        c.tips = [t.to_dict() for t in self.tips(c)] if tips and d.verdict == TOO_CLOSE else []

    def tips(self, c: Candidate) -> list[Tip]:
        """The nearest bandwidth, density and batch, each way, at which ``c``'s verdict is clear."""
        return [*self._bandwidth_tips(c), *self._density_tips(c), *self._batch_tips(c)]

    def _bandwidth_tips(self, c: Candidate) -> list[Tip]:
        from arcsim.run.decisions import BANDWIDTH_SCALES

        if self.ctx.topo.nodes < 2:  # no network between nodes to vary
            return []
        now = self.ctx.topo.network.bandwidth_per_nic
        tips = []
        for side, scales in (("at_most", sorted((s for s in BANDWIDTH_SCALES if s < 1), reverse=True)),
                             ("at_least", sorted(s for s in BANDWIDTH_SCALES if s > 1))):
            found = self._first_clear(c, [("bandwidth", s) for s in scales])
            if found is None:
                continue
            i, d, holds = found
            inside = 1.0 if i == 0 else scales[i - 1]
            scale, d = self._rounded(c, *self._refine(c, inside, scales[i], d), down=side == "at_most")
            tips.append(Tip.of("bandwidth", now * scale, now, side if holds else "at", d))
        return tips

    def _refine(self, c: Candidate, inside: float, clear: float, d: Doubt) -> tuple[float, Doubt]:
        """The scale between ``inside`` (too close) and ``clear`` nearest to ``inside`` with ``d``'s verdict
        (geometric bisection)."""
        for _ in range(BISECTIONS):
            mid = math.sqrt(inside * clear)
            m = self.doubt(c, ("bandwidth", mid))
            if m is not None and m.verdict == d.verdict:
                clear, d = mid, m
            else:
                inside = mid
        return clear, d

    def _rounded(self, c: Candidate, scale: float, d: Doubt, down: bool) -> tuple[float, Doubt]:
        """``scale`` with its bandwidth in bit/s rounded to two figures, away from the too-close side, where the
        verdict stays ``d``'s."""
        bits = self.ctx.topo.network.bandwidth_per_nic * scale * 8
        step = 10.0 ** (math.floor(math.log10(bits)) - 1)
        nice = (math.floor if down else math.ceil)(bits / step) * step / bits * scale
        there = self.doubt(c, ("bandwidth", nice))
        return (nice, there) if there is not None and there.verdict == d.verdict else (scale, d)

    def _density_tips(self, c: Candidate) -> list[Tip]:
        """The nearest densities of the measured grid, each way, where ``c``'s compressor (on its fastest collective
        there) is clear."""
        if c.density is None:
            return []
        same: dict[float, Candidate] = {}
        for g in self.grid:
            if (g.compressor, g.hierarchy) == (c.compressor, c.hierarchy) and g.density is not None \
                    and (g.density not in same or g.iteration_s < same[g.density].iteration_s):
                same[g.density] = g
        tips = []
        for side, densities in (("at_most", sorted((d for d in same if d < c.density), reverse=True)),
                                ("at_least", sorted(d for d in same if d > c.density))):
            verdicts = [self.doubt(same[d]) for d in densities]
            i = next((i for i, v in enumerate(verdicts) if v is not None and v.clear), None)
            if i is None:
                continue
            v = verdicts[i]
            assert v is not None
            holds = all(w is not None and w.verdict == v.verdict for w in verdicts[i:])
            tips.append(Tip.of("density", densities[i], c.density, side if holds else "at", v,
                               same[densities[i]].rel_error))
        return tips

    def _batch_tips(self, c: Candidate) -> list[Tip]:
        if self.batch is None or self.at_batch is None:
            return []
        b = self.batch
        below = [b >> k for k in range(1, b.bit_length()) if b >> k >= 1]
        above = [b << k for k in range(1, BATCH_REACH.bit_length())]
        tips = []
        for side, batches in (("at_most", below), ("at_least", above)):
            found = self._first_clear(c, [("batch", float(x)) for x in batches])
            if found is not None:
                i, d, holds = found
                tips.append(Tip.of("batch", float(batches[i]), float(b), side if holds else "at", d))
        return tips

    def _first_clear(self, c: Candidate, settings: list[Setting]) -> tuple[int, Doubt, bool] | None:
        """The first of ``settings`` (nearest first) where ``c``'s verdict is clear, that verdict, and whether every
        setting beyond it that could be priced gives it too."""
        doubts = [self.doubt(c, s) for s in settings]
        i = next((i for i, d in enumerate(doubts) if d is not None and d.clear), None)
        if i is None:
            return None
        d = doubts[i]
        assert d is not None
        return i, d, all(v is None or v.verdict == d.verdict for v in doubts[i:])

"""Networks that change during training: phases of inter-node latency and bandwidth, by step.

A schedule file (YAML) names its phases in steps or epochs::

    name: c1
    unit: step            # or epoch, with steps_per_epoch
    phases:
      - {start: 0,   latency: 1ms,  bandwidth: 25Gbps}
      - {start: 75,  latency: 1ms,  bandwidth: 1Gbps}

A phase lasts from its start to the next phase's start (the last one to the run's end). Each phase
replaces the topology's inter-node one-way latency and per-NIC bandwidth (``Topology.with_overrides``);
steps before the first phase keep the topology's own network. Phases must be sorted, start inside the
run, and have positive bandwidth and non-negative latency.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arcsim.errors import ArcsimError, UnitError
from arcsim.files import read_yaml
from arcsim.topology import Topology
from arcsim.units import format_bits, format_duration, parse_duration, parse_rate

UNITS = ("step", "epoch")


class ScheduleError(ArcsimError):
    """A network schedule that cannot be used as written."""


@dataclass(frozen=True)
class Phase:
    start: int          # first step (0-based) on this network
    latency_s: float    # inter-node one-way latency
    bandwidth: float    # per-NIC bandwidth, bytes/s

    @property
    def label(self) -> str:
        return f"{format_duration(self.latency_s)} / {format_bits(self.bandwidth)}"

    def on(self, topo: Topology) -> Topology:
        return topo.with_overrides(bandwidth=self.bandwidth, latency=self.latency_s)

    def to_dict(self) -> dict[str, Any]:
        return {"start_step": self.start, "latency_s": self.latency_s, "bandwidth_Bps": self.bandwidth,
                "network": self.label}


@dataclass(frozen=True)
class NetworkSchedule:
    name: str
    phases: tuple[Phase, ...]
    source: str = ""

    def check_steps(self, steps: int) -> None:
        """Refuse a phase that starts at or after the run's last step."""
        late = [p for p in self.phases if p.start >= steps]
        if late:
            raise ScheduleError(f"{self.source or self.name}: phase {self.phases.index(late[0]) + 1} starts at step "
                                f"{late[0].start}, past the run's {steps} steps; shorten the schedule or train longer")

    def index_at(self, step: int) -> int | None:
        """The phase in force at ``step`` (None before the first)."""
        current = None
        for i, p in enumerate(self.phases):
            if p.start <= step:
                current = i
        return current

    def ends(self, steps: int) -> list[int]:
        """Each phase's end step (exclusive) in a run of ``steps``."""
        return [p.start for p in self.phases[1:]] + [steps]

    def topologies(self, topo: Topology) -> list[Topology]:
        return [p.on(topo) for p in self.phases]


def load_schedule(path: str | Path) -> NetworkSchedule:
    """Read and check a schedule file; every problem is one ScheduleError line."""
    p = Path(path)
    raw = read_yaml(p, "network schedule", ScheduleError)
    if not isinstance(raw, dict) or not isinstance(raw.get("phases"), list) or not raw["phases"]:
        raise ScheduleError(f"{path}: a schedule is a mapping with a non-empty 'phases' list; see "
                            "examples/schedule-c1.yaml")
    unknown = sorted(set(raw) - {"name", "description", "unit", "steps_per_epoch", "phases"})
    if unknown:
        raise ScheduleError(f"{path}: unknown key {unknown[0]!r}; a schedule has name, description, unit, "
                            "steps_per_epoch and phases")
    unit = raw.get("unit", "step")
    if unit not in UNITS:
        raise ScheduleError(f"{path}: unit must be step or epoch, got {unit!r}")
    scale = raw.get("steps_per_epoch") if unit == "epoch" else 1
    if not isinstance(scale, int) or isinstance(scale, bool) or scale < 1:
        raise ScheduleError(f"{path}: unit epoch needs steps_per_epoch, a positive whole number")
    phases = []
    for i, entry in enumerate(raw["phases"], start=1):
        where = f"{path}: phase {i}"
        example = "(e.g. {start: 0, latency: 1ms, bandwidth: 25Gbps})"
        if not isinstance(entry, dict):
            raise ScheduleError(f"{where} is not a mapping of start, latency and bandwidth {example}")
        extra = sorted(set(entry) - {"start", "latency", "bandwidth"})
        if extra:
            raise ScheduleError(f"{where}: unknown key {extra[0]!r}; a phase has start, latency and bandwidth "
                                f"{example}")
        missing = [k for k in ("start", "latency", "bandwidth") if k not in entry]
        if missing:
            raise ScheduleError(f"{where} lacks {' and '.join(missing)} {example}")
        start = entry["start"]
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise ScheduleError(f"{where}: start must be a whole number of {unit}s ≥ 0, got {start!r}")
        try:
            latency = parse_duration(entry["latency"])
        except UnitError as exc:
            raise ScheduleError(f"{where}: latency: {exc}") from None
        try:
            bandwidth = parse_rate(entry["bandwidth"])
        except UnitError as exc:
            raise ScheduleError(f"{where}: bandwidth: {exc}") from None
        if not bandwidth > 0:
            raise ScheduleError(f"{where}: bandwidth must be positive, got {entry['bandwidth']!r}")
        phases.append(Phase(start * scale, latency, bandwidth))
    for i, (a, b) in enumerate(itertools.pairwise(phases), start=1):
        if b.start <= a.start:
            raise ScheduleError(f"{path}: phase {i + 1} starts at step {b.start}, not after phase {i} (step "
                                f"{a.start}); phases must be sorted and must not overlap")
    return NetworkSchedule(str(raw.get("name", p.stem)), tuple(phases), str(path))

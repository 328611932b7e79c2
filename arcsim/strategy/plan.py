"""A per-bucket plan: the compressor each DDP bucket runs. `arcsim run` writes the plan of its recommendation
(``--write-plan``, and the JSON's ``recommendation.plan``); :class:`arcsim.hooks.MixedState` runs it. Torch-free.

Bucket ``i`` is DDP's bucket ``i`` once DDP has rebuilt its buckets in the order gradients become ready (after the
first iteration), with the job's ``bucket_cap_mb`` the run's ``--bucket-mb`` (left unset where the run left it unset:
torch's 1 MiB first bucket comes only with the default); ``elements`` lets the hook check it.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arcsim.catalog import INFO, MEMORIES
from arcsim.errors import ArcsimError

FORMAT = "arcsim-bucket-plan"
HIERARCHIES = ("flat", "node")


@dataclass(frozen=True)
class PlannedBucket:
    bucket: int                # DDP's bucket index
    elements: int              # its gradient entries
    compressor: str
    density: float | None      # None: the compressor takes no ratio (dense, fp16, bf16)
    memory: str                # error feedback
    op: str = "allreduce"      # the collective the compressor issues (it follows from the compressor)
    collective: str = "ring"   # the algorithm arcsim priced it with (the library picks its own in the job)
    hierarchy: str = "flat"    # node: dense inside each node, compressed between nodes

    @property
    def setting(self) -> str:
        """``topk@0.01 allgather``, ``fp16 allreduce, node``: the bucket's setting, without its index."""
        ratio = "" if self.density is None else f"@{self.density:g}"
        return f"{self.compressor}{ratio} {self.op}" + ("" if self.hierarchy == "flat" else f", {self.hierarchy}")


@dataclass(frozen=True)
class BucketPlan:
    buckets: tuple[PlannedBucket, ...]
    seed: int = 0              # bucket i's compressor is seeded seed + i, as `arcsim run` measures it
    scope: str = "tensor"      # top-k family: k per layer (tensor) or per bucket

    @property
    def is_mix(self) -> bool:
        return len({(b.setting, b.memory) for b in self.buckets}) > 1

    def summary(self, most: int = 6) -> str:
        """``buckets 0–3 topk@0.01 allgather, 4–9 fp16 allreduce``: runs of buckets that share a setting (the
        first ``most``)."""
        runs = []
        for setting, group in itertools.groupby(self.buckets, key=lambda b: b.setting):
            ids = [b.bucket for b in group]
            runs.append(f"{ids[0]}{'' if len(ids) == 1 else f'–{ids[-1]}'} {setting}")
        more = f", … ({len(runs) - most} more runs)" if len(runs) > most else ""
        return f"bucket{'s' if len(self.buckets) > 1 else ''} " + ", ".join(runs[:most]) + more

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "seed": self.seed, "scope": self.scope,
                "buckets": [dataclasses.asdict(b) for b in self.buckets]}

    def save(self, path: str | Path) -> None:
        from arcsim.files import write_atomic

        write_atomic(Path(path), json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> BucketPlan:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ArcsimError(f"cannot read the bucket plan {path}: {exc}") from None
        return cls.from_dict(data, str(path))

    @classmethod
    def from_dict(cls, data: Any, source: str = "the plan") -> BucketPlan:
        """The plan ``data`` holds (``arcsim run``'s ``recommendation.plan`` or a ``--write-plan`` file)."""
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("buckets"), list):
            raise ArcsimError(f"{source} is not a bucket plan (format {FORMAT!r} with a list of buckets): write one "
                              "with arcsim run --write-plan")
        fields = {f.name for f in dataclasses.fields(PlannedBucket)}
        try:
            buckets = tuple(PlannedBucket(**{k: v for k, v in b.items() if k in fields}) for b in data["buckets"])
        except (TypeError, AttributeError) as exc:
            raise ArcsimError(f"{source}: a bucket lacks a field ({exc})") from None
        plan = cls(buckets, int(data.get("seed", 0)), str(data.get("scope", "tensor")))
        plan.check(source)
        return plan

    def check(self, source: str) -> None:
        """Refuse a plan no hook can run: buckets not numbered 0, 1, …, an unknown compressor, memory or
        hierarchy, a ratio outside (0, 1]."""
        if not self.buckets:
            raise ArcsimError(f"{source} plans no bucket")
        for i, b in enumerate(self.buckets):
            what = f"{source}, bucket {b.bucket}"
            if b.bucket != i or not isinstance(b.elements, int) or b.elements < 1:
                raise ArcsimError(f"{what}: buckets must be numbered 0, 1, … in order, each with its elements ≥ 1")
            if b.compressor not in INFO:
                raise ArcsimError(f"{what}: unknown compressor {b.compressor!r}")
            if b.memory not in MEMORIES or b.hierarchy not in HIERARCHIES:
                raise ArcsimError(f"{what}: memory must be one of {', '.join(MEMORIES)} and hierarchy one of "
                                  f"{', '.join(HIERARCHIES)}")
            if b.density is not None and not (isinstance(b.density, (int, float)) and 0 < b.density <= 1):
                raise ArcsimError(f"{what}: density must be in (0, 1], got {b.density!r}")

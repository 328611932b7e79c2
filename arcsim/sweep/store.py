"""The sweep's results directory: ``sweep.yaml`` (what was asked) and ``results.csv`` (one row per finished point).

Rows are appended and flushed as each chunk of points finishes, so an interrupted sweep keeps everything
it finished. Resuming reads the ids already present and skips them. A row cut off by a kill mid-write is
dropped on resume (it is recomputed).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from arcsim.files import AppendOnlyCSV, read_yaml, write_atomic
from arcsim.run.tables import Column, read_table
from arcsim.sweep.evaluate import COLUMNS, UNIT_COLUMNS, UNSET_AXES
from arcsim.sweep.spec import OPTIONAL_AXES, RESULTS, SPEC, SweepError, SweepSpec

_WHOLE, _NUMBER, _NAME = Column(int, required=False), Column(float, required=False), Column(str, required=False)
# how each column of results.csv reads back (evaluate.COLUMNS); an axis left unset is an empty cell
RESULT_TYPES: dict[str, Column] = {
    **{c: _NAME for c in COLUMNS}, "point_id": Column(str), "compressor": Column(str),
    "iteration_s": Column(float, positive=True),
    **{c: _WHOLE for c in ("ranks", "seed", "nodes", "gpus_per_node", "world", "params", "trace_workers")},
    **{c: _NUMBER for c in ("bandwidth_Bps", "density", "bucket_mb", "nic_gbps", "latency_us", "compute_s",
                            "compress_s", "comm_s", "exposed_comm_s", "dense_iteration_s", "speedup_vs_dense",
                            "rel_error", "compression_gain", "density_achieved", "bytes_per_rank", "effects_s")}}


class ResultStore:
    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory)
        self.results = self.dir / RESULTS
        self.spec_path = self.dir / SPEC
        self.table = AppendOnlyCSV(self.results, COLUMNS, extra="ignore")

    def check(self, spec: SweepSpec) -> dict[str, Any]:
        """Refuse a directory that holds another sweep or other files, writing nothing; the record to keep."""
        wanted = spec.to_dict()
        if self.spec_path.exists():
            held = read_yaml(self.spec_path, "sweep record", SweepError)
            for later in ("gpu", *OPTIONAL_AXES):  # recorded before sweeps had these axes: the same sweep
                if isinstance(held, dict) and later not in held and wanted.get(later) == [None]:
                    wanted.pop(later)
            if held != wanted:
                raise SweepError(f"{self.dir} holds a different sweep ({self.spec_path}); give a new --out, or "
                                 "delete that directory to start over")
        elif self.dir.exists() and any(self.dir.iterdir()):
            raise SweepError(f"{self.dir} exists and is not a sweep directory; give a new --out")
        return wanted

    def open(self, spec: SweepSpec) -> set[str]:
        """Create the directory for this spec, or check that it holds the same sweep; returns the finished ids."""
        wanted = self.check(spec)
        self.dir.mkdir(parents=True, exist_ok=True)
        if not self.spec_path.exists():
            write_atomic(self.spec_path, yaml.safe_dump(wanted, sort_keys=False))
        return self._finished_ids()

    def _finished_ids(self) -> set[str]:
        if not self.results.exists():
            return set()
        self.table.repair()
        return set(self.load()["point_id"].astype(str))

    def append(self, rows: list[dict[str, Any]]) -> None:
        """Rows under the table's own header: a table resumed from before effects_s was a column keeps its
        columns, compute_s with the cluster's effects folded in as its other rows have it."""
        header = self._header()
        if header is not None and "effects_s" not in header:
            rows = [{**r, "compute_s": r["compute_s"] + r["effects_s"]} for r in rows]
            self.table = AppendOnlyCSV(self.results, header, extra="ignore")
        self.table.append(rows)

    def _header(self) -> list[str] | None:
        """The columns of the results table on disk; None before its first row."""
        if not self.results.is_file() or self.results.stat().st_size == 0:
            return None
        with self.results.open(newline="") as fh:
            return next(csv.reader(fh), None)

    def load(self) -> pd.DataFrame:
        return load_results(self.results)


def load_results(path: Path) -> pd.DataFrame:
    """A results table (the sweep directory or its results.csv), with the columns a sweep writes today filled in
    where an older one left them out and their values are known (:func:`with_later_columns`)."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS
    if not path.is_file():
        raise SweepError(f"no sweep results at {path}; run `arcsim sweep --out DIR` first")
    return with_later_columns(read_table(path, RESULT_TYPES, "a sweep results table arcsim sweep wrote", SweepError))


def with_later_columns(df: pd.DataFrame) -> pd.DataFrame:
    """Axes added after a table was written, as its points priced them (fusion bucket, hierarchy flat), the
    cluster's effects 0 (its compute_s held them), and the rank count from nodes × GPUs per node; columns whose
    values are unknown stay absent. A column since named with its unit is read under its new name (``bandwidth`` →
    ``bandwidth_Bps``)."""
    df = df.rename(columns={old: new for new, old in UNIT_COLUMNS.items() if old in df and new not in df})
    for col, value in UNSET_AXES.items():
        if col not in df:
            df[col] = value
    if "effects_s" not in df and "compute_s" in df:  # its compute_s held the cluster's effects: the sum stays
        df["effects_s"] = 0.0
    if "world" not in df and {"nodes", "gpus_per_node"} <= set(df):
        df["world"] = df["nodes"] * df["gpus_per_node"]
    return df


def finished_results(path: Path) -> pd.DataFrame:
    """A results table with at least one finished point (what charts and summaries need)."""
    df = load_results(path)
    if df.empty:
        raise SweepError(f"{path} holds no finished points yet; run (or resume) the sweep first")
    return df


def expected_points(path: Path) -> int | None:
    """How many points the sweep recorded beside a results table asks for (None without its sweep.yaml)."""
    from arcsim.sweep.spec import build_spec, load_yaml_spec

    path = Path(path)
    spec_path = (path if path.is_dir() else path.parent) / SPEC
    if not spec_path.is_file():
        return None
    return len(build_spec(load_yaml_spec(spec_path), source=str(spec_path)).points())

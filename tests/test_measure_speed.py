"""Measuring faster changes no result: measurements made side by side in forked processes equal those made one
at a time, and the intra-op thread count a measurement sets is restored (issue 40)."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from arcsim.run import analysis as analysis_module
from arcsim.run.analysis import MEASURED_AHEAD, Analysis, RunConfig
from arcsim.run.buckets import Bucket
from arcsim.run.measure import SMALL_WORK_ELEMENTS, intra_op_threads, measuring_threads

CONFIG = RunConfig(compressors=("dense", "topk", "randk", "arctopk", "gaussiank", "powersgd", "var"),
                   ratios=(0.001, 0.01, 0.1), policy="none")  # 8x8-ib100: compression modelled on its A100


def measurements(tmp_path, monkeypatch, processes: str) -> tuple[Analysis, dict]:
    monkeypatch.setenv("ARCSIM_CACHE_DIR", str(tmp_path / processes))
    monkeypatch.setenv("ARCSIM_MEASURE_PROCESSES", processes)
    a = Analysis(dataclasses.replace(CONFIG), announce=lambda _: None)
    a.run()
    return a, {k: dataclasses.asdict(m) for k, m in a._measured.items()}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="side by side needs two cores")
def test_side_by_side_measurements_equal_serial_ones(tmp_path, monkeypatch):
    serial, alone = measurements(tmp_path, monkeypatch, "1")
    forked, ahead = measurements(tmp_path, monkeypatch, "2")
    assert MEASURED_AHEAD not in serial.timings
    assert forked.timings[MEASURED_AHEAD] == len(forked.planned_keys())  # all of them measured side by side
    assert ahead.keys() == alone.keys()
    for key in alone:
        for name, value in alone[key].items():
            if name != "compress_s":  # NaN where modelled (and NaN != NaN)
                assert ahead[key][name] == value, (key, name)
    again = Analysis(dataclasses.replace(CONFIG), announce=lambda _: None)  # they were cached, by the parent
    assert again.measure_ahead() == 0 and again.measuring_work()[0] == 0


def test_a_failing_measurement_is_raised_where_the_run_asks_for_it(tmp_path, monkeypatch):
    monkeypatch.setenv("ARCSIM_CACHE_DIR", str(tmp_path))
    a = Analysis(dataclasses.replace(CONFIG), announce=lambda _: None)

    def broken(self, key):
        raise RuntimeError(f"no {key[0]}")

    monkeypatch.setattr(analysis_module.Analysis, "_measure_key", broken)
    assert a.measure_ahead() == 0  # the pool's failure is no failure of the run …
    with pytest.raises(RuntimeError, match="no dense"):
        a.run()  # … whose own measurement raises it, in order


def test_intra_op_threads_are_restored():
    before = torch.get_num_threads()
    with intra_op_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError), intra_op_threads(1):
        raise ValueError
    assert torch.get_num_threads() == before
    small = [Bucket(0, (), 0, SMALL_WORK_ELEMENTS // 8 - 1, 0.0)]
    assert measuring_threads(small, 8) == 1 and measuring_threads(small, 9) is None

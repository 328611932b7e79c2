"""--measure-device and the kernel check (arcsim.run.kernel_check): compression timed where it runs, beside the
kernel model's price. The CUDA half runs on a GPU only (tests/test_cuda.py; benchmarks/gpu_session.py on a lent one)."""

from __future__ import annotations

import pytest
import torch
from conftest import run_cli

from arcsim.devices.catalog import matching
from arcsim.devices.kernels import compress_seconds


@pytest.mark.parametrize(("torch_name", "catalogue"), [
    ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"), ("NVIDIA A100-SXM4-80GB", "a100"),
    ("Tesla V100-SXM2-32GB", "v100"), ("NVIDIA GeForce RTX 4090", "rtx4090"), ("NVIDIA L40S", "l40s"),
    ("AMD EPYC 7B13", None)])
def test_a_torch_device_name_finds_its_catalogue_gpu(torch_name, catalogue):
    found = matching(torch_name)
    assert (found.name if found else None) == catalogue


def test_the_check_sets_each_timed_compressor_beside_the_model_of_the_same_buckets():
    from arcsim.run.analysis import Analysis
    from arcsim.run.config import RunConfig
    from arcsim.run.kernel_check import kernel_check

    analysis = Analysis(RunConfig(compressors=("topk", "qsgd", "fp16"), policy="none", ratios=(0.01,), gpu="cpu"),
                        announce=lambda _: None)
    result = analysis.run()
    check = kernel_check(result.candidates, result.ctx, "NVIDIA H100 80GB HBM3", analysis.trace.workers)
    assert check is not None and check.model.startswith("h100, measured on")
    assert [r.compressor for r in check.rows] == ["topk", "qsgd", "fp16"]  # each once, whatever its collectives
    gpu = matching("H100")
    for row in check.rows:
        meas = analysis.measurement(row.compressor, 0.01)
        assert row.measured_s == pytest.approx(sum(meas.compress_s[0])) and row.measured_s > 0
        assert row.modelled_s == pytest.approx(sum(
            compress_seconds(row.compressor, "tensor", b.numel, len(b.layers), gpu, row.density,
                             analysis.trace.workers) for b in result.ctx.buckets))
        assert row.ratio == pytest.approx(row.modelled_s / row.measured_s)
    assert check.to_dict()["rows"][0]["ratio"] == check.rows[0].ratio


def test_nothing_timed_gives_no_check():
    """Compression modelled on the topology's GPU is not timed: no check to show (no NaN rows)."""
    from arcsim.run.analysis import Analysis
    from arcsim.run.config import RunConfig
    from arcsim.run.kernel_check import kernel_check

    analysis = Analysis(RunConfig(compressors=("topk",), policy="none", ratios=(0.01,)), announce=lambda _: None)
    assert not analysis.timed
    result = analysis.run()
    assert result.kernel_check is None
    check = kernel_check(result.candidates, result.ctx, "NVIDIA H100", analysis.trace.workers)
    assert check.rows == () and "no compressor was timed" in check.why  # said, not silently absent
    unknown = kernel_check(result.candidates, result.ctx, "Some Accelerator X", analysis.trace.workers)
    assert unknown.rows == () and "no Some Accelerator X" in unknown.why


def test_a_measurement_timed_on_a_gpu_is_cached_apart_from_one_timed_on_the_cpu():
    from arcsim.run import cache

    args = ("trace-sha", [], "topk", 0.01, "ef14", 0, {}, 2, True)
    keys = {cache.key(*args), cache.key(*args, device="NVIDIA H100 (torch 2.11)"),
            cache.key(*args, device="NVIDIA H200 (torch 2.11)")}
    assert len(keys) == 3
    assert cache.key(*args) == cache.key(*args, device="cpu")  # CPU keys as before: earlier caches still found


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_measure_device_cuda_without_a_gpu_is_one_error_line():
    done = run_cli("run", "--measure-device", "cuda")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "error: --measure-device cuda asked for, but this torch sees no CUDA device; drop it to measure on this CPU"]

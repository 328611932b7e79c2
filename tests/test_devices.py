"""The device model (issue 14): catalogue, counted workloads against published figures, the fitted compute
model and the kernel model against the shipped GPU measurements, and runs priced on a GPU."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

from arcsim.devices.catalog import DEVICE_DIR, device, devices, priced_gpu
from arcsim.devices.compute import load_fit, measured_profiles, modelled_profile, step_error
from arcsim.devices.kernels import compress_seconds, fitted_rows, load_counts, relative_errors
from arcsim.devices.predict import predict_compute
from arcsim.errors import ArcsimError
from arcsim.files import packaged
from arcsim.models.workload import count_workload
from arcsim.topology import load_topology

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def test_the_catalogue_has_the_promised_devices_each_with_its_sources():
    assert {"v100", "a100", "h100", "h200", "b200", "l40s", "mi300x", "cpu"} <= set(devices())
    for d in devices().values():
        assert d.source and d.launch_source
        if d.modelled:
            assert d.peak_tflops["fp32"] > 0 and d.memory_bandwidth_GBps > 0 and d.launch_us > 0
    assert "bf16" not in device("v100").peak_tflops and device("V100").name == "v100"
    with pytest.raises(ArcsimError, match="has no bf16"):
        device("v100").check_precision("bf16")
    # the launch costs said to be measured are the ones the roofline runs measured
    for gpu in ("h100", "h200"):
        launch = json.loads((RESULTS / gpu / "roofline.json").read_text())["launch"]["host_us_per_launch"]
        assert device(gpu).launch_us == pytest.approx(launch, rel=0.05)


def test_the_gpu_priced_on_is_the_flag_else_the_topologys():
    """Issue 49: one home for the rule that run, train, shard and the topology's overrides share."""
    assert priced_gpu("h100", "a100") == "h100"
    assert priced_gpu(None, "a100") == "a100"
    assert priced_gpu("cpu", "a100") == "cpu"  # as measured here, not the topology's
    assert priced_gpu(None, None) is None
    assert load_topology("2x4-ib100").with_overrides(gpu="h100").gpu == "h100"


def test_counted_flops_match_the_published_figures():
    """ResNet-50 4.09 GMACs and ViT-B/16 17.56 GMACs per 224² image (torchvision's model cards)."""
    resnet = count_workload("resnet50", 1)
    assert sum(o.flops for o in resnet.forward) / 2 / 1e9 == pytest.approx(4.09, rel=0.01)
    vit = count_workload("vit_b_16", 1)
    assert sum(o.flops for o in vit.forward) / 2 / 1e9 == pytest.approx(17.56, rel=0.01)
    assert sum(o.flops for o in resnet.backward) == pytest.approx(2 * sum(o.flops for o in resnet.forward), rel=0.02)
    assert {o.cls for o in vit.forward} >= {"conv", "matmul", "attention", "memory"}  # attention: one fused op


def test_a_counted_workload_is_kept_on_disk_and_read_back_the_same(tmp_path, monkeypatch):
    from arcsim.models import workload

    monkeypatch.setenv("ARCSIM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(workload, "_LINES", {})  # (a line other tests' counts drew would give it, uncounted)
    workload._workload.cache_clear()
    counted = count_workload("resnet18", 3)
    assert list((tmp_path / "arcsim-results").glob("workload-*.json.gz"))
    workload._workload.cache_clear()
    monkeypatch.setattr(workload, "_count", lambda *a: pytest.fail("counted again instead of read from disk"))
    kept = count_workload("resnet18", 3)
    assert (kept.forward, kept.backward, kept.ready_after, kept.numel, kept.order, kept.input_shape) == \
        (counted.forward, counted.backward, counted.ready_after, counted.numel, counted.order, counted.input_shape)
    workload._workload.cache_clear()


@pytest.mark.parametrize("model", ["resnet18", "llama_60m"])
def test_a_workload_at_another_batch_is_on_the_line_of_three_counts(tmp_path, monkeypatch, model):
    from arcsim.models import workload

    def fresh(folder: str) -> None:
        monkeypatch.setenv("ARCSIM_CACHE_DIR", str(tmp_path / folder))
        monkeypatch.setattr(workload, "_LINES", {})
        workload._workload.cache_clear()

    fresh("line")
    for batch in (8, 4, 2):  # the third count checks that the three lie on one line
        count_workload(model, batch)
    (line,) = workload._LINES.values()
    assert line.affine
    monkeypatch.setattr(workload, "_count", lambda *a: pytest.fail("counted instead of taken from the line"))
    derived = count_workload(model, 32)
    monkeypatch.undo()
    fresh("counted")
    counted = count_workload(model, 32)
    for phase in ("forward", "backward"):
        got, want = derived.arrays(phase), counted.arrays(phase)
        assert np.array_equal(got[2], want[2]) and all(np.allclose(got[i], want[i], rtol=1e-12, atol=0) for i in (0, 1))
    assert (derived.ready_after, derived.order, derived.numel) == (counted.ready_after, counted.order, counted.numel)
    workload._workload.cache_clear()


def test_every_parameter_is_ready_once_in_backward_order():
    w = count_workload("resnet18", 4)
    assert sorted(w.order) == sorted(w.numel) and len(set(w.order)) == len(w.order)
    after = [w.ready_after[n] for n in w.order]
    assert after == sorted(after) and after[-1] <= len(w.backward)
    assert w.order[0] == "fc.bias" or w.order[0] == "fc.weight"


def test_a_modelled_profile_is_consistent_and_scales_with_the_datasheet():
    eff, _ = load_fit()
    work = count_workload("resnet50", 64)
    h100 = modelled_profile(work, device("h100"), "fp32", eff)
    ready = [la.ready_s for la in h100.layers]
    assert ready == sorted(ready) and 0 < ready[-1] <= h100.backward_s
    v100 = modelled_profile(work, device("v100"), "fp32", eff)
    assert v100.forward_s > 2 * h100.forward_s  # 15.7 TFLOP/s fp32 units against TF32 tensor cores
    assert modelled_profile(work, device("h100"), "fp32", eff).forward_s == h100.forward_s  # deterministic


def test_the_committed_fit_is_what_the_shipped_profiles_give_and_meets_the_goal():
    eff, data = load_fit()
    h100 = device("h100")
    some = [m for m in measured_profiles("h100") if m.model in ("resnet50", "vit_b_16")]
    assert len(some) == 20
    for m in some:  # the stored errors are this code on these files
        key = f"{m.model}-b{m.batch}-{m.precision}"
        assert step_error(m, h100, eff) == pytest.approx(data["in_sample"][key], abs=1e-9)
    assert len(data["fitted_on"]) == 60
    assert data["summary"]["leave_one_out"]["mean_abs"] <= 0.15  # the goal, on held-out profiles
    assert data["summary"]["leave_one_model_out"]["mean_abs_real_models"] <= 0.15
    assert data["summary"]["transfer_h200"]["mean_abs_real_models"] <= 0.15


def test_the_h100_fit_predicts_measured_h200_steps_of_real_models():
    eff, _ = load_fit()
    h200 = device("h200")
    errors = [abs(step_error(m, h200, eff)) for m in measured_profiles("h200") if m.model in ("resnet18", "vit_b_16")]
    assert len(errors) == 16 and statistics.fmean(errors) < 0.15


def test_predict_uses_the_measured_profile_when_one_matches_else_the_model():
    measured = predict_compute("resnet50", "h100", 32, "fp32")
    shipped = json.loads(packaged("traces", "profiles", "resnet50-h100-b32-fp32.json").read_text())
    assert measured.source == "measured" and measured.expected_error is None
    assert measured.profile.forward_s == shipped["forward_s"]
    modelled = predict_compute("resnet50", "h100", 32, "fp32", modelled=True)
    assert modelled.source == "modelled" and 0 < modelled.expected_error < 0.5
    assert "leave-one-out" in modelled.detail
    other = predict_compute("resnet50", "a100", 48, "bf16")
    assert other.source == "modelled" and "another GPU" in other.detail


def test_device_cli_list_show_and_predict_json():
    listing = json.loads(run_cli("device", "list", "--json", "-").stdout)
    assert {d["name"] for d in listing} == set(devices())
    r = run_cli("device", "predict", "--model", "vit_b_16", "--gpu", "h100", "--batch", "48", "--json", "-")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert {"forward_s", "backward_s", "layers", "source"} <= set(out) and out["source"] == "modelled"
    assert len(out["layers"]) == 152 and out["forward_s"] > 0
    r = run_cli("device", "predict", "--model", "resnet50", "--gpu", "h100", "--batch", "32")
    assert "measured — shipped profile resnet50-h100-b32-fp32.json" in " ".join(r.stdout.split())


def _kernel_errors(gpu: str, counts_of: str) -> list[float]:
    """Each measured call's error priced from ``counts_of``'s table, over every file ``gpu``'s table was fitted to."""
    counts, _ = load_counts(counts_of)
    table = json.loads((DEVICE_DIR / "kernels" / f"{gpu}.json").read_text())
    rows = [r for name in table["from"] for r in json.loads((ROOT / name).read_text())["compressors"]]
    return relative_errors(fitted_rows(rows), counts, device(gpu))


def test_kernel_tables_fit_their_measurements_and_the_h100_counts_carry_to_the_h200():
    for gpu, calls in (("h100", 297), ("h200", 409)):
        table = json.loads((DEVICE_DIR / "kernels" / f"{gpu}.json").read_text())
        errors = _kernel_errors(gpu, gpu)
        assert len(errors) == calls
        assert statistics.fmean(abs(e) for e in errors) == pytest.approx(table["fit_mean_abs_error"], rel=1e-6)
        assert table["fit_mean_abs_error"] < 0.25
    assert statistics.fmean(abs(e) for e in _kernel_errors("h200", "h100")) < 0.3


def test_dense_topk_pays_per_selected_element_and_per_peer_it_gathers_from():
    """Measured on an H200 (benchmarks/results/h200/2026-11-27): at ρ 0.25-0.5 the counts without a per-selected
    term priced Top-K's calls 43 % under their time; the gathered values of p peers cost ∝ p·k."""
    h200 = device("h200")
    sparse, dense = (compress_seconds("topk", "bucket", 6_000_000, 40, h200, rho) for rho in (0.01, 0.5))
    assert dense > 2 * sparse
    few, many = (compress_seconds("topk", "bucket", 6_000_000, 40, h200, 0.25, peers) for peers in (8, 64))
    work = json.loads((RESULTS / "h200" / "2026-11-27" / "work_times.json").read_text())["rows"]
    scatter = {r["peers"]: r["ms"] * 1e-3 for r in work
               if r["op"] == "index_add all peers" and r["density"] == 0.25}
    # 56 more peers' k values scattered back: the measured index_add's growth from 8 to 64 peers, within 35 %
    measured_growth = (scatter[64] - scatter[8]) * 6_000_000 / 25_557_032
    assert many - few == pytest.approx(measured_growth, rel=0.35)
    assert compress_seconds("fp16", "bucket", 6_000_000, 40, h200, 0.5, 64) == compress_seconds(
        "fp16", "bucket", 6_000_000, 40, h200)  # a cast selects nothing and gathers nothing


def test_topologies_name_their_gpu_and_the_grammar_takes_one():
    assert load_topology("8x8-ib400x8").gpu == "h100" and load_topology("8x8-ib100").gpu == "a100"
    assert load_topology("8x8-ib100-h200").gpu == "h200" and load_topology("8x8-ib100").ranks == 64
    assert load_topology("4x8-ib100").gpu is None
    with pytest.raises(ArcsimError, match="unknown gpu 'x9'"):
        load_topology("8x8-ib100-x9")


def test_a_run_on_a_gpu_is_deterministic_and_says_what_it_assumed(tmp_path):
    args = ("run", "-c", "dense,topk,star", "--ratios", "0.01", "--policy", "none", "--gpu", "h100")
    outs = []
    for i in range(2):  # each from its own empty measurement cache: both compute everything
        r = run_cli(*args, "--json", str(tmp_path / f"{i}.json"), env={"ARCSIM_CACHE_DIR": str(tmp_path / f"c{i}")})
        assert r.returncode == 0, r.stderr
        data = json.loads((tmp_path / f"{i}.json").read_text())
        data.pop("timings_s")
        outs.append(data)
    assert outs[0] == outs[1]
    text = " ".join(r.stdout.split())
    assert "compute: measured on NVIDIA H100 SXM5 80GB, batch 32 per GPU" in text  # cnn-h100-b32-fp32.json
    assert "compression time: modelled on NVIDIA H100 SXM5 80GB" in text and "measured on NVIDIA H100" in text
    shipped = json.loads(packaged("traces", "profiles", "cnn-h100-b32-fp32.json").read_text())
    for c in outs[0]["candidates"]:
        assert c["compute_s"] == pytest.approx(shipped["forward_s"] + shipped["backward_s"])
    assert np.isfinite([c["compress_s"] for c in outs[0]["candidates"]]).all()


@pytest.mark.parametrize(("gpu", "flags", "kind", "priced_on"), [
    ("h100", {}, "modelled", "h100"),
    ("h100", {"params": True}, "none", "h100"),
    ("h100", {"live_on_gpu": True}, "live-gpu", None),
    (None, {}, "here", None),
    ("cpu", {}, "here", None),
    ("cpu", {"params": True}, "none", None),
])
def test_where_compute_comes_from_is_decided_in_one_order(gpu, flags, kind, priced_on):
    from arcsim.devices.source import compute_source

    where = compute_source(gpu, **flags)
    assert where.kind == kind and (where.gpu.name if where.gpu else None) == priced_on
    assert (where.why_not_modelled == "") == (kind == "modelled")


def test_a_compute_profile_prices_compression_on_the_gpu_it_was_measured_on_unless_one_is_named():
    from arcsim.devices.source import compute_source
    from arcsim.traces.profile import PROFILE_DIR

    profile = str(PROFILE_DIR / "resnet50-h100-b32-fp32.json")
    assert compute_source(None, profile=profile).gpu.name == "h100"
    assert compute_source("a100", profile=profile).gpu.name == "a100"
    assert compute_source("cpu", profile=profile).gpu is None
    assert compute_source("a100", profile=profile).kind == "profile"


def test_the_sign_methods_decode_every_peer_and_onebit_does_not():
    """H200 (benchmarks/results/h200/2026-11-27): a majority vote of p peers' packed signs grows with p (2.7 ms at
    8 peers, 21 ms at 64 on 25.6 M); 1-bit Adam decodes its chunk of p peers, then p chunks: n each, whatever p."""
    h200 = device("h200")
    n = 25_557_032
    work = json.loads((RESULTS / "h200" / "2026-11-27" / "work_times.json").read_text())["rows"]
    vote = {r["peers"]: r["ms"] * 1e-3 for r in work if r["op"] == "majority vote" and r["numel"] == n}
    eight, many = (compress_seconds("signsgd", "bucket", n, 1, h200, None, p) for p in (8, 64))
    assert many - eight == pytest.approx(vote[64] - vote[8], rel=0.15)
    onebit = {p: compress_seconds("onebit", "bucket", n, 1, h200, None, p) for p in (1, 8, 64)}
    assert onebit[64] < onebit[8] < onebit[1]  # more peers: a smaller chunk to serve, no more to decode


def test_onebit_server_compresses_only_the_chunk_it_serves():
    """1-bit Adam's worker compresses its n elements and decodes n twice (its chunk from p peers, then p chunks);
    its server compresses the 1/p chunk it serves (DeepSpeed's server chunk; ``served`` [W, chunk] in
    arcsim.compressors.onebit), not the whole bucket: priced as the H200's measured steps, its pack's passes on n/p."""
    h200 = device("h200")
    small, n = 1 << 20, 25_557_032
    work = json.loads((RESULTS / "h200" / "2026-11-27" / "work_times.json").read_text())["rows"]
    step = {(r["op"], r["numel"]): r["ms"] * 1e-3 for r in work if r.get("peers") is None}
    pack, unpack = step["efsign scale+pack", n], step["sign unpack", n]
    per_element = (pack - step["efsign scale+pack", small]) / (n - small)  # the pack's seconds per element
    one, eight, many = (compress_seconds("onebit", "bucket", n, 1, h200, None, p) for p in (1, 8, 64))
    assert one == pytest.approx(2 * pack + 2 * unpack, rel=1e-9)  # one rank: its server's chunk is everything
    assert eight - many == pytest.approx(per_element * n * (1 / 8 - 1 / 64), rel=1e-9)
    assert one - many == pytest.approx(per_element * n * (1 - 1 / 64), rel=1e-9)
    assert compress_seconds("qsgd", "bucket", n, 1, h200, None, 8) < compress_seconds("qsgd", "bucket", n, 1, h200,
                                                                                      None, 32)

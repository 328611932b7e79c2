"""--framework deepspeed (DeepSpeed's engine without ZeRO): buffers of 500 M elements in forward order, every one of
them, and a compressor's work, after the backward pass; and fp16 compute on a V100's tensor cores."""

from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import run_cli

from arcsim.catalog import DEEPSPEED_BUFFER_ELEMENTS
from arcsim.comm.log import record
from arcsim.compressors.layout import Layer
from arcsim.errors import ArcsimError
from arcsim.pricing import Pricer
from arcsim.run.candidates import Context, step_timeline
from arcsim.run.scaling import compute_times, dense_step, dense_timeline
from arcsim.strategy.frameworks import FRAMEWORKS, deepspeed_buffers, get_framework
from arcsim.topology import NO_EFFECTS, load_topology
from arcsim.traces.profile import ComputeProfile, LayerTiming


def _layers(sizes: list[int]) -> list[Layer]:
    """Layers of ``sizes`` elements in backward order, contiguous in the flat vector (as a trace keeps them)."""
    out, offset = [], 0
    for i, n in enumerate(sizes):
        out.append(Layer(f"l{i}", (n,), offset))
        offset += n
    return out


def _profile() -> ComputeProfile:
    """16 layers of 1.6 M parameters (backward order), 60 ms forward, 120 ms backward, gradients ready through it."""
    layers = [LayerTiming(f"l{i}", 1_600_000, 0.120 * (i + 1) / 16) for i in range(16)]
    return ComputeProfile("toy", 64, "cuda", "V100", 0.060, 0.120, layers, "profile")


def test_buffers_close_past_the_element_cap_in_forward_order() -> None:
    """allreduce_no_retain: a buffer is sent once it holds MORE than the cap (the tensor that crossed it
    included), the tensors taken in named_parameters() (forward) order, the trace's backward order reversed."""
    layers = _layers([400, 300, 200, 100])           # backward order: forward is l3 (100), l2, l1, l0
    ready = [0.1, 0.2, 0.3, 0.4]
    buffers = deepspeed_buffers(layers, ready, cap_bytes=300 * 4)  # 300 elements
    assert [[la.name for la in b.layers] for b in buffers] == [["l1", "l2", "l3"], ["l0"]]
    assert [(b.lo, b.hi) for b in buffers] == [(400, 1000), (0, 400)]
    # exactly at the cap does not close it (DDP's >= would): 100 + 200 = 300 stays open for l1
    assert [len(b.layers) for b in deepspeed_buffers(_layers([300, 200, 100]), [0.0] * 3, 300 * 4)] == [3]
    # every buffer is ready when backward ends, not when its own last gradient is
    assert {b.ready_s for b in buffers} == {0.4}
    assert {b.ready_s for b in deepspeed_buffers(layers, ready, 300 * 4, backward_s=0.5)} == {0.5}


def test_default_is_deepspeeds_500m_elements_and_bucket_mb_overrides() -> None:
    fw = get_framework("deepspeed")
    assert "deepspeed" in FRAMEWORKS
    assert fw.cap_mb(None) * 2**20 / 4 == DEEPSPEED_BUFFER_ELEMENTS == 500_000_000
    assert fw.first_cap(None) is None  # no small first bucket (that is torch's DDP)
    layers = [LayerTiming(f"l{i}", 2_097_152, 0.0) for i in range(10)]  # 8 MiB of fp32 each
    prof = ComputeProfile("toy", 64, "cuda", "V100", 0.0, 0.0, layers, "profile")
    topo = load_topology("2x4-ib100")
    assert dense_step(prof, topo, framework="deepspeed").buckets == 1      # 21 M elements: one buffer
    assert dense_step(prof, topo, 25, framework="deepspeed").buckets == 3  # past 25 MiB: 4, 4, 2
    with pytest.raises(ArcsimError, match="deepspeed"):
        get_framework("zero")


def test_dense_all_reduce_starts_after_backward_under_deepspeed_only() -> None:
    """DDP's buckets go while backward runs; DeepSpeed's engine all-reduces once backward has returned, so each
    collective starts after forward + backward and every second of it is exposed."""
    prof, topo = _profile(), load_topology("2x4-eth10")
    end = prof.forward_s + prof.backward_s
    ds, ds_buckets = dense_timeline(prof, topo, 25, framework="deepspeed")
    ddp, _ = dense_timeline(prof, topo, 25, framework="ddp")
    assert len(ds_buckets) > 1
    assert min(ds.comm_start) >= end - 1e-12
    assert min(ddp.comm_start) < end          # DDP overlaps ...
    assert ds.exposed_comm_s == pytest.approx(ds.comm_s)
    assert ddp.exposed_comm_s < ds.exposed_comm_s  # ... and so hides some of what DeepSpeed exposes
    assert ds.iteration_s > ddp.iteration_s


def test_a_compressors_work_and_collectives_come_after_backward() -> None:
    """1-bit Adam compresses in the optimizer step: the compression runs on the compute stream once backward has
    ended, and each group's collectives after its compression (no stragglers here: compute is the profile's)."""
    prof, topo = _profile(), dataclasses.replace(load_topology("2x4-eth10"), effects=NO_EFFECTS)
    compute = compute_times(prof)
    fw = get_framework("deepspeed")
    layers = [Layer(la.name, (la.numel,), i * la.numel) for i, la in enumerate(prof.layers)]
    buckets = fw.buckets(layers, compute.ready_s.tolist(), 8 * 2**20, backward_s=compute.backward_s)
    ctx = Context(None, topo, compute, buckets, "analytic", framework="deepspeed")
    records = [[record("alltoall", "signs", 1, "uint8", b.numel // 8, topo.ranks),
                record("allgather", "signs", 1, "uint8", b.numel // 8 // topo.ranks, topo.ranks)] for b in buckets]
    compress = [0.010] * len(buckets)
    timeline, comm = step_timeline(records, compress, "ring", ctx, Pricer(topo, "analytic"), "allgather")
    end = compute.forward_s + compute.backward_s
    assert len(buckets) == 8 and all(c > 0 for c in comm)  # 1.6 M elements a layer: past 2 Mi every two
    assert timeline.comm_start[0] == pytest.approx(end + compress[0])
    assert all(s >= end + (i + 1) * compress[0] - 1e-12 for i, s in enumerate(timeline.comm_start))
    assert timeline.iteration_s >= end + compress[0] + sum(comm) - 1e-12


def test_arcsim_run_prices_deepspeed_on_the_shipped_trace(tmp_path) -> None:
    """`arcsim run --framework deepspeed` on the shipped trace: every group ready at the same time (backward's end),
    in buffers of more than the cap; a compressor's iteration holds its compression and its collectives after the
    compute; DDP on the same buckets' cap sends its first bucket earlier."""
    results = {}
    for fw in ("deepspeed", "ddp"):
        out = tmp_path / f"{fw}.json"
        r = run_cli("run", "--framework", fw, "--bucket-mb", "0.03", "-c", "topk", "--ratios", "0.01", "--policy",
                    "none", "--json", str(out))
        assert r.returncode == 0, r.stderr
        results[fw] = json.loads(out.read_text())
    ds = results["deepspeed"]
    assert ds["config"]["bucket_mb"] == 0.03
    assert len(ds["buckets"]) > 1 and len({b["ready_s"] for b in ds["buckets"]}) == 1
    cap = 0.03 * 2**20 / 4
    assert all(b["elements"] > cap for b in ds["buckets"][:-1])
    assert min(b["ready_s"] for b in results["ddp"]["buckets"]) < ds["buckets"][0]["ready_s"]
    for c in [ds["dense"], *ds["candidates"]]:
        assert c["iteration_s"] >= c["compute_s"] + c["compress_s"] + c["exposed_comm_s"] - 1e-12


def test_fp16_on_a_v100_runs_on_its_tensor_cores() -> None:
    """The V100 has fp16 tensor cores (125 TFLOP/s, its datasheet) and no bf16: fp16 is priced, faster than fp32
    for a transformer; bf16 is refused. On a GPU whose fp16 and bf16 peaks are equal, fp16 prices as bf16 does
    (the same 16-bit tensor-core kernels, bf16's fitted efficiencies), so no other GPU's bf16 answer moves."""
    from arcsim.devices.catalog import device
    from arcsim.devices.predict import predict_compute

    v100 = device("v100")
    assert v100.peak("matmul", "fp16") == 125e12 and v100.units("matmul", "fp32") == "fp32"
    fp32 = predict_compute("gpt2_small", "v100", 16, "fp32", modelled=True)
    fp16 = predict_compute("gpt2_small", "v100", 16, "fp16", modelled=True)
    step = {p.precision: p.profile.forward_s + p.profile.backward_s for p in (fp32, fp16)}
    assert step["fp16"] < 0.6 * step["fp32"]
    with pytest.raises(ArcsimError, match="no bf16"):
        predict_compute("gpt2_small", "v100", 16, "bf16", modelled=True)
    a100 = {p: predict_compute("gpt2_small", "a100", 16, p, modelled=True).profile for p in ("bf16", "fp16")}
    assert a100["fp16"].forward_s == pytest.approx(a100["bf16"].forward_s)
    assert a100["fp16"].backward_s == pytest.approx(a100["bf16"].backward_s)

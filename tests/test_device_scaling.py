"""How the device model prices a small model as its batch grows (issue 39): launch-bound while the host's
issue cost exceeds the GPU's work, device-bound after; and a prediction prices DDP's per-parameter hooks,
not the per-parameter CUDA events the shipped profiles were timed with."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import pytest
from _users_job import USER_GPT, token_batches

from arcsim.devices.catalog import device
from arcsim.devices.compute import (
    DDP_HOOK,
    backward_hooks,
    device_seconds,
    find_measured,
    host_paced_gaps,
    issue_seconds,
    load_fit,
    measured_profiles,
    phase_seconds,
    profiler_hook,
)
from arcsim.models import MODELS
from arcsim.models.source import model_source
from arcsim.models.workload import count_workload

DATA = token_batches(16000, 64)
GPT_ARGS = (("vocab", 16000), ("width", 256), ("depth", 4), ("block", 64))  # 11.4 M parameters, 64 tokens


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):  # type: ignore[no-untyped-def]
    """The user's GPT at 4 layers, 256 wide, 64 tokens (the issue's model), counted at each batch asked."""
    where = tmp_path_factory.mktemp("gpt")
    (where / "my_gpt.py").write_text(USER_GPT)
    (where / "data.py").write_text(DATA)
    source = model_source(f"{where / 'my_gpt.py'}:build", GPT_ARGS)
    return lambda batch: count_workload(source, batch, data=f"{where / 'data.py'}:batches")


def host_seconds(work, phase, gpu, precision, eff):  # type: ignore[no-untyped-def]
    """What the host alone spends issuing ``phase`` (DDP's hooks in backward)."""
    hooks = DDP_HOOK * backward_hooks(work).sum() * gpu.launch_us * 1e-6 if phase == "backward" else 0.0
    return float(issue_seconds(work, phase, gpu, precision, eff).sum()) + hooks


def test_the_issues_gpt_is_launch_bound_at_batch_16_and_64_and_device_bound_at_1024(gpt):  # type: ignore[no-untyped-def]
    eff, _ = load_fit()
    a100 = device("a100")
    work = {b: gpt(b) for b in (1, 16, 64, 1024)}
    assert sum(work[16].numel.values()) == pytest.approx(11.4e6, rel=0.01)
    bwd = {b: phase_seconds(w, "backward", a100, "bf16", eff) for b, w in work.items()}
    for b, phase in [(1, "forward"), (16, "forward"), (1, "backward"), (16, "backward"), (64, "backward")]:
        host = host_seconds(work[b], phase, a100, "bf16", eff)  # the GPU's work hides under the host's
        assert phase_seconds(work[b], phase, a100, "bf16", eff) == pytest.approx(host, rel=0.05)
    # at 64 the forward's last operations (the 16 000-way head and its loss) outlast the host: partly exposed
    assert phase_seconds(work[64], "forward", a100, "bf16", eff) > host_seconds(work[64], "forward", a100, "bf16",
                                                                                eff)
    assert bwd[64] / bwd[16] < 1.1
    # once the GPU's work exceeds the host's, backward grows with the batch (16x the batch, ≥ 3x the time)
    f, nbytes, cls = work[1024].arrays("backward")
    gpu_work = device_seconds(f, nbytes, cls, a100, "bf16", eff).sum()
    assert gpu_work > 2 * host_seconds(work[1024], "backward", a100, "bf16", eff)
    assert bwd[1024] == pytest.approx(gpu_work, rel=0.1)
    assert bwd[1024] / bwd[64] >= 3


def test_backward_grows_with_the_batch_once_the_device_dominates(gpt):  # type: ignore[no-untyped-def]
    eff, _ = load_fit()
    a100 = device("a100")
    times = [phase_seconds(gpt(b), "backward", a100, "bf16", eff) for b in (256, 1024, 4096)]
    assert times == sorted(times)
    assert times[2] / times[1] >= 2 and times[1] / times[0] >= 2


def test_a_prediction_prices_ddps_hooks_and_a_shipped_profile_the_profilers_events(gpt):  # type: ignore[no-untyped-def]
    eff, _ = load_fit()
    a100 = device("a100")
    work = gpt(16)
    plain = phase_seconds(work, "backward", a100, "bf16", eff)
    profiled = phase_seconds(work, "backward", a100, "bf16", eff, instrumented=True)
    hooks = backward_hooks(work).sum()
    assert hooks == len(work.numel) == 52
    # launch-bound: the two differ by the hooks' cost difference (less those after the last operation)
    assert profiled - plain == pytest.approx(hooks * (eff.hook - DDP_HOOK) * a100.launch_us * 1e-6, rel=0.05)
    assert eff.hook > DDP_HOOK and plain < profiled
    # forward has no hooks: the same either way
    assert phase_seconds(work, "forward", a100, "bf16", eff) == \
        phase_seconds(work, "forward", a100, "bf16", eff, instrumented=True)


def test_the_host_costs_respect_the_measured_launch_floor_and_the_fit_reproduces_both_phases():
    eff, data = load_fit()
    assert eff.host >= 1.0  # one tiny kernel issued from Python (roofline.json's launch) is the floor
    assert eff.autograd >= 0.25 and eff.hook > 0
    h100 = device("h100")
    errors = {phase: [abs(e[phase]) for e in data["phases"]["h100"].values()] for phase in ("forward", "backward")}
    assert len(errors["forward"]) == len(measured_profiles("h100")) == 60
    # the fit is in-sample on these: forward and backward each within 15 % on average (12.4 %, 12.9 % fitted)
    assert statistics.fmean(errors["forward"]) <= 0.15 and statistics.fmean(errors["backward"]) <= 0.15
    m = next(m for m in measured_profiles("h100") if (m.model, m.batch, m.precision) == ("resnet50", 32, "fp32"))
    stored = data["phases"]["h100"]["resnet50-b32-fp32"]["backward"]
    assert phase_seconds(m.workload(), "backward", h100, "fp32", eff, True) / m.backward_s - 1 == \
        pytest.approx(stored, abs=1e-9)


# -- issue 48, item 6: bf16 compute that scales -----------------------------------------------------------
TENSOR_CORE_GPUS = ("a100", "h100", "h200", "b200")
BATCHES = (8, 32, 128)


def zoo_transformers() -> list[str]:
    """The zoo's models with attention (counted, not listed by name: a new transformer joins the checks)."""
    return [name for name in MODELS if any(op.cls == "attention" for op in count_workload(name, 8).forward)]


@dataclass(frozen=True)
class Priced:
    """One modelled step (DDP's hooks) with what the GPU and the host each need for it."""

    forward: float
    backward: float
    gpu: dict[str, float]    # per phase: the sum of the operations' device times
    host: dict[str, float]   # per phase: the host's issue time, hooks included

    @property
    def step(self) -> float:
        return self.forward + self.backward


def priced(model: str, gpu: str, batch: int, precision: str) -> Priced:
    eff, _ = load_fit()
    dev, work = device(gpu), count_workload(model, batch)
    gpu_work = {p: float(device_seconds(*work.arrays(p), dev, precision, eff).sum()) for p in ("forward", "backward")}
    host = {p: host_seconds(work, p, dev, precision, eff) for p in ("forward", "backward")}
    forward, backward = (phase_seconds(work, p, dev, precision, eff) for p in ("forward", "backward"))
    return Priced(forward, backward, gpu_work, host)


@pytest.fixture(scope="module")
def grid():  # type: ignore[no-untyped-def]
    """Every zoo transformer on every tensor-core GPU at batch 8, 32, 128, fp32 and bf16."""
    return {(m, g, b, p): priced(m, g, b, p) for m in zoo_transformers() for g in TENSOR_CORE_GPUS
            for b in BATCHES for p in ("fp32", "bf16")}


def test_the_zoo_has_its_transformers():
    assert {"gpt2_small", "vit_b_16", "llama_60m", "llama_1b"} <= set(zoo_transformers())
    assert "resnet50" not in zoo_transformers()


def test_bf16_is_never_slower_than_fp32_unless_the_host_sets_the_pace(grid):  # type: ignore[no-untyped-def]
    """Where fp32's GPU work outlasts what the host needs to issue the bf16 step, bf16 is not slower. Where the
    host sets the pace, bf16 may lose at most its casts' host time: eager autocast issues more (the H100
    profiles measure bf16 12–66 % slower than fp32 at batch 8 for every real model)."""
    gpu_bound = 0
    for (m, g, b, p), fp32 in grid.items():
        if p != "fp32":
            continue
        bf16 = grid[m, g, b, "bf16"]
        if sum(fp32.gpu.values()) >= sum(bf16.host.values()):
            gpu_bound += 1
            assert bf16.step <= fp32.step * 1.001, (m, g, b)
        casts = sum(bf16.host.values()) - sum(fp32.host.values())
        assert bf16.step - fp32.step <= casts * 1.001, (m, g, b)
    assert gpu_bound >= 50


def test_backward_takes_1_3_to_3_5_times_the_forward(grid):  # type: ignore[no-untyped-def]
    ratios = {k: v.backward / v.forward for k, v in grid.items()}
    assert all(1.3 <= r <= 3.5 for r in ratios.values()), {k: r for k, r in ratios.items() if not 1.3 <= r <= 3.5}


def test_backward_grows_with_the_batch_as_its_flops_once_the_gpu_is_full(grid):  # type: ignore[no-untyped-def]
    """"Full" at batch b: the GPU's backward work exceeds the host's issue time. From a full batch b, 4b's
    backward takes ≥ 2.5× b's (4× the FLOPs); below it, the host's floor holds the time, and more batch never
    costs less."""
    full = 0
    for (m, g, b, p), at_b in grid.items():
        if b * 4 not in BATCHES:
            continue
        at_4b = grid[m, g, b * 4, p]
        assert at_4b.backward >= at_b.backward
        if at_b.gpu["backward"] >= at_b.host["backward"]:
            full += 1
            assert at_4b.backward / at_b.backward >= 2.5, (m, g, b, p)
    assert full >= 40


def test_the_profilers_hook_is_measured_from_the_timelines_alike_on_both_hosts():
    """Two gradients ready after the same fp32 operation have only the profiler's hook between their events:
    that gap, not the fit, prices the hook, so the fit cannot move it into autograd's cost per operation
    (which a DDP prediction keeps)."""
    eff, _ = load_fit()
    h100, h200 = device("h100"), device("h200")
    assert eff.hook == pytest.approx(profiler_hook(measured_profiles("h100"), h100), rel=1e-9)
    assert 1.5 < eff.hook < 4.0  # launch costs: 2.4 on the H100's host
    assert profiler_hook(measured_profiles("h200"), h200) == pytest.approx(eff.hook, rel=0.25)  # 2.3


def test_a_cast_costs_the_host_what_the_profiles_show_not_another_operation():
    """Under bf16 the same gap also holds the gradient's cast back to fp32: on the H100 at batch 8 (host-paced)
    GPT-2's and ViT's gaps are 4.6–4.7 launch costs against the hook's 2.4, so a backward cast costs ~2.2, far
    below an operation (the model once charged a whole one, 5.3, per tensor-core operation). The bf16
    backward then costs the host ≤ 1.25× the fp32 one, as measured (GPT-2 1.15×, ViT 1.19× at batch 8)."""
    eff, _ = load_fit()
    h100 = device("h100")
    for model in ("gpt2_small", "vit_b_16"):
        m = find_measured(model, "h100", 8, "bf16")
        assert m is not None
        cast = statistics.median(host_paced_gaps([m], h100)) - eff.hook
        assert 0.6 <= eff.cast_backward / cast <= 1.6, (model, cast)
        fp32 = find_measured(model, "h100", 8, "fp32")
        assert fp32 is not None and 1.1 <= m.backward_s / fp32.backward_s <= 1.25
    assert eff.cast_backward < eff.autograd / 2
    for model in zoo_transformers():
        work = count_workload(model, 8)
        host = {p: host_seconds(work, "backward", h100, p, eff) for p in ("fp32", "bf16")}
        assert host["bf16"] <= 1.25 * host["fp32"], model


def test_small_batches_are_bound_by_the_host_in_the_measurements_too():
    """What the rules above leave to the host is measured, not an artefact: on the H100 every real model's bf16
    step at batch 8 is slower than its fp32 step, and ViT-B/16's bf16 backward stays within 15 % from batch 8
    to 64 (the GPU never catches up with the host). The model, priced as the profiles were taken, agrees."""
    eff, _ = load_fit()
    h100 = device("h100")

    def step(model: str, batch: int, precision: str) -> tuple[float, float]:
        m = find_measured(model, "h100", batch, precision)
        assert m is not None
        w = m.workload()
        modelled = sum(phase_seconds(w, p, h100, precision, eff, instrumented=True) for p in ("forward", "backward"))
        return m.forward_s + m.backward_s, modelled

    for model in ("resnet18", "resnet50", "vit_b_16", "gpt2_small"):
        (bf16, bf16_model), (fp32, fp32_model) = step(model, 8, "bf16"), step(model, 8, "fp32")
        assert bf16 > fp32 and bf16_model > fp32_model, model
    vit = [find_measured("vit_b_16", "h100", b, "bf16") for b in (8, 16, 32, 64)]
    measured = [m.backward_s for m in vit if m is not None]
    modelled = [phase_seconds(m.workload(), "backward", h100, "bf16", eff, True) for m in vit if m is not None]
    for times in (measured, modelled):
        assert len(times) == 4 and max(times) / min(times) <= 1.15

"""Traces: the model zoo, capture semantics, the file format, streaming, statistics and bad input."""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_cli

from arcsim.compressors.layout import Layer
from arcsim.errors import ArcsimError
from arcsim.models import MODELS, count_params, loss_fn
from arcsim.models.datasets import make_dataset
from arcsim.models.dataspec import DataSpec
from arcsim.traces.capture import CaptureConfig, capture
from arcsim.traces.format import SCHEMA_VERSION, TraceError, TraceWriter, open_trace
from arcsim.traces.profile import ComputeProfile
from arcsim.traces.resolve import DEFAULT_TRACE_NAME, resolve_trace, shipped_traces_dir
from arcsim.traces.stats import step_stats
from arcsim.traces.timing import measure_profile

REFERENCE_SPECS = {"synthetic-images": DataSpec("image", (3, 224, 224), 1000),
                   "synthetic-tokens": DataSpec("tokens", (128,), 50257),
                   "python-text": DataSpec("tokens", (256,), 32000)}


@pytest.mark.parametrize("name", [n for n, e in MODELS.items() if e.reference_params])
def test_reference_parameter_counts(name):
    entry = MODELS[name]
    with torch.device("meta"):
        model = entry.build(REFERENCE_SPECS[entry.default_dataset])
    assert count_params(model) == entry.reference_params


def test_resnet50_uses_torchvision_parameter_names():
    with torch.device("meta"):
        names = [n for n, _ in MODELS["resnet50"].build(REFERENCE_SPECS["synthetic-images"]).named_parameters()]
    assert len(names) == 161
    assert names[:3] == ["conv1.weight", "bn1.weight", "bn1.bias"]
    assert "layer1.0.downsample.0.weight" in names and "layer4.2.conv3.weight" in names
    assert names[-2:] == ["fc.weight", "fc.bias"]


def _capture(tmp_path: Path, **kw) -> Path:
    cfg = CaptureConfig(**{"model": "mlp", "dataset": "mnist1d", "workers": 4, "steps": 2, "batch": 8,
                           "dtype": "fp32", "out": tmp_path / "t.npz", **kw})
    return capture(cfg)


@pytest.mark.parametrize(("optimizer", "settings"), [
    ("sgd", {}), ("adamw", {"optimizer": "adamw", "betas": (0.8, 0.95), "weight_decay": 0.01})])
def test_capture_is_real_data_parallel_training(tmp_path, optimizer, settings):
    """Recomputing by hand: every worker at the same parameters, disjoint shards, the optimizer on their mean."""
    path = _capture(tmp_path, steps=2, every=2, warmup=1, lr=0.1, **settings)
    trace = open_trace(path)
    assert trace.recorded_steps == [1, 3]
    assert trace.meta["optimizer"] == ("SGD lr 0.1 momentum 0.9 weight decay 0" if optimizer == "sgd" else
                                       "AdamW lr 0.1 betas (0.8, 0.95) weight decay 0.01")
    entry = MODELS["mlp"]
    ds = make_dataset("mnist1d")
    torch.manual_seed(0)
    model = entry.build(ds.spec)
    params = dict(model.named_parameters())
    opt = (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if optimizer == "sgd" else
           torch.optim.AdamW(model.parameters(), lr=0.1, betas=(0.8, 0.95), weight_decay=0.01))
    gen = torch.Generator().manual_seed(0)
    recorded = iter(trace.steps_iter())
    for t in range(4):
        x, y = ds.draw(4 * 8, gen)
        grads = []
        for xw, yw in zip(x.chunk(4), y.chunk(4), strict=True):
            model.zero_grad()
            loss_fn("vector", model(xw), yw).backward()
            grads.append(torch.cat([params[la.name].grad.reshape(-1) for la in trace.layers]))
        mine = torch.stack(grads)
        if t in (1, 3):
            step, theirs = next(recorded)
            assert step == t
            torch.testing.assert_close(theirs, mine, rtol=1e-5, atol=1e-6)
            assert not torch.allclose(mine[0], mine[1])  # different shards → different gradients
        mean = mine.mean(0)
        for la in trace.layers:
            params[la.name].grad = mean[la.offset:la.offset + la.numel].view(la.shape).clone()
        opt.step()


def test_layer_table_is_in_backward_order(tmp_path):
    trace = open_trace(_capture(tmp_path, model="cnn", dataset="digits"))
    names = [la.name for la in trace.layers]
    assert names[0].startswith("classifier.3") and names[-1].startswith("features.0")
    ready = trace.ready_s.mean(axis=0)
    assert np.all(np.diff(ready) >= 0) and ready[-1] <= trace.backward_s.mean() + 1e-9
    assert [la.offset for la in trace.layers] == list(np.cumsum([0] + [la.numel for la in trace.layers])[:-1])


@pytest.mark.parametrize(("model", "dataset", "size", "batch"), [
    ("mlp", "mnist1d", None, 4), ("cnn", "digits", None, 4), ("resnet18", "synthetic-images", 64, 2),
    ("resnet50", "synthetic-images", 64, 2), ("vit_b_16", "synthetic-images", 32, 1),
    ("gpt2_small", "synthetic-tokens", 8, 1)])
def test_every_model_captures_on_cpu(tmp_path, model, dataset, size, batch):
    path = capture(CaptureConfig(model=model, dataset=dataset, workers=2, steps=1, batch=batch, input_size=size,
                                 dtype="fp16", out=tmp_path / f"{model}.npz"))
    trace = open_trace(path)
    assert trace.meta["model"] == model and trace.meta["synthetic_data"] == dataset.startswith("synthetic")
    assert trace.elements == trace.meta["params"]
    if MODELS[model].reference_params and model != "vit_b_16":  # ViT's position table depends on the image size
        assert trace.elements == MODELS[model].reference_params
    (_, g), = trace.steps_iter()
    assert g.shape == (2, trace.elements) and g.abs().sum() > 0


def test_streamed_steps_equal_numpy_load_and_deflated_members_read(tmp_path):
    path = _capture(tmp_path, steps=3, dtype="fp16")
    whole = np.load(path)["gradients"]
    streamed = [g.numpy() for _, g in open_trace(path).steps_iter()]
    np.testing.assert_array_equal(np.stack(streamed), whole.astype(np.float32))
    deflated = tmp_path / "deflated.npz"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(deflated, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info.filename))
    again = open_trace(deflated)
    assert again._data_offset is None
    np.testing.assert_array_equal(np.stack([g.numpy() for _, g in again.steps_iter(start=1)]), np.stack(streamed[1:]))


def test_interrupted_capture_leaves_nothing(tmp_path):
    def interrupt(done, total):
        if done == 2:
            raise KeyboardInterrupt

    cfg = CaptureConfig(model="mlp", dataset="mnist1d", workers=2, steps=3, batch=4, out=tmp_path / "t.npz")
    with pytest.raises(KeyboardInterrupt):
        capture(cfg, interrupt)
    assert list(tmp_path.iterdir()) == []


def _write(path: Path, grads: np.ndarray, meta_changes: dict | None = None) -> Path:
    steps, workers, d = grads.shape
    meta = {"schema_version": SCHEMA_VERSION, "model": "test", "dataset": "synthetic", "synthetic_data": True,
            "params": d, "batch_per_worker": 1, "workers": workers, "steps": steps,
            "recorded_steps": list(range(steps)), "dtype": "fp32", "device": "cpu", "torch_version": "x",
            "seed": 0, "command": "test", **(meta_changes or {})}
    with TraceWriter(path, meta, (Layer("a", (d // 2,), 0), Layer("b", (d - d // 2,), d // 2)), "fp32") as w:
        for g in grads:
            w.write_step(torch.from_numpy(g), [0.0] * workers, 0.01, 0.02, [0.01, 0.02])
    return path


def _replace_member(path: Path, member: str, payload: bytes) -> None:
    with zipfile.ZipFile(path) as src:
        items = {i.filename: src.read(i.filename) for i in src.infolist()}
    items[member] = payload
    with zipfile.ZipFile(path, "w") as dst:
        for name, data in items.items():
            dst.writestr(name, data)


def _npy(array: np.ndarray) -> bytes:
    import io
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def _json_npy(obj) -> bytes:
    return _npy(np.frombuffer(json.dumps(obj).encode(), dtype=np.uint8))


def test_stats_on_known_gradients(tmp_path):
    rng = np.random.default_rng(0)
    same = np.repeat(rng.standard_normal((1, 1, 200_000)), 4, axis=1).astype(np.float32)
    s = step_stats(0, 0.0, torch.from_numpy(same[0]))
    assert s.cosine_mean == pytest.approx(1.0) and s.agreement == pytest.approx(1.0)
    assert abs(s.kurtosis) < 0.05  # Gaussian entries
    independent = rng.standard_normal((4, 200_000)).astype(np.float32)
    s = step_stats(0, 0.0, torch.from_numpy(independent))
    assert abs(s.cosine_mean) < 0.01 and s.agreement == pytest.approx(0.25, abs=0.01)
    laplace = rng.laplace(size=(2, 400_000)).astype(np.float32)
    assert step_stats(0, 0.0, torch.from_numpy(laplace)).kurtosis == pytest.approx(3.0, abs=0.2)


def test_writer_refuses_nonfinite_and_leaves_no_file(tmp_path):
    bad = np.ones((2, 2, 10), dtype=np.float32)
    bad[1, 1, 3] = np.nan
    with pytest.raises(TraceError, match="worker 1 at recorded step 1"):
        _write(tmp_path / "t.npz", bad)
    assert list(tmp_path.iterdir()) == []


def _bad_trace(tmp_path: Path, kind: str) -> Path:
    path = _write(tmp_path / "t.npz", np.ones((2, 3, 10), dtype=np.float32))
    if kind == "truncated":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif kind == "garbage":
        path.write_bytes(b"not a zip at all" * 10)
    elif kind == "schema":
        meta = json.loads(np.load(path)["metadata"].tobytes())
        _replace_member(path, "metadata.npy", _json_npy({**meta, "schema_version": 99}))
    elif kind == "layers":
        _replace_member(path, "layers.npy", _json_npy([{"name": "a", "shape": [4], "numel": 4, "offset": 0}]))
    elif kind == "nan":
        g = np.ones((2, 3, 10), dtype=np.float32)
        g[1, 2, 0] = np.inf
        _replace_member(path, "gradients.npy", _npy(g))
    elif kind == "extension":
        path = path.rename(path.with_suffix(".zip"))
    return path


@pytest.mark.parametrize(("kind", "fragment"), [
    ("truncated", "may be truncated"), ("garbage", "not a readable .npz"), ("schema", "schema version 99"),
    ("layers", "gradients are shaped (2, 3, 10) but metadata and the layer table say (2, 3, 4)"),
    ("nan", "worker 2 at recorded step 1 (training step 1) contains NaN or Inf"),
    ("extension", "traces are .npz files")])
def test_bad_traces_are_one_line_exit_2(tmp_path, kind, fragment):
    path = _bad_trace(tmp_path, kind)
    r = run_cli("trace", "info", str(path))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], r.stderr


@pytest.mark.parametrize(("args", "fragment"), [
    (("--model", "alexnet"), "unknown model 'alexnet'; choose one of: mlp, mlp_wide, cnn"),
    (("--model", "cnn", "--dataset", "imagenet"), "unknown dataset 'imagenet'"),
    (("--model", "gpt2_small", "--dataset", "digits"), "takes tokens data, not image"),
    (("--model", "mlp", "--workers", "0"), "'--workers' / '-w': must be at least 2"),
    (("--model", "mlp", "--out", "x.zip"), "must end in .npz"),
    (("--model", "cnn", "--device", "tpu"), "unknown device 'tpu'"),
])
def test_bad_capture_requests(tmp_path, args, fragment):
    full = list(args) if "--out" in args else [*args, "--out", str(tmp_path / "t.npz")]
    r = run_cli("trace", "capture", *full, "--steps", "1")
    assert r.returncode == 2, r.stderr
    assert fragment in r.stderr.strip().splitlines()[-1], r.stderr
    assert not (tmp_path / "t.npz").exists()


def test_missing_known_trace_no_capture_prints_the_command(tmp_path):
    r = run_cli("compress", "--trace", "resnet50.npz", "--no-capture", env={"ARCSIM_TRACE_DIR": str(tmp_path)})
    assert r.returncode == 2
    assert "arcsim trace capture --model resnet50 --workers 8 --steps 3" in r.stderr


def test_missing_known_trace_is_captured(tmp_path, monkeypatch):
    monkeypatch.setenv("ARCSIM_TRACE_DIR", str(tmp_path))
    said = []
    path = resolve_trace("mlp.npz", announce=said.append)
    assert path == tmp_path / "mlp.npz" and open_trace(path).workers == 8
    assert "capturing" in said[0] and resolve_trace("mlp.npz") == path  # found the second time


def test_shipped_default_trace_is_real_data_and_small():
    path = shipped_traces_dir() / DEFAULT_TRACE_NAME
    trace = open_trace(path)
    assert not trace.meta["synthetic_data"] and trace.workers == 8
    assert trace.loss[-1] < trace.loss[0]  # recorded along real training
    root = Path(__file__).resolve().parents[1]
    tracked = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "arcsim/data", "topologies", "traces"],
                             cwd=root, capture_output=True, text=True, check=True).stdout.split()
    assert f"traces/{DEFAULT_TRACE_NAME}" in tracked  # the source folder at the top; the build puts it in the wheel
    assert path == root / "traces" / DEFAULT_TRACE_NAME  # a checkout reads it there
    assert sum((root / name).stat().st_size for name in tracked) <= 20e6  # what the wheel carries


def test_compress_reads_the_default_trace():
    r = run_cli("compress", "-c", "topk", "--density", "0.05", "--json", "-")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["source"].endswith(DEFAULT_TRACE_NAME) and len(out["steps"]) == 16
    assert all(s["density_achieved"] == pytest.approx(0.05, rel=0.01) for s in out["steps"])


def test_profile_times_are_ordered_and_round_trip(tmp_path):
    prof = measure_profile("cnn", batch=8, repeats=3, warmup=1)
    ready = [la.ready_s for la in prof.layers]
    assert prof.forward_s > 0 and min(ready) >= 0 and max(ready) <= prof.backward_s
    assert len(prof.layers) == 8 and prof.layers[0].name.startswith("classifier.3")
    assert ComputeProfile.from_json(json.loads(json.dumps(prof.to_json())), "x") == prof
    out = tmp_path / "p.json"
    r = run_cli("trace", "profile", "--model", "mlp", "--batch", "4", "--repeats", "2", "--out", str(out))
    assert r.returncode == 0 and json.loads(out.read_text())["model"] == "mlp"


def test_info_json_reports_statistics():
    r = run_cli("trace", "info", "--json", "-")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert len(info["steps"]) == 16 and info["layers"]["count"] == 8
    for s in info["steps"]:
        assert -1 <= s["cosine_min"] <= s["cosine_mean"] <= s["cosine_max"] <= 1
        assert 0 <= s["agreement"] <= 1 + 1e-9  # ‖mean‖² ≤ mean ‖g_w‖² (Cauchy–Schwarz)


def test_negative_or_nonfinite_timings_are_refused_when_read(tmp_path):
    path = _write(tmp_path / "t.npz", np.ones((2, 2, 8), dtype=np.float32))
    _replace_member(path, "ready_s.npy", _npy(np.array([[0.01, -0.02], [0.01, 0.02]])))
    with pytest.raises(TraceError, match="ready_s holds negative or non-finite times"):
        open_trace(path)


def test_a_trace_of_zero_gradients_is_one_error_line_not_error_zero(tmp_path):
    path = _write(tmp_path / "zero.npz", np.zeros((2, 2, 64), dtype=np.float32))
    r = run_cli("run", "--trace", str(path), "-c", "topk", "--ratios", "0.1", "--gpu", "cpu", cwd=str(tmp_path))
    assert r.returncode == 2, r.stderr[-1500:]
    assert r.stderr.strip().splitlines()[-1].startswith("error: every gradient in trace zero.npz is zero")


def test_huge_finite_gradients_pass_the_screen_and_infinite_ones_do_not(tmp_path):
    """The NaN/Inf check reads each row's max and min: a row of finite values whose sum would overflow fp32
    must still be read; a row with one Inf, −Inf or NaN must not."""
    from arcsim.traces.format import open_trace

    g = np.ones((2, 3, 10), dtype=np.float32)
    g[0, 1, :] = 3e38  # ten of these sum past fp32's largest value
    trace = open_trace(_write(tmp_path / "huge.npz", g))
    assert [float(x[1, 0]) for _, x in trace.steps_iter()] == [pytest.approx(3e38), 1.0]
    for bad in (np.inf, -np.inf, np.nan):
        g[1, 2, 3] = bad
        with pytest.raises(Exception, match="worker 2 at recorded step 1"):
            list(open_trace(_write(tmp_path / f"bad{bad}.npz", g)).steps_iter())


def test_bf16_capture_runs_forward_under_autocast_and_keeps_fp32_gradients(tmp_path):
    path = _capture(tmp_path, steps=1, precision="bf16", optimizer="adamw")
    trace = open_trace(path)
    assert trace.meta["precision"] == "bf16" and trace.meta["optimizer"].startswith("AdamW")
    ds = make_dataset("mnist1d")
    torch.manual_seed(0)
    model = MODELS["mlp"].build(ds.spec)
    x, y = ds.draw(4 * 8, torch.Generator().manual_seed(0))
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = loss_fn("vector", model(x.chunk(4)[0]), y.chunk(4)[0]).float()
    loss.backward()
    params = dict(model.named_parameters())
    mine = torch.cat([params[la.name].grad.reshape(-1) for la in trace.layers])
    (_, theirs), = trace.steps_iter()
    torch.testing.assert_close(theirs[0], mine)
    (tmp_path / "fp32").mkdir()
    (_, plain), = open_trace(_capture(tmp_path / "fp32", steps=1, optimizer="adamw")).steps_iter()
    assert not torch.equal(plain[0], theirs[0])  # autocast changed the arithmetic


def test_optimizer_settings_of_the_other_optimizer_are_refused():
    with pytest.raises(ArcsimError, match="--momentum is SGD's"):
        CaptureConfig(model="llama_60m", momentum=0.5).check()
    with pytest.raises(ArcsimError, match="--betas are AdamW's"):
        CaptureConfig(model="mlp", betas=(0.9, 0.95)).check()

"""Recording from the user's own DDP job: a 2-rank gloo job under torchrun records, worker for worker, what
`arcsim trace capture` records for the same model, data split and seed; its trace feeds `arcsim run`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import free_port, run_cli

from arcsim.errors import ArcsimError
from arcsim.models.source import ModelSource
from arcsim.traces.format import open_trace
from arcsim.traces.merge import merge_recordings

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("record") / "rec.npz"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                           str(free_port()), str(ROOT / "examples" / "record_ddp.py"), "--out", str(out),
                           "--steps", "2"], capture_output=True, text=True, timeout=300, cwd=out.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def by_name(trace, grads: torch.Tensor) -> dict[str, torch.Tensor]:
    return {la.name: grads[:, la.offset:la.offset + la.numel] for la in trace.layers}


def test_the_recorded_job_equals_a_capture_of_the_same_training(recorded: Path, tmp_path: Path):
    r = run_cli("trace", "capture", "--model", "mlp", "--dataset", "mnist1d", "-w", "2", "-s", "2", "-b", "8",
                "--dtype", "fp32", "-o", str(tmp_path / "cap.npz"))
    assert r.returncode == 0, r.stderr
    rec, cap = open_trace(recorded), open_trace(tmp_path / "cap.npz")
    assert (rec.workers, rec.steps, rec.recorded_steps) == (2, 2, [0, 1])
    assert sorted(la.name for la in rec.layers) == sorted(la.name for la in cap.layers)
    assert rec.meta["model_source"] == {"ref": "mlp", "args": {}} and rec.meta["losses_recorded"] is False
    for (step_r, g_r), (step_c, g_c) in zip(rec.steps_iter(), cap.steps_iter(), strict=True):
        mine, theirs = by_name(rec, g_r), by_name(cap, g_c)
        assert step_r == step_c
        for name in mine:  # worker for worker: the same shards, the same parameters after the same updates
            torch.testing.assert_close(mine[name], theirs[name], rtol=1e-5, atol=1e-7)
    assert (rec.forward_s > 0).all() and (rec.backward_s >= rec.ready_s.max(axis=1) - 1e-12).all()


def test_a_recorded_trace_feeds_arcsim_run(recorded: Path):
    r = run_cli("run", "--trace", str(recorded), "-c", "dense,topk", "--policy", "none")
    assert r.returncode == 0, r.stderr
    assert "mlp" in r.stdout and "topk" in r.stdout


def test_parts_that_do_not_belong_together_are_refused(recorded: Path, tmp_path: Path):
    parts = sorted(Path(f"{recorded}.parts").glob("rank*.pt"))
    assert len(parts) == 2
    with pytest.raises(ArcsimError, match="one part per rank"):
        merge_recordings(parts[:1], tmp_path / "x.npz")
    other = torch.load(parts[1], weights_only=True)
    other["order"] = list(reversed(other["order"]))
    torch.save(other, tmp_path / "rank1.pt")
    with pytest.raises(ArcsimError, match="disagree on the layout"):
        merge_recordings([parts[0], tmp_path / "rank1.pt"], tmp_path / "x.npz")
    with pytest.raises(ArcsimError, match="does not have the recorded parameters"):
        merge_recordings(parts, tmp_path / "x.npz", ModelSource("cnn"), "digits")
    (tmp_path / "junk.pt").write_bytes(b"not a part")
    r = run_cli("trace", "merge", str(parts[0]), str(tmp_path / "junk.pt"), "-o", str(tmp_path / "y.npz"))
    assert r.returncode == 2 and "is not a recording part" in r.stderr
    assert not (tmp_path / "x.npz").exists() and not (tmp_path / "y.npz").exists()

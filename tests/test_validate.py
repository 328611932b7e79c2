"""`arcsim validate` end to end on a small emulated cluster (skipped where namespaces are unavailable)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import free_port, loopback_job, netns_available, run_cli

from arcsim.testbed import VALIDATE_WORKER
from arcsim.testbed.cluster import namespaces
from arcsim.testbed.validate_worker import PHASES

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "reports" / "validation.csv"


@pytest.mark.skipif(not netns_available(), reason="needs root and network namespaces")
def test_validate_writes_a_consistent_report(tmp_path, one_emulated_cluster):
    args = ("validate", "--ranks", "2", "--bandwidth", "200Mbit", "--delay", "0.5ms", "-c", "dense,topk,arctopk",
            "--model", "mlp", "--steps", "6", "--repeats", "2", "--out", str(tmp_path),
            "--calibration-sizes", "1KB,64KB,1MB", "--calibration-repeats", "3", "--prefix", one_emulated_cluster)
    r = run_cli(*args, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    said = " ".join(r.stdout.split())  # the table wraps at 100 columns
    assert "MAPE" in said and "predictions inside the measured spread" in said
    rows = pd.read_csv(tmp_path / "validation.csv")
    assert list(rows["compressor"]) == ["dense", "topk", "arctopk"]
    assert set(rows["bandwidth"]) == {"200Mbit+0.5ms"}  # the delayed link (TUN forwarder) was used
    assert {"measured_s", "predicted_s", "ranks", "bandwidth", "measured_p10_s", "measured_p90_s"} <= set(rows)
    assert (rows["measured_s"] > 0).all() and (rows["predicted_s"] > 0).all()
    assert (rows["measured_p10_s"] <= rows["measured_s"]).all() and (rows["measured_s"] <= rows["measured_p90_s"]).all()
    assert ((rows["predicted_s"] / rows["measured_s"] - 1 - rows["error"]).abs() < 1e-9).all()
    assert (rows["runs"] == 2).all() and ((rows["measured"] - rows["measured_s"] * 1e3).abs() < 1e-9).all()
    assert (rows["spread_min"] <= rows["measured"]).all() and (rows["measured"] <= rows["spread_max"]).all()
    assert (rows["inside_spread"] == ((rows["spread_min"] <= rows["predicted"])
                                     & (rows["predicted"] <= rows["spread_max"]))).all()
    assert (tmp_path / "validation.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "validation" / "topo-2r-200Mbit.yaml").exists()
    assert namespaces(one_emulated_cluster) == []
    again = run_cli(*args, timeout=120)  # the same settings: the finished case is kept, nothing measured again
    assert again.returncode == 0 and "already" in again.stderr
    assert pd.read_csv(tmp_path / "validation.csv")["measured"].tolist() == rows["measured"].tolist()


@pytest.mark.skipif(not netns_available(), reason="needs root and network namespaces")
def test_node_aware_validation_runs_both_hierarchies_on_nodes_of_two(tmp_path, one_emulated_cluster):
    """2 nodes × 2 ranks: one calibration (world, node and rail groups), flat and node-aware DDP hooks measured
    and each predicted its own way on the calibrated 2 × 2 topology."""
    from arcsim.pricing import Pricer
    from arcsim.topology import load_topology

    r = run_cli("validate", "--ranks", "4", "--ranks-per-node", "2", "--hierarchy", "both", "--bandwidth", "200Mbit",
                "-c", "dense,topk", "--model", "mlp", "--steps", "4", "--repeats", "1", "--out", str(tmp_path),
                "--calibration-sizes", "1KB,64KB,1MB", "--calibration-repeats", "3", "--prefix", one_emulated_cluster,
                timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "by hierarchy: flat" in " ".join(r.stdout.split())
    rows = pd.read_csv(tmp_path / "validation.csv")
    assert list(zip(rows["hierarchy"], rows["compressor"], strict=True)) == [
        ("flat", "dense"), ("flat", "topk"), ("node", "dense"), ("node", "topk")]
    assert (rows["ranks_per_node"] == 2).all() and np.isfinite(rows["error"]).all()
    topo = load_topology(str(tmp_path / "validation" / "topo-4rx2-200Mbit.yaml"))
    assert (topo.nodes, topo.gpus_per_node) == (2, 2)
    assert set(topo.group_calibration) == {"node", "inter"}
    assert Pricer(topo).group("node").price("reducescatter", 1e5).algo == "measured"
    assert Pricer(topo).group("inter").price("allgather", 1e3).algo == "measured"
    assert (tmp_path / "validation" / "compute-4rx2-200Mbit-node.json").exists()
    assert namespaces(one_emulated_cluster) == []


@pytest.mark.skipif(not netns_available(), reason="needs root and network namespaces")
def test_a_cluster_already_up_is_refused_before_the_traces_are_captured(tmp_path, one_emulated_cluster):
    """One a killed run left (or a user's own): one error line naming how to take it down, before any long work."""
    from arcsim.testbed.cluster import EmulatedCluster

    with EmulatedCluster(2, "1Gbit", prefix=one_emulated_cluster):
        r = run_cli("validate", "--ranks", "2", "--bandwidth", "1Gbit", "-c", "dense", "--model", "mlp",
                    "--out", str(tmp_path / "o"), "--prefix", one_emulated_cluster)
    assert r.returncode == 2 and "capturing" not in r.stderr, r.stderr
    down = f"arcsim cluster down --prefix {one_emulated_cluster}"
    assert r.stderr.strip() == (f"error: an emulated cluster with prefix {one_emulated_cluster!r} is already up; run "
                                f"`{down}` first (or give this one another --prefix)")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(("args", "fragment"), [
    (("--hierarchy", "node"), "needs nodes of two or more ranks: add --ranks-per-node 2"),
    (("--hierarchy", "rack"), "unknown hierarchy 'rack'"),
    (("--ranks", "4,6", "--ranks-per-node", "4"), "6 does not"),
    (("--ranks", "two"), "'two' is not a number"), (("--ranks", "1"), "must be at least 2"),
    (("-c", "zipk"), "unknown compressor zipk"),
    (("--model", "alexnet"), "unknown model 'alexnet'"),
    (("--density", "0"), "'--density': must lie in (0, 1]"),
    (("--calibration-sizes", "4KB"), "at least two different sizes"),
    (("--calibration-sizes", "4KB,lots"), "cannot read size 'lots'"),
    (("--report", str(ROOT / "README.md")), "README.md is not the validation.csv that arcsim validate wrote"),
    (("--report", "no-such.csv"), "no-such.csv does not exist"),
    (("--report", str(REPORT), "--measured", "reports"), "takes neither --measured"),
])
def test_bad_validate_requests(args, fragment):
    r = run_cli("validate", *args)
    assert r.returncode == 2 and fragment in r.stderr, r.stderr


@pytest.mark.slow
def test_real_cluster_path_under_torchrun_on_loopback(tmp_path):
    """write-config → torchrun calibrate and worker → --measured: the no-emulation path, loopback standing in."""
    d = tmp_path / "real"
    assert run_cli("validate", "--write-config", str(d), "-c", "dense,topk", "--steps", "5").returncode == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for args in (["-m", "arcsim", "calibrate", "--sizes", "16KB,1MB,8MB", "--out", str(d / "cluster.yaml")],
                 ["-m", "arcsim.testbed.validate_worker", str(d / "config.json"), str(d / "real-")]):
        r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                            "--master_port", str(free_port()), *args], capture_output=True, text=True, env=env,
                           timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
    r = run_cli("validate", "--measured", str(d), "--topology", str(d / "cluster.yaml"), "--out", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr[-2000:]
    rows = pd.read_csv(tmp_path / "o" / "validation.csv")
    assert list(rows["compressor"]) == ["dense", "topk"] and (rows["ranks"] == 2).all()
    assert (rows["bandwidth"] == "cluster").all() and (rows["predicted_s"] > 0).all()
    # compression as run: measured per compressor in the worker, and what the prediction was scaled by
    extra = json.loads((d / "real-profile.json").read_text())["extra"]
    assert set(extra["compress_scale"]) == {"dense", "topk"} and min(extra["compress_scale"].values()) >= 1
    assert (rows["compress_scale_source"] == "measured as run").all()
    assert rows["compress_scale"].tolist() == [extra["compress_scale"][c] for c in rows["compressor"]]
    # where the iterations went: the phases are every rank's, and they add up to the iteration
    times = json.loads((d / "real-times.json").read_text())
    for name in ("dense", "topk"):
        phases = times[name]["phases"]
        assert len(phases["before_hook_s"]) == 2 and len(phases["collectives_s"]) == 5
        assert all(len(calls) == 1 for calls in phases["collectives_s"])  # one (packed) collective per hook
        per_rank = np.sum([phases[k] for k in PHASES], axis=0)  # [rank, iteration]
        assert np.allclose(per_rank.max(axis=0), times[name]["iteration_s"])
        assert min(min(v) for v in phases["hook_comm_s"]) > 0
        assert np.all(np.asarray(phases["hook_node_s"]) == 0) and phases["node_collectives_s"] == [[]] * 5  # flat
    assert (rows["measured_hook_comm_s"] > 0).all() and (rows["measured_arrival_skew_s"] >= 0).all()


@pytest.mark.slow
def test_node_aware_worker_times_the_collectives_inside_the_node_apart(tmp_path):
    """2 nodes × 2 ranks on loopback, as torchrun starts them: the node-aware hook's reduce-scatter and all-gather
    inside the node are their own phase, out of the hook's local work and apart from the rails' collectives."""
    from arcsim.testbed.validate import ValidateConfig, measured_phases, worker_config

    cfg = ValidateConfig(compressors=("topk",), model="mlp", steps=3, warmup=1, ranks_per_node=2)
    (tmp_path / "config.json").write_text(json.dumps(worker_config(cfg, "node")))
    loopback_job(VALIDATE_WORKER, [str(tmp_path / "config.json"), str(tmp_path / "real-")], 4)
    topk = json.loads((tmp_path / "real-times.json").read_text())["topk"]
    phases = topk["phases"]
    assert np.asarray(phases["hook_node_s"]).shape == (4, 3) and np.all(np.asarray(phases["hook_node_s"]) > 0)
    # per bucket one rail collective (top-k's packed all-gather) and two inside the node (reduce-scatter, all-gather)
    assert [len(n) for n in phases["node_collectives_s"]] == [2 * len(c) for c in phases["collectives_s"]]
    assert np.allclose(np.sum(phases["node_collectives_s"][0]), np.asarray(phases["hook_node_s"])[0, 0])
    per_rank = np.sum([phases[k] for k in PHASES], axis=0)  # counted once: not in the hook's local work as well
    assert np.allclose(per_rank.max(axis=0), topk["iteration_s"])
    assert np.all(np.asarray(phases["hook_local_s"]) > 0)
    assert measured_phases([topk])["measured_hook_node_s"] > 0
    # compression as run, node-aware: the hook's local work with the collectives as local copies
    assert set(json.loads((tmp_path / "real-profile.json").read_text())["extra"]["compress_scale"]) == {"topk"}


def test_measured_needs_a_topology(tmp_path):
    r = run_cli("validate", "--measured", str(tmp_path))
    assert r.returncode == 2 and "--measured needs --topology" in r.stderr


def test_emulated_ranks_sharing_cores_slow_compression_down(monkeypatch):
    from arcsim.testbed import validate

    monkeypatch.setattr(validate.os, "cpu_count", lambda: 2)
    assert [validate.core_sharing(r) for r in (1, 2, 4, 8)] == [1.0, 1.0, 2.0, 4.0]


def test_finished_cases_resume_only_with_the_same_settings(tmp_path):
    from arcsim.testbed.validate import ValidateConfig, finished_cases, keep_case

    cfg = ValidateConfig(out_dir=tmp_path)
    (tmp_path / "validation").mkdir()
    keep_case(cfg, [{"ranks": 2, "bandwidth": "1Gbit", "compressor": "dense", "measured": 1.0}])
    with (tmp_path / "validation" / "cases.jsonl").open("a") as fh:
        fh.write('{"settings": {"cut off by a kill')  # a half-written line is measured again
    assert list(finished_cases(cfg)) == [(2, "1Gbit")]
    assert finished_cases(ValidateConfig(out_dir=tmp_path, steps=99)) == {}  # other settings: start over


def test_the_arrival_skew_is_the_last_rank_against_the_mean():
    from arcsim.testbed.validate import measured_phases

    run = {"phases": {"before_hook_s": [[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]],  # [rank][iteration]
                      "hook_local_s": [[1.0] * 3, [2.0] * 3], "hook_comm_s": [[5.0] * 3, [5.0] * 3],
                      "after_hook_s": [[0.5] * 3, [0.5] * 3]}}
    got = measured_phases([run, run])
    assert got["measured_arrival_skew_s"] == 1.0  # per iteration max − mean: 1, 0, 1 → median 1
    assert got["measured_hook_local_s"] == 1.5 and got["measured_hook_comm_s"] == 5.0
    assert "measured_hook_node_s" not in got  # a run from before the collectives inside the node were timed
    node_aware = {"phases": {**run["phases"], "hook_node_s": [[2.0] * 3, [4.0] * 3]}}
    assert measured_phases([node_aware])["measured_hook_node_s"] == 3.0
    assert measured_phases([{"iteration_s": [1.0]}]) == {}  # a run from before phases were timed


def test_a_case_keeps_the_median_repeat_and_the_median_compression_factors():
    from arcsim.testbed.validate import median_profile
    from arcsim.traces.profile import ComputeProfile

    def profile(work: float, topk: float) -> dict:
        return ComputeProfile("mlp", 32, "cpu", "test", work, 0.0, [], "profile",
                              extra={"after_backward_s": 0.0,
                                     "compress_scale": {"topk": topk, "dense": 1.0}}).to_json()
    got = median_profile([profile(3.0, 1.3), profile(1.0, 2.8), profile(2.0, 2.4)])
    assert got["forward_s"] == 2.0 and got["extra"]["compress_scale"] == {"topk": 2.4, "dense": 1.0}


def _case(**over):
    row = {"measured_s": 0.030, "predicted_s": 0.026, "error": 0.026 / 0.030 - 1,
           "measured_before_hook_s": 0.008, "measured_after_hook_s": 0.001, "measured_hook_local_s": 0.012,
           "measured_hook_comm_s": 0.006, "predicted_compute_s": 0.0095, "predicted_compress_s": 0.010,
           "predicted_comm_s": 0.007}
    return {**row, **over}


def test_a_case_splits_into_compute_hook_and_the_rest_and_names_the_term_furthest_off():
    from arcsim.testbed.validate import terms, worst_term

    split = terms(_case())
    assert split["compute"] == pytest.approx((0.009, 0.0095))
    assert split["hook"] == pytest.approx((0.018, 0.017))  # local and collectives compare only together
    assert split["other"] == pytest.approx((0.003, -0.0005))  # measured: the barrier; predicted: overlap
    worst = worst_term(_case())
    assert worst["term"] == "other" and worst["gap_s"] == pytest.approx(-0.0035)
    assert worst["share"] == pytest.approx(-0.0035 / 0.030)
    assert worst_term(_case(predicted_compress_s=0.002))["term"] == "hook"
    # node-aware: the collectives inside the node are the hook's too (a row from before they were timed apart
    # holds them in its local work)
    assert terms(_case(measured_hook_local_s=0.004, measured_hook_node_s=0.008))["hook"] == pytest.approx(
        (0.018, 0.017))
    assert terms({k: v for k, v in _case().items() if not k.startswith("measured_hook")}) is None


def test_report_reprints_a_committed_validation_with_the_term_each_case_outside_misses_by():
    r = run_cli("validate", "--report", str(REPORT), "--json", "-")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    frame = pd.read_csv(REPORT)
    s = out["summary"]
    assert s["cases"] == len(frame) and s["inside_spread"] == int(frame["inside_spread"].sum())
    assert len(s["outside_by_term"]) == len(frame) - s["inside_spread"]
    for t in s["outside_by_term"]:
        assert t["term"] in ("compute", "hook", "other")
        assert t["gap_s"] == pytest.approx(t["predicted_s"] - t["measured_s"])


def test_the_prediction_times_compression_at_the_ranks_priority():
    """Real-time where the emulated ranks ran real-time (and it is allowed here), and back to normal after."""
    from arcsim.testbed.cluster import realtime_allowed
    from arcsim.testbed.validate import ranks_priority

    policy = os.sched_getscheduler(0)
    with ranks_priority(False):
        assert os.sched_getscheduler(0) == policy
    with ranks_priority(True):
        assert os.sched_getscheduler(0) == (os.SCHED_FIFO if realtime_allowed() else policy)
    assert os.sched_getscheduler(0) == policy


def test_report_title_names_the_density_the_compressors_ran_at(tmp_path):
    """The committed report ran at density 0.01; its first row (dense) says 1, and the title once said so."""
    (tmp_path / "validation.csv").write_bytes(REPORT.read_bytes())
    r = run_cli("validate", "--report", "validation.csv", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    title = r.stdout.splitlines()[0]
    assert "density 0.01" in title and "density 1" not in title.replace("density 0.01", ""), title
    from arcsim.testbed.validate import read_report, what_ran

    rows = read_report(REPORT)
    assert what_ran(rows) == "mlp_wide, density 0.01"
    assert what_ran([{**rows[1], "density": 0.1}, *rows]) == "mlp_wide, densities 0.01, 0.1"
    assert what_ran([r for r in rows if r["compressor"] == "dense"]) == "mlp_wide"

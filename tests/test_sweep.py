"""`arcsim sweep` and `arcsim plot`: spec grammar, points priced as `arcsim run` prices them, resume, Dask."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import click
import pandas as pd
import pytest
from conftest import free_port, interruptible, run_cli

from arcsim.files import packaged
from arcsim.run.analysis import Analysis
from arcsim.run.candidates import candidates_for
from arcsim.run.config import RunConfig
from arcsim.sweep import runner as runner_mod
from arcsim.sweep.evaluate import COLUMNS, evaluate_point, point_topology
from arcsim.sweep.plots import hold_others
from arcsim.sweep.runner import run_sweep
from arcsim.sweep.spec import SweepError, build_spec, expand_braces, load_yaml_spec, split_top_level
from arcsim.sweep.store import ResultStore, expected_points, load_results

ROOT = Path(__file__).resolve().parents[1]


# -- the spec -------------------------------------------------------------------------------------------
def test_brace_groups_expand_in_order_and_commas_inside_braces_do_not_split():
    assert split_top_level("8x8-ib{25,100},4x8-eth{10, 40}") == ["8x8-ib{25,100}", "4x8-eth{10, 40}"]
    assert expand_braces("{8,16}x8-ib{100,400}") == ["8x8-ib100", "8x8-ib400", "16x8-ib100", "16x8-ib400"]
    spec = build_spec({"topology": "8x8-ib{25,100,400}", "compressor": "topk"})
    assert spec.axes["topology"] == ["8x8-ib25", "8x8-ib100", "8x8-ib400"]
    for bad in ("8x8-ib{25,100", "8x8-ib25}", "8x8-ib{25,,100}"):
        with pytest.raises(SweepError):
            build_spec({"topology": bad})


@pytest.mark.parametrize(("raw", "fragment"), [
    ({"compresor": "topk"}, "unknown key 'compresor'"),
    ({"compressor": []}, "axis 'compressor' is empty"),
    ({"compressor": "zip"}, "unknown compressor 'zip'"),
    ({"density": "0,0.1"}, "density: cannot use '0'"),
    ({"bandwidth": "fast"}, "bandwidth: cannot use 'fast'"),
    ({"ranks": "1.5"}, "ranks: cannot use '1.5'"),
    ({"engine": "quantum"}, "unknown engine"),
    ({"memory": "ef99"}, "unknown memory"),
    ({"density": "0.1,0.1"}, "repeats a value"),
])
def test_bad_specs_are_refused_with_the_reason(raw, fragment):
    with pytest.raises(SweepError, match=fragment):
        build_spec(raw)


def test_points_are_the_product_with_density_free_compressors_once():
    spec = build_spec({"compressor": "dense,fp16,topk,randk", "density": "0.001,0.01,0.1", "bandwidth": "10Gbit,1Tbit"})
    points = spec.points()
    assert len(points) == 2 * (2 + 2 * 3)  # dense and fp16 once per bandwidth, the others per density
    assert len({p["point_id"] for p in points}) == len(points)
    assert build_spec({"compressor": "dense,fp16,topk,randk", "density": "0.001,0.01,0.1",
                       "bandwidth": "10Gbit,1Tbit"}).points() == points  # ids are stable


def test_ranks_bandwidth_and_latency_override_the_topology():
    base = {"topology": "8x8-ib100", "bandwidth": None, "latency": None, "ranks": None}
    topo = point_topology({**base, "ranks": 256, "bandwidth": 400e9 / 8, "latency": 2e-6})
    assert (topo.nodes, topo.ranks, topo.network.bandwidth_per_nic, topo.network.latency) == (32, 256, 50e9, 2e-6)
    with pytest.raises(SweepError, match="not a whole number of 8x8-ib100's nodes"):
        point_topology({**base, "ranks": 12})


# -- points against `arcsim run` ------------------------------------------------------------------------
def test_a_point_is_priced_exactly_as_arcsim_run_prices_it():
    spec = build_spec({"compressor": "topk,arctopk", "bandwidth": "25Gbit", "density": 0.01})
    rows = {r["compressor"]: r for r in map(evaluate_point, spec.points())}
    analysis = Analysis(RunConfig(topology="8x8-ib25", compressors=("topk", "arctopk"), policy="none",
                                  ratios=(0.01,)), announce=lambda _: None)
    for name in ("topk", "arctopk"):
        best = min(candidates_for(analysis.measurement(name, 0.01), analysis.ctx, analysis.pricer),
                   key=lambda c: c.comm_s + c.compress_s)
        row = rows[name]
        assert row["collective"] == best.collective
        assert row["comm_s"] == pytest.approx(best.comm_s, rel=1e-9)  # pricing is deterministic
        # so is the seeded compressor (to float summation order: a measurement cached by a 1-thread sweep
        # worker and one computed with the default threads differ in the 8th digit)
        assert row["rel_error"] == pytest.approx(best.rel_error, rel=1e-6)
        assert row["bytes_per_rank"] == best.bytes_per_rank
    assert rows["topk"]["op"] == "allgather" and rows["arctopk"]["op"] == "allreduce"


def test_more_bandwidth_never_slows_the_network_down():
    spec = build_spec({"compressor": "dense,topk", "bandwidth": "1Gbit,10Gbit,100Gbit", "ranks": 64})
    df = pd.DataFrame(map(evaluate_point, spec.points()))
    for _, rows in df.groupby("compressor"):
        comm = rows.sort_values("nic_gbps")["comm_s"].to_numpy()
        assert (comm[:-1] > comm[1:]).all()


def test_library_fusion_and_params_axes_price_as_arcsim_run_does():
    spec = build_spec({"compressor": "dense,topk", "library": "nccl,gloo", "fusion": "bucket,model",
                       "topology": "8x1-eth10"})
    df = pd.DataFrame(map(evaluate_point, spec.points()))
    assert set(df["library"]) == {"nccl", "gloo"} and set(df["fusion"]) == {"bucket", "model"}
    for _, rows in df.groupby(["compressor", "fusion"]):
        by = rows.set_index("library")["comm_s"]
        assert by["gloo"] > by["nccl"]  # a round trip + software per step, 90 % of the line
    synthetic = pd.DataFrame(map(evaluate_point, build_spec({"compressor": "dense", "params": "2B"}).points()))
    assert synthetic["params"].tolist() == [2_000_000_000] and synthetic["model"].tolist() == ["synthetic-2B"]
    assert synthetic["bytes_per_rank"].tolist() == [8e9]
    old = build_spec({"compressor": "dense"}).points()[0]["point_id"]
    assert old == build_spec({"compressor": "dense", "library": None}).points()[0]["point_id"]  # ids kept


# -- running, interrupting and resuming ----------------------------------------------------------------
def test_interrupted_sweep_keeps_finished_rows_and_resumes_without_recomputing(tmp_path, monkeypatch):
    spec = build_spec({"compressor": "dense,topk,randk", "density": "0.01,0.1", "bandwidth": "10Gbit,100Gbit"})
    calls = []
    real = runner_mod.evaluate_chunk

    def flaky(chunk):
        calls.append(len(chunk))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(chunk)

    monkeypatch.setattr(runner_mod, "evaluate_chunk", flaky)
    first = run_sweep(spec, tmp_path / "s", workers=1, announce=lambda _: None)
    assert first.interrupted and first.computed == sum(calls[:2]) > 0
    kept = load_results(tmp_path / "s")
    assert len(kept) == first.computed
    with (tmp_path / "s" / "results.csv").open("a") as fh:
        fh.write("deadbeef0000,8x8-ib1")  # a row cut off mid-write by a kill
    monkeypatch.setattr(runner_mod, "evaluate_chunk", real)
    second = run_sweep(spec, tmp_path / "s", workers=1, announce=lambda _: None)
    assert not second.interrupted and second.already_done == first.computed
    assert second.computed == len(spec.points()) - first.computed
    final = load_results(tmp_path / "s")
    assert sorted(final["point_id"]) == sorted(p["point_id"] for p in spec.points())
    pd.testing.assert_frame_equal(final.head(len(kept)), kept)  # the first rows were not recomputed
    assert list(final.columns) == list(COLUMNS)


def test_the_bandwidth_column_names_its_unit_and_an_older_table_still_reads_and_resumes(tmp_path):
    """results.csv had a bare `bandwidth` column of bytes/s: it is `bandwidth_Bps` now, and a table with the old name
    reads (plot, resume) under the new one."""
    spec = build_spec({"compressor": "dense,topk", "density": "0.01", "bandwidth": "10Gbit,100Gbit"})
    out = tmp_path / "s"
    run_sweep(spec, out, workers=1, announce=lambda _: None)
    table = out / "results.csv"
    header, *rows = table.read_text().splitlines()
    assert "bandwidth_Bps" in header.split(",") and "bandwidth" not in header.split(",")
    new = load_results(out)
    assert sorted(set(new["bandwidth_Bps"])) == [10e9 / 8, 100e9 / 8]
    table.write_text("\n".join([header.replace("bandwidth_Bps", "bandwidth"), *rows[:-1]]) + "\n")  # an older
    old = load_results(out)  # sweep's table, one point short
    assert "bandwidth" not in old and list(old["bandwidth_Bps"]) == list(new["bandwidth_Bps"][:-1])
    again = run_sweep(spec, out, workers=1, announce=lambda _: None)
    assert (again.already_done, again.computed) == (len(rows) - 1, 1)
    resumed = load_results(out)
    assert list(resumed["point_id"]) == list(new["point_id"])
    assert list(resumed["bandwidth_Bps"]) == list(new["bandwidth_Bps"])


def test_a_recorded_sweep_file_runs_again_and_partial_results_say_incomplete(tmp_path):
    spec = build_spec({"compressor": "dense,topk", "density": "0.01,0.1", "bandwidth": "10Gbit,100Gbit",
                       "latency": "5us"})
    out = tmp_path / "s"
    run_sweep(spec, out, workers=1, announce=lambda _: None)
    recorded = (out / "sweep.yaml").read_text()
    assert "10Gbit" in recorded and "5us" in recorded  # units kept, as a user writes them
    again = build_spec(load_yaml_spec(out / "sweep.yaml"))
    assert [p["point_id"] for p in again.points()] == [p["point_id"] for p in spec.points()]
    load_results(out).head(3).to_csv(out / "results.csv", index=False)  # as if interrupted after 3 points
    assert expected_points(out) == len(spec.points()) == 6
    r = run_cli("plot", str(out), "--kind", "breakdown", "--json", "-")
    assert r.returncode == 0 and "incomplete: 3 of 6 points" in r.stderr
    assert json.loads(r.stdout)["charts"] == [str(out / "breakdown.png")]
    r = run_cli("sweep", str(out / "sweep.yaml"), "-o", str(out), "--no-plots", "-j", "1")
    assert r.returncode == 0 and "resuming: 3 of 6 points" in r.stderr, r.stderr


def test_a_directory_holding_another_sweep_is_refused(tmp_path):
    ResultStore(tmp_path / "s").open(build_spec({"compressor": "topk"}))
    with pytest.raises(SweepError, match="holds a different sweep"):
        ResultStore(tmp_path / "s").open(build_spec({"compressor": "randk"}))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(SweepError, match="not a sweep directory"):
        ResultStore(tmp_path / "other").open(build_spec({"compressor": "topk"}))


@pytest.mark.slow
def test_cli_sweep_signal_then_resume_with_local_processes(tmp_path):
    out = tmp_path / "s"
    args = [sys.executable, "-m", "arcsim", "sweep", "-c", "dense,topk,randk,arctopk,star", "-d", "0.001,0.01,0.1",
            "-b", "1Gbit,10Gbit,100Gbit", "--ranks", "8,16,32", "--engine", "analytic,des",
            "-j", "2", "--no-plots", "-o", str(out)]
    proc = subprocess.Popen(args, cwd=tmp_path, stderr=subprocess.PIPE, text=True, preexec_fn=interruptible)
    results = out / "results.csv"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if results.exists() and results.read_text().count("\n") >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read()  # still running: there is something to interrupt
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 130 and "run the same command again" in err, err
    kept = load_results(out)
    total = 2 * 3 * 3 * (1 + 4 * 3)
    assert 0 < len(kept) < total
    again = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    assert f"resuming: {len(kept)} of {total} points" in again.stderr
    final = load_results(out)
    assert len(final) == total and final["point_id"].is_unique


# -- Dask ------------------------------------------------------------------------------------------------
def test_sweep_on_a_dask_cluster_matches_the_local_run(tmp_path):
    distributed = pytest.importorskip("distributed")
    spec_args = ["-c", "dense,topk,arctopk", "-d", "0.01,0.1", "-b", "10Gbit,100Gbit", "--no-plots"]
    local = run_cli("sweep", *spec_args, "-j", "1", "-o", str(tmp_path / "local"), timeout=300)
    assert local.returncode == 0, local.stderr
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  worker_dashboard_address=None) as cluster:
        remote = run_cli("sweep", *spec_args, "--scheduler", cluster.scheduler_address, "-o",
                         str(tmp_path / "dask"), timeout=300)
    assert remote.returncode == 0, remote.stderr
    a = load_results(tmp_path / "local").sort_values("point_id").reset_index(drop=True)
    b = load_results(tmp_path / "dask").sort_values("point_id").reset_index(drop=True)
    assert list(a["point_id"]) == list(b["point_id"])
    for col in ("comm_s", "rel_error", "bytes_per_rank"):  # not the times that include measured compression
        pd.testing.assert_series_equal(a[col], b[col], check_exact=False, rtol=1e-9)
    assert (a["collective"] == b["collective"]).all()


def test_unreachable_scheduler_is_one_clear_line_and_writes_nothing(tmp_path):
    out = tmp_path / "s"
    r = run_cli("sweep", "-c", "topk", "--scheduler", f"tcp://127.0.0.1:{free_port()}", "-o", str(out), timeout=120)
    assert r.returncode == 2 and "cannot reach the Dask scheduler" in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("error: cannot reach") and not out.exists()


# -- the command line and charts ---------------------------------------------------------------------------
def test_yaml_example_and_bad_files(tmp_path):
    r = run_cli("sweep", str(ROOT / "examples" / "sweep.yaml"), "--dry-run")
    assert r.returncode == 0 and r.stdout.startswith("156 points"), r.stderr
    narrowed = run_cli("sweep", str(ROOT / "examples" / "sweep.yaml"), "--ranks", "64", "--dry-run")
    assert narrowed.stdout.startswith("52 points")  # the command line overrides the file's key
    bad = tmp_path / "bad.yaml"
    bad.write_text("compressors: [topk]\n")
    r = run_cli("sweep", str(bad))
    assert r.returncode == 2 and "unknown key 'compressors'" in r.stderr
    r = run_cli("sweep", str(tmp_path / "missing.yaml"))
    assert r.returncode == 2 and "does not exist" in r.stderr


def test_sweep_writes_table_and_every_supported_chart(tmp_path):
    out = tmp_path / "s"
    r = run_cli("sweep", "-c", "dense,topk,arctopk,randk", "-d", "0.001,0.01", "-b", "1Gbit,100Gbit",
                "--ranks", "16,64", "-j", "1", "-o", str(out), timeout=300)
    assert r.returncode == 0, r.stderr
    assert "points/s" in r.stderr
    for kind in ("heatmap", "speedup", "crossover", "breakdown"):
        png = out / f"{kind}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    df = load_results(out)
    assert len(df) == 2 * 2 * (1 + 3 * 2)
    fast = df[df["nic_gbps"] == 1.0]
    assert (fast["world"].isin([16, 64])).all()
    only_one_bw = run_cli("sweep", "-c", "dense,topk", "-o", str(tmp_path / "t"), "-j", "1", timeout=300)
    assert only_one_bw.returncode == 0 and "no chart: heatmap needs" in only_one_bw.stderr
    r = run_cli("plot", str(tmp_path / "t"), "--kind", "heatmap")
    assert r.returncode == 2 and "heatmap needs at least two bandwidths" in r.stderr
    r = run_cli("plot", str(tmp_path / "nowhere"))
    assert r.returncode == 2 and "no sweep results" in r.stderr


def test_charts_hold_other_axes_at_their_first_value_and_keep_dense():
    df = pd.DataFrame({
        "compressor": ["dense", "topk", "topk", "dense", "topk", "topk"],
        "density": [1.0, 0.01, 0.1, 1.0, 0.01, 0.1], "world": [16, 16, 16, 64, 64, 64],
        "nic_gbps": [10.0] * 6, "topology_name": ["t"] * 6, "latency_us": [5.0] * 6, "model": ["m"] * 6,
        "trace": ["x"] * 6, "bucket_mb": [25.0] * 6, "engine": ["analytic"] * 6})
    held, text = hold_others(df, ("world",))
    assert list(held["compressor"]) == ["dense", "topk", "dense", "topk"]  # density held at 0.01, dense kept
    assert text == "held at density 0.01"


def test_where_selects_the_held_value_and_says_so():
    from arcsim.errors import ArcsimError
    from arcsim.sweep.plots import select

    df = pd.DataFrame({
        "compressor": ["dense", "topk", "topk", "dense", "topk", "topk"],
        "density": [1.0, 0.01, 0.1, 1.0, 0.01, 0.1], "world": [16, 16, 16, 64, 64, 64],
        "nic_gbps": [10.0] * 3 + [100.0] * 3, "topology_name": ["t"] * 6, "latency_us": [5.0] * 6,
        "model": ["m"] * 6, "trace": ["x"] * 6, "bucket_mb": [25.0] * 6, "engine": ["analytic"] * 6})
    chosen = select(df, ("ranks=64", "density=0.1"))
    assert list(chosen["compressor"]) == ["dense", "topk"] and set(chosen["world"]) == {64}  # dense kept
    assert chosen.attrs["where"] == "ranks 64, density 0.1"
    assert list(select(df, ("bandwidth=10Gbit",))["world"]) == [16, 16, 16]
    held, text = hold_others(select(df, ("density=0.01",)), ("world",))
    assert text == "" and len(held) == 4  # nothing left to hold
    for bad, phrase in (("ranks=32", "matches no point; the table has ranks 16, 64"), ("gpus=2", "NAME one of"),
                        ("ranks=x", "cannot read 'x' as a ranks"), ("ranks=", "NAME=VALUE")):
        with pytest.raises(ArcsimError, match=phrase):
            select(df, (bad,))


OLD_TABLE = """point_id,compressor,density,nic_gbps,model,iteration_s,dense_iteration_s,speedup_vs_dense,rel_error,\
compute_s,compress_s,exposed_comm_s,op,collective
a,dense,1.0,10,cnn,1.0,1.0,1.0,0,0.5,0,0.5,allreduce,ring
b,topk,0.01,10,cnn,0.8,1.0,1.25,0.3,0.5,0.1,0.2,allgather,ring
c,dense,1.0,100,cnn,0.6,0.6,1.0,0,0.5,0,0.1,allreduce,ring
d,topk,0.01,100,cnn,0.7,0.6,0.86,0.3,0.5,0.1,0.1,allgather,ring
"""


def test_plot_reads_a_table_without_the_hierarchy_or_world_column(tmp_path):
    """A table from before the hierarchy axis (and without world): read as its points were priced (flat); a chart
    that needs a missing column is skipped with the reason; --where on it is one error naming the axes it has."""
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "results.csv").write_text(OLD_TABLE)
    r = run_cli("plot", "old", "--where", "hierarchy=flat", "-o", "flat", cwd=str(tmp_path))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert (tmp_path / "flat" / "breakdown.png").is_file() and "speedup needs the column world" in r.stderr
    r = run_cli("plot", "old", "--where", "ranks=8", "-o", "ranks", cwd=str(tmp_path))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("error: --where 'ranks=8': this table has no world column") and \
        "--where takes bandwidth, model, density, fusion, hierarchy" in r.stderr
    assert not (tmp_path / "ranks").exists()
    nodes = OLD_TABLE.replace("op,collective", "op,collective,nodes,gpus_per_node").replace("ring\n", "ring,2,4\n")
    (tmp_path / "old" / "results.csv").write_text(nodes)
    assert set(load_results(tmp_path / "old")["world"]) == {8}  # world as the sweep writes it: nodes × GPUs


def test_a_table_from_before_effects_s_resumes_under_its_own_columns_and_charts_the_same(tmp_path):
    """Issue 49: compute_s is one rank's and effects_s the cluster's; a table written when compute_s held both
    reads with effects 0, and rows appended on resume keep its header with the effects folded back in."""
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "results.csv").write_text(OLD_TABLE)
    store = ResultStore(tmp_path / "old")
    row = {c: None for c in COLUMNS} | {"point_id": "e", "compressor": "dense", "iteration_s": 1.0, "op": "allreduce",
                                         "collective": "ring", "compute_s": 0.4, "effects_s": 0.1, "compress_s": 0.0,
                                         "exposed_comm_s": 0.5}
    store.append([row])
    header = (tmp_path / "old" / "results.csv").read_text().splitlines()[0]
    assert header == OLD_TABLE.splitlines()[0]
    df = store.load()
    assert list(df["effects_s"]) == [0.0] * 5 and df.set_index("point_id").loc["e", "compute_s"] == 0.5


def test_charts_say_which_value_of_an_axis_they_do_not_separate_they_hold(tmp_path):
    """Two libraries in the table: a chart that does not separate them holds one, says so in its title and in a
    note, and names the ones left out with the --where that draws them."""
    from arcsim.sweep.plots import plot_all

    df = pd.DataFrame({
        "compressor": ["dense", "topk"] * 2, "density": [1.0, 0.01] * 2, "library": ["nccl"] * 2 + ["gloo"] * 2,
        "iteration_s": [1.0, 0.5, 2.0, 0.7], "dense_iteration_s": [1.0, 1.0, 2.0, 2.0], "op": ["allreduce"] * 4,
        "collective": ["ring"] * 4, "compute_s": [0.4] * 4, "compress_s": [0.0, 0.1] * 2,
        "exposed_comm_s": [0.6, 0.0, 1.6, 0.2], "model": ["m"] * 4, "world": [8] * 4, "nic_gbps": [10.0] * 4})
    held, text = hold_others(df, ())
    assert set(held["library"]) == {"gloo"} and text == "held at library gloo"
    notes: list[str] = []
    written, _ = plot_all(df, tmp_path, ("breakdown",), announce=notes.append)
    assert written == [tmp_path / "breakdown.png"]
    assert notes == ["breakdown.png holds library at gloo (not drawn: nccl); draw another with --where, e.g. "
                     "--where library=nccl"]


def test_heatmap_cells_and_crossover_ratios_come_from_the_table():
    from arcsim.sweep.plots import ag_over_ar, fastest_by_cell

    rows = []
    for bw, dense_t in ((1.0, 10.0), (100.0, 1.0)):
        rows.append({"compressor": "dense", "density": 1.0, "nic_gbps": bw, "iteration_s": dense_t})
        for d, topk_t, arc_t in ((0.01, 4.0, 2.0), (0.1, 6.0, 7.0)):
            rows += [{"compressor": "topk", "density": d, "nic_gbps": bw, "iteration_s": topk_t * dense_t / 10},
                     {"compressor": "arctopk", "density": d, "nic_gbps": bw, "iteration_s": arc_t * dense_t / 10}]
    df = pd.DataFrame(rows).assign(model="m", dense_iteration_s=lambda t: t["nic_gbps"].map({1.0: 10.0, 100.0: 1.0}))
    df.loc[(df["nic_gbps"] == 100.0) & (df["compressor"] != "dense"), "iteration_s"] += 1.0  # dense wins at 100
    df["rel_error"] = df["compressor"].map({"dense": 0.0, "topk": 0.5, "arctopk": 0.55})
    bws, dens, winners, speedup = fastest_by_cell(df)
    assert (bws, dens) == ([1.0, 100.0], [0.01, 0.1])
    assert winners.tolist() == [["arctopk", "topk"], ["dense", "dense"]]
    assert speedup[0].tolist() == pytest.approx([10 / 2.0, 10 / 6.0]) and speedup[1].tolist() == [1.0, 1.0]
    # a faster compressor whose error leaves it unusable wins only when error is ignored
    fast = df[df["compressor"] == "topk"].assign(compressor="randk", iteration_s=0.1, rel_error=0.99)
    both = pd.concat([df, fast], ignore_index=True)
    assert fastest_by_cell(both)[2].tolist() == winners.tolist()
    assert set(fastest_by_cell(both, policy=None)[2].ravel()) == {"randk"}
    ratio = ag_over_ar(df[df["density"] != 0.1])
    assert ratio[("m", 1.0)] == pytest.approx(4.0 / 2.0)


def test_sweep_rows_take_the_candidates_own_fields():
    from dataclasses import fields

    from arcsim.run.candidates import Candidate
    from arcsim.sweep.evaluate import CANDIDATE_COLUMNS, RESULT_COLUMNS

    names = {f.name for f in fields(Candidate)}
    assert set(CANDIDATE_COLUMNS) <= names and set(CANDIDATE_COLUMNS) <= set(RESULT_COLUMNS)


def _children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def _still_running(pids: list[int], within_s: float = 60.0) -> list[int]:
    """Those of ``pids`` neither gone nor a zombie after up to ``within_s`` seconds of waiting for them to end (a
    liveness bound, not a speed goal)."""
    def running(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + within_s
    while (alive := [p for p in pids if running(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive


def test_pool_workers_die_with_a_killed_sweep(tmp_path):
    out = tmp_path / "s"
    args = [sys.executable, "-m", "arcsim", "sweep", "-c", "dense,topk,randk,arctopk,star", "-d", "0.001,0.01,0.1",
            "-b", "1Gbit,10Gbit,100Gbit", "--ranks", "8,16,32", "--engine", "analytic,des",
            "-j", "2", "--no-plots", "-o", str(out)]
    proc = subprocess.Popen(args, cwd=tmp_path, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    workers: list[int] = []
    while time.monotonic() < deadline and proc.poll() is None and len(workers) < 2:
        servers = [k for k in _children(proc.pid) if "forkserver" in Path(f"/proc/{k}/cmdline").read_bytes().decode()]
        workers = [k for server in servers for k in _children(server)]  # the pool's workers fork from the server
        time.sleep(0.1)
    assert len(workers) >= 2, "the pool never started"
    proc.kill()  # SIGKILL: no handler runs in the parent
    proc.wait()
    alive = _still_running(workers)
    assert not alive, f"pool workers {alive} outlived their killed parent"


BUSY_POOL = """
import os, time
from arcsim.processes import forkserver
from arcsim.sweep.runner import _pool_worker

if __name__ == "__main__":
    pool = forkserver([]).Pool(2, initializer=_pool_worker, initargs=(os.getpid(), dict(os.environ)))
    busy = [pool.apply_async(time.sleep, (600,)) for _ in range(2)]
    time.sleep(1.0)  # each worker has taken its task
    print(*(p.pid for p in pool._pool), flush=True)
    time.sleep(600)
"""


def test_busy_pool_workers_die_with_a_killed_sweep(tmp_path):
    """The pool's workers are forked by its forkserver, which outlives the sweep while they live: a worker busy with
    a point (here a ten-minute one) ends with the sweep all the same."""
    (tmp_path / "owner.py").write_text(BUSY_POOL)
    owner = subprocess.Popen([sys.executable, str(tmp_path / "owner.py")], stdout=subprocess.PIPE, text=True)
    workers = [int(w) for w in owner.stdout.readline().split()]
    assert len(workers) == 2 and owner.pid not in workers
    owner.kill()
    owner.wait()
    alive = _still_running(workers)  # (left alone, they would sleep 600 s)
    assert not alive, f"pool workers {alive} outlived their killed sweep"


def test_pool_workers_take_the_sweeps_environment_not_their_servers(monkeypatch):
    """A process has one forkserver, started with the environment of its first use: the pool's workers set the
    sweep's own (ARCSIM_CACHE_DIR and the rest) when they start."""
    first = runner_mod.forkserver([]).Pool(1, initializer=runner_mod._pool_worker,
                                           initargs=(os.getpid(), dict(os.environ)))
    first.close()
    first.join()  # the server runs from here on, with the environment before the line below
    monkeypatch.setenv("ARCSIM_SWEEP_ENV_TEST", "the sweep's")
    pool = runner_mod.forkserver([]).Pool(1, initializer=runner_mod._pool_worker,
                                          initargs=(os.getpid(), dict(os.environ)))
    try:
        assert pool.apply(os.getenv, ("ARCSIM_SWEEP_ENV_TEST",)) == "the sweep's"
    finally:
        pool.terminate()
        pool.join()


def test_die_with_parent_ends_a_sleeping_child_when_its_parent_is_killed(tmp_path):
    """Without the parent-death signal the grandchild would sleep 600 s; with it, it dies with its parent."""
    code = ("import os, subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import os, time; from arcsim.processes import "
            "die_with_parent; die_with_parent(int(os.environ[\"P\"])); time.sleep(600)'], "
            "env={**os.environ, 'P': str(os.getpid())})\n"
            "print(child.pid, flush=True)\n"
            "time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    grandchild = int(parent.stdout.readline())
    time.sleep(1.0)  # let the grandchild register the signal
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 30  # a liveness bound: the alternative is 600 s
    while Path(f"/proc/{grandchild}").exists() and time.monotonic() < deadline:
        state = Path(f"/proc/{grandchild}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "Z":
            break
        time.sleep(0.1)
    gone = not Path(f"/proc/{grandchild}").exists() or \
        Path(f"/proc/{grandchild}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    if not gone:
        os.kill(grandchild, signal.SIGKILL)
    assert gone


def test_the_point_count_says_why_it_is_below_the_product_of_the_axes():
    spec = build_spec({"compressor": "dense,topk", "density": "0.01,0.1", "bandwidth": "10Gbit,100Gbit"})
    points = spec.points()
    assert len(points) == 6  # dense once per bandwidth, topk twice
    assert "8 combinations, 2 fewer points" in spec.count_note(len(points))
    assert build_spec({"compressor": "topk", "density": "0.01,0.1"}).count_note(2) == ""


def test_the_gpu_axis_prices_each_point_on_its_gpu(tmp_path):
    spec = build_spec({"compressor": "dense", "gpu": "v100,h100,cpu"})
    run_sweep(spec, tmp_path / "g", workers=1, announce=lambda _: None)
    df = load_results(tmp_path / "g")
    assert sorted(df["gpu"]) == ["cpu", "h100", "v100"]
    compute = dict(zip(df["gpu"], df["compute_s"], strict=True))
    shipped = json.loads(packaged("traces", "profiles", "cnn-h100-b32-fp32.json").read_text())
    assert compute["h100"] == pytest.approx(shipped["forward_s"] + shipped["backward_s"])  # measured profile
    assert len(set(compute.values())) == 3  # the V100 is modelled, cpu is the trace's own capture


def test_plot_offers_every_chart_it_can_draw():
    """`arcsim plot --kind` takes exactly the charts plots.KINDS draws (hierarchy had been left out of the CLI)."""
    from arcsim.cli.sweep import plot
    from arcsim.sweep.plots import KINDS

    kind = next(p for p in plot.params if p.name == "kinds")
    assert isinstance(kind.type, click.Choice) and set(kind.type.choices) == {"all", *KINDS}


def test_plot_refuses_a_policy_beside_any_error(tmp_path):
    """--any-error ignores the error, so a --policy beside it would silently change nothing."""
    (tmp_path / "results.csv").write_text("point_id,compressor\n")
    done = run_cli("plot", str(tmp_path), "--any-error", "--policy", "none")
    assert done.returncode == 2 and done.stderr.count("error:") == 1 and "--policy" in done.stderr

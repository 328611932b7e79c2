"""`arcsim run`: buckets, the iteration timeline, the Pareto front, and the command's outputs."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
from conftest import run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

from arcsim.compressors.layout import Layer
from arcsim.run.pareto import choose, pareto_front
from arcsim.strategy.buckets import make_buckets
from arcsim.strategy.data_parallel import bucketed_step

FAST = ("-c", "dense,fp16,topk,arctopk,star,randk", "--ratios", "0.003,0.01,0.1")


def layers_of(sizes):
    out, off = [], 0
    for i, n in enumerate(sizes):
        out.append(Layer(f"l{i}", (n,), off))
        off += n
    return tuple(out)


def test_buckets_pack_in_order_as_ddps_reducer():
    """DDP's rule: a layer joins the open bucket, which closes once it holds the cap or more."""
    layers = layers_of([100, 200, 50, 1000, 10, 10])
    ready = [0.1, 0.2, 0.3, 0.4, 0.5, 0.45]
    buckets = make_buckets(layers, ready, cap_bytes=1200)  # 300 elements of fp32
    assert [[la.name for la in b.layers] for b in buckets] == [["l0", "l1"], ["l2", "l3"], ["l4", "l5"]]
    assert [(b.lo, b.hi) for b in buckets] == [(0, 300), (300, 1350), (1350, 1370)]
    assert [b.ready_s for b in buckets] == [0.2, 0.4, 0.5]  # the latest layer of each
    assert buckets[2].layout()[1].offset == 10


def test_timeline_by_hand():
    # forward 1; buckets ready at 1 and 2 into backward (3 long); compress 0.5 each; comm 2 and 1
    t = bucketed_step(1.0, 3.0, [1.0, 2.0], [0.5, 0.5], [2.0, 1.0])
    assert t.comm_start == (2.5, 4.5) and t.comm_end == (4.5, 5.5)
    assert t.compute_s == 4.0 and t.compress_s == 1.0
    assert t.iteration_s == 5.5 and t.exposed_comm_s == pytest.approx(0.5)  # compute stream ends at 5
    hidden = bucketed_step(1.0, 3.0, [1.0, 2.0], [0.0, 0.0], [0.1, 0.1])
    assert hidden.iteration_s == 4.0 and hidden.exposed_comm_s == 0.0
    # the optimizer step waits for the last communication: it adds after it, it does not hide it
    stepped = bucketed_step(1.0, 3.0, [1.0, 2.0], [0.5, 0.5], [2.0, 1.0], after_s=0.75)
    assert stepped.iteration_s == 6.25 and stepped.compute_s == 4.75 and stepped.exposed_comm_s == pytest.approx(0.5)


@settings(max_examples=60)
@given(st.lists(st.tuples(st.floats(0.1, 10), st.floats(0, 1)), min_size=1, max_size=40))
def test_pareto_front_is_exactly_the_non_dominated_set(points):
    obj = np.array(points)
    front = pareto_front(obj)
    for i in range(len(obj)):
        dominated = any((obj[j] <= obj[i]).all() and (obj[j] < obj[i]).any() for j in range(len(obj)))
        on = i in front or any((obj[j] == obj[i]).all() for j in front)  # duplicates kept once
        assert on == (not dominated)
    pick, _ = choose(obj[front])
    assert 0 <= pick < len(front)


def test_knee_and_asf_choices():
    front = np.array([[1.0, 0.9], [1.05, 0.1], [2.0, 0.0]])
    assert choose(front)[0] == 1
    assert choose(front, (1.0, 0.0))[0] == 0  # time only: the fastest
    assert choose(front, (0.0, 1.0))[0] == 2  # error only: the most faithful


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    r = run_cli("run", *FAST, "--json", str(out / "r.json"), "--csv", str(out / "r.csv"), "--plot", str(out / "png"),
                env={"COLUMNS": "100"})
    assert r.returncode == 0, r.stderr
    return r, json.loads((out / "r.json").read_text()), out


def test_run_prints_a_table_and_the_assumptions(default_run):
    r, _, _ = default_run
    text = " ".join(r.stdout.split())  # the caption may wrap
    assert "Iteration time per compressor" in text and "dense (baseline)" in text
    assert "Switching policy" in r.stdout and "Pareto front" in r.stdout and "AG/AR crossover" in r.stdout
    assert "the topology has 64 ranks, the trace 8 workers" in text


def test_run_tables_fit_100_columns_without_cutting_names(default_run):
    r, res, _ = default_run  # run with COLUMNS=100
    assert max(len(line) for line in r.stdout.splitlines()) <= 100
    table = r.stdout[r.stdout.index("Iteration time per compressor"):r.stdout.index("Switching policy")]
    assert "…" not in table
    for name in {c["compressor"] for c in res["candidates"]}:
        assert f"\n{name} " in table, name


def test_json_structure_and_consistency(default_run):
    _, res, _ = default_run
    assert res["topology"]["name"] == "8x8-ib100" and res["trace"]["model"] == "cnn"
    keys = {"compressor", "collective", "density", "iteration_s", "compute_s", "compress_s", "comm_s",
            "exposed_comm_s", "speedup_vs_dense", "rel_error"}
    for c in res["candidates"]:
        assert keys <= set(c)
        busy = c["compute_s"] + c["effects_s"] + c["compress_s"]  # the compute stream, the cluster's effects on it
        assert c["iteration_s"] >= busy - 1e-12
        assert c["exposed_comm_s"] == pytest.approx(c["iteration_s"] - busy, abs=1e-9)
        assert c["speedup_vs_dense"] == pytest.approx(res["dense"]["iteration_s"] / c["iteration_s"])
    # one definition of speed-up: against dense fp32 on its fastest collective (as arcsim sweep)
    dense_rows = [c for c in res["candidates"] if c["compressor"] == "dense"]
    assert res["dense"]["iteration_s"] == pytest.approx(min(c["iteration_s"] for c in dense_rows))
    assert res["dense"]["speedup_vs_dense"] == pytest.approx(1.0)
    assert max(c["speedup_vs_dense"] for c in dense_rows) == pytest.approx(1.0)
    dense_ring = next(c for c in dense_rows if c["collective"] == "ring")
    assert dense_ring["speedup_vs_dense_ring"] == pytest.approx(1.0)
    for c in res["candidates"]:  # the textbook ring ratio is kept as a named extra
        assert c["speedup_vs_dense_ring"] == pytest.approx(dense_ring["iteration_s"] / c["iteration_s"])
    assert {c["compressor"] for c in res["candidates"]} == {"dense", "fp16", "topk", "arctopk", "star", "randk"}
    assert {c["op"] for c in res["candidates"] if c["compressor"] == "topk"} == {"allgather"}
    assert {c["op"] for c in res["candidates"] if c["compressor"] == "arctopk"} == {"allreduce"}


def test_chosen_point_lies_on_the_front_and_the_front_is_non_dominated(default_run):
    _, res, _ = default_run
    par = res["pareto"]
    assert par["chosen"] in par["points"]
    for p in par["points"]:
        for q in par["evaluated"]:
            better_or_equal = q["iteration_s"] <= p["iteration_s"] and q["rel_error"] <= p["rel_error"]
            strictly = q["iteration_s"] < p["iteration_s"] or q["rel_error"] < p["rel_error"]
            assert not (better_or_equal and strictly), (p, q)
    densities = {p["density"] for p in par["evaluated"] if p["density"] is not None}
    assert densities == {0.003, 0.01, 0.1}


def test_fewer_bytes_never_priced_slower_on_the_same_collective(default_run):
    _, res, _ = default_run
    # dense, fp16 and randk issue one all-reduce each: they differ only in bytes
    single = [c for c in res["candidates"] if c["compressor"] in ("dense", "fp16", "randk")]
    for a in single:
        for b in single:
            if a["collective"] == b["collective"] and a["bytes_per_rank"] < b["bytes_per_rank"]:
                assert a["comm_s"] <= b["comm_s"] + 1e-12, (a, b)
    # the same compressor and collective at a lower density sends fewer bytes and is never slower to move
    points = res["pareto"]["evaluated"]
    compared = 0
    for p in points:
        for q in points:
            if (p["compressor"], p["collective"]) == (q["compressor"], q["collective"]) \
                    and p["bytes_per_rank"] < q["bytes_per_rank"]:
                assert p["comm_s"] <= q["comm_s"] + 1e-12, (p, q)
                compared += 1
    assert compared > 10


def test_policy_choices_are_eligible_and_soonest_to_target(default_run):
    _, res, _ = default_run
    pol = res["policy"]
    assert pol["name"] == "auto" and len(pol["choices"]) == len(res["buckets"])
    for ch in pol["choices"]:
        assert ch["compressor"] in pol["eligible"]
    errors = {c["compressor"]: c["rel_error"] for c in res["candidates"]}
    for name in pol["eligible"]:
        assert name in ("dense", "fp16") or errors[name] <= pol["error_limit"] + 1e-3
    assert "randk" not in pol["eligible"]  # a random selection never reached the target in training
    usable = [e for e in pol["estimates"] if e["excluded"] is None]
    assert pol["deploy"] == "mix" or pol["time_to_target_s"] == pytest.approx(
        min(e["time_to_target_s"] for e in usable))


def test_gate_policy_choices_are_eligible_and_fastest(tmp_path):
    out = tmp_path / "r.json"
    r = run_cli("run", *FAST, "--policy", "gate", "--json", str(out))
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    pol = res["policy"]
    assert pol["name"] == "gate" and len(pol["choices"]) == len(res["buckets"])
    for ch in pol["choices"]:
        assert ch["compressor"] in pol["eligible"]
        assert all(ch["time_s"] <= r["time_s"] + 1e-15 for r in ch["runners_up"])
    errors = {c["compressor"]: c["rel_error"] for c in res["candidates"]}
    for name in pol["eligible"]:
        assert name in ("dense", "fp16") or errors[name] <= pol["error_limit"]


def test_the_recommendation_leads_the_output_and_is_in_the_json(default_run):
    r, res, _ = default_run
    rec = res["recommendation"]
    assert r.stdout.index("Recommended:") < r.stdout.index("Iteration time per compressor")
    assert f"Recommended: {rec['compressor']} over " in r.stdout
    soonest = min((e for e in res["policy"]["estimates"] if e["excluded"] is None),
                  key=lambda e: e["time_to_target_s"])  # one answer: auto's soonest is the recommendation
    assert (rec["compressor"], rec["collective"], rec["density"]) == \
        (soonest["compressor"], soonest["collective"], soonest["density"])
    assert rec["rel_error"] < rec["error_limit"] == 0.95
    assert rec["speedup_vs_dense"] == pytest.approx(res["dense"]["iteration_s"] / rec["iteration_s"])
    assert rec["why"] and all(isinstance(w, str) for w in rec["why"])
    for c in res["candidates"]:
        assert c["usable"] == (c["rel_error"] < 0.95)


def test_unusable_candidates_go_last_marked_in_the_table(default_run):
    r, res, _ = default_run
    table = r.stdout[r.stdout.index("Iteration time per compressor"):r.stdout.index("Switching policy")]
    unusable = {c["compressor"] for c in res["candidates"] if not c["usable"]}
    assert "randk" in unusable  # Rand-K's error is 0.99 on the default trace
    rows = [line.split()[0] for line in table.splitlines() if line.split() and line.split()[0] in
            {c["compressor"] for c in res["candidates"]}]
    marked = [line.split()[0] for line in table.splitlines() if "✗" in line and line.split()[0] in rows]
    assert set(marked) == unusable and rows[-len(marked):] == marked


def _candidate(name: str, seconds: float, error: float, density: float | None = 0.01):
    from arcsim.run.candidates import Candidate

    return Candidate(name, "ring", density, "ef14", "allreduce", seconds, 0.0, 0.0, seconds, seconds, error, error,
                     1.0, density or 1.0, 1.0, speedup_vs_dense=2.0 / seconds)


def test_the_fastest_unusable_point_is_never_chosen_and_the_reason_is_said():
    from arcsim.run.decisions import pareto, recommend

    grid = [_candidate("dense", 2.0, 0.0, None), _candidate("randk", 1.0, 0.99), _candidate("topk", 1.5, 0.5)]
    front = pareto(grid, [0.01], (1.0, 0.0))  # time alone: before, the fastest point whatever its error
    assert {p.compressor for p in front.points} == {"dense", "randk", "topk"}  # the front still shows it
    assert front.chosen.compressor == "topk"
    rec = recommend(front, grid, None)
    assert (rec.compressor, rec.speedup_vs_dense) == ("topk", pytest.approx(2.0 / 1.5))
    assert any("faster but unusable" in w and "randk" in w for w in rec.why)


def test_one_node_has_no_crossover_over_inter_node_bandwidth(tmp_path):
    out = tmp_path / "one.json"
    r = run_cli("run", "-t", "1x8-ib100", *FAST, "--json", str(out), env={"COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    crossover = r.stdout[r.stdout.index("AG/AR crossover"):r.stdout.index("Pareto front:")]
    assert "Gb/s per NIC" not in crossover and "one node" in crossover and "ratio:" in crossover
    cx = json.loads(out.read_text())["crossover"]
    assert "bandwidth" not in cx and "bandwidth_flips_gbps" not in cx and cx["ratio"]


def test_csv_and_plots(default_run):
    _, res, out = default_run
    with open(out / "r.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len({(p["compressor"], p["collective"], p["density"]) for p in res["pareto"]["evaluated"]})
    assert sum(r["chosen"] == "True" for r in rows) == 1
    assert sum(r["on_front"] == "True" for r in rows) == len(res["pareto"]["points"])
    for name in ("breakdown", "pareto", "crossover"):
        data = (out / "png" / f"{name}.png").read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


def test_des_engine_agrees_with_the_closed_form_for_dense(tmp_path):
    results = {}
    for engine in ("analytic", "des"):
        out = tmp_path / f"{engine}.json"
        r = run_cli("run", "-c", "dense", "--ratios", "0.01", "--engine", engine, "--json", str(out),
                    "--policy", "none", "--library", "ideal")
        assert r.returncode == 0, r.stderr
        results[engine] = json.loads(out.read_text())
    a = {c["collective"]: c["comm_s"] for c in results["analytic"]["candidates"]}
    d = {c["collective"]: c["comm_s"] for c in results["des"]["candidates"]}
    for algo in ("ring", "rhd", "hierarchical"):
        assert d[algo] == pytest.approx(a[algo], rel=0.03), algo


def test_matching_ranks_drop_the_extrapolation_note_and_profile_replaces_compute(tmp_path):
    prof = tmp_path / "p.json"
    r = run_cli("trace", "profile", "--model", "cnn", "--batch", "16", "--repeats", "2", "--out", str(prof))
    assert r.returncode == 0, r.stderr
    out = tmp_path / "r.json"
    # compute_s is the profile's on any cluster (an ethernet topology's stragglers and interference are effects_s)
    r = run_cli("run", "-t", "8x1-ib10", "-c", "dense,topk", "--ratios", "0.01", "--compute-profile", str(prof),
                "--json", str(out))
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert not any("the topology has" in a for a in res["assumptions"])
    p = json.loads(prof.read_text())
    for c in res["candidates"]:
        assert math.isclose(c["compute_s"], p["forward_s"] + p["backward_s"], rel_tol=1e-9)


@pytest.mark.parametrize(("args", "fragment"), [
    (("-c", "topk,zipk"), "unknown compressor zipk; choose from dense"),
    (("--policy", "greedy"), "unknown policy 'greedy'; choose one of auto, paper, gate, none"),
    (("--ratios", "0,0.1"), "must lie in (0, 1]"),
    (("--ratios", "0.1,1.5"), "must lie in (0, 1]"),
    (("--density", "2"), "must lie in (0, 1]"),
    (("--weights", "1"), "'--weights': takes 2 comma-separated values"),
    (("--ratios", "a,b"), "'--ratios': value 1 of 'a,b': 'a' is not a number"),
    (("--trace", "nope.npz"), "no such trace file"),
    (("-t", "9x9-foo1"), "fabric"),
])
def test_bad_input_is_one_line_and_exit_2(args, fragment):
    r = run_cli("run", *args)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], r.stderr


def test_profile_of_another_model_is_refused(tmp_path):
    prof = tmp_path / "mlp.json"
    assert run_cli("trace", "profile", "--model", "mlp", "--batch", "4", "--repeats", "1", "--out",
                   str(prof)).returncode == 0
    r = run_cli("run", "-c", "dense", "--compute-profile", str(prof))
    assert r.returncode == 2 and "does not match trace cnn-digits-small.npz" in r.stderr


def test_grid_steps_only_shrinks_the_grid(tmp_path):
    out = tmp_path / "r.json"
    r = run_cli("run", "-c", "dense,topk", "--ratios", "0.01,0.1", "--grid-steps", "2", "--policy", "none",
                "--json", str(out))
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    keys = res["timings_s"]
    assert "measure topk @ 0.01 (16 steps)" in keys and "measure topk @ 0.1 (2 steps)" in keys
    assert "measure dense @ 1 (16 steps)" in keys
    assert any("first 2 of the trace's 16 steps" in a for a in res["assumptions"])
    topk = next(c for c in res["candidates"] if c["compressor"] == "topk")
    assert len(topk["density_by_step"]) == 16


def test_compress_scale_multiplies_measured_compression_only():
    import dataclasses

    from arcsim.run.analysis import Analysis
    from arcsim.run.candidates import step_timelines
    from arcsim.run.config import RunConfig

    analysis = Analysis(RunConfig(compressors=("topk",), policy="none", ratios=(0.01,), gpu="cpu"),
                        announce=lambda _: None)
    meas = analysis.measurement("topk", 0.01)
    plain, _, _ = step_timelines(meas, "ring", analysis.ctx, analysis.pricer)
    shared, _, _ = step_timelines(meas, "ring", dataclasses.replace(analysis.ctx, compress_scale=3.0), analysis.pricer)
    for a, b in zip(plain, shared, strict=True):
        assert b.compress_s == pytest.approx(3 * a.compress_s) and b.comm_s == a.comm_s
        assert b.iteration_s > a.iteration_s
    by_name = dataclasses.replace(analysis.ctx, compress_scale={"topk": 2.0, "arctopk": 5.0})
    assert by_name.scale_for("topk") == 2.0 and by_name.scale_for("randk") == 1.0  # per compressor, 1 if unnamed
    for a, b in zip(plain, step_timelines(meas, "ring", by_name, analysis.pricer)[0], strict=True):
        assert b.compress_s == pytest.approx(2 * a.compress_s)


@pytest.mark.parametrize(("topology", "word"), [("8x8-ib100", "upper estimate"), ("4x1-eth25", "lower estimate")])
def test_the_error_estimate_is_named_by_which_way_the_rank_count_differs(topology, word):
    from arcsim.run.analysis import Analysis
    from arcsim.run.config import RunConfig

    analysis = Analysis(RunConfig(topology=topology, compressors=("topk",), policy="none", ratios=(0.01,)),
                        announce=lambda _: None)
    notes = " ".join(analysis._assumptions())
    assert word in notes
    assert ("upper estimate" if word == "lower estimate" else "lower estimate") not in notes


def test_a_compressor_off_its_requested_density_is_said_once():
    from arcsim.run.analysis import density_notes
    from arcsim.run.candidates import Candidate

    def cand(name: str, asked: float | None, got: float, collective: str = "ring") -> Candidate:
        return Candidate(name, collective, asked, "ef14", "allreduce", 1, 1, 0, 0, 0, 0, 0, 1, got, 4)

    notes = density_notes([cand("arctopk", 0.01, 0.022), cand("arctopk", 0.01, 0.022, "tree"),
                           cand("topk", 0.01, 0.0105), cand("dense", None, 1.0)])
    assert len(notes) == 1 and "arctopk reached density 0.022 where 0.01 was asked" in notes[0]


def test_a_second_run_reads_the_measurements_from_the_cache_and_answers_the_same(tmp_path):
    """… and, every measurement cached, prices without loading torch (its import is half a cached run's time)."""
    env = {"ARCSIM_CACHE_DIR": str(tmp_path / "cache")}
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    args = ("run", "-c", "dense,topk,arctopk", "--ratios", "0.01", "--policy", "none")
    assert run_cli(*args, "--json", str(first), env=env).returncode == 0
    again = run_cli(*args, "-t", "8x8-ib400x8", "--library", "gloo", "--json", str(second),
                    env={**env, "PYTHONPROFILEIMPORTTIME": "1"})  # each module imported, on standard error
    assert again.returncode == 0, again.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in again.stderr.splitlines() if line.startswith("import time")}
    assert "arcsim.run.analysis" in imported and "torch" not in imported
    a, b = json.loads(first.read_text()), json.loads(second.read_text())
    assert any("were cached from an earlier run" in note for note in b["assumptions"])
    assert not any("cached" in note for note in a["assumptions"])
    rows = {c["compressor"]: c for c in a["candidates"]}
    for c in b["candidates"]:  # the same measurements: bytes and errors identical, the price differs
        assert c["rel_error"] == rows[c["compressor"]]["rel_error"]
        assert c["bytes_per_rank"] == rows[c["compressor"]]["bytes_per_rank"]
    info = json.loads(run_cli("cache", "info", "--json", "-", env=env).stdout)
    assert info["entries"] >= 3 and info["directory"] == env["ARCSIM_CACHE_DIR"]
    assert run_cli("cache", "clear", env=env).returncode == 0
    assert json.loads(run_cli("cache", "info", "--json", "-", env=env).stdout)["entries"] == 0


def test_error_interval_over_steps_and_the_eligibility_it_cannot_settle():
    """Per-step errors 0.1, 0.2, 0.3: mean 0.2, 95 % half-width t(0.975, 2)·0.1/√3 = 0.2484; one step: none.
    A limit inside a candidate's interval is reported unsettled, one outside is not."""
    from arcsim.run.candidates import Candidate
    from arcsim.run.decisions import unsettled
    from arcsim.run.measurement import Measurement

    m = Measurement("topk", 0.01, "ef14", 10, err2=[[0.5, 0.5], [1.0, 1.0], [1.5, 1.5]], ref2=[[5, 5]] * 3)
    lo, hi = m.rel_error_interval()
    assert m.rel_error() == pytest.approx(0.2)
    assert (lo, hi) == (pytest.approx(0.0), pytest.approx(0.2 + 0.24841, abs=1e-4))  # clipped at zero
    assert Measurement("topk", 0.01, "ef14", 10, err2=[[1.0]], ref2=[[5.0]]).rel_error_interval() is None

    def cand(name, ci):
        c = Candidate(name, "ring", 0.01, "ef14", "allreduce", 1, 1, 0, 0, 0, 0.2, 0, 1, 0.01, 4)
        c.rel_error_ci = ci
        return c

    cands = [cand("star", (0.15, 0.25)), cand("var", (0.05, 0.12)), cand("randk", None), cand("arctopk", (0.1, 0.3))]
    assert unsettled(cands, 0.2) == ["arctopk", "star"]
    assert unsettled(cands, 0.5) == [] and unsettled(cands, None) == []


def test_a_lean_run_chooses_and_times_as_the_whole_run_without_crossover_or_tips():
    """A network schedule's phases run lean (arcsim.run.phases): the same candidates, times, intervals, verdicts and
    recommendation as the whole run; only the crossover and the too-close verdicts' tips are left out."""
    from arcsim.run.analysis import Analysis
    from arcsim.run.config import RunConfig

    cfg = RunConfig(compressors=("topk", "arctopk", "randk"), ratios=(0.001, 0.01, 0.1), bandwidth=25e9 / 8)
    whole = Analysis(cfg, announce=lambda _: None).run()
    lean = Analysis(cfg, announce=lambda _: None).run(lean=True)
    assert whole.crossover.bandwidth and not lean.crossover.bandwidth
    assert any(c.tips for c in whole.candidates) and not any(c.tips for c in lean.candidates)

    def seen(c):
        return c.compressor, c.collective, c.hierarchy, c.iteration_s, c.verdict, c.speedup_low, c.speedup_high

    assert [seen(c) for c in lean.candidates] == [seen(c) for c in whole.candidates]
    assert lean.recommendation == whole.recommendation
    assert lean.policy == whole.policy


@pytest.mark.parametrize(("args", "fragment"), [
    (("-c", "qsgd", "--option", "block"), "is not KEY=VALUE"),
    (("-c", "qsgd", "--option", "scope=bucket"), "give the scope with --scope"),
    (("-c", "topk", "--option", "levels=15"), "option 'levels' applies to qsgd"),
    (("-c", "qsgd", "--option", "block=-1"), "QSGD block must be a whole number"),
    (("-c", "qsgd", "--option", "levels=0"), "QSGD levels s must be"),
    (("-c", "qsgd", "--option", "block=abc"), "qsgd cannot take"),
    (("-c", "qsgd", "--option", "levels=inf"), "must be a finite number"),
    (("-c", "powersgd", "--option", "rank=4"), "rank is not set by --option"),
    (("-c", "qsgd", "--option", "block=512", "--write-plan", "p.json"), "give it without --option"),
])
def test_a_bad_compressor_option_is_one_line_before_any_measuring(args, fragment, tmp_path):
    r = run_cli("run", *args, cwd=str(tmp_path))
    assert r.returncode == 2 and fragment in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert not (tmp_path / "p.json").exists()


def test_compressor_options_reach_the_compressor_and_its_price(tmp_path):
    """--option block=512 sends qsgd's norm per 512 elements: more bytes, a smaller error than one norm per bucket."""
    seen = {}
    for name, extra in (("plain", ()), ("blocks", ("--option", "block=512"))):
        out = tmp_path / f"{name}.json"
        r = run_cli("run", "-c", "qsgd", "--policy", "none", *extra, "--json", str(out))
        assert r.returncode == 0, r.stderr
        (c,) = [c for c in json.loads(out.read_text())["candidates"] if c["compressor"] == "qsgd"][:1]
        seen[name] = c
    assert seen["blocks"]["rel_error"] < seen["plain"]["rel_error"]
    assert seen["blocks"]["bytes_per_rank"] > seen["plain"]["bytes_per_rank"]



def test_densities_at_which_a_compressor_does_the_same_work_are_measured_once(tmp_path, monkeypatch):
    """PowerSGD's ranks round to 1 on the shipped CNN's matrices at 0.0001 and 0.0003: the second is the first's copy
    (Analysis._twin), and equals what measuring it would give; 0.3 is measured."""
    from arcsim.run.analysis import Analysis
    from arcsim.run.config import RunConfig

    def analysis(folder: str) -> Analysis:
        monkeypatch.setenv("ARCSIM_CACHE_DIR", str(tmp_path / folder))
        return Analysis(RunConfig(compressors=("dense", "powersgd"), density=0.3, ratios=(0.0001, 0.0003, 0.3),
                                  policy="none"),
                        announce=lambda _: None)

    a = analysis("twins")
    measured: list[float] = []
    real = a._measure_key
    monkeypatch.setattr(a, "_measure_key", lambda key: measured.append(key[1]) or real(key))
    low, same, high = (a.measurement("powersgd", r, grid=True) for r in (0.0001, 0.0003, 0.3))
    assert a._twin(a._key("powersgd", 0.0003, True)) == a._key("powersgd", 0.0001, True)
    assert measured == [0.0001, 0.3] and same.density == 0.0003
    assert (same.err2, same.records) == (low.err2, low.records) and high.err2 != low.err2
    b = analysis("alone")
    monkeypatch.setattr(b, "_twin", lambda key: None)
    alone = b.measurement("powersgd", 0.0003, grid=True)
    assert (alone.err2, alone.ref2, alone.records, alone.selected) == \
        (same.err2, same.ref2, same.records, same.selected)

"""`arcsim run`'s speed-up intervals (arcsim/run/doubt.py): from the benchmarks' held-out errors, a verdict, and the
settings that would make a too-close verdict clear."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from conftest import benchmark, run_cli

from arcsim.collectives.libraries.nccl import NET_STEP_US
from arcsim.run import doubt
from arcsim.run.analysis import Analysis
from arcsim.run.config import RunConfig

VERDICTS = {"faster", "slower", "too close to call", "baseline"}
FAST = ("-c", "dense,fp16,topk,arctopk", "--ratios", "0.003,0.01,0.1", "--policy", "none")


def test_a_verdict_is_clear_only_where_the_interval_leaves_1():
    assert doubt.doubt(1.3, 0.1).verdict == "faster" and doubt.doubt(0.8, 0.1).verdict == "slower"
    near = doubt.doubt(1.05, 0.1)
    assert near.verdict == "too close to call" and near.low < 1 < near.high
    assert near.low == pytest.approx(1.05 * math.exp(-0.1)) and near.high == pytest.approx(1.05 * math.exp(0.1))


@pytest.fixture(scope="module")
def slow_network():
    """The shipped trace on 8x8-ib100 at 2 Gbit/s per NIC: communication is most of an iteration."""
    cfg = RunConfig(compressors=("dense", "fp16", "topk"), ratios=(0.01,), policy="none", bandwidth=2e9 / 8)
    analysis = Analysis(cfg, announce=lambda _: None)
    return analysis, analysis.run()


def test_the_interval_widens_with_the_size_bands_error(slow_network):
    """fp16's all-reduce lies in one size band: doubling that band's held-out error widens fp16's interval, and
    with no collective error (and no framework floor) only compute's and compression's are left."""
    analysis, result = slow_network
    fp16 = min((c for c in result.candidates if c.compressor == "fp16"), key=lambda c: c.iteration_s)
    errors = doubt.errors_for(analysis.topo, "ddp", 0.2, analysis.ctx.gpu)
    no_floor = dataclasses.replace(errors, framework=0.0)

    def width(e: doubt.Errors) -> float:
        d = doubt.Judge(e, analysis.ctx, analysis.pricer, result.dense, []).doubt(fp16)
        assert d is not None and d.low < d.speedup < d.high
        return math.log(d.high / d.low)

    band = doubt.band_seconds(fp16.measurement, fp16.collective, analysis.ctx, analysis.pricer, errors).sum(0).argmax()
    doubled = dataclasses.replace(no_floor, bands=tuple(dataclasses.replace(b, mape=2 * b.mape) if i == band else b
                                                        for i, b in enumerate(errors.bands)))
    silent = dataclasses.replace(no_floor, bands=tuple(dataclasses.replace(b, mape=0.0) for b in errors.bands))
    assert width(doubled) > width(no_floor) > width(silent) > 0
    # the framework's end-to-end error, over the two times' open shares, is a floor, not a further term
    end_to_end = errors.framework * math.hypot(doubt.open_share(result.dense), doubt.open_share(fp16))
    assert width(errors) == pytest.approx(2 * doubt.Z * max(width(no_floor) / (2 * doubt.Z), end_to_end))


def test_json_has_the_interval_verdict_and_tips(tmp_path):
    out = tmp_path / "r.json"
    r = run_cli("run", *FAST, "--json", str(out))
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    for c in [res["recommendation"], res["dense"], *res["candidates"]]:
        assert {"speedup_low", "speedup_high", "verdict", "tips"} <= set(c), c
        assert c["verdict"] in VERDICTS
        assert c["speedup_low"] <= c["speedup_vs_dense"] <= c["speedup_high"]
        assert (c["verdict"] == "too close to call") == (c["speedup_low"] <= 1 <= c["speedup_high"]
                                                          and c["verdict"] != "baseline")
        assert bool(c["tips"]) <= (c["verdict"] == "too close to call")
        for tip in c["tips"]:
            assert {"axis", "value", "now", "side", "verdict", "speedup", "speedup_low", "speedup_high",
                    "text"} <= set(tip)
    assert res["dense"]["verdict"] == "baseline" and res["dense"]["speedup_low"] == 1.0
    assert res["speedup_errors"]["level"] == "68 %" and "held-out" in res["speedup_errors"]["basis"]


def test_a_too_close_candidate_names_a_tip_that_applied_gives_a_clear_verdict(tmp_path):
    """On the shipped trace fp16 is ~1.02× dense: too close to call. Its bandwidth tip, applied (a run at that
    bandwidth, 2 % further on the tip's side), gives the tip's verdict."""
    out = tmp_path / "r.json"
    r = run_cli("run", *FAST, "--json", str(out), env={"COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    fp16 = next(c for c in res["candidates"] if c["compressor"] == "fp16" and c["verdict"] == "too close to call")
    tip = next(t for t in fp16["tips"] if t["axis"] == "bandwidth")
    assert tip["verdict"] in {"faster", "slower"} and tip["text"].startswith(f"clearly {tip['verdict']} at bandwidth")
    further = {"at_most": 0.98, "at_least": 1.02, "at": 1.0}[tip["side"]]
    again = tmp_path / "again.json"
    r = run_cli("run", *FAST, "--engine", "analytic", "--bandwidth", f"{tip['value'] * further * 8:.6g}bit",
                "--json", str(again))
    assert r.returncode == 0, r.stderr
    there = next(c for c in json.loads(again.read_text())["candidates"]
                 if (c["compressor"], c["collective"]) == ("fp16", tip["collective"]))
    assert there["verdict"] == tip["verdict"]
    rec = res["recommendation"]
    if rec["verdict"] == "too close to call":  # the human output says what would tip the recommendation
        shown = run_cli("run", *FAST, env={"COLUMNS": "200"})
        assert "what would make it clear:" in shown.stdout and rec["tips"][0]["text"] in shown.stdout


def test_the_errors_file_is_what_the_benchmarks_compute(published_collectives):
    """The collectives' section is benchmarks/published_collectives.py's held-out MAPE per transport and band (run
    again here), the frameworks' section published_e2e.py's summary of the speed-ups it priced."""
    table = doubt.load_table()
    pub = benchmark("published_collectives")
    fresh = pub.errors_section(published_collectives["report"])  # pub.report(show_rows=False), once a session
    stored = table["collectives"]
    assert stored["bands"] == fresh["bands"]
    assert stored["transports"].keys() == fresh["transports"].keys()
    for name, pool in fresh["transports"].items():
        assert stored["transports"][name]["kinds"] == pool["kinds"]
        for band, fig in pool["bands"].items():
            assert stored["transports"][name]["bands"][band]["rows"] == fig["rows"]
            assert stored["transports"][name]["bands"][band]["held_out_mape"] == pytest.approx(fig["held_out_mape"],
                                                                                              abs=0.01)
    assert set(NET_STEP_US) == set(stored["transports"]["all"]["kinds"])  # every transport has its figures
    e2e = benchmark("published_e2e")
    for name, fw in table["frameworks"]["frameworks"].items():
        pairs = [(name, p["source"], p["measured"], p["predicted"]) for p in fw["pairs"]]
        again = e2e.framework_errors(pairs)[name]
        for key in ("rows", "verdict_agrees", "median_abs_speedup_error", "median_abs_log_error"):
            assert fw[key] == pytest.approx(again[key], abs=1e-3), key

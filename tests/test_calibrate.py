"""Calibration: the fit, the topology it writes, pricing with measured collectives, and the command."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from conftest import run_cli

from arcsim.errors import ArcsimError, TopologyError
from arcsim.pricing import Pricer
from arcsim.testbed.calibrate import Fit, best_fit, fit_burst, fit_line, fits_from, monotone, topology_text
from arcsim.topology import Calibrated, load_topology


def test_fit_recovers_a_known_line():
    alpha, bandwidth = 250e-6, 12.5e6
    points = [(n, alpha + n / bandwidth) for n in (4e3, 6.4e4, 1e6, 4e6)]
    fit = fit_line(points, "allreduce")
    assert fit.latency == pytest.approx(alpha, rel=1e-9) and fit.bandwidth == pytest.approx(bandwidth, rel=1e-9)
    assert fit.r2 == pytest.approx(1.0) and fit.worst_rel_residual < 1e-9


def test_fit_keeps_latency_non_negative_and_refuses_one_size():
    fit = fit_line([(1e3, 1e-5), (1e6, 2e-2), (4e6, 7.9e-2)], "allgather")  # the free fit's α would be < 0
    assert fit.latency == 0.0 and fit.bandwidth > 0
    with pytest.raises(ArcsimError, match="two different sizes"):
        fit_line([(1e3, 1e-3), (1e3, 2e-3)], "broadcast")


def test_small_messages_get_their_own_band_and_are_priced_by_it(tmp_path):
    """Small collectives at twice the large messages' line: one line misses them by ~2×, two bands do not."""
    alpha, bandwidth = 200e-6, 12.5e6
    sizes = [1024 * 4**i for i in range(7)]  # 1 KiB … 4 MiB, the default grid
    measured = {"median_s": {op: {str(n): (alpha + n / bandwidth) * (2.0 if n <= 65536 else 1.0) for n in sizes}
                             for op in ("allreduce", "allgather", "broadcast")}}
    fits = fits_from(measured, 2)
    ar = fits["allreduce"]
    assert ar.small is not None and ar.bandwidth == pytest.approx(bandwidth, rel=1e-6)
    single = fit_line(ar.points, "allreduce")
    assert single.worst_rel_residual > 0.25  # what one line does to this regime
    path = tmp_path / "banded.yaml"
    path.write_text(topology_text("banded", 2, fits, "test"))
    topo = load_topology(str(path))
    cal = topo.calibration["allreduce"]
    assert cal.library == "gloo" and cal.small is not None
    for n in sizes:
        truth = (alpha + n / bandwidth) * (2.0 if n <= 65536 else 1.0)
        assert Pricer(topo).price("allreduce", n).time_s == pytest.approx(truth, rel=0.02), n
    slow = topo.with_overrides(bandwidth=topo.network.bandwidth_per_nic / 2).calibration["allreduce"]
    assert slow.small.bandwidth == pytest.approx(cal.small.bandwidth / 2)  # both bands follow an override
    assert any("off the fitted line" in w for w in single.warnings())


def test_written_topology_loads_and_measured_collectives_price_by_their_fit(tmp_path):
    measured = {"median_s": {"allreduce": {"1000": 1e-3 + 1e3 / 1e7, "100000": 1e-3 + 1e5 / 1e7},
                             "allgather": {"1000": 2e-3 + 4e3 / 5e6, "100000": 2e-3 + 4e5 / 5e6},
                             "broadcast": {"1000": 5e-4 + 1e3 / 2e7, "100000": 5e-4 + 1e5 / 2e7}}}
    fits = fits_from(measured, 4)
    assert isinstance(fits["allgather"], Fit) and fits["allgather"].bandwidth == pytest.approx(5e6)
    path = tmp_path / "cal4.yaml"
    path.write_text(topology_text("cal4", 4, fits, "test"))
    topo = load_topology(str(path))
    assert topo.ranks == 4 and set(topo.calibration) == {"allreduce", "allgather", "broadcast"}
    assert topo.network.bandwidth_per_nic == pytest.approx(2 * 3 / 4 * 1e7, rel=1e-5)  # ring: 2(p−1)/p · n / B
    priced = Pricer(topo).price("allgather", 1e5, "ring")
    assert priced.algo == "measured" and priced.time_s == pytest.approx(2e-3 + 4e5 / 5e6, rel=1e-5)


def test_measured_points_price_between_them_and_the_lines_carry_on_beyond():
    """Priced at a measured size: its time; between two: straight from one to the other in the model's time;
    beyond: the line scaled to meet the last point (continuous); monotone throughout; a faster network moves
    every point."""
    cal = Calibrated(1e-4, 1e8, measured=((1e3, 3e-4), (4e3, 6e-4), (1.6e4, 6e-4), (6.4e4, 1.2e-3)))
    assert [cal.time(n) for n, _ in cal.measured] == pytest.approx([t for _, t in cal.measured])
    assert cal.time(2e3) == pytest.approx(3e-4 + 3e-4 / 3)  # the line's time is a third of the way at 2 kB
    assert cal.time(1e7) == pytest.approx(1.2e-3 * cal.line(1e7) / cal.line(6.4e4))
    assert cal.time(10.0) == pytest.approx(3e-4 * cal.line(10.0) / cal.line(1e3))
    sizes = np.geomspace(10, 1e8, 400)
    assert (np.diff([cal.time(n) for n in sizes]) >= -1e-15).all()
    fast = cal.scaled(bandwidth=2.0)
    for n, t in cal.measured:
        assert fast.time(n) == pytest.approx(t * (1e-4 + n / 2e8) / (1e-4 + n / 1e8))


def test_calibrate_keeps_its_points_monotone_and_checks_sizes_it_did_not_measure(tmp_path):
    """A noisy dip is pooled with the size before it; each interior size priced from its neighbours is the
    held-out check: within 10 % on a smooth curve, and a warning where a step between sizes is missed."""
    smooth = [(n, 2e-4 + n / 1e8) for n in (1e3, 4e3, 1.6e4, 6.4e4, 2.56e5, 1.024e6)]
    fit = fit_line(smooth, "allreduce")
    assert fit.held_out_error() < 0.10 and not fit.warnings()
    np.testing.assert_allclose(monotone([(1e3, 2e-4), (4e3, 1.8e-4), (1.6e4, 3e-4)]),
                               [(1e3, 1.9e-4), (4e3, 1.9e-4), (1.6e4, 3e-4)])  # a dip pooled with the size before
    stepped = fit_line([(n, t * (3 if n == 6.4e4 else 1)) for n, t in smooth], "allgather")
    assert stepped.held_out_error() > 0.10
    assert any("priced from its neighbours" in w for w in stepped.warnings())
    path = tmp_path / "pts.yaml"
    path.write_text(topology_text("pts", 2, {"allreduce": fit}, "test"))
    topo = load_topology(str(path))
    np.testing.assert_allclose(topo.calibration["allreduce"].measured, smooth, rtol=1e-5)
    assert Pricer(topo).price("allreduce", 3e4).time_s == pytest.approx(topo.calibration["allreduce"].time(3e4))
    bad = path.read_text().replace("measured: [[1000,", "measured: [[99000000,")
    path.write_text(bad)
    with pytest.raises(TopologyError, match="increasing order"):
        load_topology(str(path))


def test_a_token_bucket_burst_is_found_between_measured_sizes_and_prices_the_sizes_held_out():
    """tbf at 100 Mbit/s with a 12.5 kB burst: flat to the burst, then the rate. Fitted on 1, 4, 16, 64 and
    256 kB, the knee is placed between 4 and 16 kB, and 8 and 32 kB (not measured) are priced within 10 %."""
    def truth(n: float) -> float:
        return 5e-4 + max(0.0, n - 12_500) / 12.5e6

    fit = best_fit([(n, truth(n)) for n in (1e3, 4e3, 1.6e4, 6.4e4, 2.56e5)], "broadcast")
    assert fit.burst and 4e3 < fit.burst < 1.6e4
    cal = fit.calibrated(2)
    for n in (8e3, 3.2e4, 1.28e5):
        assert cal.time(n) == pytest.approx(truth(n), rel=0.10), n
    assert fit_burst([(1e3, 1e-3), (2e3, 1.1e-3)], "allreduce") is None  # too few sizes to place a knee


def test_groups_are_measured_fitted_and_priced_by_their_own_fits(tmp_path, quiet_cores):
    """--ranks-per-node 2: the node's reduce-scatter and all-gather and the rails' collectives are measured
    (each group of a kind at once), written under calibration_groups and price their group's records; the
    NIC is derived from the rails' all-reduce (G rails share it) and the link in a node from its all-gather."""
    out = tmp_path / "loop22.yaml"
    r = run_cli("calibrate", "--loopback", "--ranks", "4", "--ranks-per-node", "2", "--sizes", "256KB,2MB,8MB",
                "--repeats", "3", "--out", str(out), "--json", str(tmp_path / "c.json"))  # 2: failed once, busy
    assert r.returncode == 0, r.stderr
    assert "node reducescatter:" in r.stderr and "inter allreduce:" in r.stderr
    topo = load_topology(str(out))
    assert (topo.nodes, topo.gpus_per_node, topo.ranks) == (2, 2, 4)
    assert set(topo.group_calibration["node"]) == {"reducescatter", "allgather"}
    assert set(topo.group_calibration["inter"]) == {"allreduce", "allgather", "broadcast"}
    rail = topo.group_calibration["inter"]["allreduce"]
    assert rail.ranks == 2 and topo.calibration["allreduce"].ranks == 4
    assert topo.network.bandwidth_per_nic == pytest.approx(2 * 2 * (2 - 1) / 2 * rail.bandwidth, rel=1e-5)
    ag = topo.group_calibration["node"]["allgather"]
    assert topo.intra.bandwidth == pytest.approx(ag.bandwidth / 2, rel=1e-5)
    pricer = Pricer(topo)
    for group, op in (("node", "reducescatter"), ("inter", "allreduce"), ("inter", "allgather")):
        fit = topo.group_calibration[group][op]
        priced = pricer.group(group).price(op, 1e6)
        size = 1e6 * (2 if op == "allgather" else 1)  # an all-gather's size: its output over the group's 2 ranks
        assert priced.algo == "measured" and priced.time_s == pytest.approx(fit.time(size)), (group, op)
    assert set(json.loads((tmp_path / "c.json").read_text())["group_fits"]) == {"node", "inter"}


def test_a_group_without_fits_of_its_own_is_priced_by_its_links_not_the_worlds_fits(tmp_path):
    measured = {"median_s": {"allreduce": {"1000": 1e-3 + 1e3 / 1e7, "100000": 1e-3 + 1e5 / 1e7}}}
    path = tmp_path / "flat.yaml"
    path.write_text(topology_text("flat", 4, fits_from(measured, 4), "test"))
    topo = dataclasses.replace(load_topology(str(path)), nodes=2, gpus_per_node=2)
    assert Pricer(topo).price("allreduce", 1e5).algo == "measured"
    assert Pricer(topo).group("inter").price("allreduce", 1e5).algo != "measured"  # 4 ranks' fit is not a rail's


def test_loopback_calibration_feeds_arcsim_run(tmp_path, quiet_cores):
    out = tmp_path / "loop.yaml"
    r = run_cli("calibrate", "--loopback", "--ranks", "2", "--sizes", "64KB,2MB,16MB", "--repeats", "3",
                "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "allreduce:" in r.stderr and "R²" in r.stderr
    topo = load_topology(str(out))
    assert topo.ranks == 2 and all(c.bandwidth > 0 and c.ranks == 2 for c in topo.calibration.values())
    res_path = tmp_path / "run.json"
    r = run_cli("run", "-t", str(out), "-c", "dense,topk,arctopk", "--ratios", "0.01", "--json", str(res_path))
    assert r.returncode == 0, r.stderr
    res = json.loads(res_path.read_text())
    assert {c["collective"] for c in res["candidates"]} == {"measured"}
    assert res["dense"]["collective"] == "measured"


@pytest.mark.parametrize(("args", "fragment"), [
    (("--ranks", "2", "--out", "x.yaml"), "say where to measure"),
    (("--loopback", "--ranks", "2", "--out", "x.txt"), "ends in .yaml"),
    (("--loopback", "--ranks", "1", "--out", "x.yaml"), "--ranks must be at least 2"),
    (("--loopback", "--ranks", "2", "--sizes", "4KB", "--out", "x.yaml"), "at least two different sizes"),
    (("--cluster", "emulated", "--ranks", "2", "--out", "x.yaml"), "needs --bandwidth"),
])
def test_bad_calibration_requests(tmp_path, args, fragment):
    r = run_cli("calibrate", *args, cwd=str(tmp_path))
    assert r.returncode == 2 and fragment in r.stderr, r.stderr
    assert not list(tmp_path.iterdir())


def test_validation_summary_mape_and_ag_ar_agreement():
    from arcsim.testbed.validate import summary

    def row(name, coll, measured, predicted):
        return {"ranks": 2, "bandwidth": "1Gbit", "compressor": name, "collective": coll, "measured_s": measured,
                "predicted_s": predicted, "error": predicted / measured - 1}

    rows = [row("dense", "allreduce", 1.0, 1.1), row("topk", "allgather", 0.5, 0.45),
            row("arctopk", "allreduce", 0.8, 0.9)]
    s = summary(rows)
    assert s["mape"] == pytest.approx((0.1 + 0.1 + 0.125) / 3)
    (check,) = s["ag_ar"]
    assert check["measured_faster"] == "allgather" and check["predicted_faster"] == "allgather"
    assert check["agrees"] and check["counts"] and check["measured_gap"] == pytest.approx(0.375)

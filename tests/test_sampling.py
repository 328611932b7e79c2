"""Sampled measurements (arcsim.run.sampling): a stratified sample of buckets, the others estimated, and an
error interval that includes the sampling. The shipped CNN example has no two buckets alike, so these run
on a synthetic model of 16 equal layers (one bucket each), forced to sample by a low threshold."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli

from arcsim.compressors.layout import Layer
from arcsim.run import cache
from arcsim.run.analysis import Analysis
from arcsim.run.config import RunConfig
from arcsim.run.measure import measure
from arcsim.run.sampling import BucketSample
from arcsim.strategy.buckets import make_buckets

COMPRESSORS = ("topk", "randk", "gaussiank", "powersgd", "adaptive")


@pytest.fixture
def forced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARCSIM_SAMPLE_ELEMENTS", "1e5")


def config(exact: bool) -> RunConfig:
    return RunConfig(params=10**9, layers=16, compressors=COMPRESSORS, ratios=(0.01,), exact=exact)


@pytest.fixture(scope="module")
def runs() -> dict[bool, Analysis]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ARCSIM_SAMPLE_ELEMENTS", "1e5")
        out = {}
        for exact in (True, False):
            a = Analysis(config(exact), announce=lambda _: None)
            a.result = a.run()  # type: ignore[attr-defined]
            out[exact] = a
        return out


def test_plan_keeps_unique_buckets_and_samples_each_stratum_systematically():
    layers = [Layer("head", (7, 3), 0), *(Layer(f"l{i}", (4, 4), 21 + 16 * i) for i in range(12)),
              Layer("tail", (5,), 21 + 16 * 12)]
    buckets = make_buckets(layers, [0.0] * len(layers), 16 * 4)
    sample = BucketSample.plan(buckets)
    assert sample.strata == ((0,), tuple(range(1, 13)), (13,))
    assert sample.measured == (0, 3, 7, 11, 13)  # every 4th of the 12 alike buckets (3 = max(3, ⌈12 / 8⌉)), both odd
    assert not sample.whole
    assert BucketSample.plan(buckets[:4]).whole  # strata of one and three: nothing left to sample


def test_sampled_records_cover_every_bucket_as_the_exact_run_sends_them(runs):
    exact, sampled = runs[True], runs[False]
    buckets = sampled.ctx.buckets
    for name in ("topk", "randk", "powersgd"):  # fixed k: the same messages in every equal bucket
        s, e = sampled.measurement(name, 0.01), exact.measurement(name, 0.01)
        assert s.sample is not None and e.sample is None
        assert all(len(step) == len(buckets) for step in s.records)
        assert s.records == e.records
        for i in s.sample["measured"]:  # a measured bucket's numbers are the exact run's own
            assert s.err2_bucket(i) == e.err2_bucket(i) and s.ref2_bucket(i) == e.ref2_bucket(i)
    g = sampled.measurement("gaussiank", 0.01)  # a data-dependent k: every bucket sends, the mean size
    assert all(len(step) == len(buckets) and all(step) for step in g.records)


def test_sampled_interval_contains_the_exact_error(runs):
    for name in COMPRESSORS:
        s, e = runs[False].measurement(name, 0.01), runs[True].measurement(name, 0.01)
        lo, hi = s.rel_error_interval()
        assert lo <= e.rel_error() <= hi, name
        assert s.sampling_half_width() is not None and e.sampling_half_width() is None
        assert hi - s.rel_error() >= s.sampling_half_width() - 1e-15  # the sampling's and the steps' together
        #                                                           (above: below, the interval stops at 0)


def test_sampled_runs_say_so_and_keep_the_recommendation(runs):
    exact, sampled = runs[True].result, runs[False].result  # type: ignore[attr-defined]
    def answer(r):
        return r.compressor, r.collective, r.op, r.hierarchy, r.density

    def soonest_single(result):
        e = next(e for e in result.policy.estimates if e["excluded"] is None)
        return e["compressor"], e["collective"], e["op"], e["hierarchy"], e["density"]

    assert soonest_single(exact) == soonest_single(sampled) == answer(sampled.recommendation)
    # a per-bucket mix rests on each bucket's own numbers, which a sample estimates: here the exact run's mix of
    # Top-K and Gaussian-K (whose data-dependent k a sample sends at its mean size) is 6.1 % sooner, past the 5 %
    assert answer(exact.recommendation) == answer(sampled.recommendation) or exact.recommendation.is_mix
    assert any(n.startswith("SAMPLED: ") for n in sampled.assumptions)
    assert not any(n.startswith("SAMPLED") for n in exact.assumptions)


def test_exact_gives_the_unsampled_numbers(runs):
    a = runs[True]
    for name in ("topk", "gaussiank"):
        key = a._key(name, 0.01, False)
        assert a.sample_for(key) is None
        old = measure(a.steps(), a.ctx.buckets, name, 0.01, a._memory(name), a.cfg.seed, a.cfg.options,
                      timed=a.ctx.gpu is None, count=key[2])
        if a.params is not None:
            old.records = [[[a.params.scale_record(r) for r in recs] for recs in step] for step in old.records]
        got = a.measurement(name, 0.01)
        assert (got.err2, got.ref2, got.records, got.selected) == (old.err2, old.ref2, old.records, old.selected)


def test_cache_keys_tell_sampled_from_exact(runs, forced):
    key = runs[True]._key("topk", 0.01, False)
    exact, sampled = runs[True]._cache_name(key), runs[False]._cache_name(key)
    assert exact != sampled
    assert cache.held(exact) and cache.held(sampled)


def test_cli_exact_flag(tmp_path, forced):
    args = ["run", "--params", "1e9", "--layers", "16", "-c", "topk", "--ratios", "0.01", "--policy", "none"]
    run_cli(*args, "--json", str(tmp_path / "s.json"))
    run_cli(*args, "--exact", "--json", str(tmp_path / "e.json"))
    s, e = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("s", "e"))
    assert s["sampling"]["measured"] == [2, 8, 13] and s["sampling"]["elements_fraction"] == 3 / 16
    assert e["sampling"] is None and e["config"]["exact"] and not s["config"]["exact"]


def test_sampling_half_width_is_the_stratified_ratio_estimators():
    from scipy.stats import t as student_t

    from arcsim.run.measurement import Measurement

    e_m, r_m = [1.0, 2.0, 4.0], [10.0, 10.0, 20.0]  # buckets 0 (alone), 1 and 3 of the stratum 1–4 measured
    err2 = [[e_m[0], e_m[1], 3.0, e_m[2], 3.0]]      # 2 and 4: the measured mean of their stratum
    ref2 = [[r_m[0], r_m[1], 15.0, r_m[2], 15.0]]
    m = Measurement("topk", 0.01, "ef14", 5, err2=err2, ref2=ref2,
                    sample={"strata": [[0], [1, 2, 3, 4]], "measured": [0, 1, 3]})
    ratio = (1 + 4 * 3) / (10 + 4 * 15)
    assert m.rel_error() == pytest.approx(ratio)
    d = [2.0 - ratio * 10, 4.0 - ratio * 20]
    s2 = ((d[0] - d[1]) ** 2) / 2
    se = (16 * (1 - 2 / 4) * s2 / 2) ** 0.5 / 70
    assert m.sampling_half_width() == pytest.approx(student_t.ppf(0.975, 1) * se)
    lo, hi = m.rel_error_interval()  # one step: the sampling's interval alone
    assert hi - m.rel_error() == pytest.approx(m.sampling_half_width()) and lo >= 0.0
    whole = Measurement("topk", 0.01, "ef14", 5, err2=err2, ref2=ref2,
                        sample={"strata": [[0], [1, 2, 3, 4]], "measured": [0, 1, 2, 3, 4]})
    assert whole.sampling_half_width() is None and whole.rel_error_interval() is None

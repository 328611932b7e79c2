"""benchmarks/published_e2e.py: the published compressed-vs-dense rows and one row priced end to end."""

import math

import pytest
from conftest import benchmark

from arcsim.traces.resolve import DEFAULT_TRACE_NAME, shipped_traces_dir


def _script():
    return benchmark("published_e2e")


def test_every_row_is_priced_or_says_why_not():
    pub = _script()
    table = pub.rows()
    assert len(table) == 135
    for r in table:
        assert r["url"].startswith("https://") and r["where"], r
        if r["skip"]:
            continue
        assert r["arcsim_trace"] in pub.TRACES and r["stand_in"], r
        assert r["arcsim_compressor"] in {"randk", "topk", "dgc", "efsignsgd", "onebit"}, r
        assert r["arcsim_hierarchy"] in {"flat", "node"} and float(r["speedup"]) > 0
        assert pub.options_of(r).keys() <= pub.OPTIONS.keys()  # refuses an unknown key or value
        assert (r["arcsim_density"] == "") == (r["arcsim_compressor"] in {"efsignsgd", "onebit"}), r
    assert sum(not r["skip"] for r in table) == 60


def test_a_row_refuses_options_and_densities_it_cannot_have():
    pub = _script()
    row = next(r for r in pub.rows("DeepSpeed") if not r["skip"])
    assert pub.options_of(row) == {"baseline": "fp16", "scope": "bucket", "precision": "fp16", "bucket_mb": "25"}
    assert row["arcsim_framework"] == "deepspeed"
    for bad in ("baseline=fp8", "fusoin=model", "scope", "precision=fp8", "bucket_mb=0", "bucket_mb=x"):
        with pytest.raises(ValueError, match="arcsim_options"):
            pub.options_of({**row, "arcsim_options": bad})
    with pytest.raises(ValueError, match="does not depend on the density"):
        pub.density_of({**row, "arcsim_density": "0.01"}, [])


def test_one_row_priced_end_to_end_on_the_shipped_trace(tmp_path):
    """The BytePS top-k row's setup (4 × 8 V100, 25 Gb/s, batch 32, node-aware) on the shipped CNN trace (8
    workers): a finite speed-up and a verdict."""
    pub = _script()
    row = next(r for r in pub.rows("BytePS") if not r["skip"] and r["arcsim_compressor"] == "topk"
               and "eth25" in r["arcsim_topology"])
    (tmp_path / f"cnn_w{pub.WORKERS}s{pub.STEPS}.npz").symlink_to(shipped_traces_dir() / DEFAULT_TRACE_NAME)
    p = pub.price({**row, "arcsim_trace": "cnn", "arcsim_density": "0.01"}, tmp_path)
    assert math.isfinite(p.speedup) and p.speedup > 0 and p.dense_s > 0 and p.density == 0.01
    assert pub.verdict(p.speedup) in {"faster", "slower"}

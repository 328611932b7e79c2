"""benchmarks/published_e2e.py: the published compressed-vs-dense rows and one row priced end to end."""

import math
import time

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
        assert r["arcsim_compressor"] in {"randk", "topk", "powersgd"} and r["arcsim_hierarchy"] in {"flat", "node"}
        assert float(r["speedup"]) > 0
    assert sum(not r["skip"] for r in table) == 29


def test_one_row_priced_end_to_end_on_the_shipped_trace(tmp_path):
    """The BytePS top-k row's setup (4 × 8 V100, 25 Gb/s, batch 32, node-aware) on the shipped CNN trace (8
    workers): a finite speed-up and a verdict, in seconds."""
    pub = _script()
    row = next(r for r in pub.rows("BytePS") if not r["skip"] and r["arcsim_compressor"] == "topk"
               and "eth25" in r["arcsim_topology"])
    (tmp_path / f"cnn_w{pub.WORKERS}s{pub.STEPS}.npz").symlink_to(shipped_traces_dir() / DEFAULT_TRACE_NAME)
    started = time.perf_counter()
    p = pub.price({**row, "arcsim_trace": "cnn", "arcsim_density": "0.01"}, tmp_path)
    assert math.isfinite(p.speedup) and p.speedup > 0 and p.dense_s > 0 and p.density == 0.01
    assert pub.verdict(p.speedup) in {"faster", "slower"}
    assert time.perf_counter() - started < 20

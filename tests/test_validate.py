"""`arcsim validate` end to end on a small emulated cluster (skipped where namespaces are unavailable)."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import netns_available, run_cli

from arcsim.cluster import namespaces


@pytest.mark.skipif(not netns_available(), reason="needs root and network namespaces")
def test_validate_writes_a_consistent_report(tmp_path):
    r = run_cli("validate", "--ranks", "2", "--bandwidth", "200Mbit", "-c", "dense,topk,arctopk", "--steps", "6",
                "--out", str(tmp_path), timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "MAPE" in r.stdout
    rows = pd.read_csv(tmp_path / "validation.csv")
    assert list(rows["compressor"]) == ["dense", "topk", "arctopk"]
    assert {"measured_s", "predicted_s", "ranks", "bandwidth", "measured_p10_s", "measured_p90_s"} <= set(rows)
    assert (rows["measured_s"] > 0).all() and (rows["predicted_s"] > 0).all()
    assert (rows["measured_p10_s"] <= rows["measured_s"]).all() and (rows["measured_s"] <= rows["measured_p90_s"]).all()
    assert ((rows["predicted_s"] / rows["measured_s"] - 1 - rows["error"]).abs() < 1e-9).all()
    assert (tmp_path / "validation.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "validation" / "topo-2r-200Mbit.yaml").exists()
    assert namespaces() == []


@pytest.mark.parametrize(("args", "fragment"), [
    (("--ranks", "two"), "--ranks takes whole numbers"),
    (("-c", "zipk"), "unknown compressor zipk"),
    (("--model", "alexnet"), "unknown model 'alexnet'"),
    (("--density", "0"), "--density must lie in (0, 1]"),
])
def test_bad_validate_requests(args, fragment):
    r = run_cli("validate", *args)
    assert r.returncode == 2 and fragment in r.stderr, r.stderr

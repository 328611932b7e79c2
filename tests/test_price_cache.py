"""Prices kept on disk (arcsim.pricing.keep_prices): a process that prices a topology again reads what an earlier
one priced, the same to the bit; a damaged table or another code's is a miss."""

from __future__ import annotations

import gzip
import json

import pytest
from conftest import multi

from arcsim import files, pricing
from arcsim.pricing import Pricer


@pytest.fixture
def fresh(tmp_path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("ARCSIM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(pricing, "_PRICED", pricing.OrderedDict())
    monkeypatch.setattr(pricing, "_KEPT", {})
    monkeypatch.setattr(pricing, "_KEEPER", [pricing.os.getpid()])  # this process keeps (no exit hook added)
    return tmp_path


def prices(topo) -> list[pricing.PricedRecord]:
    p = Pricer(topo)
    return [p.price(op, size) for op in ("allreduce", "allgather") for size in (4.0, 1e6, 3e8)]


def test_a_later_process_reads_the_prices_an_earlier_one_kept(fresh, monkeypatch):
    topo = multi(4, 8, 1, gbps=100.0)
    first = prices(topo)
    pricing.keep_prices()
    kept = [p for p in files.cache_entries() if p.name.startswith(pricing.PRICES_PREFIX)]
    assert len(kept) == 1
    Pricer(topo).price("allreduce", 1e6, tag="values")  # a tagged copy of a kept price: nothing new to write
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(files, "cache_write", lambda *a, **k: pytest.fail("written again with nothing new"))
        pricing.keep_prices()
    monkeypatch.setattr(pricing, "_PRICED", pricing.OrderedDict())  # as a new process starts
    monkeypatch.setattr(pricing, "price_collective", lambda *a, **k: pytest.fail("priced again"))
    assert prices(topo) == first
    other = multi(4, 8, 1, gbps=200.0)  # another topology is priced, not read
    with pytest.raises(pytest.fail.Exception):
        prices(other)


def test_a_damaged_table_or_another_codes_is_a_miss(fresh, monkeypatch):
    topo = multi(2, 8, 1)
    first = prices(topo)
    pricing.keep_prices()
    (path,) = [p for p in files.cache_entries() if p.name.startswith(pricing.PRICES_PREFIX)]
    entry = json.loads(gzip.decompress(path.read_bytes()))
    entry["value"]["prices"][0][6] = "not a time"
    path.write_bytes(gzip.compress(json.dumps(entry).encode()))
    monkeypatch.setattr(pricing, "_PRICED", pricing.OrderedDict())
    assert prices(topo) == first  # priced again from scratch
    monkeypatch.setattr(pricing, "_PRICED", pricing.OrderedDict())
    monkeypatch.setattr(pricing, "code_version", lambda: "other code")
    assert pricing._read_prices((repr(topo), "analytic")) == {}

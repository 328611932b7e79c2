"""The Communicator seam: in-process semantics, the CommLog, the hand-off to pricing, and the real thing."""

import json
from pathlib import Path

import pytest
import torch
from conftest import spawn_ranks

from arcsim.comm.inprocess import InProcessComm
from arcsim.compressors.memory import MEMORIES
from arcsim.compressors.registry import NAMES, make_compressor
from arcsim.pricing import price_collective, price_records
from arcsim.topology import load_topology

HERE = Path(__file__).resolve().parent


def test_in_process_collectives_and_log():
    comm = InProcessComm(4)
    x = torch.arange(12, dtype=torch.float32).view(4, 3)
    assert torch.equal(comm.all_reduce(x, "sum", tag="a"), x.sum(0, keepdim=True))
    assert torch.allclose(comm.all_reduce(x, tag="b"), x.mean(0, keepdim=True))
    gathered = comm.all_gather(x.to(torch.int32), tag="c")
    assert gathered.shape == (1, 4, 3) and torch.equal(gathered[0], x.to(torch.int32))
    assert torch.equal(comm.broadcast(x, src=2, tag="d"), x[2:3])
    recs = comm.log.records
    assert [(r.op, r.tag) for r in recs] == [("allreduce", "a"), ("allreduce", "b"), ("allgather", "c"),
                                             ("broadcast", "d")]
    assert recs[0].bytes_per_rank == 12 and recs[2].dtype == "int32" and recs[2].total_bytes == 48
    with pytest.raises(ValueError, match="leading worker axis"):
        comm.all_reduce(torch.zeros(3, 3))


def test_a_commlog_prices_on_any_topology():
    comm = InProcessComm(8)
    d = 250_000
    make_compressor("dense").compress(torch.randn(8, d), comm, 0)
    x = torch.randn(8, d)
    make_compressor("topk", 0.01).compress(x, comm, 0)
    make_compressor("topk", 0.01, packed=False).compress(x, comm, 0)
    topo = load_topology("8x8-ib100").with_overrides(library="ideal")  # 64 ranks priced from 8 simulated workers
    dense, packed, values, indices = price_records(comm.log.records, topo, algorithms={"allreduce": "ring",
                                                                                        "allgather": "ring"})
    expect = price_collective(topo, "allreduce", "ring", 4 * d, ("analytic",))[0].time_s
    assert dense.time_s == pytest.approx(expect) and dense.bytes == 4 * d
    assert values.bytes == 4 * 2500 * 64 and indices.bytes == values.bytes  # total output over 64 ranks
    assert packed.tag == "values+indices" and packed.bytes == values.bytes + indices.bytes
    # one message instead of two: the same bytes, one latency term of the ring fewer
    ring_latency = 63 * topo.network.latency
    assert packed.time_s == pytest.approx(values.time_s + indices.time_s - ring_latency, rel=1e-3)
    auto = price_records(comm.log.records, topo)
    assert all(a.time_s <= p.time_s * (1 + 1e-12)
               for a, p in zip(auto, (dense, packed, values, indices), strict=True))


@pytest.mark.parametrize("world", [2, 4])
def test_torch_distributed_matches_in_process_for_every_compressor_and_memory(world, tmp_path):
    spawn_ranks(HERE / "_dist_check.py", world, tmp_path)
    for r in range(world):
        report = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert len(report) == len(NAMES) * len(MEMORIES)
        for combo, result in report.items():
            # fp16 and bf16 sum in 16 bits on the wire: gloo and the in-process mean round differently
            tolerance = 2e-3 if combo.startswith("fp16") else 1.6e-2 if combo.startswith("bf16") else 1e-6
            assert result["rel_diff"] <= tolerance, (combo, result)
            assert result["same_log"], combo

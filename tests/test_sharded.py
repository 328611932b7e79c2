"""Quantised reduce-scatters as compressors (arcsim/compressors/sharded.py): the Communicator's reduce_scatter and its
node and rail groups, the error against the reductions as sharding/quant.py computed them, the records for 2 nodes
× 2 GPUs, the same under real torch.distributed (gloo), and arcsim run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import run_cli, spawn_ranks

from arcsim.catalog import QUANT_BLOCK
from arcsim.comm.inprocess import InProcessComm
from arcsim.compressors import sharded
from arcsim.compressors.registry import make_compressor
from arcsim.compressors.sharded import SHARDED, Codec, blockwise, reduce_mean, reduction_errors, step_piece
from arcsim.strategy.schedule import ShardCollective

HERE = Path(__file__).resolve().parent


def _grads(p: int, d: int, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(p, d, generator=gen) * torch.logspace(-3, 1, d)  # scales spread across blocks


def _blockwise_before(x: torch.Tensor, block: int = 256, bits: int = 8) -> torch.Tensor:
    """sharding/quant.py's int8_blockwise as it was written before it moved to compressors/sharded.py."""
    top = 2 ** (bits - 1) - 1
    n = x.shape[-1]
    flat = torch.nn.functional.pad(x.float(), (0, (-n) % block)).reshape(*x.shape[:-1], -1, block)
    scale = flat.abs().amax(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny) / top
    return (torch.round(flat / scale).clamp(-top, top).to(torch.int8).float() * scale).reshape(*x.shape[:-1], -1)[
        ..., :n]


def _reference(grads: torch.Tensor, how: str, g: int) -> torch.Tensor:
    """sharding/quant.py's reduce_mean math before it ran these compressors; the ring re-derived hop by hop as a ring
    reduce-scatter runs it (chunk j from rank j+1 round to its owner j, who adds its own last, unquantised)."""
    p, n = grads.shape
    q = _blockwise_before
    if how == "bf16":
        return grads.to(torch.bfloat16).float().mean(0)
    if how == "int8":
        return q(grads).mean(0)
    if how in ("int8-hier", "int4-hier"):
        bits = 8 if how == "int8-hier" else 4
        nodes = q(grads, bits=bits).reshape(p // g, g, -1).sum(1)
        return q(nodes, bits=bits).sum(0) / p
    assert how == "int8-ring"
    unit = 256 * p
    xp = torch.nn.functional.pad(grads, (0, -n % unit)).reshape(p, p, -1)
    out = []
    for j in range(p):
        acc = q(xp[(j + 1) % p, j])
        for s in range(2, p):
            acc = q(acc + xp[(j + s) % p, j])
        out.append(acc + xp[j, j])
    return torch.cat(out)[:n] / p


@pytest.mark.parametrize(("p", "g", "d"), [(4, 2, 1000), (8, 4, 5000), (8, 2, 777), (6, 3, 3000), (2, 1, 513)])
def test_each_compressor_has_the_reductions_error(p: int, g: int, d: int) -> None:
    x = _grads(p, d)
    assert torch.equal(blockwise(x), _blockwise_before(x))
    assert torch.equal(blockwise(x, bits=4), _blockwise_before(x, bits=4))
    exact = x.mean(0)
    for cls in SHARDED:
        options = {"gpus_per_node": g} if cls.name.startswith("qgz") else {}
        agg = make_compressor(cls.name, **options).compress(x, InProcessComm(p), 0).aggregate[0]
        ref = _reference(x, cls.way, g)
        # bit for bit, but a mean of P > 4 rows, which torch's mean(0) and a sum / P may round apart
        assert torch.allclose(agg, ref, rtol=0, atol=1e-6 * float(ref.abs().max())), cls.name
        assert torch.equal(reduce_mean(x, cls.way, g), agg), cls.name  # the reductions' errors run these compressors
        err, err_ref = ((a - exact).pow(2).sum() / exact.pow(2).sum() for a in (agg, ref))
        assert float(err) == pytest.approx(float(err_ref), rel=1e-6)


def test_codecs_round_trip_as_the_blockwise_math() -> None:
    x = _grads(3, 1024)
    for bits, width in ((8, 1024 + 16), (4, 512 + 16)):
        c = Codec(bits)
        payload = c.encode(x)
        assert payload.dtype == torch.uint8 and payload.shape == (3, width)
        assert torch.equal(c.decode(payload), blockwise(x, bits=bits))
    assert torch.equal(Codec(16).roundtrip(x), x.to(torch.bfloat16).float())


def test_reduce_scatter_and_groups_in_process() -> None:
    comm = InProcessComm(4)
    x = torch.arange(4 * 4 * 3, dtype=torch.float32).view(4, 4, 3)  # [worker, chunk, c]
    out = comm.reduce_scatter(x, "sum", tag="v")
    assert torch.equal(out, x.sum(0))  # worker w: chunk w summed over the workers
    assert torch.allclose(comm.reduce_scatter(x, tag="m"), x.mean(0))
    node, inter = comm.subgroups(2)  # 2 nodes × 2: nodes {0, 1}, {2, 3}; rails {0, 2}, {1, 3}
    part = node.reduce_scatter(x.reshape(4, 2, 6), "sum", tag="n")
    assert torch.equal(part[0], x[0].reshape(2, 6)[0] + x[1].reshape(2, 6)[0])
    assert torch.equal(part[3], x[2].reshape(2, 6)[1] + x[3].reshape(2, 6)[1])
    rail = inter.all_gather(part, tag="r")
    assert rail.shape == (4, 2, 6) and torch.equal(rail[1], part[[1, 3]]) and torch.equal(rail[2], part[[0, 2]])
    recs = [(r.op, r.tag, r.group, r.elements, r.bytes_per_rank, r.total_bytes) for r in comm.log.records]
    assert recs == [("reducescatter", "v", "world", 12, 48, 48), ("reducescatter", "m", "world", 12, 48, 48),
                    ("reducescatter", "n", "node", 12, 48, 48), ("allgather", "r", "inter", 6, 24, 48)]
    with pytest.raises(ValueError, match="4 chunks"):
        comm.reduce_scatter(torch.zeros(4, 3, 2))


def test_records_for_two_nodes_of_two() -> None:
    """Ops, groups and bytes per rank on 2 nodes × 2 GPUs, as the sharding schedule sizes the same collectives."""
    d, n = 1000, 1024  # padded to whole blocks of 256 per rank
    int8 = n + 4 * n // 256
    expect = {
        "rs-bf16": [("reducescatter", "world", 2 * n), ("allgather", "world", 4 * n // 4)],
        "rs-int8": [("reducescatter", "world", int8), ("allgather", "world", 4 * n // 4)],
        "rs-int8-ring": [("reducescatter", "world", int8), ("allgather", "world", 4 * n // 4)],
        "qgz": [("reducescatter", "node", int8), ("reducescatter", "inter", int8 // 2),
                ("allgather", "world", 4 * n // 4)],
        "qgz4": [("reducescatter", "node", n // 2 + 16), ("reducescatter", "inter", (n // 2 + 16) // 2),
                 ("allgather", "world", 4 * n // 4)],
    }
    for cls in SHARDED:
        for gather in ("fp32", "quantised"):
            comm = InProcessComm(4)
            make_compressor(cls.name, gather=gather).compress(_grads(4, d), comm, 0)
            got = [(r.op, r.group, r.bytes_per_rank) for r in comm.log.records]
            want = list(expect[cls.name])
            if gather == "quantised":  # the reduced shard re-quantised in the compressor's format
                want[-1] = ("allgather", "world", cls.codec.encode(torch.zeros(1, n // 4)).numel() *
                            cls.codec.encode(torch.zeros(1, n // 4)).element_size())
            assert got == want, (cls.name, gather)
            assert comm.log.records[-1].total_bytes == 4 * comm.log.records[-1].bytes_per_rank
            assert all(r.total_bytes == r.bytes_per_rank for r in comm.log.records[:-1])
    # the pricer's sizes: what strategy/schedule.py gives qgZ's two reduce-scatters of the same vector
    comm = InProcessComm(4)
    make_compressor("qgz").compress(_grads(4, d), comm, 0)
    for rec, sc in zip(comm.log.records, (ShardCollective("reducescatter", "node", 2, "u", "backward", n, "int8", "g"),
                                          ShardCollective("reducescatter", "inter", 2, "u", "backward", n // 2, "int8",
                                                          "g")), strict=False):
        assert rec.bytes_per_rank == sc.bytes_per_rank and rec.group == sc.group


@pytest.mark.parametrize("world", [3, 4])
def test_torch_distributed_matches_in_process(world: int, tmp_path: Path) -> None:
    """reduce_scatter (plain, decoded, ring), the node and rail groups, and every compressor here both ways."""
    spawn_ranks(HERE / "_sharded_check.py", world, tmp_path)
    for r in range(world):
        report = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert len(report) == 4 + (2 if world % 2 == 0 else 0) + 2 * len(SHARDED)
        for name, res in report.items():
            assert res["same_log"], name
            if name.startswith("rs fp32"):  # gloo's own reduce-scatter sums in its order
                assert res["rel_diff"] <= 1e-6, (name, res)
            else:  # the payloads decoded and summed in rank order, as in-process: bit for bit
                assert res["equal"], (name, res)


def test_arcsim_run_measures_them_on_the_default_trace(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    r = run_cli("run", "-c", "dense,rs-int8,qgz,rs-int8-ring", "-t", "2x4-ib100", "--gpu", "h100", "--json", str(out))
    assert r.returncode == 0, r.stderr
    rows = {c["compressor"]: c for c in json.loads(out.read_text())["candidates"]}
    assert 0 < rows["rs-int8"]["rel_error"] < rows["qgz"]["rel_error"] < rows["rs-int8-ring"]["rel_error"] < 1e-3
    assert all(rows[c]["compress_s"] > 0 and rows[c]["bytes_per_rank"] < rows["dense"]["bytes_per_rank"]
               for c in ("rs-int8", "qgz", "rs-int8-ring"))


def test_a_step_measured_in_column_pieces_has_the_whole_steps_error():
    """LLaMA-1B's steps are measured in pieces of whole blocks per rank (memory O(workers × piece)): every
    blockwise way gives the whole step's error to float rounding; the int8 ring (whose hop order follows the
    block's owner) the same rounding in another order, so within a few per cent."""
    workers, gpus = 4, 2
    g = torch.Generator().manual_seed(3)
    grads = torch.randn(workers, 60 * 3 * QUANT_BLOCK * workers + 1000, generator=g)
    grads[:, :2000] *= 40  # blocks of very different scales, as layers have
    width = 3 * QUANT_BLOCK * workers
    pieces = [grads[:, lo:lo + width] for lo in range(0, grads.shape[1], width)]
    whole = {e.how: e.rel_error_mean for e in reduction_errors([grads], gpus)}
    pieced = {e.how: e.rel_error_mean for e in reduction_errors([iter(pieces)], gpus)}
    for way in ("bf16", "int8", "int8-hier", "int4-hier"):
        assert pieced[way] == pytest.approx(whole[way], rel=1e-5), way
    assert pieced["int8-ring"] == pytest.approx(whole["int8-ring"], rel=0.05)
    assert step_piece(workers) % (QUANT_BLOCK * workers) == 0


def test_a_sample_of_whole_units_is_reduced_as_the_whole_step():
    """sampled_pieces keeps whole units (a quantisation block on each rank): all of them give the whole step's
    error to float rounding; half of them, joined, columns of the step unit by unit and an error near the whole's."""
    workers, gpus, unit = 4, 2, QUANT_BLOCK * 4
    g = torch.Generator().manual_seed(5)
    grads = torch.randn(workers, 400 * unit, generator=g) * torch.rand(1, 400 * unit, generator=g) ** 4  # uneven
    whole = {e.how: e.rel_error_mean for e in reduction_errors([grads], gpus)}
    every = {e.how: e.rel_error_mean for e in reduction_errors(sharded.sampled_pieces([grads], workers, 1.0), gpus)}
    for way in ("bf16", "int8", "int8-hier", "int4-hier"):
        assert every[way] == pytest.approx(whole[way], rel=1e-5), way
    (step,) = sharded.sampled_pieces([grads], workers, 0.5, seed=1)
    (half,) = list(step)
    units = half.view(workers, -1, unit).transpose(0, 1)  # each kept unit, found whole in the step
    starts = [int((grads[0] == u[0, 0]).nonzero()[0]) for u in units]
    assert 150 < len(starts) < 250 and all(s % unit == 0 for s in starts)
    assert all(torch.equal(grads[:, s:s + unit], u) for s, u in zip(starts, units, strict=True))
    (floor,) = sharded.sampled_pieces([grads], workers, 1e-6, elements=grads.shape[1])  # many workers: few units
    assert 200 < sum(p.shape[1] for p in floor) // unit < 320  # at least MIN_SAMPLED_UNITS (256) in expectation
    sampled = {e.how: e.rel_error_mean for e in reduction_errors(sharded.sampled_pieces([grads], workers, 0.5), gpus)}
    for way in ("bf16", "int8", "int8-hier", "int4-hier"):
        assert sampled[way] == pytest.approx(whole[way], rel=0.25), way


def test_a_stored_trace_read_in_pieces_has_the_whole_steps_error(monkeypatch):
    """trace_pieces over the shipped trace, pieces made small (two blocks' worth per worker, so many pieces and a
    short last one), against its steps read whole: what `run --sharding` and `shard` measure on a large trace."""
    from arcsim.traces.format import open_trace
    from arcsim.traces.resolve import resolve_trace

    trace = open_trace(resolve_trace(None))
    monkeypatch.setattr(sharded, "STEP_PIECE_ELEMENTS", 2 * QUANT_BLOCK * trace.workers)
    width = step_piece(trace.workers)
    assert width == 2 * QUANT_BLOCK * trace.workers and trace.elements > 3 * width and trace.elements % width
    gpus = trace.workers // 2
    whole = {e.how: e.rel_error_mean for e in reduction_errors((g for _, g in trace.steps_iter()), gpus)}
    pieced = {e.how: e.rel_error_mean for e in reduction_errors(sharded.trace_pieces(trace), gpus)}
    for way in ("bf16", "int8", "int8-hier", "int4-hier"):
        assert pieced[way] == pytest.approx(whole[way], rel=1e-5), way
    assert pieced["int8-ring"] == pytest.approx(whole["int8-ring"], rel=0.05)

"""Run in spawned gloo processes: reduce_scatter (plain, decoded, a re-encoding ring), the node and rail subgroups,
and the quantised reduce-scatter compressors through DistributedComm against InProcessComm."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from _rank_report import report_and_leave  # a sibling script: its folder is on the path

from arcsim.comm.distributed import DistributedComm
from arcsim.comm.inprocess import InProcessComm
from arcsim.compressors.registry import make_compressor
from arcsim.compressors.sharded import SHARDED, Codec

D = 2000


def _records(comm: DistributedComm | InProcessComm) -> list[list]:
    return [[r.op, r.tag, r.elements, r.dtype, r.bytes_per_rank, r.total_bytes, r.group] for r in comm.log.records]


def compare(rank: int, world: int, port: int, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(world, world, 512, generator=gen) * torch.logspace(-2, 1, 512)  # [worker, chunk, c]
    report: dict[str, dict] = {}

    def check(name: str, mine: torch.Tensor, ref: torch.Tensor, dc: DistributedComm, ic: InProcessComm) -> None:
        report[name] = {"equal": bool(torch.equal(mine, ref)),
                        "rel_diff": float((mine - ref).norm() / ref.norm().clamp_min(1e-30)),
                        "same_log": _records(dc) == _records(ic), "log": _records(dc)}

    int8 = Codec(8)
    for label, op, decode, encode, t in (
            ("rs fp32 mean", "mean", None, None, x), ("rs fp32 sum", "sum", None, None, x),
            ("rs int8 one hop", "mean", int8.decode, None, int8.encode(x)),
            ("rs int8 ring", "sum", int8.decode, int8.encode, x)):
        dc, ic = DistributedComm(), InProcessComm(world)
        check(label, dc.reduce_scatter(t[rank:rank + 1], op, "values", decode=decode, encode=encode)[0],
              ic.reduce_scatter(t, op, "values", decode=decode, encode=encode)[rank], dc, ic)
    if world % 2 == 0:
        g = 2
        dc, ic = DistributedComm(), InProcessComm(world)
        (dn, inn), (di, ini) = dc.subgroups(g), ic.subgroups(g)  # (node, inter) of each
        flat = x.reshape(world, -1)
        mine = dn.reduce_scatter(flat[rank:rank + 1].reshape(1, g, -1), "sum", "values")
        ref = di.reduce_scatter(flat.reshape(world, g, -1), "sum", "values")
        mine2 = inn.reduce_scatter(mine.reshape(1, world // g, -1), "sum", "values")
        ref2 = ini.reduce_scatter(ref.reshape(world, world // g, -1), "sum", "values")
        check("node then rail", torch.cat([mine[0], mine2[0]]), torch.cat([ref[rank], ref2[rank]]), dc, ic)
        check("rail all-gather", inn.all_gather(mine2, "shard")[0], ini.all_gather(ref2, "shard")[rank], dc, ic)
    flat = x.reshape(world, -1)[:, :D]
    for cls in SHARDED:
        for gather in ("fp32", "quantised"):
            dc, ic = DistributedComm(), InProcessComm(world)
            mine = make_compressor(cls.name, gather=gather).compress(flat[rank:rank + 1], dc, 0).aggregate
            ref = make_compressor(cls.name, gather=gather).compress(flat, ic, 0).aggregate
            check(f"{cls.name}/{gather}", mine, ref, dc, ic)
    report_and_leave(out_dir, rank, report)


if __name__ == "__main__":
    compare(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])

"""Run in spawned gloo processes: arcsim's hooks against PyTorch's own fp16 and PowerSGD hooks on the
same gradients (each rank writes what both produced; the test compares).

- fp16: every rank's gradient is 40,000 — a sum of two halves overflows fp16 (max 65,504), the mean
  does not. PyTorch's fp16_compress_hook divides before its all-reduce.
- PowerSGD: one bucket with matrices of several shapes (6×5 among them, which PyTorch sends dense at
  rank 4), no error feedback, no warm start. PyTorch draws its initial Q from
  np.random.RandomState(seed).randint → torch.manual_seed → torch.randn per matrix, matrices grouped
  by shape in first-seen order; the same Q is handed to arcsim's PowerSGD, so the two aggregates must
  agree to rounding.
"""

from __future__ import annotations

import sys
from collections import defaultdict

import numpy as np
import torch
import torch.distributed as dist
from _rank_report import report_and_leave  # a sibling script: its folder is on the path
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
from torch.nn.parallel import DistributedDataParallel as DDP

from arcsim.comm.inprocess import InProcessComm
from arcsim.compressors.layout import layout_of
from arcsim.compressors.registry import make_compressor
from arcsim.hooks import CompressionState, compression_hook

RANK_R = 4
PSGD_SEED = 7


def recorded(hook):
    """Wrap a hook so that each bucket's input and output are kept."""
    seen: list[tuple[torch.Tensor, torch.Tensor, list[tuple[int, ...]]]] = []

    def wrapper(state, bucket):
        inp = bucket.buffer().clone()
        shapes = [tuple(p.shape) for p in bucket.parameters()]
        fut = hook(state, bucket)

        def keep(f):
            out = f.value()
            out = out[0] if isinstance(out, list) else out
            seen.append((inp, out.clone(), shapes))
            return out
        return fut.then(keep)
    return wrapper, seen


def bf16_case(rank: int) -> dict:
    """Per-rank random gradients (so that the bf16 rounding and the division before the sum both matter)."""
    results = {}
    for label, hook, state in (("torch", default_hooks.bf16_compress_hook, None),
                               ("arcsim", compression_hook, CompressionState("bf16", memory="none"))):
        torch.manual_seed(0)
        net = nn.Linear(16, 8)
        ddp = DDP(net)
        wrapper, seen = recorded(hook)
        ddp.register_comm_hook(state, wrapper)
        x = torch.randn(4, 16, generator=torch.Generator().manual_seed(100 + rank))
        (ddp(x) ** 2).sum().backward()
        results[label] = {"in": seen[0][0].tolist(), "out": seen[0][1].tolist()}
    return results


def fp16_case(rank: int) -> dict:
    results = {}
    for label, hook, state in (("torch", default_hooks.fp16_compress_hook, None),
                               ("arcsim", compression_hook, CompressionState("fp16", memory="none"))):
        torch.manual_seed(0)
        net = nn.Linear(4, 3, bias=False)
        ddp = DDP(net)
        wrapper, seen = recorded(hook)
        ddp.register_comm_hook(state, wrapper)
        (ddp(torch.ones(1, 4)) * 40_000.0).sum().backward()  # every weight's gradient is 40,000 on every rank
        results[label] = {"in": seen[0][0].tolist(), "out": seen[0][1].tolist()}
    return results


class Shapes(nn.Module):
    """Parameters whose gradients are matrices of several shapes, in one DDP bucket."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(40, 24)   # 24×40: compressed at rank 4
        self.b = nn.Linear(24, 24)   # 24×24: compressed
        self.c = nn.Linear(24, 6)    # 6×24: (6+24)·4·2 = 240 > 144, sent dense
        self.d = nn.Linear(6, 5)     # 5×6: sent dense
        self.e = nn.Linear(5, 40)    # 40×5: sent dense

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.e(torch.tanh(self.d(torch.tanh(self.c(torch.tanh(self.b(torch.tanh(self.a(x)))))))))


def powersgd_case(rank: int, world: int) -> dict:
    torch.manual_seed(0)
    net = Shapes()
    ddp = DDP(net, bucket_cap_mb=100)
    state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=RANK_R, start_powerSGD_iter=1,
                               use_error_feedback=False, warm_start=False, random_seed=PSGD_SEED)
    wrapper, seen = recorded(psgd.powerSGD_hook)
    ddp.register_comm_hook(state, wrapper)
    gen = torch.Generator().manual_seed(1 + rank)
    for _ in range(2):  # iteration 0 is plain all-reduce (start_powerSGD_iter = 1), iteration 1 compresses
        ddp.zero_grad()
        x = torch.randn(8, 40, generator=gen)
        ddp(x).pow(2).mean().backward()
    inp, torch_out, shapes = seen[-1]
    everyone = [None] * world
    dist.all_gather_object(everyone, inp)
    stacked = torch.stack(everyone)

    # PyTorch's initial Q for the one PowerSGD step: its RNG's first draw seeds torch.randn
    matrices = [(s[0], int(np.prod(s[1:]))) if len(s) > 1 else (s[0], 1) for s in shapes]
    compressed = [(n, m) for n, m in matrices if (n + m) * min(n, m, RANK_R) * 2 < n * m]
    by_shape: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, nm in enumerate(compressed):
        by_shape[nm].append(i)
    seed = np.random.RandomState(PSGD_SEED).randint(1_000_000_000)
    qs: dict[int, torch.Tensor] = {}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for (n, m), members in by_shape.items():
            for i in members:
                qs[i] = torch.randn(1, m, min(n, m, RANK_R))[0]

    comp = make_compressor("powersgd", 0.5, rank=RANK_R)
    layout = layout_of(shapes)
    worth, _ = comp.split(layout, 0.5)
    offsets = {layer.offset: (layer.shape[0], layer.numel // layer.shape[0]) for layer in layout}
    order = [offsets[mat.offset] for mat in worth]
    for j, mat in enumerate(worth):
        assert order[j] == compressed[j], (order, compressed)
        comp._q[(mat.offset, mat.m, RANK_R)] = qs[j].clone()
    out = comp.compress(stacked, InProcessComm(world), 1, layout)
    arcsim_out = out.aggregate[0]
    sent_arcsim = int(out.selected[0])
    dense_numel = sum(n * m for n, m in matrices)
    sent_torch = sum((n + m) * min(n, m, RANK_R) for n, m in compressed) + dense_numel - sum(
        n * m for n, m in compressed)
    return {"torch": torch_out.tolist(), "arcsim": arcsim_out.tolist(), "sent_torch": sent_torch,
            "sent_arcsim": sent_arcsim, "compressed": len(compressed), "matrices": len(matrices)}


def main(rank: int, world: int, port: int, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    report = {"fp16": fp16_case(rank), "bf16": bf16_case(rank), "powersgd": powersgd_case(rank, world)}
    report_and_leave(out_dir, rank, report)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])

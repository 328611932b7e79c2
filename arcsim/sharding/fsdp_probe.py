"""Record the collectives real PyTorch FSDP2 (``fully_shard``) issues in one training step, on CPU with gloo:
the check that :func:`arcsim.strategy.schedule.fsdp_schedule` issues the same ones (tests/test_sharding.py).

Each rank wraps ``torch.distributed``'s collectives (FSDP2 calls ``dist.all_gather_single``,
``dist.reduce_scatter_single`` and, for HSDP, ``dist.all_reduce``) and rank 0 writes what the second step
issued — operation, size in nccl-tests terms (all-gather: output; reduce-scatter: input), dtype and group
size — in order."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

_OPS = {"all_gather_single": "allgather", "reduce_scatter_single": "reducescatter", "all_reduce": "allreduce",
        "all_gather_into_tensor": "allgather", "reduce_scatter_tensor": "reducescatter", "broadcast": "broadcast",
        "all_gather": "allgather_list", "reduce_scatter": "reducescatter_list"}


class Block(nn.Module):
    def __init__(self, dim: int, hidden: int, heads: int = 2) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.down(torch.relu(self.up(self.ln2(x))))


class TinyTransformer(nn.Module):
    """An embedding, numbered blocks, a final norm and an untied head: the root keeps the last three."""

    def __init__(self, vocab: int = 51, dim: int = 16, hidden: int = 37, layers: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, hidden) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def build(name: str) -> nn.Module:
    torch.manual_seed(0)
    if name == "mlp":
        return nn.Sequential(nn.Linear(10, 33), nn.ReLU(), nn.Linear(33, 17), nn.ReLU(), nn.Linear(17, 5))
    if name == "transformer":
        return TinyTransformer()
    raise ValueError(name)


def sample(name: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randn(4, 10, generator=g) if name == "mlp" else torch.randint(0, 51, (2, 7), generator=g)


def shard_modules(model: nn.Module) -> list[nn.Module]:
    """What gets its own ``fully_shard``: the blocks of a transformer, each Linear of the MLP."""
    if isinstance(model, TinyTransformer):
        return list(model.layers)
    return [m for m in model if isinstance(m, nn.Linear)]  # type: ignore[attr-defined]


def _record(log: list[dict[str, Any]]) -> dict[str, Any]:
    saved = {}
    for fn in _OPS:
        orig = getattr(dist, fn)
        saved[fn] = orig

        def wrap(*args: Any, _fn: str = fn, _orig: Any = orig, **kwargs: Any) -> Any:
            tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
            group = kwargs.get("group")
            t = tensors[0] if _fn != "reduce_scatter_single" and _fn != "reduce_scatter_tensor" else tensors[1]
            log.append({"op": _OPS[_fn], "bytes": t.numel() * t.element_size(),
                        "dtype": str(t.dtype).removeprefix("torch."), "ranks": dist.get_world_size(group)})
            return _orig(*args, **kwargs)

        setattr(dist, fn, wrap)
    return saved


def _worker(rank: int, world: int, store: str, configs: Sequence[dict[str, Any]], out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    results = []
    for cfg in configs:
        model = build(cfg["model"])
        kwargs: dict[str, Any] = {"reshard_after_forward": cfg["reshard"]} if "reshard" in cfg else {}
        if cfg.get("mesh"):
            kwargs["mesh"] = init_device_mesh("cpu", tuple(cfg["mesh"]), mesh_dim_names=("replicate", "shard"))
        if cfg.get("bf16"):
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for m in shard_modules(model):
            fully_shard(m, **kwargs)
        fully_shard(model, **kwargs)
        x = sample(cfg["model"])
        log: list[dict[str, Any]] = []
        for step in range(2):
            saved = _record(log) if step == 1 else {}
            model(x).float().pow(2).mean().backward()
            for fn, orig in saved.items():
                setattr(dist, fn, orig)
        results.append({**cfg, "shapes": [[n, list(p.shape)] for n, p in build(cfg["model"]).named_parameters()],
                        "collectives": log})
    if rank == 0:
        with open(out, "w") as fh:
            json.dump(results, fh)
    dist.destroy_process_group()


def probe(configs: Sequence[dict[str, Any]], world: int = 2) -> list[dict[str, Any]]:
    """Run each config (``model``: mlp or transformer; ``reshard``: bool or int, absent for FSDP2's default;
    ``mesh``: (replicas, shard) for HSDP; ``bf16``: bf16 parameters, fp32 reduction) for two steps on
    ``world`` gloo ranks and return the second step's collectives, as rank 0 saw them."""
    import torch.multiprocessing as mp

    from arcsim.processes import forkserver

    # ranks forked from a server that imported torch once (spawned, each spent 1.5 s of CPU importing it again)
    forkserver(["torch", "torch.distributed.fsdp", __name__])
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "collectives.json")
        mp.start_processes(_worker, args=(world, os.path.join(tmp, "store"), list(configs), out), nprocs=world,
                           join=True, start_method="forkserver")
        with open(out) as fh:
            return json.load(fh)  # type: ignore[no-any-return]

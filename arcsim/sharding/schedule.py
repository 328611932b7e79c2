"""The collectives one training step of FSDP2 (``fully_shard``) issues, in FSDP2's issue order.

Forward: the root's all-gather, then each unit's all-gather (FSDP2 issues unit i+1's while unit i computes:
prefetch one unit ahead). Backward, units in reverse: the unit's all-gather again (its parameters were freed
after forward, ``reshard_after_forward=True``; the root never frees its own), the next unit's all-gather
(backward prefetch), then the unit's reduce-scatter of its gradients; the root's reduce-scatter last, from
autograd's final callback. Hybrid sharding (HSDP) shards inside a node — all-gathers and reduce-scatters
among the node's GPUs — and after each reduce-scatter all-reduces the shard among the nodes (one rail per GPU).

Sizes follow nccl-tests: an all-gather's is its total output, a reduce-scatter's the full vector each rank
holds, an all-reduce's its vector. FSDP2 pads each parameter's dim 0 to a multiple of the shard count.
Quantised collectives (ZeRO++): weights all-gathered as fp16/bf16/int8 (qwZ), gradients reduce-scattered as
blockwise int8 with an in-node step first (qgZ): a reduce-scatter among the node's GPUs, then among the
nodes on the 1/G shard (or, hybrid, an all-reduce of it)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from arcsim.errors import ArcsimError
from arcsim.sharding.units import ShardUnit

STRATEGIES = ("none", "full", "hybrid")  # DDP; FSDP / ZeRO-3 (full sharding); HSDP (shard in node, replicate)
WEIGHT_DTYPES = ("none", "fp16", "bf16", "int8")
GRAD_DTYPES = ("none", "int8")
QUANT_BLOCK = 256  # elements per int8 block, one fp32 scale each (ZeRO++'s blockwise quantisation)
DTYPE_BYTES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "int8": 1.0 + 4.0 / QUANT_BLOCK}


@dataclass(frozen=True)
class Quantize:
    """What goes on the wire compressed: weights in all-gathers (qwZ), gradients in reduce-scatters (qgZ)."""

    weights: str = "none"
    grads: str = "none"

    @property
    def label(self) -> str:
        parts = ([f"qwZ {self.weights}"] if self.weights != "none" else []) + (
            [f"qgZ {self.grads}"] if self.grads != "none" else [])
        return " + ".join(parts) or "none"

    @property
    def active(self) -> bool:
        return self.weights != "none" or self.grads != "none"


QUANT_VARIANTS = {"none": Quantize(), "fp16": Quantize("fp16"), "bf16": Quantize("bf16"), "int8": Quantize("int8"),
                  "qgz": Quantize(grads="int8"), "zeropp": Quantize("int8", "int8")}


def quantize_variant(name: str) -> Quantize:
    try:
        return QUANT_VARIANTS[name]
    except KeyError:
        raise ArcsimError(f"unknown --quantize {name!r}; choose among {', '.join(QUANT_VARIANTS)} (fp16/bf16/int8: "
                          "weights' all-gathers; qgz: int8 gradients' reduce-scatters; zeropp: both int8)") from None


@dataclass(frozen=True)
class ShardCollective:
    op: str          # allgather, reducescatter, allreduce
    group: str       # world, node, inter (arcsim.comm.log.GROUPS)
    ranks: int       # the group's size
    unit: str
    phase: str       # forward, backward
    numel: int       # elements of the collective's size (all-gather: output; reduce-scatter: input)
    dtype: str       # on the wire
    what: str        # params or grads

    @property
    def nbytes(self) -> float:
        """The size in nccl-tests terms, with a quantised dtype's scales."""
        return self.numel * DTYPE_BYTES[self.dtype]

    @property
    def bytes_per_rank(self) -> float:
        """What arcsim.pricing.Pricer.price takes: an all-gather's input, any other op's full vector."""
        return self.nbytes / self.ranks if self.op == "allgather" else self.nbytes

    def to_dict(self) -> dict:
        return {**asdict(self), "bytes": self.nbytes}


def _wider(dtype: str, base: str) -> bool:
    return DTYPE_BYTES[dtype] >= DTYPE_BYTES[base]


def fsdp_schedule(units: Sequence[ShardUnit], root: ShardUnit, strategy: str, world: int, gpus_per_node: int,
                  param_dtype: str = "fp32", reduce_dtype: str = "fp32", reshard_after_forward: bool = True,
                  quantize: Quantize = Quantize()) -> list[ShardCollective]:
    """One step's collectives in issue order for ``full`` or ``hybrid`` sharding over ``world`` ranks."""
    if strategy not in ("full", "hybrid"):
        raise ArcsimError(f"fsdp_schedule prices full or hybrid sharding, not {strategy!r}")
    if world < 2:
        raise ArcsimError(f"sharding needs at least 2 ranks, got {world}")
    if world % gpus_per_node:
        raise ArcsimError(f"{world} ranks are no whole number of {gpus_per_node}-GPU nodes")
    nodes = world // gpus_per_node
    shard = world if strategy == "full" else gpus_per_node
    if shard < 2:
        raise ArcsimError("hybrid sharding with one GPU per node shards nothing: use none (DDP) or full")
    shard_group = "world" if strategy == "full" else "node"
    wdtype = param_dtype if quantize.weights == "none" or _wider(quantize.weights, param_dtype) else quantize.weights
    gdtype = reduce_dtype if quantize.grads == "none" or _wider(quantize.grads, reduce_dtype) else quantize.grads
    out: list[ShardCollective] = []

    def gather(u: ShardUnit, phase: str) -> None:
        if u.numel:
            out.append(ShardCollective("allgather", shard_group, shard, u.name, phase, u.padded_numel(shard), wdtype,
                                       "params"))

    def reduce(u: ShardUnit) -> None:
        if not u.numel:
            return
        n = u.padded_numel(shard)
        if gdtype != reduce_dtype and strategy == "full" and nodes > 1:  # qgZ: in the node first, then across
            out.append(ShardCollective("reducescatter", "node", gpus_per_node, u.name, "backward", n, gdtype, "grads"))
            out.append(ShardCollective("reducescatter", "inter", nodes, u.name, "backward", n // gpus_per_node,
                                       gdtype, "grads"))
            return
        out.append(ShardCollective("reducescatter", shard_group, shard, u.name, "backward", n, gdtype, "grads"))
        if strategy == "hybrid" and nodes > 1:
            out.append(ShardCollective("allreduce", "inter", nodes, u.name, "backward", n // shard, gdtype, "grads"))

    gather(root, "forward")
    for u in units:
        gather(u, "forward")
    backward = list(reversed(units))
    for k, u in enumerate(backward):
        if reshard_after_forward and k == 0:
            gather(u, "backward")
        if reshard_after_forward and k + 1 < len(backward):
            gather(backward[k + 1], "backward")  # prefetch the next unit in backward
        reduce(u)
    reduce(root)
    return out


def cross_node_bytes(c: ShardCollective, gpus_per_node: int, nodes: int) -> float:
    """Bytes one GPU sends to other nodes for ``c`` (ring algorithms, as NCCL runs all-gather and
    reduce-scatter): a world ring moves each node's 1/G share of the vector (n−1)/n of the way across nodes,
    a rail moves its GPU's vector so; an all-reduce twice."""
    if nodes < 2 or c.group == "node":
        return 0.0
    factor = 2.0 if c.op == "allreduce" else 1.0
    vector = c.nbytes / gpus_per_node if c.group == "world" else c.nbytes
    return factor * vector * (nodes - 1) / nodes

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

from arcsim.catalog import QUANT_BLOCK
from arcsim.errors import ArcsimError
from arcsim.strategy.units import ShardUnit

STRATEGIES = ("none", "full", "hybrid")  # DDP; FSDP / ZeRO-3 (full sharding); HSDP (shard in node, replicate)
WEIGHT_DTYPES = ("none", "fp16", "bf16", "int8")
GRAD_DTYPES = ("none", "int8", "int4")
DTYPE_BYTES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "int8": 1.0 + 4.0 / QUANT_BLOCK,
               "int4": 0.5 + 4.0 / QUANT_BLOCK}


def gathered_dtype(precision: str) -> str:
    """The dtype FSDP2 gathers parameters in under ``precision`` (MixedPrecisionPolicy's param_dtype): bf16 or fp16 as
    the step computes in, else fp32."""
    return precision if precision in ("bf16", "fp16") else "fp32"


@dataclass(frozen=True)
class Quantize:
    """ZeRO++'s three changes: weights all-gathered compressed (qwZ: fp16, bf16 or blockwise int8), gradients
    reduce-scattered as blockwise int8 or int4 with an in-node step first (qgZ), and parameters kept sharded
    inside the node after forward so that backward's all-gathers stay in the node (hpZ: FSDP2's
    ``reshard_after_forward=G``, at 1/G of the parameters more memory)."""

    weights: str = "none"
    grads: str = "none"
    hpz: bool = False

    @property
    def label(self) -> str:
        parts = ([f"qwZ {self.weights}"] if self.weights != "none" else []) + (["hpZ"] if self.hpz else []) + (
            [f"qgZ {self.grads}"] if self.grads != "none" else [])
        return " + ".join(parts) or "none"

    @property
    def active(self) -> bool:
        return self.weights != "none" or self.grads != "none" or self.hpz


_TOKENS: dict[str, dict[str, object]] = {
    "fp16": {"weights": "fp16"}, "bf16": {"weights": "bf16"}, "int8": {"weights": "int8"},
    "qgz": {"grads": "int8"}, "qgz4": {"grads": "int4"}, "hpz": {"hpz": True},
    "zeropp": {"weights": "int8", "hpz": True, "grads": "int4"}}
VARIANT_HELP = ("none; fp16, bf16 or int8 (weights' all-gathers, qwZ); qgz or qgz4 (gradients' reduce-scatters "
                "in int8 or int4, qgZ); hpz (backward's all-gathers inside the node); joined with +, e.g. "
                "int8+qgz; zeropp = int8+hpz+qgz4, ZeRO++ as published")


def quantize_variant(name: str) -> Quantize:
    """A variant by its tokens joined with ``+`` (``int8+qgz``, ``zeropp``), or ``none`` alone; each of weights,
    gradients and hpZ set by one token at most."""
    tokens = [t.strip() for t in name.strip().lower().split("+")]
    if tokens == ["none"]:
        return Quantize()
    if "none" in tokens:
        rest = "+".join(t for t in tokens if t != "none") or "none"
        raise ArcsimError(f"--quantize {name!r} joins none with a format; none stands alone (no quantisation): give "
                          f"none, or the formats without it, e.g. {rest}")
    fields: dict[str, object] = {}
    for token in tokens:
        if token not in _TOKENS:
            raise ArcsimError(f"unknown --quantize {token!r} in {name!r}; choose among {VARIANT_HELP}")
        for key, value in _TOKENS[token].items():
            if key in fields:
                raise ArcsimError(f"--quantize {name!r} sets {key} with two tokens (zeropp = int8+hpz+qgz4); give "
                                  "each once")
            fields[key] = value
    return Quantize(**fields)  # type: ignore[arg-type]


def check_fits(strategy: str, quantize: Quantize, gpus_per_node: int, nodes: int, where: str) -> None:
    """Refuse what nodes of one GPU cannot do: hybrid sharding (it shards inside the node) and hpZ (its secondary
    shard of the parameters lives inside the node); ``where`` names the cluster."""
    if gpus_per_node >= 2:
        return
    if strategy == "hybrid":
        raise ArcsimError(f"{where} has one GPU per node: hybrid sharding shards nothing there")
    if strategy == "full" and quantize.hpz and nodes > 1:
        raise ArcsimError(f"{where} has one GPU per node, and hpZ (asked for by --quantize: {quantize.label}) keeps "
                          "its secondary shard of the parameters inside a node, so it has nothing to shard: drop hpz "
                          "(zeropp without it is int8+qgz4) or give a topology with several GPUs per node")


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
                  param_dtype: str = "fp32", reduce_dtype: str = "fp32",
                  reshard_after_forward: bool | int | None = None,
                  quantize: Quantize = Quantize()) -> list[ShardCollective]:
    """One step's collectives in issue order for ``full`` or ``hybrid`` sharding over ``world`` ranks.

    ``reshard_after_forward`` as ``fully_shard`` takes it for every unit and the root: None (FSDP2's default)
    frees the units' parameters after forward but not the root's; True frees the root's too (gathered again
    first in backward); False frees none (no all-gathers in backward); an int G keeps them sharded over G
    ranks (the node) so that backward gathers among those — the same as hpZ (``quantize.hpz``, for the
    units)."""
    if strategy not in ("full", "hybrid"):
        raise ArcsimError(f"fsdp_schedule prices full or hybrid sharding, not {strategy!r}")
    if world < 2:
        raise ArcsimError(f"sharding needs at least 2 ranks, got {world}")
    if world % gpus_per_node:
        raise ArcsimError(f"{world} ranks are no whole number of {gpus_per_node}-GPU nodes")
    nodes = world // gpus_per_node
    check_fits(strategy, quantize, gpus_per_node, nodes, f"a cluster of {nodes} × {gpus_per_node} GPUs")
    shard = world if strategy == "full" else gpus_per_node
    shard_group = "world" if strategy == "full" else "node"
    wdtype = param_dtype if quantize.weights == "none" or _wider(quantize.weights, param_dtype) else quantize.weights
    gdtype = reduce_dtype if quantize.grads == "none" or _wider(quantize.grads, reduce_dtype) else quantize.grads
    unit_reshard: bool | int = True if reshard_after_forward is None else reshard_after_forward
    root_reshard: bool | int = False if reshard_after_forward is None else reshard_after_forward
    if quantize.hpz and strategy == "full" and nodes > 1:
        unit_reshard = gpus_per_node
    for r in (unit_reshard, root_reshard):
        if not isinstance(r, bool) and (r < 1 or shard % r):
            raise ArcsimError(f"reshard_after_forward={r} must divide the {shard} ranks a unit is sharded over")
    out: list[ShardCollective] = []

    def gather(u: ShardUnit, phase: str, reshard: bool | int = True) -> None:
        if not u.numel:
            return
        if phase == "backward" and not isinstance(reshard, bool) and reshard < shard:
            group = "node" if reshard == gpus_per_node else f"{reshard} ranks"
            out.append(ShardCollective("allgather", group, reshard, u.name, phase, u.padded_numel(shard), wdtype,
                                       "params"))
        else:
            out.append(ShardCollective("allgather", shard_group, shard, u.name, phase, u.padded_numel(shard), wdtype,
                                       "params"))

    def reduce(u: ShardUnit) -> None:
        if not u.numel:
            return
        n = u.padded_numel(shard)
        if gdtype != reduce_dtype and strategy == "full" and nodes > 1:  # qgZ: in the node first, then across
            if gpus_per_node > 1:  # a node of one GPU has nothing to reduce inside it
                out.append(ShardCollective("reducescatter", "node", gpus_per_node, u.name, "backward", n, gdtype,
                                           "grads"))
            out.append(ShardCollective("reducescatter", "inter", nodes, u.name, "backward", n // gpus_per_node,
                                       gdtype, "grads"))
            return
        out.append(ShardCollective("reducescatter", shard_group, shard, u.name, "backward", n, gdtype, "grads"))
        if strategy == "hybrid" and nodes > 1:
            out.append(ShardCollective("allreduce", "inter", nodes, u.name, "backward", n // shard, gdtype, "grads"))

    gather(root, "forward")
    for u in units:
        gather(u, "forward")
    # backward: the root's pre-backward hook fires first, then each unit's in reverse; each gathers itself
    # unless prefetched, and prefetches the next one in backward
    hooks = [(root, root_reshard)] + [(u, unit_reshard) for u in reversed(units)]
    gathered: set[str] = set()

    def need(i: int) -> None:
        u, reshard = hooks[i]
        if reshard is not False and u.name not in gathered:
            gathered.add(u.name)
            gather(u, "backward", reshard)

    for i, (u, _) in enumerate(hooks):
        need(i)
        if i + 1 < len(hooks):
            need(i + 1)
        if u is not root:
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

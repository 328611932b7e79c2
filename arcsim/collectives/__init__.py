"""The catalogue: one step description per (operation, algorithm).

Sizes follow cost-models.md: for all-reduce, reduce-scatter and broadcast ``nbytes`` is the vector each
rank holds; for all-gather it is the TOTAL gathered output. Ranks are numbered node by node.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from arcsim.collectives import limits, recursive, ring, tree
from arcsim.collectives.schedule import Schedule, Step, concat, make_step
from arcsim.errors import CollectiveError
from arcsim.topology import Topology

__all__ = ["ALGORITHMS", "OPS", "Schedule", "Step", "build", "busbw_factor", "make_step", "normalize_op"]


def _groups(topo: Topology) -> tuple[np.ndarray, np.ndarray]:
    """(ranks of each node, one row per node; ranks of each rail, one row per GPU index)."""
    per_node = np.arange(topo.ranks).reshape(topo.nodes, topo.gpus_per_node)
    return per_node, per_node.T.copy()


def _flat(topo: Topology) -> np.ndarray:
    return np.arange(topo.ranks).reshape(1, -1)


def _slowest_link(topo: Topology) -> tuple[float, float]:
    """(α, β) of the slowest link a message may cross, used to choose pipeline chunk counts."""
    if topo.nodes > 1:
        return topo.network.latency, 1.0 / topo.network.bandwidth_per_nic
    return topo.intra.latency, 1.0 / topo.intra.bandwidth


def _tree_all_reduce(topo: Topology, n: float) -> tuple[list[Step], str]:
    p = topo.ranks
    alpha, beta = _slowest_link(topo)
    depth = int(np.ceil(np.log2(p + 1)))
    chunks = tree.best_chunks(depth, n, alpha, beta)
    return tree.double_binary_tree_all_reduce(p, n, chunks), f"{chunks} chunks per tree"


def _chain_broadcast(topo: Topology, n: float) -> tuple[list[Step], str]:
    alpha, beta = _slowest_link(topo)
    chunks = tree.best_chunks(topo.ranks - 2, n, alpha, beta)
    return tree.chain_broadcast(topo.ranks, n, chunks), f"{chunks} chunks"


def _hierarchical_all_reduce(topo: Topology, n: float) -> tuple[Step, ...]:
    """Reduce-scatter inside each node, ring all-reduce of n/g across nodes per rail, all-gather inside."""
    per_node, rails = _groups(topo)
    g = topo.gpus_per_node
    return concat(ring.reduce_scatter(per_node, n), ring.all_reduce(rails, n / g), ring.all_gather(per_node, n))


def _hierarchical_all_gather(topo: Topology, total: float) -> tuple[Step, ...]:
    """All-gather across nodes per rail (each rail ends with total/g), then inside each node."""
    per_node, rails = _groups(topo)
    return concat(ring.all_gather(rails, total / topo.gpus_per_node), ring.all_gather(per_node, total))


Built = tuple["list[Step] | tuple[Step, ...]", str]  # the steps, and a note such as the chunk count chosen
Builder = Callable[[Topology, float], Built]


def _plain(fn: Callable[[Topology, float], list[Step] | tuple[Step, ...]]) -> Builder:
    return lambda t, n: (fn(t, n), "")


ALGORITHMS: dict[str, dict[str, Builder]] = {
    "allreduce": {
        "ring": _plain(lambda t, n: ring.all_reduce(_flat(t), n)),
        "tree": _tree_all_reduce,
        "rhd": _plain(lambda t, n: recursive.halving_doubling_all_reduce(t.ranks, n)),
        "rd": _plain(lambda t, n: recursive.doubling_all_reduce(t.ranks, n)),
        "hierarchical": _plain(_hierarchical_all_reduce),
    },
    "allgather": {
        "ring": _plain(lambda t, n: ring.all_gather(_flat(t), n)),
        "rd": _plain(lambda t, n: recursive.doubling_all_gather(t.ranks, n)),
        "hierarchical": _plain(_hierarchical_all_gather),
    },
    "broadcast": {
        "tree": _plain(lambda t, n: tree.binomial_broadcast(t.ranks, n)),
        "chain": _chain_broadcast,
    },
    "reducescatter": {
        "ring": _plain(lambda t, n: ring.reduce_scatter(_flat(t), n)),
    },
}
OPS = tuple(ALGORITHMS)
_ALIASES = {"ar": "allreduce", "ag": "allgather", "bcast": "broadcast", "rs": "reducescatter"}


def normalize_op(op: str) -> str:
    key = op.lower().replace("-", "").replace("_", "")
    key = _ALIASES.get(key, key)
    if key not in ALGORITHMS:
        raise CollectiveError(f"unknown collective {op!r}; choose one of {', '.join(OPS)}")
    return key


def build(op: str, algo: str, nbytes: float, topo: Topology) -> Schedule:
    """The step schedule of ``algo`` for ``op`` moving ``nbytes`` on ``topo`` (no 'auto' here)."""
    op = normalize_op(op)
    table = ALGORITHMS[op]
    if algo not in table:
        raise CollectiveError(f"algorithm {algo!r} does not exist for {op}; choose one of "
                              f"{', '.join([*table, 'auto', 'all'])}")
    if not nbytes >= 0:
        raise CollectiveError(f"size must be ≥ 0 bytes (got {nbytes})")
    with limits.counting_stored(f"{algo} {op} on {topo.ranks:,} ranks"):
        steps, detail = table[algo](topo, float(nbytes))
    return Schedule(op, algo, topo.ranks, float(nbytes), tuple(steps), detail)


def busbw_factor(op: str, ranks: int) -> float:
    """nccl-tests bus-bandwidth factor: busbw = algbw × factor."""
    op = normalize_op(op)
    if op == "allreduce":
        return 2.0 * (ranks - 1) / ranks
    if op in ("allgather", "reducescatter"):
        return (ranks - 1) / ranks
    return 1.0

"""The catalogue: one step description per (operation, algorithm).

Sizes follow cost-models.md: for all-reduce, reduce-scatter and broadcast ``nbytes`` is the vector each
rank holds; for all-gather it is the TOTAL gathered output; for all-to-all each rank's send buffer (as
nccl-tests counts it). Ranks are numbered node by node.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from arcsim.collectives import limits, pairwise, recursive, ring, tree
from arcsim.collectives.schedule import Schedule, Step, concat, make_step
from arcsim.errors import CollectiveError
from arcsim.topology import Topology

__all__ = ["ALGORITHMS", "ALGORITHM_NAMES", "OPS", "PIPELINED", "Schedule", "Step", "build", "busbw_factor",
           "make_step", "message_count", "normalize_op", "tree_channels"]


def _groups(topo: Topology) -> tuple[np.ndarray, np.ndarray]:
    """(ranks of each node, one row per node; ranks of each rail, one row per GPU index)."""
    per_node = np.arange(topo.ranks).reshape(topo.nodes, topo.gpus_per_node)
    return per_node, per_node.T.copy()


def _rings(topo: Topology) -> np.ndarray:
    """The rings a ring algorithm runs side by side over all ranks, one row each, each carrying 1/rows of the data.

    One ring through the nodes in order when nodes have one NIC; otherwise one ring per NIC (as NCCL's
    channels): ring j visits GPUs j+1 … j+g (mod g) of each node, so it leaves every node through NIC j
    and enters the next through NIC j+1, and all NICs carry data at once.
    """
    g, nics = topo.gpus_per_node, topo.network.nics_per_node
    if nics == 1 or topo.nodes == 1:
        return np.arange(topo.ranks).reshape(1, -1)
    nodes = np.arange(topo.nodes)[:, None] * g
    return np.stack([(nodes + (j + 1 + np.arange(g)) % g).ravel() for j in range(nics)])


def tree_channels(topo: Topology) -> int:
    """Channels a tree all-reduce runs side by side: one per NIC when nodes have several (each channel's
    chains headed by the GPU on its NIC, as NCCL places them), else one (all share the node's NIC)."""
    return topo.network.nics_per_node if topo.nodes > 1 else 1


Built = tuple["list[Step] | tuple[Step, ...]", str]  # the steps, and a note such as the chunk count chosen
Builder = Callable[[Topology, float, "int | None"], Built]


def _slowest_link(topo: Topology) -> tuple[float, float]:
    """(α, β) of the slowest link a message may cross, used to choose pipeline chunk counts."""
    if topo.nodes > 1:
        return topo.network.latency, 1.0 / topo.network.bandwidth_per_nic
    return topo.intra.latency, 1.0 / topo.intra.bandwidth


def _tree_all_reduce(topo: Topology, n: float, chunks: int | None) -> Built:
    """NCCL's tree: chains inside nodes under a double binary tree of nodes, one pair of trees per channel
    (:func:`tree_channels`), each tree carrying n / (2 · channels)."""
    channels, chunks = tree_channels(topo), _tree_chunks(topo, n, chunks)
    steps = tree.chain_tree_all_reduce(topo.nodes, topo.gpus_per_node, n, chunks, channels)
    return steps, f"{chunks} chunks per tree" + (f", {channels} channels (one per NIC)" if channels > 1 else "")


def _tree_chunks(topo: Topology, n: float, chunks: int | None) -> int:
    """The tree all-reduce's chunk count: ``chunks``, else the one its closed form prices lowest."""
    if chunks is not None:
        return chunks
    alpha, beta = _slowest_link(topo)
    levels = tree.node_tree_depth(topo.nodes, topo.gpus_per_node) + 1
    return tree.best_chunks(levels, n / tree_channels(topo), alpha, beta)


def _chain_broadcast(topo: Topology, n: float, chunks: int | None) -> Built:
    if chunks is None:
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


def _plain(fn: Callable[[Topology, float], list[Step] | tuple[Step, ...]]) -> Builder:
    return lambda t, n, chunks: (fn(t, n), "")


def _over_rings(fn: Callable[[np.ndarray, float], list[Step]]) -> Builder:
    """A ring algorithm on the topology's rings, each carrying its share of the data."""
    def steps(t: Topology, n: float) -> list[Step]:
        rings = _rings(t)
        return fn(rings, n / len(rings))

    return _plain(steps)


ALGORITHMS: dict[str, dict[str, Builder]] = {
    "allreduce": {
        "ring": _over_rings(ring.all_reduce),
        "tree": _tree_all_reduce,
        "rhd": _plain(lambda t, n: recursive.halving_doubling_all_reduce(t.ranks, n)),
        "rd": _plain(lambda t, n: recursive.doubling_all_reduce(t.ranks, n)),
        "binomial": _plain(lambda t, n: tree.binomial_reduce(t.ranks, n) + tree.binomial_broadcast(t.ranks, n)),
        "hierarchical": _plain(_hierarchical_all_reduce),
    },
    "allgather": {
        "ring": _over_rings(ring.all_gather),
        "rd": _plain(lambda t, n: recursive.doubling_all_gather(t.ranks, n)),
        "hierarchical": _plain(_hierarchical_all_gather),
    },
    "broadcast": {
        "binomial": _plain(lambda t, n: tree.binomial_broadcast(t.ranks, n)),
        "flat": _plain(lambda t, n: tree.flat_broadcast(t.ranks, n)),
        "eager": _plain(lambda t, n: tree.eager_binomial_broadcast(t.ranks, n)),
        "chain": _chain_broadcast,
    },
    "reducescatter": {
        "ring": _over_rings(ring.reduce_scatter),
        "rd": _plain(lambda t, n: recursive.halving_reduce_scatter(t.ranks, n)),
    },
    "alltoall": {
        "pairwise": _plain(lambda t, n: pairwise.all_to_all(t.ranks, n)),
        "direct": _plain(lambda t, n: pairwise.direct(t.ranks, n)),
    },
}
PIPELINED = {("allreduce", "tree"), ("broadcast", "chain")}  # the algorithms that take a chunk count
OPS = tuple(ALGORITHMS)
ALGORITHM_NAMES = tuple(dict.fromkeys(a for table in ALGORITHMS.values() for a in table))
_ALIASES = {"ar": "allreduce", "ag": "allgather", "bcast": "broadcast", "rs": "reducescatter", "a2a": "alltoall"}


def normalize_op(op: str) -> str:
    key = op.lower().replace("-", "").replace("_", "")
    key = _ALIASES.get(key, key)
    if key not in ALGORITHMS:
        raise CollectiveError(f"unknown collective {op!r}; choose one of {', '.join(OPS)}")
    return key


def build(op: str, algo: str, nbytes: float, topo: Topology, chunks: int | None = None) -> Schedule:
    """The step schedule of ``algo`` for ``op`` moving ``nbytes`` on ``topo`` (no 'auto' here).

    ``chunks`` fixes a pipelined algorithm's piece count (default: the count its closed form prices lowest).
    """
    op = _checked(op, algo, nbytes, chunks)
    with limits.counting_stored(f"{algo} {op} on {topo.ranks:,} ranks"):
        steps, detail = ALGORITHMS[op][algo](topo, float(nbytes), chunks)
    return Schedule(op, algo, topo.ranks, float(nbytes), tuple(steps), detail)


def _checked(op: str, algo: str, nbytes: float, chunks: int | None) -> str:
    """``op``'s name, once ``algo`` of ``nbytes`` in ``chunks`` pieces is a schedule the catalogue can build."""
    op = normalize_op(op)
    table = ALGORITHMS[op]
    if algo not in table:
        raise CollectiveError(f"algorithm {algo!r} does not exist for {op}; choose one of "
                              f"{', '.join([*table, 'auto', 'all'])}")
    if not nbytes >= 0:
        raise CollectiveError(f"size must be ≥ 0 bytes (got {nbytes})")
    if chunks is not None and (op, algo) not in PIPELINED:
        raise CollectiveError(f"{algo} {op} is not pipelined, so it takes no chunk count; pipelined: "
                              + ", ".join(f"{a} {o}" for o, a in sorted(PIPELINED)))
    if chunks is not None and not 1 <= chunks <= tree.MAX_CHUNKS:
        raise CollectiveError(f"a chunk count must be between 1 and {tree.MAX_CHUNKS} (got {chunks})")
    return op


def message_count(op: str, algo: str, nbytes: float, topo: Topology, chunks: int | None = None) -> int | None:
    """The messages ``build(op, algo, nbytes, topo, chunks)`` would hold, where the algorithm counts them without
    building (the tree all-reduce, whose steps grow with ranks × chunks), refused as build() would refuse them for
    their stored size; else None."""
    op = _checked(op, algo, nbytes, chunks)
    if (op, algo) != ("allreduce", "tree"):
        return None
    with limits.counting_stored(f"{algo} {op} on {topo.ranks:,} ranks"):
        return tree.chain_tree_messages(topo.nodes, topo.gpus_per_node, _tree_chunks(topo, float(nbytes), chunks),
                                        tree_channels(topo))


def busbw_factor(op: str, ranks: int) -> float:
    """nccl-tests bus-bandwidth factor: busbw = algbw × factor."""
    op = normalize_op(op)
    if op == "allreduce":
        return 2.0 * (ranks - 1) / ranks
    if op in ("allgather", "reducescatter", "alltoall"):
        return (ranks - 1) / ranks
    return 1.0

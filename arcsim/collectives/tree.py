"""Tree and pipelined algorithms: pipelined (double binary) tree and binomial all-reduce; binomial, eager
binomial, flat and chain broadcast."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import OrderedDict

import numpy as np

from arcsim.collectives import limits
from arcsim.collectives.schedule import Step, make_step

MAX_CHUNKS = 64


def best_chunks(hops: int, nbytes: float, alpha: float, beta: float) -> int:
    """Chunk count s minimising (hops + s)(α + nβ/s): s* = sqrt(hops·nβ/α), clamped to 1..MAX_CHUNKS."""
    if hops <= 0 or nbytes <= 0:
        return 1
    if alpha <= 0:
        return MAX_CHUNKS
    return int(min(MAX_CHUNKS, max(1, round(math.sqrt(hops * nbytes * beta / alpha)))))


def inorder_parents(p: int) -> np.ndarray:
    """Parent of each rank in a balanced in-order binary tree over 0..p−1 (the root's parent is −1)."""
    parent = np.full(p, -1, dtype=np.int64)
    stack = [(0, p, -1)]
    while stack:
        lo, hi, up = stack.pop()
        if lo >= hi:
            continue
        mid = (lo + hi) // 2
        parent[mid] = up
        stack += [(lo, mid, mid), (mid + 1, hi, mid)]
    return parent


def _depths_and_heights(parent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each rank's hops below the root and above its deepest descendant, level by level (numpy per level)."""
    depth = np.zeros(parent.size, dtype=np.int64)
    above = parent.copy()
    while (climbing := above >= 0).any():  # every rank climbs one hop per round until it passes the root
        depth += climbing
        above[climbing] = parent[above[climbing]]
    height = np.zeros(parent.size, dtype=np.int64)
    for d in range(int(depth.max()), 0, -1):  # deepest first: a rank's height is final before its parent reads it
        at = np.flatnonzero(depth == d)
        np.maximum.at(height, parent[at], height[at] + 1)
    return depth, height


def double_binary_trees(p: int) -> tuple[np.ndarray, np.ndarray]:
    """Two trees such that most ranks are a leaf in one and an inner node in the other (tree B = A shifted by 1)."""
    a = inorder_parents(p)
    b = np.full(p, -1, dtype=np.int64)
    has_parent = a >= 0
    b[(np.flatnonzero(has_parent) + 1) % p] = (a[has_parent] + 1) % p
    return a, b


def node_chain_trees(nodes: int, gpus_per_node: int, head: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """NCCL's trees of one channel: a double binary tree over nodes, and inside each node a chain.

    The chain starts at the node's GPU ``head`` (the one whose NIC carries this channel between nodes)
    and runs head, head + 1, … (mod g): GPU ``head`` hangs under GPU ``head`` of its node's parent in each
    tree, every other GPU under the one before it in the chain. With one GPU per node this is the double
    binary tree over ranks.
    """
    g = gpus_per_node
    chain = np.arange(nodes)[:, None] * g + (head + np.arange(g)) % g  # rank at each chain position, per node
    out = []
    for node_parent in double_binary_trees(nodes):
        parent = np.full(nodes * g, -1, dtype=np.int64)
        parent[chain[:, 1:]] = chain[:, :-1]
        parent[chain[:, 0]] = np.where(node_parent >= 0, chain[node_parent, 0], -1)
        out.append(parent)
    return out[0], out[1]


def node_tree_depth(nodes: int, gpus_per_node: int) -> int:
    """Hops from the root of :func:`node_chain_trees` to its farthest rank: the chain, then the node tree."""
    return gpus_per_node - 1 + math.ceil(math.log2(nodes + 1)) - 1


@dataclasses.dataclass(frozen=True, eq=False)
class TreeEdges:
    """Trees as their edges: every tree's sending ranks side by side, tree after tree (a step's messages keep
    that order), each one's parent and the step its first chunk leaves going up (its height) and comes down
    (its depth − 1). What a tree pattern needs of its trees, whatever the chunk count."""

    trees: int
    sender: np.ndarray
    receiver: np.ndarray
    up_start: np.ndarray
    down_start: np.ndarray

    @classmethod
    def of(cls, trees: tuple[np.ndarray, ...]) -> TreeEdges:
        parts = []
        for parent in trees:
            depth, height = _depths_and_heights(parent)
            v = np.flatnonzero(parent >= 0)
            parts.append((v, parent[v], height[v], depth[v] - 1))
        return cls(len(trees), *(np.concatenate(column) for column in zip(*parts, strict=True)))

    def all_reduce(self, nbytes: float, chunks: int) -> list[Step]:
        """See :func:`pipelined_tree_all_reduce`."""
        chunk = nbytes / self.trees / chunks

        def steps_for(start: np.ndarray, reduce: bool) -> list[Step]:
            out: list[Step] = []
            last = int(start.max())
            window = None
            for t in range(chunks + last):
                before, window = window, (max(0, t - chunks + 1), min(t, last))  # the starts that send in step t
                if window == before:  # only while last < t < chunks: every edge sends, and out[-1] is step t − 1
                    out[-1] = dataclasses.replace(out[-1], repeat=out[-1].repeat + 1)
                    continue
                active = (start <= t) & (t < start + chunks)
                if active.any():
                    src, dst = self.sender[active], self.receiver[active]
                    out.append(make_step(src, dst, chunk, chunk) if reduce else make_step(dst, src, chunk, 0.0))
            return out

        return merge_repeats(steps_for(self.up_start, reduce=True) + steps_for(self.down_start, reduce=False))

    def message_count(self, chunks: int) -> int:
        """The messages :meth:`all_reduce` in ``chunks`` pieces holds, counted without building it: each edge sends
        in steps [start, start + chunks) going up and again coming down, and trees sending over one pair in one
        step are one message (make_step merges them), so a pair sends in the union of its trees' windows."""
        p = int(max(self.sender.max(), self.receiver.max())) + 1 if self.sender.size else 0

        def count(src: np.ndarray, dst: np.ndarray, start: np.ndarray) -> int:
            pair = src * p + dst
            order = np.lexsort((start, pair))
            pair, start = pair[order], start[order]
            same_pair_next = np.append(pair[1:] == pair[:-1], False)
            until_next = np.append(np.diff(start), chunks)
            return int(np.where(same_pair_next, np.minimum(chunks, until_next), chunks).sum())

        return (count(self.sender, self.receiver, self.up_start)
                + count(self.receiver, self.sender, self.down_start))


def pipelined_tree_all_reduce(trees: tuple[np.ndarray, ...], nbytes: float, chunks: int) -> list[Step]:
    """Each tree reduces its share of the vector to its root, then broadcasts it back, in ``chunks`` pieces.

    Reduce: a rank of height h sends chunk j to its parent in step j + h. Broadcast: a rank of depth d
    receives chunk j from its parent in step j + d − 1. All trees run in the same steps.
    """
    return TreeEdges.of(trees).all_reduce(nbytes, chunks)


@functools.lru_cache(maxsize=16)
def _chain_tree_edges(nodes: int, gpus_per_node: int, channels: int) -> TreeEdges:
    return TreeEdges.of(tuple(t for head in range(channels) for t in node_chain_trees(nodes, gpus_per_node, head)))


def _expect_stored(nodes: int, gpus_per_node: int, chunks: int, channels: int) -> None:
    """Refuse (arcsim.collectives.limits) the trees' steps before building them where they would store too much:
    every non-root rank of each of the 2 × channels trees sends each chunk once up and once down."""
    limits.expect_stored(2 * 2 * channels * (nodes * gpus_per_node - 1) * chunks)


def chain_tree_messages(nodes: int, gpus_per_node: int, chunks: int, channels: int = 1) -> int:
    """The messages :func:`chain_tree_all_reduce` holds, counted from its trees' edges instead of building them;
    refused as building them would be where they would store too much."""
    _expect_stored(nodes, gpus_per_node, chunks, channels)
    return _counted_messages(nodes, gpus_per_node, chunks, channels)


@functools.lru_cache(maxsize=16)
def _counted_messages(nodes: int, gpus_per_node: int, chunks: int, channels: int) -> int:
    return _chain_tree_edges(nodes, gpus_per_node, channels).message_count(chunks)


PATTERN_MESSAGES = 4_000_000  # messages the kept tree patterns hold at most together (~130 MB): every chunk count
#                              (1-64) of a 64-rank shape is 0.1 M; 16 patterns kept had a run's pricing build 2 of 3
#                              again (tree all-reduce plans 3.3 → 1.6 ms on 8x8-ib100)
_patterns: OrderedDict[tuple[int, int, int, int], tuple[Step, ...]] = OrderedDict()  # least recently used first


def _chain_tree_pattern(nodes: int, gpus_per_node: int, chunks: int, channels: int) -> tuple[Step, ...]:
    """The trees' steps at one byte a chunk, kept (the least recently used dropped past PATTERN_MESSAGES)."""
    key = (nodes, gpus_per_node, chunks, channels)
    if key in _patterns:
        _patterns.move_to_end(key)
        return _patterns[key]
    edges = _chain_tree_edges(nodes, gpus_per_node, channels)
    pattern = tuple(edges.all_reduce(float(edges.trees * chunks), chunks))
    _patterns[key] = pattern
    held = sum(s.messages for steps in _patterns.values() for s in steps)
    while held > PATTERN_MESSAGES and len(_patterns) > 1:
        held -= sum(s.messages for s in _patterns.popitem(last=False)[1])
    return pattern


def chain_tree_all_reduce(nodes: int, gpus_per_node: int, nbytes: float, chunks: int,
                          channels: int = 1) -> list[Step]:
    """:func:`pipelined_tree_all_reduce` over the trees of ``channels`` channels side by side, channel j's
    chains headed by GPU j of each node (so on nodes with several NICs each channel crosses between nodes
    on its own NIC, as NCCL spreads its tree channels over the NICs); each of the 2 × channels trees carries
    nbytes / (2 · channels). Only the chunk size depends on ``nbytes``, so the message pattern is built once
    per (nodes, GPUs per node, chunks, channels) and scaled: building it was most of the time `arcsim run`
    spent pricing (4 of 9 s on ResNet-50's grid). The work limits count a pattern when it is built; a kept
    one shares its index arrays, so using it again is not counted."""
    _expect_stored(nodes, gpus_per_node, chunks, channels)
    chunk = nbytes / (2 * channels) / chunks
    return [Step(s.src, s.dst, s.nbytes * chunk, s.reduce * chunk, s.repeat)  # (replace(): 1.58 ms a plan)
            for s in _chain_tree_pattern(nodes, gpus_per_node, chunks, channels)]


def binomial_reduce(p: int, nbytes: float) -> list[Step]:
    """To root 0, not pipelined: in step i every rank r with r mod 2^(i+1) = 2^i sends its partial sum to r − 2^i."""
    steps = []
    d = 1
    while d < p:
        src = np.arange(d, p, 2 * d)
        steps.append(make_step(src, src - d, nbytes, nbytes))
        d *= 2
    return steps


def eager_binomial_broadcast(p: int, nbytes: float) -> list[Step]:
    """gloo's broadcast: the binomial tree in which rank v receives from v minus its highest bit and sends to
    v + 2^i for every i above that bit — and posts all those sends at once, so a rank's children share
    its uplink. Step k: every rank holding the data for k hops (k one-bits) sends to all its children."""
    ranks = np.arange(p)
    ones = np.array([bin(v).count("1") for v in range(p)])
    top = np.array([v.bit_length() for v in range(p)])  # children differ in a bit above the highest set one
    steps = []
    for k in range(int(ones.max())):
        src, dst = [], []
        for v in ranks[ones == k]:
            i = top[v]
            while v + (1 << i) < p:
                src.append(v)
                dst.append(v + (1 << i))
                i += 1
        if src:
            steps.append(make_step(src, dst, nbytes, 0.0))
    return steps


def flat_broadcast(p: int, nbytes: float) -> list[Step]:
    """The root posts all p − 1 sends at once: one step, every message through its one uplink."""
    return [make_step(np.zeros(p - 1, dtype=np.int64), np.arange(1, p), nbytes, 0.0)]


def binomial_broadcast(p: int, nbytes: float) -> list[Step]:
    """Root 0; in step i every rank below 2^i that has the data sends it to rank + 2^i."""
    steps = []
    d = 1
    while d < p:
        src = np.arange(min(d, p - d))
        steps.append(make_step(src, src + d, nbytes, 0.0))
        d *= 2
    return steps


def chain_broadcast(p: int, nbytes: float, chunks: int) -> list[Step]:
    """Root 0 → 1 → … → p−1, pipelined: in step t rank i forwards chunk t − i."""
    i = np.arange(p - 1)
    steps = []
    for t in range(p + chunks - 2):
        active = i[(t - i >= 0) & (t - i < chunks)]
        steps.append(make_step(active, active + 1, nbytes / chunks, 0.0))
    return merge_repeats(steps)


def merge_repeats(steps: list[Step]) -> list[Step]:
    """Fold runs of identical consecutive steps into one step with a repeat count."""
    out: list[Step] = []
    for s in steps:
        last = out[-1] if out else None
        if (last is not None and np.array_equal(last.src, s.src) and np.array_equal(last.dst, s.dst)
                and np.array_equal(last.nbytes, s.nbytes) and np.array_equal(last.reduce, s.reduce)):
            out[-1] = Step(last.src, last.dst, last.nbytes, last.reduce, last.repeat + s.repeat)
        else:
            out.append(s)
    return out

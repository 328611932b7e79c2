"""A collective algorithm written down once, as steps of messages.

A :class:`Step` is a set of messages (arrays ``src``, ``dst``, ``nbytes``, ``reduce``) that every
rank involved performs together, ``repeat`` times in a row. ``reduce`` is the number of bytes the
receiver combines into its buffer after the message arrives (reduction cost γ per byte).

Execution rule, shared by both engines: a rank takes the steps it appears in, in order; a message
starts when its sender and its receiver have both reached its step; a rank leaves a step when all of
its messages of that step are done and it has reduced what it received.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from arcsim.collectives import limits


@dataclass(frozen=True)
class Step:
    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray
    reduce: np.ndarray
    repeat: int = 1

    @property
    def messages(self) -> int:
        return int(self.src.size)


def make_step(src, dst, nbytes, reduce=0.0, repeat: int = 1) -> Step:
    """A step from array-likes; scalar byte counts are broadcast to every message.

    Messages between the same pair in one step share a path and start together, so they are merged
    into one message carrying their summed bytes.
    """
    src_a = np.asarray(src, dtype=np.int64).ravel()
    dst_a = np.asarray(dst, dtype=np.int64).ravel()
    limits.store(src_a.size)
    nbytes_a = np.broadcast_to(np.asarray(nbytes, dtype=float), src_a.shape).ravel().copy()
    reduce_a = np.broadcast_to(np.asarray(reduce, dtype=float), src_a.shape).ravel().copy()
    if src_a.size:
        pair = src_a * (int(max(src_a.max(), dst_a.max())) + 1) + dst_a
        unique, first, inverse = np.unique(pair, return_index=True, return_inverse=True)
        if unique.size < pair.size:
            keep = np.sort(first)
            order = np.argsort(first)  # unique index -> position among kept messages
            slot = np.empty_like(order)
            slot[order] = np.arange(order.size)
            summed_bytes = np.zeros(keep.size)
            summed_reduce = np.zeros(keep.size)
            np.add.at(summed_bytes, slot[inverse], nbytes_a)
            np.add.at(summed_reduce, slot[inverse], reduce_a)
            src_a, dst_a, nbytes_a, reduce_a = src_a[keep], dst_a[keep], summed_bytes, summed_reduce
    return Step(src_a, dst_a, nbytes_a, reduce_a, int(repeat))


@dataclass(frozen=True)
class Schedule:
    op: str
    algo: str
    ranks: int
    nbytes: float  # all-reduce/reduce-scatter/broadcast: the vector per rank; all-gather: total output
    steps: tuple[Step, ...]
    detail: str = ""  # e.g. the chunk count a pipelined algorithm chose

    @property
    def step_count(self) -> int:
        return sum(s.repeat for s in self.steps)

    @property
    def message_count(self) -> int:
        return sum(s.messages * s.repeat for s in self.steps)

    def bytes_sent(self) -> np.ndarray:
        """Bytes each rank sends over the whole collective."""
        out = np.zeros(self.ranks)
        for s in self.steps:
            np.add.at(out, s.src, s.nbytes * s.repeat)
        return out

    def bytes_received(self) -> np.ndarray:
        out = np.zeros(self.ranks)
        for s in self.steps:
            np.add.at(out, s.dst, s.nbytes * s.repeat)
        return out

    def is_translation_invariant(self, shift: int) -> bool:
        """True when renumbering every rank r as (r + shift) mod p leaves each step's messages unchanged."""
        p = self.ranks
        if shift % p == 0:
            return True
        for s in self.steps:
            original = _rows(s.src, s.dst, s.nbytes, s.reduce)
            shifted = _rows((s.src + shift) % p, (s.dst + shift) % p, s.nbytes, s.reduce)
            if not np.array_equal(original, shifted):
                return False
        return True


def _rows(src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray, reduce: np.ndarray) -> np.ndarray:
    table = np.stack([src.astype(float), dst.astype(float), nbytes, reduce], axis=1)
    return table[np.lexsort(table.T[::-1])]


def concat(*parts: list[Step]) -> tuple[Step, ...]:
    return tuple(step for part in parts for step in part)

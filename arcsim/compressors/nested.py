"""Top-K sets of one bucket's raw gradients at many densities, found once and nested.

The ratio grid compresses the same trace step with Top-K-family methods at ~8 densities each. The k
largest |x| at a smaller density are among those at a larger one, so the set at the largest planned
density is searched on the whole row and every smaller one only within the set above it: one search of
the row instead of one per density and per method (on LLaMA-60M's largest bucket, 16.4 M elements ×
4 workers, 8 densities: 1.2 s against 2.6 s). A density between two levels is searched within the
smallest level above it. The sets are those :func:`~arcsim.compressors.base.largest` finds, so they equal
``topk``'s up to ties.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from arcsim.compressors.base import group_k, largest

Groups = tuple[tuple[int, int], ...]


class NestedTopK:
    """The nested sets of one bucket's raw gradients at the planned ``densities``, found as they are asked for.
    It holds no gradients: :meth:`bind` gives the view a compressor reads, on the [W, d] gradients the sets
    are found on."""

    def __init__(self, densities: Iterable[float]) -> None:
        self.densities = sorted(set(densities), reverse=True)
        self._levels: dict[Groups, list[list[list[torch.Tensor]]]] = {}  # groups → [group][row] → per density

    def bind(self, x: torch.Tensor) -> RawTopK:
        """These sets, found on and read from ``x`` (this trace step's [W, d] raw gradients of the bucket)."""
        return RawTopK(self, x)

    def covers(self, groups: Sequence[tuple[int, int]], density: float) -> bool:
        """Whether ``density`` is at most the largest planned one in every group (so a level holds it)."""
        return bool(self.densities) and all(group_k(n, density) <= group_k(n, self.densities[0]) for _, n in groups)

    def levels(self, x: torch.Tensor, groups: Groups, rows: Iterable[int]) -> list[list[list[torch.Tensor]]]:
        """The level sets (int32, one per planned density, largest first) of ``rows`` of ``x``, found where
        missing."""
        levels = self._levels.setdefault(groups, [[[] for _ in range(x.shape[0])] for _ in groups])
        for (off, n), per_row in zip(groups, levels, strict=True):
            for r in rows:
                if per_row[r]:
                    continue
                mag = x[r, off:off + n].abs()
                idx: torch.Tensor | None = None
                for d in self.densities:
                    k = group_k(n, d)
                    idx = largest(mag, k) if idx is None else idx[largest(mag[idx], k)]
                    per_row[r].append(idx.to(torch.int32))
        return levels


@dataclass(frozen=True, eq=False)  # (identity: it holds a tensor)
class RawTopK:
    """:class:`NestedTopK`'s sets bound to the gradients ``source`` they are found on (compressors check
    ``source is u`` first, so a memory's accumulated or copied input never takes this path)."""

    sets: NestedTopK
    source: torch.Tensor

    def covers(self, groups: Sequence[tuple[int, int]], density: float) -> bool:
        return self.sets.covers(groups, density)

    def indices(self, groups: Sequence[tuple[int, int]], density: float, rows: Sequence[int] | None = None
                ) -> torch.Tensor:
        """[len(rows), K]: each row's k largest |x| in every group at ``density`` (see :meth:`covers`), as
        column indices (the layout of :func:`~arcsim.compressors.base.topk_indices`)."""
        return self._select(tuple(groups), [group_k(n, density) for _, n in groups],
                            range(self.source.shape[0]) if rows is None else rows)

    def kth_abs(self, row: int, k: int) -> torch.Tensor:
        """The k-th largest |x| of one whole row (0-d); k at most the largest planned density's."""
        d = self.source.shape[1]
        return self.source[row, self._select(((0, d),), [k], [row])[0]].abs().min()

    def _select(self, groups: Groups, ks: list[int], rows: Sequence[int]) -> torch.Tensor:
        levels = self.sets.levels(self.source, groups, rows)
        parts = []
        for (off, n), k, per_row in zip(groups, ks, levels, strict=True):
            level = max(i for i, d in enumerate(self.sets.densities) if group_k(n, d) >= k)
            picked = []
            for r in rows:
                idx = per_row[r][level].long()
                if idx.numel() > k:
                    idx = idx[largest(self.source[r, off:off + n][idx].abs(), k)]
                picked.append(idx)
            parts.append(torch.stack(picked) + off)
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)

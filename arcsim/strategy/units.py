"""FSDP units: which parameters each ``fully_shard`` call owns, as FSDP2 is applied to a model in practice —
one unit per repeated block (a transformer layer, a ResNet bottleneck: any child of a numbered container)
with the embeddings, final norm and head in the root (``fully_shard(model)``); a model without numbered
blocks: one unit per top-level child module."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from arcsim.models.source import ModelSource

ROOT = "<root>"
_NUMBERED = re.compile(r"^(.*?\.\d+)\.")  # the first numbered container child: model.layers.3.


@dataclass(frozen=True)
class ShardUnit:
    """One ``fully_shard`` call's parameters (shapes in registration order)."""

    name: str
    shapes: tuple[tuple[int, ...], ...]

    @property
    def numel(self) -> int:
        return sum(math.prod(s) for s in self.shapes)

    def padded_numel(self, shards: int) -> int:
        """Elements of the unit's flat all-gather output (reduce-scatter input) over ``shards`` ranks: FSDP2
        pads each parameter's dim 0 to a multiple of the shard count (a 0-dim parameter counts as one row)."""
        total = 0
        for s in self.shapes:
            rows, rest = (s[0], math.prod(s[1:])) if s else (1, 1)
            total += math.ceil(rows / shards) * shards * rest
        return total


def assign(named_shapes: Sequence[tuple[str, tuple[int, ...]]], wrap: str = "auto") -> dict[str, str]:
    """Each parameter's unit (ROOT for the root's). ``wrap``: ``auto`` (numbered blocks where the model has them,
    the rest in the root; else each top-level child), ``blocks``, ``children`` (each top-level child), ``none``
    (the root only)."""
    if wrap not in ("auto", "blocks", "children", "none"):
        raise ValueError(f"unknown wrap {wrap!r}")
    if wrap == "auto":  # a model with repeated blocks is wrapped per block, as torchtitan and the FSDP2 docs do
        wrap = "blocks" if any(_NUMBERED.match(n) for n, _ in named_shapes) else "children"
    out = {}
    for name, _ in named_shapes:
        m = _NUMBERED.match(name)
        if wrap == "blocks":
            out[name] = m.group(1) if m else ROOT
        elif wrap == "children":
            out[name] = name.split(".")[0] if "." in name else ROOT
        else:
            out[name] = ROOT
    return out


def group_units(named_shapes: Sequence[tuple[str, tuple[int, ...]]],
                wrap: str = "auto") -> tuple[list[ShardUnit], ShardUnit]:
    """The non-root units in forward (registration) order and the root (see :func:`assign`)."""
    units = assign(named_shapes, wrap)
    shapes: dict[str, list[tuple[int, ...]]] = {ROOT: []}
    for name, shape in named_shapes:
        shapes.setdefault(units[name], []).append(tuple(shape))
    root = shapes.pop(ROOT)
    return [ShardUnit(u, tuple(s)) for u, s in shapes.items()], ShardUnit(ROOT, tuple(root))


def model_shapes(model: object) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of each trainable parameter of a torch module, in registration order."""
    return [(n, tuple(p.shape)) for n, p in model.named_parameters() if p.requires_grad]  # type: ignore[attr-defined]


def zoo_shapes(model: str | ModelSource, dataset: str | None = None,
               input_size: int | None = None) -> list[tuple[str, tuple[int, ...]]]:
    """A zoo model's (or any model source's) parameter shapes, built on the meta device (nothing allocated) for
    ``dataset`` at ``input_size`` (default: the model's own; None with a model of the user's fed its own batches)."""
    import torch

    from arcsim.models.datasets import data_spec
    from arcsim.models.source import as_source

    source = as_source(model)
    source.check()
    name = dataset or source.default_dataset
    with torch.device("meta"):
        built = source.build(None if name is None else data_spec(name, input_size))
    return model_shapes(built)

"""A flat gradient's layer layout: each layer's name, shape and offset in the vector (torch-free, so what only
lays gradients out — buckets, frameworks, a synthetic model's size — loads without torch)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Layer:
    name: str
    shape: tuple[int, ...]
    offset: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def flat_layout(d: int) -> tuple[Layer, ...]:
    return (Layer("bucket", (d,), 0),)


def layout_of(shapes: list[tuple[int, ...]], names: list[str] | None = None) -> tuple[Layer, ...]:
    layers, offset = [], 0
    for i, shape in enumerate(shapes):
        layers.append(Layer(names[i] if names else f"layer{i}", tuple(shape), offset))
        offset += math.prod(shape)
    return tuple(layers)

"""What a dataset is: the shape a model must accept (DataSpec), how batches are drawn (Dataset), and the error."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from arcsim.errors import ArcsimError

if TYPE_CHECKING:
    import torch


class DatasetError(ArcsimError):
    """An unknown dataset, or one that does not fit the model."""


@dataclass(frozen=True)
class DataSpec:
    """What a model must accept: kind 'image' (C, H, W), 'vector' (F,) or 'tokens' (T,); classes = vocabulary."""

    kind: str
    shape: tuple[int, ...]
    classes: int


class Dataset:
    name: str = ""
    synthetic: bool = False
    description: str = ""
    spec: DataSpec

    def draw(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch of n training examples (inputs, targets)."""
        raise NotImplementedError

    def held_out(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The test split, where the dataset has one."""
        return None

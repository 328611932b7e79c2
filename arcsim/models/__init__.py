"""The model zoo traces are captured from, defined in the project (torchvision is optional here).

Each entry builds a model for a dataset's DataSpec; ``reference_params`` is the parameter count on the
model's default dataset (torchvision's and GPT-2's published figures), checked by the tests.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from arcsim.models.dataspec import DatasetError, DataSpec
from arcsim.models.llama_shapes import LLAMA_SHAPES

if TYPE_CHECKING:  # the model classes (and torch) load when a model is built, not when the zoo is read
    import torch
    from torch import nn


def _mlp(spec: DataSpec, **options: int) -> nn.Module:
    from arcsim.models.small import MLP

    return MLP(math.prod(spec.shape), spec.classes, **options)


def _cnn(spec: DataSpec) -> nn.Module:
    from arcsim.models.small import SmallCNN

    return SmallCNN(spec.shape[0], spec.shape[1], spec.classes)


def _resnet(depth: int) -> Callable[[DataSpec], nn.Module]:
    def build(spec: DataSpec) -> nn.Module:
        from arcsim.models.resnet import resnet18, resnet50

        return (resnet18 if depth == 18 else resnet50)(spec.shape[0], spec.classes)

    return build


def _vit(spec: DataSpec) -> nn.Module:
    from arcsim.models.vit import vit_b_16

    return vit_b_16(spec.shape[1], spec.shape[0], spec.classes)


def _gpt(spec: DataSpec) -> nn.Module:
    from arcsim.models.gpt import GPT

    return GPT(spec.classes)


def _llama_builder(name: str) -> Callable[[DataSpec], nn.Module]:
    def build(spec: DataSpec) -> nn.Module:
        from arcsim.models.llama import llama

        return llama(name, spec.classes)

    return build


@dataclass(frozen=True)
class ModelEntry:
    name: str
    kinds: tuple[str, ...]              # DataSpec kinds the model accepts
    default_dataset: str
    lr: float                           # learning rate of its optimizer between recorded steps
    default_batch: int                  # per worker
    reference_params: int | None
    build_fn: Callable[[DataSpec], nn.Module]
    description: str
    optimizer: str = "sgd"              # what it trains with by default: sgd (momentum 0.9) or adamw

    def build(self, spec: DataSpec) -> nn.Module:
        if spec.kind not in self.kinds:
            raise DatasetError(f"model {self.name} takes {' or '.join(self.kinds)} data, not {spec.kind}; "
                               f"try --dataset {self.default_dataset}")
        try:
            return self.build_fn(spec)
        except ValueError as exc:
            raise DatasetError(f"model {self.name} does not fit the data: {exc}") from None


MODELS: dict[str, ModelEntry] = {e.name: e for e in (
    ModelEntry("mlp", ("vector", "image"), "mnist1d", 0.05, 32, None,
               _mlp, "MLP, two hidden layers of 128"),
    ModelEntry("mlp_wide", ("vector", "image"), "digits", 0.05, 32, None,
               lambda s: _mlp(s, hidden=1024),
               "MLP, two hidden layers of 1024 (≈1.1 M parameters on digits: a network-bound validation case)"),
    ModelEntry("cnn", ("image",), "digits", 0.05, 32, None,
               _cnn, "small CNN: two 3×3 convs, pool, two fc"),
    ModelEntry("resnet18", ("image",), "synthetic-images", 0.05, 4, 11_689_512,
               _resnet(18), "ResNet-18 (torchvision layout)"),
    ModelEntry("resnet50", ("image",), "synthetic-images", 0.05, 4, 25_557_032,
               _resnet(50), "ResNet-50 (torchvision layout, v1.5)"),
    ModelEntry("vit_b_16", ("image",), "synthetic-images", 0.01, 2, 86_567_656,
               _vit, "ViT-B/16 (torchvision layout)"),
    ModelEntry("gpt2_small", ("tokens",), "synthetic-tokens", 0.01, 2, 124_439_808,
               _gpt, "GPT-2-small-shaped decoder, tied embeddings"),
    *(ModelEntry(name, ("tokens",), "python-text", 1e-3, 2, reference, _llama_builder(name),
                 f"LLaMA {name.removeprefix('llama_').upper()} (GaLore's C4 configuration: {shape.layers} layers × "
                 f"{shape.hidden}, untied embeddings), AdamW", "adamw")
      for (name, shape), reference in zip(LLAMA_SHAPES.items(), (58_073_600, 134_105_856, 367_969_280,
                                                                  1_339_082_752), strict=True)),
)}


def model_entry(name: str) -> ModelEntry:
    if name not in MODELS:
        raise DatasetError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}")
    return MODELS[name]


def loss_fn(kind: str, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy: per example for classification, per position for next-token prediction."""
    import torch.nn.functional as F

    if kind == "tokens":
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
    return F.cross_entropy(logits, target)


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())

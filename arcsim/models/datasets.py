"""Datasets that need no download: real small ones (digits, MNIST-1D, the standard library's text) and seeded
synthetic ones.

Every dataset draws a global batch with a torch.Generator; data-parallel callers split it into
disjoint per-worker shards. Synthetic sets carry a learnable signal (class templates, a Markov chain
over tokens) so training on them is training, not noise fitting — but they say so: ``synthetic`` is
recorded in trace metadata and shown by ``arcsim trace info``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from arcsim.models.dataspec import Dataset, DatasetError, DataSpec
from arcsim.models.text import PythonText

if TYPE_CHECKING:
    import torch


class ArrayDataset(Dataset):
    """A finite real dataset held in memory; batches are sampled without replacement within a batch."""

    def __init__(self, x: np.ndarray, y: np.ndarray, x_test: np.ndarray, y_test: np.ndarray, spec: DataSpec) -> None:
        import torch

        self.x, self.y = torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y, dtype=torch.int64)
        self.x_test = torch.as_tensor(x_test, dtype=torch.float32)
        self.y_test = torch.as_tensor(y_test, dtype=torch.int64)
        self.spec = spec

    def draw(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        if n > len(self.x):
            raise DatasetError(f"a global batch of {n} exceeds the {len(self.x)} training examples of {self.name}; "
                               "use fewer workers or a smaller --batch")
        pick = torch.randperm(len(self.x), generator=gen)[:n]
        return self.x[pick], self.y[pick]

    def held_out(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x_test, self.y_test


def _split(x: np.ndarray, y: np.ndarray, test_fraction: float,
           seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    order = np.random.default_rng(seed).permutation(len(x))
    cut = round(len(x) * (1 - test_fraction))
    return x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]


class Digits(ArrayDataset):
    name = "digits"
    description = "scikit-learn's 1,797 handwritten digits, 8×8, 10 classes (80/20 split)"

    @staticmethod
    def spec_for(size: int | None = None) -> DataSpec:
        if size not in (None, 8):
            raise DatasetError("digits images are 8×8; drop --input-size")
        return DataSpec("image", (1, 8, 8), 10)

    def __init__(self, size: int | None = None) -> None:
        from sklearn.datasets import load_digits

        spec = self.spec_for(size)
        raw = load_digits()
        x = (raw.data.astype(np.float32) / 16.0 - 0.5).reshape(-1, *spec.shape)
        super().__init__(*_split(x, raw.target, 0.2, seed=0), spec)


class MNIST1D(ArrayDataset):
    name = "mnist1d"
    description = "MNIST-1D (Greydanus 2020) generated locally by the mnist1d package: 40-sample signals, 10 classes"

    @staticmethod
    def spec_for(size: int | None = None) -> DataSpec:
        if size not in (None, 40):
            raise DatasetError("MNIST-1D signals have 40 samples; drop --input-size")
        return DataSpec("vector", (40,), 10)

    def __init__(self, size: int | None = None) -> None:
        from mnist1d.data import get_dataset_args, make_dataset

        spec = self.spec_for(size)
        data = make_dataset(get_dataset_args())
        if data["x"].shape[1:] != spec.shape:
            raise DatasetError(f"the mnist1d package made signals of {data['x'].shape[1]} samples, not 40")
        super().__init__(data["x"], data["y"], data["x_test"], data["y_test"], spec)


class SyntheticImages(Dataset):
    """Class templates (seeded 8×8 colour patterns, upsampled) plus Gaussian noise; 1,000 classes."""

    name = "synthetic-images"
    synthetic = True

    @staticmethod
    def spec_for(size: int | None = None, classes: int = 1000) -> DataSpec:
        side = size or 224
        if side < 8:
            raise DatasetError(f"--input-size {side} is too small for images; use at least 8")
        return DataSpec("image", (3, side, side), classes)

    def __init__(self, size: int | None = None, classes: int = 1000, seed: int = 0) -> None:
        import torch

        self.spec = self.spec_for(size, classes)
        side = self.spec.shape[1]
        gen = torch.Generator().manual_seed(seed)
        self.templates = torch.randn(classes, 3, 8, 8, generator=gen)
        self.description = f"seeded synthetic images 3×{side}×{side}, {classes} classes (templates + noise)"

    def draw(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        import torch
        import torch.nn.functional as F

        y = torch.randint(self.spec.classes, (n,), generator=gen)
        side = self.spec.shape[1]
        x = F.interpolate(self.templates[y], size=(side, side), mode="bilinear", align_corners=False)
        return x + torch.randn(x.shape, generator=gen), y


class SyntheticTokens(Dataset):
    """Token sequences from a seeded Markov chain: each token has one likely successor (p = 0.7)."""

    name = "synthetic-tokens"
    synthetic = True

    @staticmethod
    def spec_for(size: int | None = None, vocab: int = 50257) -> DataSpec:
        length = size or 128
        if not 2 <= length <= 1024:
            raise DatasetError(f"--input-size {length} is not a usable sequence length; use 2 … 1024")
        return DataSpec("tokens", (length,), vocab)

    def __init__(self, size: int | None = None, vocab: int = 50257, seed: int = 0) -> None:
        import torch

        self.spec = self.spec_for(size, vocab)
        length = self.spec.shape[0]
        self.successor = torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))
        self.description = f"seeded synthetic token sequences of {length}, vocabulary {vocab} (Markov chain)"

    def draw(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        length, vocab = self.spec.shape[0], self.spec.classes
        seq = torch.empty(n, length + 1, dtype=torch.int64)
        seq[:, 0] = torch.randint(vocab, (n,), generator=gen)
        for t in range(length):
            jump = torch.rand(n, generator=gen) > 0.7
            seq[:, t + 1] = torch.where(jump, torch.randint(vocab, (n,), generator=gen), self.successor[seq[:, t]])
        return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()  # as a loader's: .view works


DATASETS: dict[str, type[Digits] | type[MNIST1D] | type[SyntheticImages] | type[SyntheticTokens] | type[PythonText]] = {
    cls.name: cls for cls in (Digits, MNIST1D, SyntheticImages, SyntheticTokens, PythonText)}


def make_dataset(name: str, size: int | None = None) -> Dataset:
    if name not in DATASETS:
        raise DatasetError(f"unknown dataset {name!r}; choose one of: {', '.join(DATASETS)}")
    return DATASETS[name](size)


def data_spec(name: str, size: int | None = None) -> DataSpec:
    """What a model built for ``name`` must accept, without loading or generating any data."""
    if name not in DATASETS:
        raise DatasetError(f"unknown dataset {name!r}; choose one of: {', '.join(DATASETS)}")
    return DATASETS[name].spec_for(size)

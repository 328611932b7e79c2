"""Real text, offline: the Python standard library's own sources, tokenised by a byte-level BPE trained here.

Every Python installation carries its standard library (12 MB of .py files in 3.11: code, docstrings and
comments in English), so transformer gradients can see the statistics of real text with no download.
Tests and site-packages are left out. Files are split, every twentieth to the held-out set, so
held-out windows come from files the model never trained on. The tokenizer (``tokenizers``' byte-level
BPE, 32,000 tokens — LLaMA's vocabulary size — merges seen at least twice) is trained on the training
files only. Tokenizer and token streams are kept in the user cache, keyed by the corpus's content, so
they are built once per Python installation (about 15 s on 2 cores).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sysconfig
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from arcsim.files import atomic_path, cache_dir, writable_cache_dir
from arcsim.models.dataspec import Dataset, DatasetError, DataSpec

if TYPE_CHECKING:
    import torch

VOCAB = 32_000
HELD_OUT_EVERY = 20   # file i is held out when i % 20 == 19
HELD_OUT_WINDOWS = 64  # sequences the held-out loss and accuracy are measured on
SKIPPED_PARTS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}


def corpus_files() -> list[Path]:
    """The standard library's .py files in a stable order, tests and installed packages left out."""
    return list(_sources(sysconfig.get_paths()["stdlib"]))


@lru_cache(maxsize=4)
def _sources(stdlib: str) -> tuple[Path, ...]:
    """:func:`corpus_files` under ``stdlib``, walked once a process, never into the folders left out (a recursive
    glob walked the installed packages too: 0.5 s a process, where this takes 10 ms)."""
    found = []
    for folder, subfolders, files in os.walk(stdlib):
        subfolders[:] = [name for name in subfolders if name not in SKIPPED_PARTS]
        found += [Path(folder) / name for name in files if name.endswith(".py")]
    return tuple(sorted(found))


def _digest(files: list[Path]) -> str:
    h = hashlib.sha256(f"{VOCAB}:{HELD_OUT_EVERY}".encode())
    for p in files:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def build_corpus(files: list[Path], where: Path) -> None:
    """Train the tokenizer on the training files and write it with both token streams (uint16) to ``where``."""
    try:
        from tokenizers import ByteLevelBPETokenizer
    except ImportError:
        raise DatasetError("real text needs the tokenizers package: pip install tokenizers") from None
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in files]
    train = [t for i, t in enumerate(texts) if i % HELD_OUT_EVERY != HELD_OUT_EVERY - 1]
    held = [t for i, t in enumerate(texts) if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1]
    tokenizer = ByteLevelBPETokenizer()
    tokenizer.train_from_iterator(train, vocab_size=VOCAB, min_frequency=2, show_progress=False)
    where.mkdir(parents=True, exist_ok=True)
    for name, part in (("train", train), ("held_out", held)):
        ids = np.concatenate([np.asarray(e.ids, dtype=np.uint16) for e in tokenizer.encode_batch(part)])
        with atomic_path(where / f"{name}.npy") as tmp, tmp.open("wb") as fh:
            np.save(fh, ids)
    about = {"files": len(files), "train_files": len(train), "held_out_files": len(held),
             "bytes": sum(len(t.encode()) for t in texts), "python": platform.python_version()}
    with atomic_path(where / "tokenizer.json") as tmp:
        tokenizer.save(str(tmp))
    with atomic_path(where / "about.json") as tmp:  # written last: its presence means the rest is complete
        tmp.write_text(json.dumps(about))


class PythonText(Dataset):
    """Next-token windows of the standard library's text; targets are the inputs shifted by one."""

    name = "python-text"

    @staticmethod
    def spec_for(size: int | None = None) -> DataSpec:
        length = size or 256
        if not 2 <= length <= 4096:
            raise DatasetError(f"--input-size {length} is not a usable sequence length; use 2 … 4096")
        return DataSpec("tokens", (length,), VOCAB)

    def __init__(self, size: int | None = None) -> None:
        import torch

        self.spec = self.spec_for(size)
        files = corpus_files()
        if not files:
            raise DatasetError(f"found no standard-library sources under {sysconfig.get_paths()['stdlib']}")
        where = cache_dir() / "text" / f"python-stdlib-{_digest(files)}"
        if not (where / "about.json").is_file():
            writable_cache_dir()
            build_corpus(files, where)
        self.about = json.loads((where / "about.json").read_text())
        self.train_ids = torch.from_numpy(np.load(where / "train.npy").astype(np.int64))
        self.held_ids = torch.from_numpy(np.load(where / "held_out.npy").astype(np.int64))
        self.tokenizer_path = where / "tokenizer.json"
        a = self.about
        self.description = (f"Python {a['python']} standard-library sources ({a['files']} files, "
                            f"{a['bytes'] / 1e6:.1f} MB; {a['held_out_files']} files held out), byte-level BPE of "
                            f"{VOCAB:,} tokens trained here; {len(self.train_ids):,} training tokens, windows of "
                            f"{self.spec.shape[0]}")
        if len(self.held_ids) <= self.spec.shape[0] + 1:
            raise DatasetError(f"the held-out text has {len(self.held_ids)} tokens, fewer than one window of "
                               f"{self.spec.shape[0]}; use a smaller --input-size")

    def _windows(self, ids: torch.Tensor, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        seq = ids[starts[:, None] + torch.arange(self.spec.shape[0] + 1)]
        return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()  # as a loader's: .view works

    def draw(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        starts = torch.randint(len(self.train_ids) - self.spec.shape[0] - 1, (n,), generator=gen)
        return self._windows(self.train_ids, starts)

    def held_out(self) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        span = len(self.held_ids) - self.spec.shape[0] - 1
        starts = torch.linspace(0, span, HELD_OUT_WINDOWS).long()  # evenly over the held-out files
        return self._windows(self.held_ids, starts)

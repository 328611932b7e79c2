"""Writing files so that no reader ever sees half of one: write beside the final name, then rename."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` (same suffix, so writers that look at it still work); renamed onto
    ``path`` when the block ends, removed if it raises."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.partial-{os.getpid()}{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_atomic(path: Path, text: str, check: Callable[[Path], object] | None = None) -> Path:
    """Write ``text`` to ``path`` atomically; ``check(tmp)`` may refuse the content before it lands."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
        if check is not None:
            check(tmp)
    return path

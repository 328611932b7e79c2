"""The compressors, one module per method, named in arcsim.compressors.registry. The package loads nothing itself,
so its torch-free modules (the layer layout) load without torch; ``from arcsim.compressors import
make_compressor`` still works, reaching the registry when asked."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from arcsim.compressors.registry import NAMES, REGISTRY, Compressed, CompressionError, Compressor, make_compressor

__all__ = ["NAMES", "REGISTRY", "Compressed", "CompressionError", "Compressor", "make_compressor"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from arcsim.compressors import registry

        return getattr(registry, name)
    raise AttributeError(f"module 'arcsim.compressors' has no attribute {name!r}")

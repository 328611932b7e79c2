"""The compressor registry: one class per method, looked up by name (`make_compressor`)."""

from __future__ import annotations

from arcsim.catalog import INFO
from arcsim.compressors.adaptive import Adaptive
from arcsim.compressors.arctopk import ArcTopK
from arcsim.compressors.artopk import Star, Var
from arcsim.compressors.base import Compressed, Compressor
from arcsim.compressors.dense import Bf16, Dense, Fp16
from arcsim.compressors.dgc import DGC
from arcsim.compressors.gaussiank import GaussianK
from arcsim.compressors.onebit import OneBit
from arcsim.compressors.powersgd import PowerSGD
from arcsim.compressors.quantisers import QSGD, Natural, TernGrad
from arcsim.compressors.randk import RandK
from arcsim.compressors.sharded import SHARDED
from arcsim.compressors.signs import EFSignSGD, SignSGD, Signum
from arcsim.compressors.topk import TopK
from arcsim.errors import CompressionError

REGISTRY: dict[str, type[Compressor]] = {
    cls.name: cls for cls in (Dense, Fp16, Bf16, TopK, RandK, GaussianK, ArcTopK, Star, Var, PowerSGD, Adaptive)
}
REGISTRY.update({cls.name: cls for cls in (QSGD, TernGrad, Natural, SignSGD, Signum, EFSignSGD)})  # quantisers, signs
REGISTRY.update({cls.name: cls for cls in (DGC, OneBit)})  # DGC, 1-bit Adam's compressed all-reduce
REGISTRY.update({cls.name: cls for cls in SHARDED})  # quantised reduce-scatters (FSDP, ZeRO++), then all-gathers
NAMES = tuple(REGISTRY)


def make_compressor(name: str, density: float = 0.01, seed: int = 0, rank: int | None = None,
                    **options) -> Compressor:
    """A compressor by name; ``rank`` is PowerSGD's rank or ARC-Top-K's sketch columns r; ``options`` must
    be ones its descriptor lists (:data:`arcsim.catalog.INFO`)."""
    if name not in REGISTRY:
        raise CompressionError(f"unknown compressor {name!r}; choose one of {', '.join(NAMES)}")
    unknown = sorted(set(options) - set(INFO[name].options))
    if unknown:
        raise CompressionError(f"{name} takes no option {', '.join(unknown)}; its options: "
                               f"{', '.join(INFO[name].options) or 'none'}")
    if rank is not None:
        if rank < 1:
            raise CompressionError(f"rank r must be ≥ 1 (got {rank})")
        target = options.get("inner", "topk") if name == "adaptive" else name
        if target not in ("powersgd", "arctopk"):
            raise CompressionError("--rank applies to powersgd (its rank) and arctopk (sketch columns r) only")
        options["rank"] = rank
    return REGISTRY[name](density=density, seed=seed, **options)


__all__ = ["NAMES", "REGISTRY", "Compressed", "CompressionError", "Compressor", "make_compressor"]

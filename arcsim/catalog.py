"""Names the command line offers, importable without torch (the registries are checked against them in tests)."""

COMPRESSORS = ("dense", "fp16", "topk", "randk", "gaussiank", "arctopk", "star", "var", "powersgd", "adaptive")
AG_FAMILY = ("topk", "gaussiank")            # index-based: moved by all-gather
AR_TOPK_FAMILY = ("arctopk", "star", "var")  # all-reduce-compatible top-k variants
DENSITY_FREE = ("dense", "fp16")  # compressors whose result does not depend on k/d
MEMORIES = ("none", "ef14", "ef21", "ef21m")
SYNTHETIC_KINDS = ("normal", "laplace", "t3", "correlated")
MODELS = ("mlp", "mlp_wide", "cnn", "resnet18", "resnet50", "vit_b_16", "gpt2_small")
DATASETS = ("digits", "mnist1d", "synthetic-images", "synthetic-tokens")
POLICIES = ("auto", "none")
DEFAULT_RATIOS = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0)


def check_compression(compressors: tuple[str, ...], memory: str | None, error: type[Exception]) -> None:
    """Refuse an empty or unknown compressor list, or an unknown memory (None: each compressor's default)."""
    unknown = [c for c in compressors if c not in COMPRESSORS]
    if unknown or not compressors:
        raise error(f"unknown compressor {', '.join(unknown) or '(none given)'}; choose from {', '.join(COMPRESSORS)}")
    if memory is not None and memory not in MEMORIES:
        raise error(f"unknown memory {memory!r}; choose one of {', '.join(MEMORIES)}")

"""Names the command line offers and ONE descriptor per compressor, importable without torch.

A compressor's family, whether its result depends on the density, its default error feedback, the
options it accepts and its GPU work per element live here and nowhere else: the registry, ``run``,
``sweep``, ``train``, ``validate``, the hooks and the cost model read them. Adding a compressor is its
file under ``arcsim/compressors/`` plus its line in ``DESCRIPTORS`` (tests hold the two together).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CompressorInfo:
    name: str
    family: str                   # "all-reduce", "all-gather", "all-to-all" or "reduce-scatter" (each of the last two
    #                               then an all-gather): how values travel
    selection: str                # none, top-k, random, leader, sketch, low-rank, adaptive (wraps another),
    #                               quantise (every element in a few bits), sign (one bit per element)
    density_free: bool            # its result does not depend on k/d
    default_memory: str           # error feedback arcsim run uses unless --memory says otherwise
    options: tuple[str, ...]      # keyword options its constructor accepts besides density and seed
    summary: str
    own_memory: bool = False      # keeps its own error compensation: always run with memory none (memory_for)

    @property
    def all_reduce_compatible(self) -> bool:
        return self.family == "all-reduce"


DESCRIPTORS: tuple[CompressorInfo, ...] = (
    CompressorInfo("dense", "all-reduce", "none", True, "none", (), "fp32 all-reduce, the baseline"),
    CompressorInfo("fp16", "all-reduce", "none", True, "none", (), "fp16 cast, half the bytes"),
    CompressorInfo("bf16", "all-reduce", "none", True, "none", (), "bf16 cast, half the bytes, fp32's range"),
    CompressorInfo("topk", "all-gather", "top-k", False, "ef14", ("scope", "packed"),
                   "each worker's k largest |x|; values and indices all-gathered (packed in one)"),
    CompressorInfo("randk", "all-reduce", "random", False, "ef14", ("scope", "unbiased"),
                   "k indices from a shared seed; values all-reduced"),
    CompressorInfo("gaussiank", "all-gather", "top-k", False, "ef14", ("scope", "packed"),
                   "threshold from mean and std; counts, then values and indices all-gathered (packed)"),
    CompressorInfo("arctopk", "all-reduce", "sketch", False, "ef14", ("scope", "rank", "block", "selector"),
                   "rows agreed through an all-reduced random sketch; values all-reduced"),
    CompressorInfo("star", "all-reduce", "leader", False, "ef14", ("scope",),
                   "round-robin leader's top-k indices broadcast; values all-reduced"),
    CompressorInfo("var", "all-reduce", "leader", False, "ef14", ("scope", "window", "alpha"),
                   "largest-gradient-norm leader's top-k indices broadcast; values all-reduced"),
    CompressorInfo("powersgd", "all-reduce", "low-rank", False, "ef14", ("rank", "min_compression_rate"),
                   "rank-r approximation, P and Q all-reduced"),
    CompressorInfo("adaptive", "all-gather", "adaptive", False, "ef14", ("inner", "scope", "rank"),
                   "water-filling k per step around an inner topk or arctopk"),
    CompressorInfo("qsgd", "all-gather", "quantise", True, "none", ("levels", "block"),
                   "s-level stochastic rounding of |x|/‖x‖ (int8) and the norm (per bucket, or per block of "
                   "elements); payloads all-gathered"),
    CompressorInfo("terngrad", "all-gather", "quantise", True, "none", ("clip",),
                   "ternary 0/±max|x| (2 bits, clipped at 2.5σ) and the scale; payloads all-gathered"),
    CompressorInfo("natural", "all-gather", "quantise", True, "none", (),
                   "|x| stochastically to a power of two (sign + exponent, 8 bits); payloads all-gathered"),
    CompressorInfo("signsgd", "all-gather", "sign", True, "none", (),
                   "1-bit signs and an ℓ1 scale all-gathered; majority vote"),
    CompressorInfo("signum", "all-gather", "sign", True, "none", ("beta",),
                   "1-bit signs of each worker's momentum all-gathered; majority vote"),
    CompressorInfo("efsignsgd", "all-gather", "sign", True, "ef14", (),
                   "1-bit signs times ‖x‖₁/d all-gathered and averaged, with error feedback"),
    CompressorInfo("dgc", "all-gather", "top-k", False, "none",
                   ("scope", "packed", "momentum", "masking", "clip_norm", "sample_ratio", "strided", "warmup_steps",
                    "warmup_coeff", "optimizer_momentum"),
                   "momentum-corrected velocity, sampled threshold, masking; values and indices all-gathered",
                   own_memory=True),
    CompressorInfo("onebit", "all-to-all", "sign", True, "none", ("scope", "warmup_steps"),
                   "1-bit Adam's: signs × scale all-to-all to servers, server signs all-gathered; worker and "
                   "server error", own_memory=True),
    # FSDP's and ZeRO++'s gradient path (arcsim/compressors/sharded.py): the order of SHARDED there
    CompressorInfo("rs-bf16", "reduce-scatter", "quantise", True, "none", ("gather",),
                   "bf16 reduce-scatter summed in fp32, then the shards all-gathered (fp32)"),
    CompressorInfo("rs-int8", "reduce-scatter", "quantise", True, "none", ("gather",),
                   "blockwise int8 quantised once, reduce-scattered one hop (ZeRO++'s all-to-all); shards gathered"),
    CompressorInfo("qgz", "reduce-scatter", "quantise", True, "none", ("gather", "gpus_per_node"),
                   "ZeRO++'s qgZ, int8: reduce-scattered in the node, re-quantised, then across; shards gathered"),
    CompressorInfo("rs-int8-ring", "reduce-scatter", "quantise", True, "none", ("gather",),
                   "int8 ring reduce-scatter re-quantising the running sum at each hop; shards gathered"),
    CompressorInfo("qgz4", "reduce-scatter", "quantise", True, "none", ("gather", "gpus_per_node"),
                   "ZeRO++'s qgZ as published, int4: in the node, then across; shards gathered"),
)
INFO: dict[str, CompressorInfo] = {c.name: c for c in DESCRIPTORS}
COMPRESSORS = tuple(INFO)
AG_FAMILY = tuple(c.name for c in DESCRIPTORS if c.family == "all-gather" and c.selection == "top-k")
AR_TOPK_FAMILY = tuple(c.name for c in DESCRIPTORS if c.selection in ("sketch", "leader"))
DENSITY_FREE = tuple(c.name for c in DESCRIPTORS if c.density_free)
SCOPES = ("tensor", "bucket")
MEMORIES = ("none", "ef14", "ef21", "ef21m")
SYNTHETIC_KINDS = ("normal", "laplace", "t3", "correlated")
MODELS = ("mlp", "mlp_wide", "cnn", "resnet18", "resnet50", "vit_b_16", "gpt2_small", "llama_60m", "llama_130m",
          "llama_350m", "llama_1b")
DATASETS = ("digits", "mnist1d", "synthetic-images", "synthetic-tokens", "python-text")
LIBRARY_NAMES = ("nccl", "gloo", "mpi", "ideal")  # collectives.libraries.LIBRARIES (a test holds them equal)
POLICIES = ("auto", "paper", "gate", "none")  # run/policies.py; gate: the error gate before issue 41
FUSIONS = ("bucket", "model")  # DDP buckets, each compressed on its own; or the whole gradient as one vector
HIERARCHIES = ("flat", "node", "both")  # --hierarchy (arcsim.compressors.hierarchy)
# the ratio grid stops at 0.3: a sparsifier at density 1 sends every entry (with its index, for the top-k
# family) and has dense's zero error, so it is never on the front; dense itself is the grid's end point
DEFAULT_RATIOS = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3)
LIVE_DEFAULTS = {"workers": 4, "steps": 3, "device": "cpu"}  # run --live, and a sweep's live settings
FRAMEWORKS = ("ddp", "horovod", "deepspeed")  # --framework (arcsim.strategy.frameworks)
MEASURE_DEVICES = ("cpu", "cuda")  # where arcsim run --measure-device runs a trace's compressors
DDP_BUCKET_MB = 25.0      # DDP's bucket_cap_mb default (--bucket-mb with --framework ddp)
HOROVOD_FUSION_MB = 64.0  # HOROVOD_FUSION_THRESHOLD's default (--bucket-mb with --framework horovod)
# DeepSpeed's engine (no ZeRO): gradients all-reduced after backward in buffers of MEMORY_OPT_ALLREDUCE_SIZE elements
# (deepspeed/runtime/engine.py, v0.3.0); as --bucket-mb's MiB of fp32 with --framework deepspeed
DEEPSPEED_BUFFER_ELEMENTS = 500_000_000
DEEPSPEED_BUFFER_MB = DEEPSPEED_BUFFER_ELEMENTS * 4 / 2**20
MAX_BUCKET_MB = 1e6  # a DDP bucket cap above this (about 1 TB of fp32) is a typo, not a bucket
BUCKET_MB_RANGE = f"a number of MiB in (0, {MAX_BUCKET_MB:g}], e.g. 25"


def bucket_mb_ok(value: float) -> bool:
    """Whether ``value`` is a bucket cap: finite, above 0 and at most MAX_BUCKET_MB (nan and inf are not)."""
    return 0 < value <= MAX_BUCKET_MB


def memory_for(compressor: str, memory: str | None) -> str:
    """The error feedback ``compressor`` runs with when ``memory`` is asked for (None: its default): ``none`` for one
    that keeps its own (DGC's momentum correction, 1-bit Adam's worker and server errors), which feedback on top
    would count twice."""
    info = INFO.get(compressor)
    if info is not None and info.own_memory:
        return "none"
    return memory or (info.default_memory if info is not None else "none")


def check_compression(compressors: tuple[str, ...], memory: str | None, error: type[Exception]) -> None:
    """Refuse an empty or unknown compressor list, or an unknown memory (None: each compressor's default)."""
    unknown = [c for c in compressors if c not in COMPRESSORS]
    if unknown or not compressors:
        raise error(f"unknown compressor {', '.join(unknown) or '(none given)'}; choose from {', '.join(COMPRESSORS)}")
    if memory is not None and memory not in MEMORIES:
        raise error(f"unknown memory {memory!r}; choose one of {', '.join(MEMORIES)}")


def options_for(compressor: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The subset of shared ``options`` (e.g. scope for a whole run) that ``compressor`` accepts (none for
    an unknown name, which make_compressor then refuses)."""
    accepted = INFO[compressor].options if compressor in INFO else ()
    return {k: v for k, v in options.items() if k in accepted}


def check_options(compressors: tuple[str, ...], options: Mapping[str, Any], error: type[Exception]) -> None:
    """Refuse an option no chosen compressor accepts (scope, a run-wide setting, is always allowed), and a
    scope that is not tensor or bucket."""
    for key in options:
        if key != "scope" and not any(key in INFO[c].options for c in compressors if c in INFO):
            takers = [c.name for c in DESCRIPTORS if key in c.options]
            raise error(f"option {key!r} applies to {', '.join(takers) or 'no compressor'}, none of which was "
                        "chosen; drop it or add one of them")
    if "scope" in options and options["scope"] not in SCOPES:
        raise error(scope_message(options["scope"]))


def fusion_message(fusion: object) -> str:
    return f"unknown fusion {fusion!r}; choose {' or '.join(FUSIONS)}"


def model_ref_problem(ref: str, with_args: bool) -> str | None:
    """What is wrong with a --model reference that shows without importing anything (None: nothing yet): a zoo
    model given --model-arg, or a bare name that is neither a zoo model nor an import path (path.py:build,
    package.module:build, hf:config.json)."""
    if ref in MODELS:
        return f"--model-arg goes with a model of your own; {ref} is a zoo model" if with_args else None
    if ":" not in ref:
        return (f"unknown model {ref!r}; choose one of: {', '.join(MODELS)}, or name your own as "
                "path/to/file.py:build, package.module:build or hf:config.json")
    return None


def hierarchy_message(name: str) -> str:
    return (f"unknown hierarchy {name!r}; choose flat (compress across every rank), node (dense inside a node, "
            "compressed between nodes) or both (price each compressor both ways)")


def unknown_library(name: str, role: str = "") -> str:
    """The one refusal of a library name (``role``, e.g. " for --library", says where it was given)."""
    return f"unknown library {name!r}{role}; choose one of {', '.join(LIBRARY_NAMES)}"


def scope_message(scope: object) -> str:
    return (f"unknown scope {scope!r}; choose tensor (k per layer, as the reference implementations) or "
            "bucket (one k over the whole bucket)")

# elements per block of the blockwise quantisers, one fp32 scale each (ZeRO++'s blockwise int8 and int4)
QUANT_BLOCK = 256

"""arcsim's compressors as DDP communication hooks: the code the simulator prices, in real training.

Follows PyTorch's contract, ``hook(state, bucket) -> torch.futures.Future[torch.Tensor]`` with a state
object (like PowerSGD's):

    state = CompressionState("arctopk", density=0.01, memory="ef14")
    ddp.register_comm_hook(state, compression_hook)

Each DDP bucket gets its own compressor and error-feedback memory (seeded ``seed + bucket index``, as
``arcsim run`` does), and the bucket's parameters give the compressor its layer layout. Collectives go
through :class:`~arcsim.comm.distributed.DistributedComm`, so ``state.comm.log`` is the CommLog of the
real run — the same records ``arcsim run`` prices. The hook is synchronous: its collectives finish
before it returns a completed future (the compressors are multi-phase, each phase depending on the
last), so DDP overlaps it with backward only between buckets.
"""

# No `from __future__ import annotations` here: DDP checks the hook's annotations as real objects.
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from arcsim.catalog import options_for
from arcsim.comm.distributed import DistributedComm
from arcsim.compressors import Compressor, make_compressor
from arcsim.compressors.base import Layer
from arcsim.compressors.memory import Memory, make_memory


@dataclass
class CompressionState:
    """What a compression hook keeps across buckets and iterations."""

    compressor: str
    density: float = 0.01
    memory: str = "ef14"
    seed: int = 0
    matrix_rank: int | None = None       # PowerSGD's low rank / ARC-Top-K's sketch columns (not the process rank)
    scope: str = "tensor"                 # top-k family: k per layer ("tensor") or per bucket
    options: dict = field(default_factory=dict)  # further descriptor options, e.g. {"unbiased": True}
    process_group: dist.ProcessGroup | None = None
    step: int = 0                         # iterations completed
    per_bucket: dict[tuple[int, int], tuple[Compressor, Memory]] = field(default_factory=dict)
    _comm: DistributedComm | None = None

    def __post_init__(self) -> None:
        self.make(0)  # refuse bad names, ratios and options now
        make_memory(self.memory)

    def options_for_compressor(self) -> dict:
        """The options this state's compressor is made with (rank included when set)."""
        rank = {} if self.matrix_rank is None else {"rank": self.matrix_rank}
        return {**options_for(self.compressor, {"scope": self.scope}), **self.options, **rank}

    def make(self, seed: int) -> Compressor:
        return make_compressor(self.compressor, self.density, seed=seed, **self.options_for_compressor())

    @property
    def comm(self) -> DistributedComm:
        if self._comm is None:
            self._comm = DistributedComm(self.process_group)
        return self._comm

    def for_bucket(self, index: int, numel: int) -> tuple[Compressor, Memory]:
        """The bucket's compressor and memory; a rebuilt bucket (DDP re-buckets once) gets fresh ones."""
        key = (index, numel)
        if key not in self.per_bucket:
            self.per_bucket[key] = (self.make(self.seed + index), make_memory(self.memory))
        return self.per_bucket[key]


def bucket_layout(bucket: dist.GradBucket) -> tuple[Layer, ...]:
    """The bucket's parameters as layers over its flat buffer."""
    layers, offset = [], 0
    for i, p in enumerate(bucket.parameters()):
        layers.append(Layer(f"p{i}", tuple(p.shape), offset))
        offset += p.numel()
    return tuple(layers)


def compress_bucket(state: CompressionState, index: int, flat: torch.Tensor,
                    layout: tuple[Layer, ...] | None) -> torch.Tensor:
    """This rank's gradient buffer in, the all-rank mean update out (same shape and dtype)."""
    comp, mem = state.for_bucket(index, flat.numel())
    update = mem.step(flat.detach().float().view(1, -1), comp, state.comm, state.step, layout)
    return update.view(-1).to(flat.dtype)


def compression_hook(state: CompressionState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: compress, communicate and decompress one bucket with arcsim's compressor."""
    out = compress_bucket(state, bucket.index(), bucket.buffer(), bucket_layout(bucket))
    if bucket.is_last():
        state.step += 1
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(out)
    return fut

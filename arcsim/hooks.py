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

**Node-aware** (``CompressionState(..., nodes=node_groups(gpus_per_node))``, ranks numbered node by node): a
dense reduce-scatter inside the node, each rank compressing its slice with its own compressor and memory
over its rail (the same local rank of every node), then an all-gather inside the node — what
:mod:`arcsim.compressors.hierarchy` simulates, record for record.

**A compressor per bucket** (what ``arcsim run`` recommends when a per-bucket mix wins):
``ddp.register_comm_hook(MixedState.load("plan.json"), mixed_hook)`` with the plan ``arcsim run --write-plan``
wrote (:mod:`arcsim.strategy.plan`); each bucket runs its own compressor through :func:`compress_bucket`.

``recording_hook`` with a :class:`RecordingState` records the user's own job instead: each rank keeps its
bucket gradients on chosen steps and all-reduces as DDP would; ``arcsim trace merge`` joins the ranks.
"""

# No `from __future__ import annotations` here: DDP checks the hook's annotations as real objects.
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from arcsim.catalog import memory_for, options_for
from arcsim.comm import Communicator
from arcsim.comm.distributed import DistributedComm, InNodeComm
from arcsim.compressors.grouping import slice_bounds, slice_layout, slice_seed
from arcsim.compressors.hierarchy import in_node_records
from arcsim.compressors.layout import Layer
from arcsim.compressors.memory import Memory, make_memory
from arcsim.compressors.registry import Compressor, make_compressor
from arcsim.errors import ArcsimError
from arcsim.files import atomic_path
from arcsim.strategy.plan import BucketPlan
from arcsim.topology import splits_into_nodes
from arcsim.traces.format import DTYPES, as_torch_dtype


@dataclass
class NodeGroups:
    """This rank's groups for node-aware compression: its node's ranks, and its rail (its local rank on every
    node)."""

    gpus_per_node: int
    nodes: int
    local_rank: int
    node: dist.ProcessGroup
    rail: dist.ProcessGroup


def node_groups(gpus_per_node: int) -> NodeGroups:
    """Make the node and rail groups of a job whose ranks are numbered node by node (rank = node × G + local
    rank, as torchrun numbers them). Every rank must call it, in the same order (``dist.new_group``)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    g = gpus_per_node
    if g < 2 or not splits_into_nodes(world, g):
        raise ValueError(f"node-aware compression needs two or more nodes of {g} ranks; the job has {world} ranks")
    nodes = world // g
    by_node = [dist.new_group(list(range(j * g, (j + 1) * g))) for j in range(nodes)]
    by_rail = [dist.new_group(list(range(local, world, g))) for local in range(g)]
    return NodeGroups(g, nodes, rank % g, by_node[rank // g], by_rail[rank % g])


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
    nodes: NodeGroups | None = None       # node-aware: the node and rail groups (node_groups); None: flat
    step: int = 0                         # iterations completed
    per_bucket: dict[tuple[int, int], tuple[Compressor, Memory]] = field(default_factory=dict)
    _comm: Communicator | None = None
    _node_comm: InNodeComm | None = None

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
    def comm(self) -> Communicator:
        """The communicator the compressor runs on: every rank, or node-aware this rank's rail (whose log also
        holds the dense steps inside the node)."""
        if self._comm is None:
            self._comm = (DistributedComm(self.process_group) if self.nodes is None else
                          DistributedComm(self.nodes.rail, "inter"))
        return self._comm

    @property
    def node_comm(self) -> InNodeComm:
        """Node-aware: the dense reduce-scatter and all-gather inside this rank's node."""
        if self.nodes is None:
            raise ValueError("flat compression has no collectives inside a node; give nodes=node_groups(G)")
        if self._node_comm is None:
            self._node_comm = InNodeComm(self.nodes.node)
        return self._node_comm

    def for_bucket(self, index: int, numel: int) -> tuple[Compressor, Memory]:
        """The bucket's compressor and memory (node-aware: those of this rank's slice of it, ``numel`` the slice's);
        a rebuilt bucket (DDP re-buckets once) gets fresh ones."""
        key = (index, numel)
        if key not in self.per_bucket:
            seed = self.seed + index if self.nodes is None else slice_seed(self.seed, index, self.nodes.local_rank)
            self.per_bucket[key] = (self.make(seed), make_memory(memory_for(self.compressor, self.memory)))
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
    if state.nodes is not None:
        return _compress_node_aware(state, state.nodes, index, flat, layout or (Layer("bucket", (flat.numel(),), 0),))
    comp, mem = state.for_bucket(index, flat.numel())
    update = mem.step(flat.detach().float().view(1, -1), comp, state.comm, state.step, layout)
    return update.view(-1).to(flat.dtype)


def _compress_node_aware(state: CompressionState, nodes: NodeGroups, index: int, flat: torch.Tensor,
                         layout: tuple[Layer, ...]) -> torch.Tensor:
    """Reduce-scatter inside the node (slices padded to one length), this rank's slice compressed over its
    rail, all-gather inside the node; each collective in ``state.comm.log`` with its group."""
    g, n = nodes.gpus_per_node, flat.numel()
    bounds = slice_bounds(n, g, layout)
    width = max(hi - lo for lo, hi in bounds)
    padded = torch.zeros(g, width)
    grad = flat.detach().float()
    for row, (lo, hi) in enumerate(bounds):
        padded[row, :hi - lo] = grad[lo:hi]
    mine = torch.empty(width)
    log, (scatter, gather) = state.comm.log, in_node_records(n, g)
    log.records.append(scatter)
    state.node_comm.reduce_scatter(mine, padded.view(-1))
    lo, hi = bounds[nodes.local_rank]
    comp, mem = state.for_bucket(index, hi - lo)  # by the slice's size: a rebuilt bucket's layout can move its cuts
    piece = mem.step((mine[:hi - lo] / g).view(1, -1), comp, state.comm, state.step, slice_layout(layout, lo, hi))
    out = torch.zeros(width)
    out[:hi - lo] = piece.view(-1)
    gathered = torch.empty(g * width)
    log.records.append(gather)
    state.node_comm.all_gather(gathered, out)
    rows = gathered.view(g, width)
    return torch.cat([rows[r, :b - a] for r, (a, b) in enumerate(bounds)]).to(flat.dtype)


def compression_hook(state: CompressionState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: compress, communicate and decompress one bucket with arcsim's compressor."""
    out = compress_bucket(state, bucket.index(), bucket.buffer(), bucket_layout(bucket))
    if bucket.is_last():
        state.step += 1
    return _completed(out)


def _completed(out: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(out)
    return fut


@dataclass
class MixedState:
    """What the per-bucket hook keeps: a :class:`CompressionState` per planned bucket (its compressor, ratio,
    memory and hierarchy; seeded ``plan.seed + bucket index``), their communicators shared (``comm.log`` holds
    every flat bucket's records). DDP's first iteration runs provisional buckets: one that is not the plan's is
    all-reduced dense then; after DDP rebuilds its buckets, one that is not the plan's is an error.
    ``nodes`` (:func:`node_groups`) is needed where the plan compresses a bucket node-aware."""

    plan: BucketPlan
    process_group: dist.ProcessGroup | None = None
    nodes: NodeGroups | None = None
    step: int = 0                                   # iterations completed
    states: dict[int, CompressionState] = field(default_factory=dict, init=False)  # by bucket index
    provisional: CompressionState = field(init=False)  # DDP's first-iteration buckets that are not the plan's
    _comms: dict[str, Communicator] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        node = [b.bucket for b in self.plan.buckets if b.hierarchy == "node"]
        if node and self.nodes is None:
            raise ArcsimError(f"the plan compresses bucket(s) {', '.join(map(str, node))} node-aware: give "
                              "nodes=node_groups(gpus_per_node)")
        for b in self.plan.buckets:  # no ratio (dense, fp16, bf16): 1
            self.states[b.bucket] = CompressionState(b.compressor, 1.0 if b.density is None else b.density,
                                                     b.memory, self.plan.seed, scope=self.plan.scope,
                                                     process_group=self.process_group,
                                                     nodes=self.nodes if b.hierarchy == "node" else None)
        self.provisional = CompressionState("dense", 1.0, "none", process_group=self.process_group)

    @classmethod
    def load(cls, path: str | Path, process_group: dist.ProcessGroup | None = None,
             nodes: NodeGroups | None = None) -> "MixedState":
        """The state of the plan ``arcsim run --write-plan`` wrote to ``path``."""
        return cls(BucketPlan.load(path), process_group, nodes)

    @property
    def comm(self) -> Communicator:
        """The flat buckets' communicator (node-aware ones share their rail's)."""
        return self._shared(self.provisional)

    def _shared(self, state: CompressionState) -> Communicator:
        way = "flat" if state.nodes is None else "node"
        if way not in self._comms:
            self._comms[way] = state.comm
        state._comm = self._comms[way]
        return state._comm

    def for_bucket(self, index: int, numel: int) -> CompressionState:
        """The state bucket ``index`` (``numel`` elements) runs with, at this iteration."""
        planned = self.plan.buckets[index] if index < len(self.plan.buckets) else None
        if planned is not None and planned.elements == numel:
            state = self.states[index]
        elif self.step == 0:  # DDP's provisional buckets, before it rebuilds them in ready order
            state = self.provisional
        else:
            raise ArcsimError(f"DDP's bucket {index} holds {numel:,} elements, the plan's "
                              + ("none" if planned is None else f"{planned.elements:,}")
                              + ": the job's buckets are not the plan's (give DDP bucket_cap_mb = arcsim run's "
                                "--bucket-mb, or leave both unset, and the run the job's model)")
        self._shared(state)
        state.step = self.step
        return state


def mixed_hook(state: MixedState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: each bucket compressed, communicated and decompressed with its planned compressor."""
    flat = bucket.buffer()
    out = compress_bucket(state.for_bucket(bucket.index(), flat.numel()), bucket.index(), flat, bucket_layout(bucket))
    if bucket.is_last():
        state.step += 1
    return _completed(out)


@dataclass
class RecordingState:
    """What the recording hook keeps: the steps to record and, per recorded step, this rank's gradient of
    every parameter (on the CPU, in ``dtype``: fp16 by default, as traces store them, half of fp32's memory),
    when each became ready, and the step's forward time; and once, the shapes and dtypes of the forward's
    input (:class:`arcsim.models.inputs.RecordedInput`, never its values), the autocast precision the
    forward ran under, and the optimizer when it is given. ``ranks`` (default: all) are the ranks that keep
    gradients; the others only all-reduce, and their ``save`` writes nothing.

    ``RecordingState.for_model(ddp, steps=(10, 20), optimizer=opt)``, then
    ``ddp.register_comm_hook(state, recording_hook)``; ``state.save(path)`` writes this rank's part, and
    ``arcsim trace merge`` (or :func:`arcsim.traces.merge.merge_recordings`) joins the recorded ranks' parts
    into one trace of as many workers. The hook still all-reduces every bucket, so training is unchanged.
    """

    names: dict
    steps: tuple
    process_group: dist.ProcessGroup | None = None
    optimizer: torch.optim.Optimizer | None = None
    dtype: str = "fp16"                        # what the kept gradients are held and saved in
    ranks: tuple | None = None                 # the ranks that keep gradients (None: all)
    step: int = 0                              # iterations completed
    grads: dict = field(default_factory=dict)  # step → {name: flat gradient, in dtype}
    ready: dict = field(default_factory=dict)  # step → {name: seconds from the end of forward}
    forward: dict = field(default_factory=dict)  # step → forward seconds
    order: list = field(default_factory=list)  # parameter names in the order their buckets became ready
    shapes: dict = field(default_factory=dict)
    inputs: dict | None = None                 # the first recorded forward's input (RecordedInput.to_meta)
    precision: str = "fp32"                    # the autocast the first recorded forward ran under
    _marks: list = field(default_factory=lambda: [0.0, 0.0])  # forward start, forward end

    @classmethod
    def for_model(cls, ddp: torch.nn.Module, steps: tuple, process_group: dist.ProcessGroup | None = None,
                  optimizer: torch.optim.Optimizer | None = None, dtype: str = "fp16",
                  ranks: tuple | None = None) -> "RecordingState":
        wanted = list(steps)
        if not wanted or len(set(wanted)) != len(wanted) or not all(isinstance(s, int) and s >= 0 for s in wanted):
            raise ArcsimError(f"steps {wanted} to record must be step numbers from 0, each once (e.g. (3, 5, 7))")
        if dtype not in DTYPES:
            raise ArcsimError(f"dtype {dtype!r} to keep the gradients in must be one of {', '.join(DTYPES)}")
        if ranks is not None:
            world = dist.get_world_size(process_group) if dist.is_initialized() else float("inf")
            if (len(set(ranks)) != len(ranks) or len(ranks) < 2
                    or not all(isinstance(r, int) and 0 <= r < world for r in ranks)):
                raise ArcsimError(f"ranks {list(ranks)} to record must be two or more ranks of the job, each once "
                                  "(e.g. (0, 1))")
            ranks = tuple(sorted(ranks))
        module = getattr(ddp, "module", ddp)
        state = cls({id(p): n for n, p in module.named_parameters()}, tuple(sorted(wanted)), process_group, optimizer,
                    dtype, ranks)
        module.register_forward_pre_hook(state._enter, with_kwargs=True)
        module.register_forward_hook(lambda *_: state._mark(1))
        return state

    def _enter(self, _module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        if self.inputs is None and self.step in self.steps:
            from arcsim.models.inputs import RecordedInput

            self.inputs = RecordedInput.of_call(args, kwargs).to_meta()
            self.precision = autocast_precision()
        self._mark(0)

    def _mark(self, which: int) -> None:
        self._marks[which] = time.perf_counter()

    def _rank(self) -> int:
        return dist.get_rank(self.process_group) if dist.is_initialized() else 0

    def records(self) -> bool:
        """Whether this rank keeps gradients (``ranks``)."""
        return self.ranks is None or self._rank() in self.ranks

    def save(self, path) -> None:
        """This rank's recorded steps (call after the last one): a .pt file ``arcsim trace merge`` reads; nothing
        on a rank that does not record (``ranks``)."""
        from arcsim.traces.training import describe_torch_optimizer

        if not self.records():
            return
        missing = [s for s in self.steps if s not in self.grads]
        if missing:
            raise RuntimeError(f"steps {missing} were never reached (the job ran {self.step} steps)")
        rank = self._rank()
        world = dist.get_world_size(self.process_group) if dist.is_initialized() else 1
        part = {"rank": rank, "world": world, "ranks": list(self.ranks or range(world)), "dtype": self.dtype,
                "steps": list(self.steps), "order": self.order,
                "shapes": self.shapes, "grads": {s: torch.cat([self.grads[s][n] for n in self.order])
                                                for s in self.steps},
                "ready_s": {s: [self.ready[s][n] for n in self.order] for s in self.steps},
                "forward_s": {s: self.forward[s] for s in self.steps},
                "inputs": self.inputs, "precision": self.precision,
                "optimizer": describe_torch_optimizer(self.optimizer) if self.optimizer is not None else None,
                "torch_version": str(torch.__version__)}
        with atomic_path(Path(path)) as tmp:  # a killed job leaves no half-written part
            torch.save(part, tmp)


def autocast_precision() -> str:
    """The precision autocast runs the current forward in: bf16, fp16, or fp32 when autocast is off."""
    for device_type in ("cuda", "cpu"):
        if torch.is_autocast_enabled(device_type):
            return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(torch.get_autocast_dtype(device_type), "fp32")
    return "fp32"


def recording_hook(state: RecordingState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: keep this rank's bucket gradients on the recorded steps, then all-reduce as DDP does."""
    if state.step in state.steps and state.records():
        now = time.perf_counter()
        grads, ready = state.grads.setdefault(state.step, {}), state.ready.setdefault(state.step, {})
        state.forward.setdefault(state.step, state._marks[1] - state._marks[0])
        for p, g in zip(bucket.parameters(), bucket.gradients(), strict=True):
            name = state.names[id(p)]
            grads[name] = g.detach().reshape(-1).to("cpu", as_torch_dtype(state.dtype), copy=True)
            ready[name] = now - state._marks[1]
            if name not in state.shapes:
                state.shapes[name] = list(p.shape)
                state.order.append(name)
    world = dist.get_world_size(state.process_group)
    buffer = bucket.buffer().div_(world)
    work = dist.all_reduce(buffer, group=state.process_group, async_op=True)
    if bucket.is_last():
        state.step += 1
    return work.get_future().then(lambda fut: fut.value()[0])

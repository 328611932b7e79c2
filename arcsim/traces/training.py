"""Data-parallel training of W workers simulated in one process: the source of real gradients.

At every training step all W workers compute gradients at the SAME parameters on DISJOINT shards of
one global batch; their average is applied by the optimizer (SGD with momentum, or AdamW; the model's own
by default), exactly what DDP does. With ``precision="bf16"`` forward and loss run under bf16 autocast, as
mixed-precision training does; parameters and gradients stay fp32. Recorded
steps (after ``warmup`` steps, then every ``every``) yield each worker's gradient, so later recorded
steps see a model that has trained, not a fresh initialisation. Each worker keeps its own BatchNorm
batch statistics (DDP without SyncBN). Forward, backward and each parameter's ready time are timed
per worker (CUDA events on a GPU, the host clock on the CPU).

A trace capture writes the recorded steps to a file; ``arcsim run --live`` feeds them straight to the
compressors (:mod:`arcsim.traces.live`). Memory does not grow with the number of steps: one step's
[W, d] gradients at a time.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from arcsim.compressors.layout import Layer
from arcsim.errors import ArcsimError
from arcsim.models import count_params
from arcsim.models.datasets import data_spec, make_dataset
from arcsim.models.source import ModelSource, UserBatches, model_source, to_device
from arcsim.traces.timing import ComputeTimer, StepTiming, resolve_device

OPTIMIZERS = ("sgd", "adamw")
DEFAULT_MOMENTUM, DEFAULT_BETAS = 0.9, (0.9, 0.999)
MAX_LR = 100.0  # far above any learning rate that trains; past it the first steps overflow the weights


def check_optimizer(lr: float | None, momentum: float | None, betas: tuple[float, float] | None,
                    weight_decay: float) -> None:
    """Refuse hyper-parameters no optimizer trains with, before any work (the one place they are checked)."""
    if lr is not None and not 0 < lr <= MAX_LR:
        raise ArcsimError(f"--lr must lie in (0, {MAX_LR:g}], got {lr:g}")
    if momentum is not None and not 0 <= momentum < 1:
        raise ArcsimError(f"--momentum must lie in [0, 1), got {momentum:g}: at 1 the velocity never forgets")
    if betas is not None and not all(0 <= b < 1 for b in betas):
        raise ArcsimError(f"--betas must each lie in [0, 1), got {','.join(f'{b:g}' for b in betas)}: at 1 "
                          "AdamW's averages never forget (its bias correction divides by zero)")
    if not 0 <= weight_decay <= 1:
        raise ArcsimError(f"--weight-decay must lie in [0, 1], got {weight_decay:g}")


def build_optimizer(params: Iterable[torch.nn.Parameter], name: str, lr: float, momentum: float | None = None,
                    betas: tuple[float, float] | None = None, weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """SGD with momentum (0.9 when None) or AdamW (betas (0.9, 0.999) when None): captures, live runs and
    `arcsim train` build the optimizer here."""
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=betas or DEFAULT_BETAS, weight_decay=weight_decay)
    return torch.optim.SGD(params, lr=lr, momentum=DEFAULT_MOMENTUM if momentum is None else momentum,
                           weight_decay=weight_decay)


def describe_torch_optimizer(optimizer: torch.optim.Optimizer) -> str:
    """An optimizer as traces record it, from its first parameter group: its class, lr, betas or momentum,
    weight decay (e.g. 'AdamW lr 0.001 betas (0.9, 0.999) weight decay 0')."""
    group = optimizer.param_groups[0]
    words = [type(optimizer).__name__, f"lr {float(group['lr']):g}"]
    if "betas" in group:
        words.append(f"betas ({float(group['betas'][0]):g}, {float(group['betas'][1]):g})")
    if "momentum" in group:
        words.append(f"momentum {float(group['momentum']):g}")
    return " ".join([*words, f"weight decay {float(group.get('weight_decay', 0)):g}"])


@dataclass
class TrainingConfig:
    """What data-parallel training produces gradients from (a capture and a live run alike)."""

    model: str                      # a zoo name or a factory's import path (arcsim.models.source)
    dataset: str | None = None
    workers: int = 8
    steps: int = 3
    every: int = 1
    warmup: int = 0
    batch: int | None = None        # per worker; the model's default when None
    device: str = "cpu"
    seed: int = 0
    lr: float | None = None
    input_size: int | None = None
    optimizer: str | None = None    # sgd or adamw; the model's when None
    momentum: float | None = None   # sgd (0.9 when None)
    betas: tuple[float, float] | None = None  # adamw ((0.9, 0.999) when None)
    weight_decay: float = 0.0
    precision: str = "fp32"         # fp32, or bf16 autocast
    model_args: tuple[str, ...] = ()  # --model-arg key=value, for a factory of the user's
    data: str | None = None         # --data file.py:batches, instead of a built-in dataset

    @property
    def source(self) -> ModelSource:
        return model_source(self.model, self.model_args)

    def optimizer_name(self) -> str:
        return self.optimizer or self.source.default_optimizer

    def learning_rate(self) -> float:
        return self.lr or self.source.default_lr

    def make_optimizer(self, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
        return build_optimizer(params, self.optimizer_name(), self.learning_rate(), self.momentum, self.betas,
                               self.weight_decay)

    def describe_optimizer(self) -> str:
        """What the trace says it trained with, e.g. 'AdamW lr 0.001 betas (0.9, 0.999) weight decay 0'."""
        return describe_torch_optimizer(self.make_optimizer([torch.nn.Parameter(torch.zeros(1))]))

    def check(self) -> None:
        """Refuse bad settings before any work; an unknown model or a missing CUDA device included."""
        source = self.source
        source.check()
        dataset = source.dataset_for(self.dataset, self.data, self.input_size)
        if self.optimizer not in (None, *OPTIMIZERS):
            raise ArcsimError(f"unknown optimizer {self.optimizer!r}; choose {' or '.join(OPTIMIZERS)}")
        if self.precision not in ("fp32", "bf16"):
            raise ArcsimError(f"unknown precision {self.precision!r}; choose fp32 or bf16")
        if self.momentum is not None and self.optimizer_name() != "sgd":
            raise ArcsimError(f"--momentum is SGD's; {self.model} trains with {self.optimizer_name()} (add "
                              "--optimizer sgd, or drop --momentum)")
        if self.betas is not None and self.optimizer_name() != "adamw":
            raise ArcsimError(f"--betas are AdamW's; {self.model} trains with {self.optimizer_name()} (add "
                              "--optimizer adamw, or drop --betas)")
        for name in ("steps", "every"):
            if getattr(self, name) < 1:
                raise ArcsimError(f"--{name} must be at least 1, got {getattr(self, name)}")
        if self.workers < 2:
            raise ArcsimError(f"--workers must be at least 2 (fidelity compares workers' gradients), got "
                              f"{self.workers}")
        if self.warmup < 0:
            raise ArcsimError(f"--warmup must be ≥ 0, got {self.warmup}")
        if self.batch is not None and self.batch < 1:
            raise ArcsimError(f"--batch must be at least 1, got {self.batch}")
        check_optimizer(self.lr, self.momentum, self.betas, self.weight_decay)
        resolve_device(self.device)
        source.try_forward(data_spec(dataset, self.input_size) if dataset else None, self.data)

    @property
    def on_gpu(self) -> bool:
        return self.device == "cuda"

    @property
    def total_steps(self) -> int:
        return self.warmup + (self.steps - 1) * self.every + 1

    def recorded(self, t: int) -> bool:
        return t >= self.warmup and (t - self.warmup) % self.every == 0

    def record_dtype(self) -> torch.dtype:
        """The dtype a recorded step's gradients are held in (a capture to fp16 holds them so: half the bytes)."""
        return torch.float32

    @property
    def recorded_steps(self) -> list[int]:
        return [t for t in range(self.total_steps) if self.recorded(t)]


def live_config(model: str, workers: int, steps: int, device: str, seed: int, dataset: str | None = None,
                batch: int | None = None, model_args: tuple[str, ...] = (), data: str | None = None,
                **optimizer: Any) -> TrainingConfig:
    """The training `arcsim run --live` (and a sweep's live axis) runs: one untimed warm-up step, so the
    timed steps are not the first call's (allocation, kernel selection)."""
    return TrainingConfig(model=model, dataset=dataset, workers=workers, steps=steps, warmup=1, batch=batch,
                          device=device, seed=seed, model_args=model_args, data=data, **optimizer)


@dataclass
class RecordedStep:
    step: int                   # the training step
    grads: torch.Tensor         # [workers, d] in cfg.record_dtype() on the training device, layers in backward order
    losses: list[float]         # each worker's loss
    timings: list[StepTiming]   # each worker's forward/backward/ready times

    def median_timing(self, layers: tuple[Layer, ...]) -> tuple[float, float, list[float]]:
        """Median over the workers of forward, backward and each layer's ready time."""
        end = statistics.median(tm.backward_s for tm in self.timings)
        return (statistics.median(tm.forward_s for tm in self.timings), end,
                [statistics.median(tm.ready_s.get(la.name, end) for tm in self.timings) for la in layers])


class DataParallelSteps:
    """Iterate to train; yields each recorded step. ``layers`` (backward order) is known after the first."""

    def __init__(self, cfg: TrainingConfig, progress: Callable[[int, int], None] | None = None) -> None:
        cfg.check()
        self.cfg = cfg
        self.source = cfg.source
        dataset = self.source.dataset_for(cfg.dataset, cfg.data, cfg.input_size)
        self.data = None if dataset is None else make_dataset(dataset, cfg.input_size)
        self.device = resolve_device(cfg.device)
        self.batch = cfg.batch or self.source.default_batch
        self.progress = progress
        self.layers: tuple[Layer, ...] = ()
        self.params = 0

    def __iter__(self) -> Iterator[RecordedStep]:
        cfg, dev, ds = self.cfg, self.device, self.data
        torch.manual_seed(cfg.seed)
        spec = ds.spec if ds is not None else None
        model = self.source.build(spec).to(dev).train()
        user = UserBatches(cfg.data, cfg.workers * self.batch, cfg.seed) if cfg.data is not None else None
        self.params = count_params(model)
        params = dict(model.named_parameters())
        opt = cfg.make_optimizer(model.parameters())
        autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cfg.precision == "bf16")
        gen = torch.Generator().manual_seed(cfg.seed)
        timer = ComputeTimer(model, dev)
        buf: torch.Tensor | None = None  # [workers, d]: the step being recorded (reused: one step in memory)
        try:
            for t in range(cfg.total_steps):
                if user is not None:
                    shards = user.shards(user.next(), cfg.workers)
                else:
                    assert ds is not None
                    x, y = ds.draw(cfg.workers * self.batch, gen)
                    shards = list(zip(x.chunk(cfg.workers), y.chunk(cfg.workers), strict=True))
                last = t == cfg.total_steps - 1  # nothing trains after it: no average, no optimizer state
                avg = {} if last else {name: torch.zeros_like(p) for name, p in params.items()}
                losses: list[float] = []
                timings: list[StepTiming] = []
                for shard in shards:
                    model.zero_grad(set_to_none=True)
                    on_device = to_device(shard, dev)

                    def forward(shard: Any = on_device) -> torch.Tensor:
                        with autocast:
                            return self.source.loss(model, shard, spec).float()

                    loss, timing = timer.run(forward)
                    if not self.layers:  # backward order, fixed by the first backward
                        order = timing.order + [n for n in params if n not in timing.order]
                        self.layers = _layout(order, params)
                    for name, p in params.items():
                        if p.grad is not None and not last:
                            avg[name] += p.grad / cfg.workers
                    if cfg.recorded(t):
                        if buf is None:
                            buf = torch.empty(cfg.workers, sum(la.numel for la in self.layers), device=dev,
                                              dtype=cfg.record_dtype())
                        _record(buf[len(losses)], params, self.layers)
                        losses.append(float(loss))
                        timings.append(timing)
                if cfg.recorded(t):
                    assert buf is not None  # a recorded step filled it
                    yield RecordedStep(t, buf, losses, timings)
                if not last:
                    for name, p in params.items():
                        p.grad = avg[name]
                    opt.step()
                if self.progress:
                    self.progress(t + 1, cfg.total_steps)
        finally:
            timer.close()


def _record(row: torch.Tensor, params: Mapping[str, torch.Tensor], layers: tuple[Layer, ...]) -> None:
    """One worker's gradients into ``row`` (layers in backward order), cast layer by layer to its dtype: no copy
    of the whole model's gradients in between (a 1 B-parameter model's is 5 GB)."""
    for la in layers:
        grad = params[la.name].grad
        part = row[la.offset:la.offset + la.numel]
        if grad is None:
            part.zero_()
        else:
            part.copy_(grad.detach().reshape(-1))


def _layout(order: list[str], params: Mapping[str, torch.Tensor]) -> tuple[Layer, ...]:
    layers, offset = [], 0
    for name in order:
        layers.append(Layer(name, tuple(params[name].shape), offset))
        offset += params[name].numel()
    return tuple(layers)

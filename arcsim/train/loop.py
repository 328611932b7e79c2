"""Real data-parallel training of W simulated workers in one process, through a compressor.

Every step each worker computes the gradient of its own shard of the global batch (real forward and
backward on the shared parameters, as synchronous data parallelism keeps them equal); the [W, d]
gradients go bucket by bucket through the compressor and its error feedback over the in-process
Communicator (``BucketedCompression``, the code `arcsim run` measures with); the aggregated update is
the gradient the optimizer applies (the model's own — SGD with momentum; AdamW for the LLaMAs — or
``--optimizer``), forward and loss under bf16 autocast with ``precision="bf16"``. The model is any model
source (a zoo name, ``file.py:build``, ``pkg.mod:build``, ``hf:CONFIG.json``) on a built-in dataset with a
held-out split. Loss is recorded every step, held-out accuracy (next-token accuracy for token data) and
held-out loss every ``eval_every`` steps, and the step's CommLog records are kept so the run can be priced
on a topology afterwards.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from arcsim.catalog import DDP_BUCKET_MB, FUSIONS, check_compression, fusion_message
from arcsim.compressors.grouping import Grouping, group_workers
from arcsim.compressors.layout import Layer
from arcsim.errors import ArcsimError
from arcsim.files import writable_cache_dir
from arcsim.models.datasets import DATASETS, Dataset, data_spec, make_dataset
from arcsim.models.source import ModelSource, model_source, output_logits
from arcsim.run.measure import BucketedCompression
from arcsim.run.measurement import Measurement
from arcsim.strategy.buckets import Bucket, make_buckets
from arcsim.traces.profile import ComputeProfile, load_profile
from arcsim.traces.timing import measure_profile
from arcsim.traces.training import OPTIMIZERS, build_optimizer, check_optimizer
from arcsim.train.estimate import descent_ratio


@dataclass
class TrainConfig:
    model: str = "cnn"            # a zoo name or a factory's import path (arcsim.models.source)
    dataset: str = "digits"
    workers: int = 8
    compressors: tuple[str, ...] = ("dense", "topk", "arctopk", "star", "randk")
    density: float = 0.1
    memory: str = "ef14"
    steps: int = 300
    batch: int = 16               # per worker
    lr: float | None = None       # None: the model's default
    momentum: float = 0.9
    eval_every: int = 10
    seeds: tuple[int, ...] = (0,)
    bucket_mb: float = DDP_BUCKET_MB
    compute_profile: str | None = None  # compute timings for pricing (default: measured here, on the CPU)
    scope: str = "tensor"         # top-k family: k per layer or per bucket
    fusion: str = "bucket"        # bucket: DDP buckets; model: the whole gradient as one vector
    model_args: tuple[str, ...] = ()  # --model-arg key=value, for a factory of the user's
    optimizer: str | None = None  # sgd or adamw; the model's when None
    betas: tuple[float, float] | None = None  # adamw's ((0.9, 0.999) when None)
    weight_decay: float = 0.0
    precision: str = "fp32"       # fp32, or bf16 autocast
    hierarchy: str = "flat"       # flat, or node: node-aware compression (arcsim.compressors.hierarchy)
    gpus_per_node: int = 0        # node-aware: the priced topology's GPUs per node
    input_size: int | None = None  # image side or sequence length (None: the dataset's)

    @property
    def source(self) -> ModelSource:
        return model_source(self.model, self.model_args)

    @property
    def optimizer_name(self) -> str:
        return self.optimizer or self.source.default_optimizer

    def extra_key(self) -> dict[str, object]:
        """The settings added since experiments were first keyed, where not at their defaults (so that older
        directories still resume)."""
        given = {"model_args": list(self.model_args), "optimizer": self.optimizer,
                 "betas": list(self.betas) if self.betas else None, "weight_decay": self.weight_decay,
                 "precision": None if self.precision == "fp32" else self.precision,
                 "hierarchy": None if self.hierarchy == "flat" else self.hierarchy,
                 "gpus_per_node": self.gpus_per_node if self.hierarchy != "flat" else None,
                 "input_size": self.input_size}
        return {k: v for k, v in given.items() if v}

    def check(self) -> None:
        writable_cache_dir()
        self.source.check()
        if self.dataset not in DATASETS:
            raise ArcsimError(f"unknown dataset {self.dataset!r}; choose one of: {', '.join(DATASETS)}")
        if self.optimizer not in (None, *OPTIMIZERS):
            raise ArcsimError(f"unknown optimizer {self.optimizer!r}; choose {' or '.join(OPTIMIZERS)}")
        if self.betas is not None and self.optimizer_name != "adamw":
            raise ArcsimError(f"--betas are AdamW's; {self.model} trains with {self.optimizer_name} (add "
                              "--optimizer adamw, or drop --betas)")
        if self.momentum != 0.9 and self.optimizer_name != "sgd":
            raise ArcsimError(f"--momentum is SGD's; {self.model} trains with {self.optimizer_name} (add "
                              "--optimizer sgd, or drop --momentum)")
        if self.precision not in ("fp32", "bf16"):
            raise ArcsimError(f"unknown precision {self.precision!r}; choose fp32 or bf16")
        check_compression(self.compressors, self.memory, ArcsimError)
        if not 0 < self.density <= 1:
            raise ArcsimError(f"--density must lie in (0, 1], got {self.density}")
        for name, value in (("--steps", self.steps), ("--batch", self.batch), ("--eval-every", self.eval_every)):
            if value < 1:
                raise ArcsimError(f"{name} must be at least 1, got {value}")
        if self.workers < 2:
            raise ArcsimError(f"--workers must be at least 2 for data-parallel training, got {self.workers}")
        check_optimizer(self.lr, self.momentum, self.betas, self.weight_decay)
        if not self.seeds:
            raise ArcsimError("--seeds is empty; give at least one, e.g. 0,1,2")
        if self.fusion not in FUSIONS:
            raise ArcsimError(fusion_message(self.fusion))
        if self.hierarchy not in ("flat", "node"):
            raise ArcsimError(f"--hierarchy {self.hierarchy}: train runs one hierarchy, flat or node (both is for "
                              "arcsim run, which prices each compressor both ways, and for --network-schedule, "
                              "whose policies choose)")
        self.grouping()  # node-aware: the workers must make two or more nodes
        # a wrong model (or input size) fails before the data is made
        self.source.try_forward(data_spec(self.dataset, self.input_size), None)

    def grouping(self) -> Grouping | None:
        """Node-aware: the workers grouped into nodes of the priced topology (None: flat)."""
        if self.hierarchy == "flat":
            return None
        if self.gpus_per_node < 2:
            raise ArcsimError("--hierarchy node compresses between nodes of a topology: give --topology with two or "
                              "more GPUs per node (e.g. 4x8-eth25-a100-nvlink)")
        return group_workers(self.workers, self.gpus_per_node)


@dataclass
class History:
    """One (compressor, seed) training run."""

    compressor: str
    seed: int
    memory: str
    measurement: Measurement                                           # per-step records for pricing
    loss: list[float] = field(default_factory=list)                   # mean worker loss per step
    eval_steps: list[int] = field(default_factory=list)               # steps after which it was evaluated
    accuracy: list[float] = field(default_factory=list)               # held-out; NaN for a model without logits
    val_loss: list[float] = field(default_factory=list)               # held-out loss
    descent: list[float] = field(default_factory=list)                # per step ⟨ḡ, update⟩/‖ḡ‖² (train.estimate)
    diverged_at: int | None = None


PROFILE_REPEATS = 3  # timed CPU iterations of the compute profile (after one untimed): a large model's take seconds


@dataclass
class Setup:
    """What every run of a config shares: data, layer layout, buckets and the compute profile."""

    source: ModelSource
    data: Dataset
    layers: tuple[Layer, ...]
    buckets: list[Bucket]
    profile: ComputeProfile
    precision: str = "fp32"
    profile_path: str | None = None  # the --compute-profile the profile was read from (None: measured here)
    input_size: int | None = None    # the image side or sequence length trained (None: the dataset's)

    @property
    def elements(self) -> int:
        """Parameters in the flat gradient vector."""
        return self.layers[-1].offset + self.layers[-1].numel


def prepare(cfg: TrainConfig) -> Setup:
    cfg.check()
    source = cfg.source
    data = make_dataset(cfg.dataset, cfg.input_size)
    if data.held_out() is None:
        raise ArcsimError(f"dataset {cfg.dataset} has no held-out split to measure accuracy on; use digits, "
                          "mnist1d or python-text")
    if hasattr(data, "x") and cfg.workers * cfg.batch > len(data.x):
        raise ArcsimError(f"{cfg.workers} workers × batch {cfg.batch} exceeds the {len(data.x)} training examples of "
                          f"{cfg.dataset}; use fewer workers or a smaller --batch")
    torch.manual_seed(0)
    model = source.build(data.spec)  # fails early, with the reason, when the model does not fit the data
    x, y = data.draw(min(2, cfg.batch), torch.Generator().manual_seed(0))
    source.loss(model, (x, y), data.spec)  # and when its forward rejects the data or returns no loss
    params = dict(model.named_parameters())
    if cfg.compute_profile:
        profile = load_profile(cfg.compute_profile)
        have = {la.name: la.numel for la in profile.layers}
        if have != {n: p.numel() for n, p in params.items()}:
            raise ArcsimError(f"compute profile {cfg.compute_profile} is not of {cfg.model} on {cfg.dataset}; "
                              f"write one with `arcsim trace profile --model {cfg.model} --dataset {cfg.dataset}`")
    else:
        profile = measure_profile(source, cfg.batch, "cpu", dataset=cfg.dataset, input_size=cfg.input_size,
                                  repeats=PROFILE_REPEATS, warmup=1,
                                  bf16=cfg.precision == "bf16")
    order = [la.name for la in profile.layers] + [n for n in params if n not in {la.name for la in profile.layers}]
    layers, offset = [], 0
    for name in order:  # backward order, contiguous in the flat gradient vector
        layers.append(Layer(name, tuple(params[name].shape), offset))
        offset += params[name].numel()
    ready = {la.name: la.ready_s for la in profile.layers}
    cap = float("inf") if cfg.fusion == "model" else cfg.bucket_mb * 2**20
    buckets = make_buckets(layers, [ready.get(la.name, profile.backward_s) for la in layers], cap)
    return Setup(source, data, tuple(layers), buckets, profile, cfg.precision, cfg.compute_profile, cfg.input_size)


def evaluate(model: torch.nn.Module, source: ModelSource, data: Dataset) -> tuple[float, float]:
    """Held-out accuracy (of the class, or for token data of the next token; NaN for a model that returns a
    loss and no logits) and held-out loss (the mean of the batches' losses, the model's own rule), evaluated
    8 examples at a time (a language model's logits over its vocabulary are large)."""
    x, y = data.held_out()  # type: ignore[misc]
    correct, losses, sizes = 0.0, [], []
    model.eval()
    with torch.no_grad():
        for xs, ys in zip(x.split(8), y.split(8), strict=True):
            out = source.forward(model, xs, ys)
            logits = output_logits(out)
            if logits is not None and logits.ndim == ys.ndim + 1:
                correct += int((logits.argmax(dim=-1) == ys).sum())
                losses.append(float(source.loss_of_output(out, ys, data.spec)))
            else:
                correct = math.nan
                losses.append(float(source.loss(model, (xs, ys), data.spec)))
            sizes.append(len(xs))
    model.train()
    return correct / y.numel(), float(np.average(losses, weights=sizes))


def sgd_momentum(cfg: TrainConfig) -> float:
    """SGD's momentum for this run: off under EF21M, whose update h̄ already carries momentum
    (v ← (1 − η) v + η g), so the step is x ← x − γ·h̄ as the method prescribes."""
    return 0.0 if cfg.memory == "ef21m" else cfg.momentum


Before = Callable[[int, torch.Tensor, "TrainingRun"], None]  # (step, [W, d] gradients, run): may switch


class TrainingRun:
    """One run advanced a step at a time: the model, its optimizer, the compressor with its error feedback,
    the batch generator's state and the history so far. It pickles whole (``torch.save``): a checkpoint."""

    def __init__(self, cfg: TrainConfig, setup: Setup, compressor: str, seed: int,
                 density: float | None = None, timed: bool = True) -> None:
        """``timed``: time each bucket's compression here (False when steps are priced on a modelled GPU, which
        never reads these times)."""
        torch.manual_seed(seed)
        self.model = setup.source.build(setup.data.spec)
        self.opt = build_optimizer(self.model.parameters(), cfg.optimizer_name, cfg.lr or setup.source.default_lr,
                                   sgd_momentum(cfg), cfg.betas, cfg.weight_decay)
        options: dict[str, object] = {"scope": cfg.scope}
        if cfg.optimizer_name == "sgd":  # DGC at SGD's momentum, its update handed to it (compressors/dgc.py)
            options.update(momentum=sgd_momentum(cfg), optimizer_momentum=True)
        self.bc = BucketedCompression(setup.buckets, compressor, cfg.density if density is None else density,
                                      cfg.memory, seed=seed, options=options, timed=timed, grouping=cfg.grouping())
        self.hist = History(compressor, seed, self.bc.memory,
                            Measurement(compressor, self.bc.density, self.bc.memory, setup.elements, cfg.hierarchy))
        self.generator = torch.Generator().manual_seed(seed).get_state()  # a state: Generators do not pickle
        self.step = 0  # the next step to train

    def advance(self, cfg: TrainConfig, setup: Setup, before: Before | None = None) -> bool:
        """Train one step (``before`` sees the gradients first and may switch the compressor); False once the
        run has diverged."""
        params = dict(self.model.named_parameters())
        gen = torch.Generator()
        gen.set_state(self.generator)
        x, y = setup.data.draw(cfg.workers * cfg.batch, gen)
        self.generator = gen.get_state()
        grads = torch.empty(cfg.workers, setup.elements)
        losses = []
        autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.precision == "bf16")
        for w, (xw, yw) in enumerate(zip(x.chunk(cfg.workers), y.chunk(cfg.workers), strict=True)):
            self.model.zero_grad(set_to_none=True)
            with autocast:
                loss = setup.source.loss(self.model, (xw, yw), setup.data.spec)
            loss.backward()
            losses.append(loss.item())
            for la in setup.layers:
                p = params[la.name]
                grads[w, la.offset:la.offset + la.numel] = 0.0 if p.grad is None else p.grad.reshape(-1)
        step, hist = self.step, self.hist
        hist.loss.append(float(np.mean(losses)))
        if not np.isfinite(hist.loss[-1]):  # the last update broke the model: record what it now predicts
            hist.diverged_at = step
            self._evaluate(step + 1, setup)
            return False
        if before is not None:
            before(step, grads, self)
        mean = grads.mean(dim=0)
        parts, row = self.bc.step(step, grads)
        update = torch.cat(parts, dim=1)
        hist.measurement.add(row)
        hist.descent.append(descent_ratio(mean, update[0]))
        for la in setup.layers:
            params[la.name].grad = update[0, la.offset:la.offset + la.numel].reshape(la.shape)
        self.opt.step()
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
            self._evaluate(step + 1, setup)
        self.step += 1
        return True

    def _evaluate(self, after: int, setup: Setup) -> None:
        acc, loss = evaluate(self.model, setup.source, setup.data)
        self.hist.eval_steps.append(after)
        self.hist.accuracy.append(acc)
        self.hist.val_loss.append(loss)


def train(cfg: TrainConfig, setup: Setup, compressor: str, seed: int,
          progress: Callable[[int], None] | None = None) -> History:
    """Train from the same initial weights and batches for every compressor of a seed."""
    run = TrainingRun(cfg, setup, compressor, seed)
    while run.step < cfg.steps and run.advance(cfg, setup):
        if progress:
            progress(1)
    return run.hist

"""Where a model comes from: the zoo, or a user's factory named by import path — one interface.

``--model cnn`` is a zoo entry; ``--model path/to/file.py:build`` or ``--model my_pkg.models:build`` is a
callable returning an ``nn.Module``, called with the ``--model-arg key=value`` pairs (values read as YAML
scalars: 8 is an int, 0.1 a float, true a flag). ``--model hf:CONFIG.json`` (or ``hf:llama``, a model type,
with its config's fields as ``--model-arg``) is a HuggingFace causal LM built from its config by
transformers: no weights, no download. Capture, live runs, `trace profile` and the device model
take a :class:`ModelSource` and never ask which kind it is. A trace records the source (``model_source``
in its metadata), so `arcsim run` can rebuild the model on the meta device and price its compute on a GPU.

How a batch becomes a loss: a zoo model keeps its own rule (cross-entropy of ``model(x)`` against ``y``).
Otherwise a dict batch is passed as ``model(**batch)``, a tuple or list as ``model(*batch)``, anything else
as ``model(batch)``; the result is the loss — a scalar tensor, an object with ``.loss`` as HuggingFace
models return, or a tuple holding it as nanoGPT's ``(logits, loss)``. A user's model on a built-in dataset
gets ``model(x, targets=y)`` when its forward takes ``targets`` (nanoGPT's contract: it computes its own loss,
and only then returns logits at every position), else ``model(x)``; a result that is not a loss is taken as
logits (a tensor, ``.logits``, a tuple's first) for the dataset's cross-entropy.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from arcsim.catalog import model_ref_problem
from arcsim.models import MODELS, ModelEntry, loss_fn
from arcsim.models.dataspec import DatasetError, DataSpec
from arcsim.models.inputs import RecordedInput

if TYPE_CHECKING:  # torch loads where a model is built or fed, not where a trace names its model
    import torch
    from torch import nn

# a user's model trains, unless told otherwise, as most transformers do
USER_OPTIMIZER, USER_LR, USER_BATCH = "adamw", 1e-3, 8


class ModelError(DatasetError):
    """A model that cannot be found, built, or trained as given."""


def parse_args(pairs: Sequence[str], what: str = "--model-arg") -> tuple[tuple[str, Any], ...]:
    """``key=value`` pairs (values as YAML scalars), in order; one error names the pair at fault."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip().isidentifier():
            raise ModelError(f"{what} {pair!r}: write key=value with a Python name as the key (e.g. {what} depth=4)")
        try:
            value = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError:
            value = text
        if isinstance(value, dict | list):
            value = text  # a plain string: structures come from the factory's own defaults
        if key.strip() in out:
            raise ModelError(f"{what} gives {key.strip()} twice")
        out[key.strip()] = value
    return tuple(out.items())


@contextmanager
def user_code(what: str) -> Iterator[None]:
    """Around every call into a user's code: its prints go to stderr (stdout may be carrying ``--json -``), and
    its ``sys.exit`` is one error naming it, not arcsim's own exit."""
    try:
        with redirect_stdout(sys.stderr):
            yield
    except SystemExit as exc:
        raise ModelError(f"{what} called sys.exit({exc.code!r}); return or raise an exception instead") from None


@lru_cache(maxsize=32)
def _file_module(path: str, mtime_ns: int) -> ModuleType:
    """A user's .py file executed as a module once per version of it (checks, builds and batches share it)."""
    name = f"_arcsim_user_{hashlib.sha1(path.encode()).hexdigest()[:12]}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path} as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look their module up
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def load_callable(ref: str, what: str) -> Callable[..., Any]:
    """``file.py:name`` or ``package.module:name`` → the object; one ModelError for every way it can fail."""
    target, sep, attr = ref.rpartition(":")
    if not sep or not target or not attr.isidentifier():
        raise ModelError(f"{what} {ref!r}: name a callable as path/to/file.py:name or package.module:name")
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise ModelError(f"{what} {ref!r}: no such file {target}")
        try:
            with user_code(f"{what} {ref!r}: importing {target}"):
                module = _file_module(str(path.resolve()), path.stat().st_mtime_ns)
        except ModelError:
            raise
        except Exception as exc:  # the user's code: any failure is theirs to see, in one line
            raise ModelError(f"{what} {ref!r}: importing {target} failed: {type(exc).__name__}: {exc}") from None
    else:
        try:
            with user_code(f"{what} {ref!r}: importing {target}"):
                module = importlib.import_module(target)
        except ModelError:
            raise
        except ModuleNotFoundError as exc:
            raise ModelError(f"{what} {ref!r}: no module {exc.name!r} (is it installed, or on PYTHONPATH?)") from None
        except Exception as exc:
            raise ModelError(f"{what} {ref!r}: importing {target} failed: {type(exc).__name__}: {exc}") from None
    found = getattr(module, attr, None)
    if found is None or not callable(found):
        raise ModelError(f"{what} {ref!r}: {target} has no callable {attr!r}")
    return found


def call_user(fn: Callable[..., Any], args: dict[str, Any], what: str) -> Any:
    try:
        with user_code(what):
            return fn(**args)
    except ModelError:
        raise
    except Exception as exc:
        raise ModelError(f"{what} raised {type(exc).__name__}: {exc}") from None


def _is_loss(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor) and value.ndim == 0 and value.is_floating_point()


def output_loss(out: Any) -> torch.Tensor | None:
    """The loss in a forward's result, as popular code returns it: a scalar tensor, ``.loss`` (HuggingFace's
    ``ModelOutput``), or the scalar in a tuple (nanoGPT's ``(logits, loss)``); None when there is none."""
    if _is_loss(out):
        return out
    if _is_loss(getattr(out, "loss", None)):
        return out.loss
    if isinstance(out, tuple | list):
        return next((v for v in out if _is_loss(v)), None)
    return None


def output_logits(out: Any) -> torch.Tensor | None:
    """The logits in a forward's result: a tensor, ``.logits``, or the first tensor of a tuple."""
    import torch

    if isinstance(out, torch.Tensor) and out.ndim > 0:
        return out
    if isinstance(getattr(out, "logits", None), torch.Tensor):
        return out.logits
    if isinstance(out, tuple | list):
        return next((v for v in out if isinstance(v, torch.Tensor) and v.ndim > 0), None)
    return None


def loss_of(result: Any, what: str) -> torch.Tensor:
    """The loss a forward returned (:func:`output_loss`), or one error saying what came back instead."""
    import torch

    loss = output_loss(result)
    if loss is not None:
        return loss
    got = type(result).__name__ + (f" of shape {tuple(result.shape)}" if isinstance(result, torch.Tensor) else "")
    raise ModelError(f"{what} returned {got}, not a loss: return a scalar tensor, an object with .loss, or a "
                     "tuple holding the loss (as nanoGPT's (logits, loss))")


def recorded_loss(data: RecordedInput, model: nn.Module, example: tuple[list[Any], dict[str, Any]],
                  what: str) -> torch.Tensor:
    """The model on ``example`` of ``data``: the loss it returns, else the sum of its output (logits) as the loss."""
    args, kwargs = example
    try:
        out = model(*args, **kwargs)
    except Exception as exc:
        raise ModelError(f"{what} rejected the recorded input ({data.describe()}): {type(exc).__name__}: "
                         f"{str(exc)[:300]}") from None
    loss = output_loss(out)
    if loss is not None:
        return loss
    logits = output_logits(out)
    if logits is None or not logits.is_floating_point():
        raise ModelError(f"{what} returned {type(out).__name__} on the recorded input: neither a loss nor a "
                         "tensor of logits")
    return logits.float().sum()


def call_forward(model: nn.Module, batch: Any) -> Any:
    """A user's batch through the model by its type: dict → ``model(**b)``, tuple/list → ``model(*b)``, else
    ``model(b)``."""
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, tuple | list):
        return model(*batch)
    return model(batch)


def forward_loss(model: nn.Module, batch: Any, what: str) -> torch.Tensor:
    """The loss of a user's batch through the model (:func:`call_forward`)."""
    try:
        with user_code(what):
            result = call_forward(model, batch)
    except ModelError:
        raise
    except Exception as exc:
        raise ModelError(f"{what} rejected a batch: {type(exc).__name__}: {str(exc)[:300]}") from None
    return loss_of(result, what)


def takes_targets(model: nn.Module) -> bool:
    """Whether the model's forward takes ``targets`` by name, as nanoGPT's ``forward(idx, targets=None)``. (A
    HuggingFace model's ``labels`` are the inputs, shifted inside it, so a dataset's next tokens are not passed
    as labels.)"""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
    return "targets" in params


def _trainable(loss: torch.Tensor, ref: str) -> torch.Tensor:
    """A user model's loss, refused when gradients are wanted and it does not depend on the parameters."""
    import torch

    if torch.is_grad_enabled() and not loss.requires_grad:
        raise ModelError(f"--model {ref} returned a loss that does not depend on its parameters (no gradient flows "
                         "back: detached, computed under no_grad, or from the inputs alone)")
    return loss


@dataclass(frozen=True)
class ModelSource:
    """A model to train: a zoo entry (``ref`` its name) or a user's factory (``ref`` its import path)."""

    ref: str
    args: tuple[tuple[str, Any], ...] = ()

    @property
    def entry(self) -> ModelEntry | None:
        return MODELS.get(self.ref)

    @property
    def label(self) -> str:
        """The model's name in outputs and trace metadata: the zoo name, or the factory's name."""
        if self.entry:
            return self.ref
        if self.ref.startswith("hf:"):
            return f"hf:{Path(self.ref[3:]).stem}"
        target, _, name = self.ref.rpartition(":")
        return f"{Path(target).stem if target.endswith('.py') else target}:{name}"

    @property
    def default_dataset(self) -> str | None:
        return self.entry.default_dataset if self.entry else None

    @property
    def default_batch(self) -> int:
        return self.entry.default_batch if self.entry else USER_BATCH

    @property
    def default_optimizer(self) -> str:
        return self.entry.optimizer if self.entry else USER_OPTIMIZER

    @property
    def default_lr(self) -> float:
        return self.entry.lr if self.entry else USER_LR

    def check(self) -> None:
        """Find the factory (importing the user's file or module), without building the model."""
        problem = model_ref_problem(self.ref, bool(self.args))
        if problem:
            raise ModelError(problem)
        if self.entry is not None:
            return
        if self.ref.startswith("hf:"):
            hf_config(self.ref, dict(self.args))
            return
        load_callable(self.ref, "--model")

    def dataset_for(self, dataset: str | None, data: str | RecordedInput | None,
                    input_size: int | None = None) -> str | None:
        """The built-in dataset this model is fed (None when the user's ``data``, or a recorded job's input, feeds
        it), after checking that exactly one of the two is there: one rule for capture, profiles and the device
        model's count."""
        if data is not None:
            if dataset is not None or input_size is not None:
                raise ModelError("--data gives the batches: drop --dataset and --input-size (--seq-len)")
            if isinstance(data, str):
                load_callable(data, "--data")
            return None
        if dataset is None and self.default_dataset is None:
            raise ModelError(f"--model {self.ref} is your own: give --dataset (a built-in dataset its forward "
                             "takes, e.g. python-text) or --data file.py:batches")
        return dataset or self.default_dataset

    def build(self, spec: DataSpec | None) -> nn.Module:
        """The model (on the current default device), for ``spec`` when it is a zoo model."""
        from torch import nn

        if self.entry is not None:
            if spec is None:
                raise ModelError(f"{self.ref} is built for a dataset; give --dataset")
            return self.entry.build(spec)
        if self.ref.startswith("hf:"):
            from transformers import AutoModelForCausalLM

            config = hf_config(self.ref, dict(self.args))
            return call_user(lambda: AutoModelForCausalLM.from_config(config), {}, f"--model {self.ref}")
        model = call_user(load_callable(self.ref, "--model"), dict(self.args), f"--model {self.ref}")
        if not isinstance(model, nn.Module):
            raise ModelError(f"--model {self.ref} returned {type(model).__name__}, not a torch.nn.Module")
        params = list(model.parameters())
        if not any(p.requires_grad for p in params):
            held = "only frozen parameters (requires_grad=False)" if params else "no parameters"
            raise ModelError(f"--model {self.ref} returned a module with {held}: there is no gradient to compress")
        return model

    def try_forward(self, spec: DataSpec | None, data: str | None) -> None:
        """One forward of a user's model on 2 examples on the meta device (shapes only, nothing computed, no data
        made), so that a forward that raises, or returns neither a loss nor logits, is refused before any data is
        prepared; a forward the meta device cannot run (one that reads values) is left to the real run."""
        import torch

        if self.entry is not None:
            return
        with torch.device("meta"):
            model = self.build(spec)
            if spec is not None:
                x = torch.zeros((2, *spec.shape), dtype=torch.long if spec.kind == "tokens" else torch.float)
                batch: Any = (x, torch.zeros(x.shape if spec.kind == "tokens" else (2,), dtype=torch.long))
        if spec is None:
            assert data is not None
            batches = UserBatches(data, 2, 0)
            first = batches.next()
            batches.shards(first, 1)  # a batch that cannot be split over workers is refused as such first
            batch = to_device(first, torch.device("meta"))
        what = f"a batch of {spec.kind} data, shape {tuple(batch[0].shape)}" if spec else "a batch of --data"
        try:
            with torch.device("meta"), user_code(f"--model {self.ref}"):
                out = self.forward(model, *batch) if spec is not None else call_forward(model, batch)
        except ModelError:
            raise
        except Exception as exc:
            if isinstance(exc, NotImplementedError) or "meta" in str(exc):
                return
            raise ModelError(f"--model {self.ref} rejected {what}: {type(exc).__name__}: {str(exc)[:300]}") from None
        if spec is not None:
            self.loss_of_output(out, batch[1], spec)
        else:
            loss_of(out, f"--model {self.ref}")

    def loss(self, model: nn.Module, batch: Any, spec: DataSpec | None) -> torch.Tensor:
        """One shard's loss: the zoo's rule, a user batch by its type, or a user model on a built-in dataset."""
        if spec is None:
            return _trainable(forward_loss(model, batch, f"--model {self.ref}"), self.ref)
        x, y = batch
        if self.entry is not None:
            return loss_fn(spec.kind, model(x), y)
        try:
            with user_code(f"--model {self.ref}"):
                out = self.forward(model, x, y)
        except ModelError:
            raise
        except Exception as exc:
            raise ModelError(f"--model {self.ref} rejected a batch of {spec.kind} data, shape {tuple(x.shape)}: "
                             f"{type(exc).__name__}: {str(exc)[:300]}") from None
        return _trainable(self.loss_of_output(out, y, spec), self.ref)

    def forward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Any:
        """A built-in dataset's batch through the model: ``model(x, targets=y)`` for a user's forward that takes
        ``targets`` (:func:`takes_targets`), else ``model(x)``."""
        return model(x, targets=y) if self.entry is None and takes_targets(model) else model(x)

    def loss_of_output(self, out: Any, y: torch.Tensor, spec: DataSpec) -> torch.Tensor:
        """The loss of a forward's result on a built-in dataset's targets ``y``: the zoo's rule; for a user's model
        the loss it returned, else the dataset's loss on its logits."""
        if self.entry is not None:
            return loss_fn(spec.kind, out, y)
        loss = output_loss(out)
        if loss is not None:
            return loss
        logits = output_logits(out)
        if logits is not None and logits.ndim >= 2 and logits.shape[-1] < spec.classes:  # more: padded vocabulary
            raise ModelError(f"--model {self.ref} returned logits of shape {tuple(logits.shape)}, over "
                             f"{logits.shape[-1]} classes where the {spec.kind} data has {spec.classes}: build it "
                             f"with {spec.classes} outputs or more")
        if logits is not None and tuple(logits.shape[:-1]) != tuple(y.shape):
            raise ModelError(f"--model {self.ref} returned logits of shape {tuple(logits.shape)} for targets of shape "
                             f"{tuple(y.shape)}: return logits of shape {(*y.shape, spec.classes)} from forward(x), "
                             "or take the targets as forward(idx, targets=None) and return (logits, loss) as "
                             "nanoGPT does")
        try:
            return loss_fn(spec.kind, out if logits is None else logits, y)
        except Exception as exc:
            raise ModelError(f"--model {self.ref} returned {type(out).__name__} that is neither a loss nor "
                             f"{spec.kind} logits: {type(exc).__name__}: {str(exc)[:200]}") from None

    def identity(self) -> str:
        """What the model's structure depends on, for cache keys: the ref, the args and the file's bytes."""
        target = self.ref[3:] if self.ref.startswith("hf:") else self.ref.rpartition(":")[0]
        body = Path(target).read_bytes() if target.endswith((".py", ".json")) and Path(target).is_file() else b""
        return f"{self.ref}|{self.args}|{hashlib.sha256(body).hexdigest()[:16]}"

    def to_meta(self) -> dict[str, Any]:
        return {"ref": absolute_ref(self.ref), "args": dict(self.args)}


def absolute_ref(ref: str) -> str:
    """``file.py:name`` (or ``hf:config.json``) with the file's absolute path, so that a trace rebuilds from
    any folder."""
    if ref.startswith("hf:") and ref.endswith(".json"):
        return f"hf:{Path(ref[3:]).resolve()}"
    target, _, name = ref.rpartition(":")
    return f"{Path(target).resolve()}:{name}" if target.endswith(".py") else ref


def hf_config(ref: str, args: dict[str, Any]) -> Any:
    """The transformers config ``hf:CONFIG.json`` or ``hf:MODEL_TYPE`` names, ``--model-arg`` fields applied."""
    try:
        from transformers import AutoConfig
    except ImportError:
        raise ModelError(f"--model {ref} needs transformers: pip install 'arcsim[hf]'") from None
    what = ref[3:]
    try:
        if what.endswith(".json"):
            if not Path(what).is_file():
                raise ModelError(f"--model {ref}: no such config file {what}")
            return AutoConfig.from_pretrained(what, **args)
        return AutoConfig.for_model(what, **args)
    except ModelError:
        raise
    except Exception as exc:  # transformers' own messages: an unknown model type, a malformed config
        raise ModelError(f"--model {ref}: transformers cannot read it: {type(exc).__name__}: "
                         f"{str(exc).splitlines()[0][:200]}") from None


def as_source(model: str | ModelSource) -> ModelSource:
    """A zoo name or a source, as a source."""
    return model if isinstance(model, ModelSource) else ModelSource(model)


def model_source(ref: str, args: Sequence[str] | tuple[tuple[str, Any], ...] = ()) -> ModelSource:
    """A source from ``--model`` and its ``--model-arg`` pairs (strings, or parsed pairs)."""
    parsed = parse_args(args) if args and isinstance(args[0], str) else tuple(args)  # type: ignore[arg-type]
    return ModelSource(ref, parsed)  # type: ignore[arg-type]


def source_of_trace(meta: dict[str, Any]) -> ModelSource | None:
    """How to rebuild a trace's model (None when it cannot be: a model neither in the zoo nor recorded)."""
    recorded = meta.get("model_source")
    if isinstance(recorded, dict) and isinstance(recorded.get("ref"), str):
        return ModelSource(recorded["ref"], tuple(dict(recorded.get("args") or {}).items()))
    return ModelSource(meta["model"]) if meta.get("model") in MODELS else None


class UserBatches:
    """``--data file.py:batches``: the user's ``batches(batch_size, seed)``, drawn one global batch at a time and
    split into the workers' disjoint shards along the leading axis of every tensor it holds."""

    def __init__(self, ref: str, global_batch: int, seed: int) -> None:
        self.ref, self.global_batch = ref, global_batch
        batches = load_callable(ref, "--data")
        stream = call_user(lambda: batches(global_batch, seed), {}, f"--data {ref}")
        try:
            self.stream = iter(stream)
        except TypeError:
            raise ModelError(f"--data {ref} returned {type(stream).__name__}; return an iterable of batches") from None
        self.drawn = 0

    def next(self) -> Any:
        try:
            with user_code(f"--data {self.ref}"):
                batch = next(self.stream)
        except ModelError:
            raise
        except StopIteration:
            raise ModelError(f"--data {self.ref} ran out after {self.drawn} batches; yield batches without end "
                             "(loop over your data)") from None
        except Exception as exc:
            raise ModelError(f"--data {self.ref} raised {type(exc).__name__}: {exc}") from None
        self.drawn += 1
        return _tensors(batch, self.ref)

    def shards(self, batch: Any, workers: int) -> list[Any]:
        """The workers' disjoint shards; a batch with nothing to split would train every worker on the same data."""
        shards = [_part(batch, workers, i, self.ref) for i in range(workers)]
        if not _holds_tensor(shards[0]):
            raise ModelError(f"--data {self.ref}: a batch of {type(batch).__name__} holds no tensor or numpy array to "
                             "split over the workers; yield torch tensors or numpy arrays")
        return shards


def _part(batch: Any, workers: int, i: int, ref: str) -> Any:
    """Worker ``i``'s slice of every tensor in ``batch`` along its first axis (dicts, tuples and lists kept as they
    are; numbers, strings and None passed whole, as arguments). Anything else cannot be split."""
    import torch

    if isinstance(batch, torch.Tensor):
        if batch.ndim == 0 or batch.shape[0] < workers:
            raise ModelError(f"--data {ref}: a tensor of shape {tuple(batch.shape)} cannot be split over {workers} "
                             "workers along its first axis; yield batches of batch_size examples")
        return batch.tensor_split(workers)[i]
    if isinstance(batch, dict):
        return {k: _part(v, workers, i, ref) for k, v in batch.items()}
    if isinstance(batch, tuple | list):
        return type(batch)(_part(v, workers, i, ref) for v in batch)
    if batch is None or isinstance(batch, bool | int | float | str):
        return batch
    raise ModelError(f"--data {ref}: a batch holds a {type(batch).__name__}, which cannot be split over the workers; "
                     "yield torch tensors or numpy arrays (in dicts, tuples or lists)")


def _tensors(batch: Any, ref: str) -> Any:
    """The batch with its numpy arrays as torch tensors (sharing their memory)."""
    import torch

    if isinstance(batch, np.ndarray):
        try:
            return torch.from_numpy(batch)
        except TypeError:
            raise ModelError(f"--data {ref}: a numpy array of dtype {batch.dtype} holds no numbers; yield numeric "
                             "arrays or torch tensors") from None
    if isinstance(batch, dict):
        return {k: _tensors(v, ref) for k, v in batch.items()}
    if isinstance(batch, tuple | list):
        return type(batch)(_tensors(v, ref) for v in batch)
    return batch


def _holds_tensor(batch: Any) -> bool:
    import torch

    if isinstance(batch, dict):
        return any(_holds_tensor(v) for v in batch.values())
    if isinstance(batch, tuple | list):
        return any(_holds_tensor(v) for v in batch)
    return isinstance(batch, torch.Tensor)


def to_device(batch: Any, device: torch.device) -> Any:
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, tuple | list):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def input_of_trace(meta: dict[str, Any]) -> tuple[str | None, int | None, str | RecordedInput | None]:
    """What a trace's model was fed, to feed it alike on the meta device: (built-in dataset, its input size
    when not the default, None), or (None, None, the input a recorded job saw, else the user's ``--data``)."""
    from arcsim.models.datasets import DATASETS, data_spec

    dataset = meta.get("dataset")
    if dataset not in DATASETS:
        recorded = RecordedInput.from_meta(meta.get("recorded_input"))
        return None, None, recorded or (dataset if isinstance(dataset, str) and ":" in dataset else None)
    shape = tuple(meta.get("input_shape") or ())
    if not shape or shape == data_spec(dataset).shape:
        return dataset, None, None
    return dataset, int(shape[1] if len(shape) == 3 else shape[0]), None

"""The count behind arcsim.models.workload: the model run once forward and backward on the meta device under a
dispatch mode that records every aten operation (its FLOPs by ``torch.utils.flop_counter``, the bytes of its tensor
arguments and results, its class), scaled dot-product attention as one fused operation, and the operation after
which each parameter's gradient is accumulated.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

from arcsim.models.inputs import RecordedInput
from arcsim.models.operations import Op, Workload, op_class

if TYPE_CHECKING:
    from arcsim.models.dataspec import DataSpec
    from arcsim.models.source import ModelSource


# no kernel: views the dispatcher does not flag as views (``_unsafe_view``, the reshape in ``linear`` and ``matmul``
# on 3-d inputs) and allocations
_FREE = {"detach", "alias", "lift_fresh", "empty", "empty_like", "empty_strided", "set_", "resize_", "_unsafe_view"}


def _nbytes(tree: object) -> float:
    leaves, _ = tree_flatten(tree)
    return float(sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor)))


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[Op] = []
        self.silent = False

    @contextmanager
    def paused(self) -> Iterator[None]:
        self.silent = True
        try:
            yield
        finally:
            self.silent = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.silent:
            return out
        name = func.__name__.split(".")[0]
        if func.is_view or name in _FREE:
            return out
        packet = func._overloadpacket
        flops = float(flop_registry[packet](*args, **kwargs, out_val=out)) if packet in flop_registry else 0.0
        self.ops.append(Op(op_class(name), flops, _nbytes(args) + _nbytes(kwargs) + _nbytes(out)))
        return out


def attention_flops(q: torch.Tensor, k: torch.Tensor, causal: bool) -> float:
    """Forward FLOPs of softmax(QKᵀ)V: two products of B·H·Tq·Tk·D multiply-adds (half of them when causal)."""
    *batch, tq, d = q.shape
    tk = k.shape[-2]
    return 4.0 * math.prod(batch) * tq * tk * d * (0.5 if causal else 1.0)


class _FusedAttention(torch.autograd.Function):
    """Scaled dot-product attention as the one fused kernel a GPU runs (flash / memory-efficient), forward
    and backward each recorded as a single operation instead of the decomposition the meta device takes."""

    @staticmethod
    def forward(ctx, recorder, q, k, v, causal):  # type: ignore[no-untyped-def, override]
        ctx.recorder, ctx.causal = recorder, causal
        ctx.save_for_backward(q, k, v)
        out = torch.empty_like(q)
        recorder.ops.append(Op("attention", attention_flops(q, k, causal), _nbytes((q, k, v, out))))
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def, override]
        q, k, v = ctx.saved_tensors
        grads = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        ctx.recorder.ops.append(Op("attention", 2.5 * attention_flops(q, k, ctx.causal),
                                   _nbytes((q, k, v, grad, *grads))))  # flash backward: 2.5× the forward
        return None, *grads, None


@contextmanager
def _fused_attention(recorder: _Recorder) -> Iterator[None]:
    """Route ``F.scaled_dot_product_attention`` (GPT's, and nn.MultiheadAttention's, which calls it by the
    module's name) through :class:`_FusedAttention` while counting."""
    original = F.scaled_dot_product_attention

    def fused(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *args, **kwargs):  # type: ignore[no-untyped-def]
        with recorder.paused():
            return _FusedAttention.apply(recorder, q, k, v, bool(is_causal))

    F.scaled_dot_product_attention = fused  # type: ignore[assignment]
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


def count(source: ModelSource, batch: int, spec: DataSpec | None, data: str | RecordedInput | None) -> Workload:
    """One fp32 training step of ``source`` at ``batch`` counted op by op (``spec``: a built-in dataset's batch; else
    ``data``'s first batch, or the input a recorded job saw)."""
    from arcsim.models.source import UserBatches, recorded_loss, to_device

    torch.manual_seed(0)
    with torch.device("meta"):
        model = source.build(spec).train()
    if spec is not None:
        with torch.device("meta"):
            shape = (batch, *spec.shape)
            x = torch.randint(spec.classes, shape) if spec.kind == "tokens" else torch.randn(shape)
            y = torch.randint(spec.classes, shape if spec.kind == "tokens" else (batch,))
        example: Any = (x, y)
    elif isinstance(data, RecordedInput):
        example = data.example(batch)
    else:
        assert data is not None
        example = to_device(UserBatches(data, batch, 0).next(), torch.device("meta"))
    work = Workload(source.label, batch, tuple(spec.shape) if spec else ())
    params = dict(model.named_parameters())
    work.numel = {n: p.numel() for n, p in params.items()}
    recorder = _Recorder()

    def ready(name: str) -> None:
        work.ready_after[name] = len(recorder.ops)
        work.order.append(name)

    handles = [p.register_post_accumulate_grad_hook(lambda _p, n=n: ready(n)) for n, p in params.items()]
    try:
        with recorder, _fused_attention(recorder), torch.device("meta"):  # tensors made in forward: meta too
            loss = (recorded_loss(data, model, example, f"--model {source.ref}") if isinstance(data, RecordedInput) else
                    source.loss(model, example, spec))
            work.forward = list(recorder.ops)
            recorder.ops.clear()
            loss.backward()
            work.backward = list(recorder.ops)
    finally:
        for h in handles:
            h.remove()
    return work

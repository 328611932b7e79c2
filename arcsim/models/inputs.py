"""The input a recorded job fed its model, kept as shapes and dtypes, so that its compute can be counted again.

The recording hook sees each forward's arguments (:class:`arcsim.hooks.RecordingState`) and keeps their
structure — tensors as shape and dtype, plain values as they are — but never their values. The device model
rebuilds the model on the meta device and feeds it tensors of those shapes, at another batch when asked (every
tensor whose leading dimension is the recorded batch gets the new one). When the job computed its loss
outside the model (the forward returns logits), the count takes the sum of the output as the loss: the
model's forward and backward are counted, the loss's own few kernels are not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

SCALARS = (bool, int, float, str, type(None))


def _encode(value: Any) -> Any:
    import torch  # (torch loads where a recorded input is encoded or built, not where a trace's input is read)

    if isinstance(value, torch.Tensor):
        return {"tensor": list(value.shape), "dtype": str(value.dtype).removeprefix("torch.")}
    if isinstance(value, dict):
        return {"dict": {str(k): _encode(v) for k, v in value.items()}}
    if isinstance(value, tuple | list):
        return {"list": [_encode(v) for v in value]}
    return {"value": value if isinstance(value, SCALARS) else None}


def _decode(node: dict[str, Any], recorded: int, batch: int, device: torch.device) -> Any:
    import torch

    if "tensor" in node:
        shape = list(node["tensor"])
        if shape and shape[0] == recorded:
            shape[0] = batch
        return torch.zeros(shape, dtype=getattr(torch, node["dtype"]), device=device)
    if "dict" in node:
        return {k: _decode(v, recorded, batch, device) for k, v in node["dict"].items()}
    if "list" in node:
        return [_decode(v, recorded, batch, device) for v in node["list"]]
    return node["value"]


def _first_shape(node: dict[str, Any]) -> list[int] | None:
    if "tensor" in node:
        return list(node["tensor"])
    children = node.get("dict", {}).values() if "dict" in node else node.get("list", [])
    for child in children:
        shape = _first_shape(child)
        if shape is not None:
            return shape
    return None


@dataclass(frozen=True)
class RecordedInput:
    """A forward's positional and keyword arguments as shapes and dtypes (``tree``: their JSON, hashable)."""

    tree: str

    @classmethod
    def of_call(cls, args: tuple, kwargs: dict[str, Any]) -> RecordedInput:
        return cls(json.dumps({"args": _encode(list(args)), "kwargs": _encode(kwargs)}, sort_keys=True))

    @classmethod
    def from_meta(cls, raw: Any) -> RecordedInput | None:
        """The input a trace's metadata records (None when it records none)."""
        if not isinstance(raw, dict) or not {"args", "kwargs"} <= set(raw):
            return None
        return cls(json.dumps(raw, sort_keys=True))

    def to_meta(self) -> dict[str, Any]:
        return dict(json.loads(self.tree))

    @property
    def batch(self) -> int:
        """The recorded batch: the leading dimension of the first tensor (0 when no tensor has one)."""
        raw = json.loads(self.tree)
        shape = _first_shape(raw["args"]) or _first_shape(raw["kwargs"])
        return int(shape[0]) if shape else 0

    def describe(self) -> str:
        """e.g. ``args (8×64 int64)`` or ``input_ids=8×64 int64, labels=8×64 int64``."""
        raw = json.loads(self.tree)

        def one(node: dict[str, Any]) -> str:
            if "tensor" in node:
                return f"{'×'.join(map(str, node['tensor'])) or 'scalar'} {node['dtype']}"
            if "dict" in node:
                return "{" + ", ".join(f"{k}: {one(v)}" for k, v in node["dict"].items()) + "}"
            if "list" in node:
                return "(" + ", ".join(one(v) for v in node["list"]) + ")"
            return repr(node["value"])

        parts = [one(a) for a in raw["args"]["list"]] + [f"{k}={one(v)}" for k, v in raw["kwargs"]["dict"].items()]
        return ", ".join(parts)

    def example(self, batch: int, device: torch.device | str = "meta") -> tuple[list[Any], dict[str, Any]]:
        """Arguments of the recorded shapes (zeros) at ``batch``: (args, kwargs)."""
        import torch

        raw = json.loads(self.tree)
        recorded, where = self.batch, torch.device(device)
        return _decode(raw["args"], recorded, batch, where), _decode(raw["kwargs"], recorded, batch, where)

"""What a training run aims for: a held-out accuracy to reach (``--target``), or a held-out loss to get
under (``--target-loss``, the usual goal for language models: perplexity is its exponential)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from arcsim.errors import ArcsimError

if TYPE_CHECKING:
    import pandas as pd  # (only typed here: a run without --history does not pay its 0.5 s import)


@dataclass(frozen=True)
class Target:
    value: float
    metric: Literal["accuracy", "loss"] = "accuracy"

    @property
    def column(self) -> str:
        """The history column the target is judged on."""
        return "accuracy" if self.metric == "accuracy" else "val_loss"

    def of(self, hist: Any) -> list[float]:
        """This target's metric at each evaluation of a training History (its attribute is the column's name)."""
        return list(getattr(hist, self.column))

    @property
    def label(self) -> str:
        if self.metric == "accuracy":
            return f"{self.value:.0%} held-out accuracy"
        return f"held-out loss {self.value:g} (perplexity {math.exp(min(self.value, 700)):.3g})"

    @property
    def short(self) -> str:
        return f"{self.value:.0%}" if self.metric == "accuracy" else f"loss {self.value:g}"

    def met(self, values: Any) -> Any:
        """Whether each value meets the target (NaN never does); a float or a pandas Series."""
        return values >= self.value if self.metric == "accuracy" else values <= self.value

    def best(self, values: pd.Series) -> Any:
        """The index of the value nearest the target's side (the most accurate, or the lowest loss)."""
        return values.idxmax() if self.metric == "accuracy" else values.idxmin()

    def key(self) -> dict[str, float]:
        """Its part of an experiment's key (an accuracy target keeps the key older directories hold)."""
        return {"target": self.value} if self.metric == "accuracy" else {"target_loss": self.value}


def target_of(accuracy: float | None, loss: float | None) -> Target | None:
    """The target from ``--target`` and ``--target-loss`` (at most one)."""
    if accuracy is not None and loss is not None:
        raise ArcsimError("give --target (held-out accuracy) or --target-loss (held-out loss), not both")
    if accuracy is not None:
        if not 0 < accuracy <= 1:
            raise ArcsimError(f"--target is a held-out accuracy in (0, 1], got {accuracy}")
        return Target(accuracy)
    if loss is not None:
        if not (loss > 0 and math.isfinite(loss)):
            raise ArcsimError(f"--target-loss is a held-out loss (cross-entropy, nats) above 0, got {loss}")
        return Target(loss, "loss")
    return None


@dataclass
class Reached:
    step: float     # NaN when not reached
    time_s: float   # NaN when not reached or not priced


def first_reach(run: pd.DataFrame, target: Target) -> Reached:
    """The first evaluation that meets ``target`` in one run's history."""
    hit = run[target.met(run[target.column])]
    if hit.empty:
        return Reached(math.nan, math.nan)
    row = hit.iloc[0]
    return Reached(float(row["step"]), float(row["time_s"]))

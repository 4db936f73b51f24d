"""Task metrics on labelled validation data: how much worse the task is, not only how far from eager.

Two kinds, measured by the validate stage (etforge.builders.numerics.task_metrics) when the model's
``validation`` carries ``labels`` or ``metrics`` (docs/models.md):

- ``accuracy``: the program's top-1/top-5 accuracy on the labels, eager fp32's on the same samples,
  and the drop (eager's top-1 minus the program's), gated by the cell's ``max_accuracy_drop``;
- ``metric``: a user's function ``score(outputs, labels) -> float`` on the program's outputs (and,
  for comparison, on eager fp32's), gated by its own ``min``/``max``. One check per named metric.

A non-finite figure fails either check, whatever its bounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from etforge.checks.base import Check, Figure, finite


@dataclass(frozen=True, kw_only=True)
class Accuracy(Check):
    kind: ClassVar[str] = "accuracy"

    labels: str | None = None  # where the labels came from: "npz data/val.npz array labels"
    samples: int | None = None
    top1: float | None = None  # the program's accuracy (a fraction)
    top5: float | None = None  # None: fewer than six classes
    eager_top1: float | None = None  # eager fp32's on the same samples
    eager_top5: float | None = None
    drop: float | None = None  # eager_top1 - top1 (positive: the program is worse)
    max_drop: float | None = None  # the cell's max_accuracy_drop, None: recorded, not gated
    misses: tuple = ()

    def reason(self) -> str:
        return "; ".join(self.misses)

    def heading(self) -> str:
        return "top-1 acc"

    def text(self) -> str:
        return "-" if finite(self.top1) is None else f"{self.top1:.1%}"

    def detail(self) -> str:
        parts = [f"on {self.samples} labelled samples ({self.labels})"]
        for label, mine, eager in (("top-1", self.top1, self.eager_top1), ("top-5", self.top5, self.eager_top5)):
            if finite(mine) is not None and finite(eager) is not None:
                parts.append(f"{label} {mine:.1%} (eager fp32 {eager:.1%})")
        if finite(self.drop) is not None:
            bound = f", at most {self.max_drop:.1%}" if self.max_drop is not None else ""
            parts.append(f"drop {self.drop:+.1%}{bound}")
        return "; ".join(parts)

    def meter(self) -> float | None:
        return finite(self.top1)

    def figures(self) -> tuple[Figure, ...]:
        out = [
            Figure("accuracy_top1", self.top1, " points", "higher", "top_k", scale=100, digits=4),
            Figure("accuracy_top5", self.top5, " points", "higher", "top_k", scale=100, digits=4),
            Figure("accuracy_drop", self.drop, " points", "lower", "top_k", scale=100, digits=4),
        ]
        return tuple(f for f in out if finite(f.value) is not None)

    def manifest(self) -> dict:
        keys = ("top1", "top5", "eager_top1", "eager_top5", "drop")
        return {"accuracy": {"samples": self.samples, **{k: finite(getattr(self, k)) for k in keys}}}


@dataclass(frozen=True, kw_only=True)
class UserMetric(Check):
    kind: ClassVar[str] = "metric"

    name: str = ""  # its key under validation.metrics
    function: str = ""  # module:function
    value: float | None = None  # on the program's outputs (None after a round trip: it was not finite)
    eager_value: float | None = None  # on eager fp32's outputs
    min: float | None = None
    max: float | None = None
    misses: tuple = ()

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.name}"

    def reason(self) -> str:
        return "; ".join(self.misses)

    def heading(self) -> str:
        return self.name

    def text(self) -> str:
        return "-" if finite(self.value) is None else f"{self.value:.4g}"

    def detail(self) -> str:
        bounds = [f"{k} {v}" for k, v in (("min", self.min), ("max", self.max)) if v is not None]
        eager = f" (eager fp32 {self.eager_value:.4g})" if finite(self.eager_value) is not None else ""
        return f"{self.function}: {self.text()}{eager}" + (f"; {', '.join(bounds)}" if bounds else "")

    def figures(self) -> tuple[Figure, ...]:
        better = "higher" if self.min is not None else "lower" if self.max is not None else None
        out = Figure(f"metric {self.name}", self.value, "", better, digits=6)
        return (out,) if finite(out.value) is not None else ()

    def manifest(self) -> dict:
        return {self.key: {"value": finite(self.value), "eager": finite(self.eager_value)}}

"""Delegation coverage: how much of a program's compute its delegates run, against the backend's gate.

The export measures it (etforge.builders.gates.gates delegation_coverage, in FLOPs through
etforge.builders.gates.compute_share; compute-op counts as information) and judges it with
:meth:`Delegation.judged`: the share of FLOPs must reach ``minimum`` (the backend's
``min_coverage``; None: no delegate, no gate). A record made before FLOPs were measured is
judged on the share of compute ops. Every comparison fails on a NaN.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar

from etforge.checks.base import Check, Figure, finite


def human(flops: int | float) -> str:
    """12.3 MFLOP, 950 FLOP."""
    for scale, unit in ((1e9, "GFLOP"), (1e6, "MFLOP"), (1e3, "kFLOP")):
        if flops >= scale:
            return f"{flops / scale:.3g} {unit}"
    return f"{int(flops)} FLOP"


def share(value) -> str:
    """A fraction (0..1) as a percentage for a table: '98.4%', '100%', '-'."""
    if finite(value) is None:
        return "-"
    pct = value * 100
    return f"{pct:.1f}%" if pct < 100 else "100%"


@dataclass(frozen=True, kw_only=True)
class Delegation(Check):
    kind: ClassVar[str] = "delegation"

    backend: str | None = None  # the cell's backend, as messages name it
    minimum: float | None = None  # the gate: the least share of compute its delegates must run
    compute_coverage: float | None = None  # delegated FLOPs / all FLOPs: what the gate judges
    flops: int | None = None
    delegated_flops: int | None = None
    flops_not_delegated: dict = field(default_factory=dict)  # op -> its FLOPs on portable kernels
    delegation_coverage: float | None = None  # of compute ops (information)
    compute_ops: int | None = None
    delegated_compute_ops: int | None = None
    delegated_by_backend: dict = field(default_factory=dict)  # backend id -> compute ops it took
    not_delegated: dict = field(default_factory=dict)  # op -> how many stayed on portable kernels
    delegated_ops: int | None = None  # every op, as ExecuTorch's get_delegation_info counts them
    non_delegated_ops: int | None = None
    delegated_subgraphs: int | None = None

    def judged(self) -> Delegation:
        """This check with ``passed`` decided (no minimum: nothing to gate)."""
        return replace(self, passed=None if self.minimum is None else self.reason_for() is None)

    @property
    def coverage(self) -> float | None:
        """The share shown and compared: of FLOPs, else of compute ops, else of every op."""
        if finite(self.compute_coverage) is not None:
            return self.compute_coverage
        if finite(self.delegation_coverage) is not None:
            return self.delegation_coverage
        d, n = self.delegated_ops, self.non_delegated_ops
        return d / (d + n) if d is not None and n is not None and d + n > 0 else None

    def reason_for(self) -> str | None:
        """Why this program must not count as accelerated, or None."""
        minimum = self.minimum
        if minimum is None:
            return None
        op_share = f"{self.delegation_coverage:.0%}" if self.delegation_coverage is not None else "?"
        ops = f"{self.delegated_compute_ops} of {self.compute_ops} compute ops ({op_share}) delegated"
        if self.compute_coverage is None:
            coverage = self.delegation_coverage if self.delegation_coverage is not None else float("nan")
            if not coverage >= minimum:  # NaN-safe: a coverage that is not a number fails
                return (
                    f"backend {self.backend!r} took {self.delegated_compute_ops} of {self.compute_ops} "
                    f"compute ops ({coverage:.0%}, gate: at least {minimum:.0%}); the rest runs on portable kernels"
                    + _left(self.not_delegated, lambda n: f"x{n}")
                )
            return None
        coverage = self.compute_coverage
        if not coverage >= minimum:  # NaN-safe
            return (
                f"backend {self.backend!r} runs {coverage:.0%} of the program's compute "
                f"({human(self.delegated_flops or 0)} of {human(self.flops or 0)}, gate: at least {minimum:.0%}); "
                f"the rest runs on portable kernels" + _left(self.flops_not_delegated, human) + f"; {ops}"
            )
        return None

    def reason(self) -> str:
        return self.reason_for() or ""

    def heading(self) -> str:
        return "delegation"

    def text(self) -> str:
        return share(self.coverage)

    def meter(self) -> float | None:
        return self.coverage

    def detail(self) -> str:
        """What the percentage is: the compute share (the gate's), and the op counts."""
        parts = []
        if self.compute_coverage is not None:
            parts.append(f"{share(self.compute_coverage)} of the compute (FLOPs) delegated")
        if self.compute_ops is not None and self.delegated_compute_ops is not None:
            parts.append(
                f"{self.delegated_compute_ops} of {self.compute_ops} compute ops delegated "
                f"({share(self.delegation_coverage)})"
            )
        elif self.delegated_ops is not None and self.non_delegated_ops is not None:
            parts.append(f"{self.delegated_ops} delegated, {self.non_delegated_ops} not delegated")
        return "; ".join(parts)

    def figures(self) -> tuple[Figure, ...]:
        coverage = Figure(
            "coverage", self.coverage, " points", "higher", "coverage_pct", tolerance_scale=0.01, scale=100, digits=4
        )
        return (coverage,) if finite(coverage.value) is not None else ()

    def structure(self) -> dict:
        return {
            "portable op": dict(self.not_delegated),
            "ops delegated to": dict(self.delegated_by_backend),
            "delegated_ops": self.delegated_ops,
            "non_delegated_ops": self.non_delegated_ops,
            "delegated_subgraphs": self.delegated_subgraphs,
        }


def _left(by_op: dict, show) -> str:
    heaviest = sorted(by_op.items(), key=lambda kv: (-kv[1], kv[0]))[:4]
    return (" (" + ", ".join(f"{name} {show(n)}" for name, n in heaviest) + ")") if heaviest else ""

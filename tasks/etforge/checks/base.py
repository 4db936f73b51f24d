"""What every check is: one frozen dataclass that judges one thing about a cell's program.

A cell's evidence is a list of checks (numerics on a runtime, delegation coverage, the size
gate, budgets, ...). Each check says whether it passed, why not in one line, and how every
reader shows it, through the methods below; the readers (the outcome, the report, the
manifests, ``etforge diff``, the release) call only these and never name a check's fields.

    check.key            what it is among a cell's checks ("numerics@x86_64", "delegation")
    check.failed         it gates and it did not pass (a NaN figure fails: the builder judged it so)
    check.provisional    it judged seeded random inputs only (the cell is then provisional, not ok)
    check.reason()       one line: why it failed
    check.note()         one line a passing cell's reason shows too ("" for none)
    check.heading()      the column it is shown in (report, summary table)
    check.text()         the short text of that column's cell ("42.1", "98%", "0.28x")
    check.detail()       a longer line: the tooltip
    check.meter()        a share (0..1) drawn as a bar, or None
    check.figures()      the numbers ``etforge diff`` compares, each with its direction and tolerance
    check.structure()    facts that say what changed when the program's bytes changed (not judged)
    check.manifest()     what the manifests say of it for a shipped variant
    check.judge()        the runtime that judged the program and its verdict (a ``Judge``), or None

``gates`` says what a failure stops: the cell (``cell``), only a release (``release``, the
runtime window), or nothing (``never``: information, e.g. Vela's estimates).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Protocol

from etforge.core.typed import TypedRecord
from etforge.program.costs import ProgramCosts

GATES = ("cell", "release", "never")


@dataclass(frozen=True)
class Figure:
    """One number a check measured, as ``etforge diff`` compares it.

    ``tolerance`` names the ``diff:`` setting (etforge.config.defaults DIFF_TOLERANCES) that makes a
    change in the worse direction a regression; ``relative``: that setting is a percentage of the
    baseline's value, else an absolute amount in the figure's units after ``tolerance_scale``
    (coverage_pct is in points, the figure a fraction: 0.01). ``scale`` and ``unit`` show it
    (a fraction as percentage points). No ``better``: any change is only "changed"."""

    name: str
    value: float | None
    unit: str = ""
    better: str | None = None  # "higher" | "lower" | None
    tolerance: str | None = None
    relative: bool = False
    tolerance_scale: float = 1.0
    scale: float = 1.0
    digits: int = 2  # rounded to this many decimals in a snapshot (the same program gives the same bytes)
    chart: str | None = None  # the axis label of the report's accuracy-against-size chart, when it plots this one

    def to_json(self) -> dict:
        value = finite(self.value)
        return {
            "value": None if value is None else round(float(value), self.digits),
            "unit": self.unit,
            "better": self.better,
            "tolerance": self.tolerance,
            "relative": self.relative,
            "tolerance_scale": self.tolerance_scale,
            "scale": self.scale,
        }


def finite(value):
    """``value`` when it is a finite number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return value


VERDICTS = ("passed", "failed", "not run", "on device")


@dataclass(frozen=True)
class Judge:
    """Who ran a cell's program to judge it and what came of it: the report's "judged by" chips.

    ``runtime``: this host's ExecuTorch runtime, an aarch64 core under qemu-user, the TOSA reference
    model, a proxy, the device; ``verdict``: one of VERDICTS; ``why``: one line behind it (what was
    missing, the missed threshold, what it measured)."""

    runtime: str
    verdict: str
    why: str = ""


class ProgramFacts(Protocol):
    """What a derived check reads of a cell's program: its export's facts (etforge.pipeline.stage_results
    ExportResult)."""

    @property
    def size_bytes(self) -> int | None: ...

    @property
    def data_size_bytes(self) -> int | None: ...

    @property
    def executorch_version(self) -> str | None: ...

    @property
    def costs(self) -> ProgramCosts: ...


@dataclass(frozen=True, kw_only=True)
class Check(TypedRecord):
    """The base of every check (a frozen dataclass of its own fields; see the module docstring)."""

    kind: ClassVar[str] = ""  # its name in the check table and in records ("numerics", "size")
    gates: ClassVar[str] = "cell"  # cell | release | never
    passed: bool | None = None  # None: not judged here (e.g. checked on the device)

    @property
    def key(self) -> str:
        return self.kind

    @property
    def failed(self) -> bool:
        return self.gates != "never" and self.passed is False

    @property
    def provisional(self) -> bool:
        """Judged on seeded random inputs only: weaker than a verdict on representative data."""
        return False

    def reason(self) -> str:
        return ""

    def note(self) -> str:
        return ""

    def heading(self) -> str:
        return self.kind

    def text(self) -> str:
        return "-"

    def detail(self) -> str:
        return ""

    def meter(self) -> float | None:
        """A share (0..1) the report draws as a bar beside the text, or None."""
        return None

    def figures(self) -> tuple[Figure, ...]:
        return ()

    def structure(self) -> dict:
        return {}

    def manifest(self) -> dict:
        return {}

    def judge(self) -> Judge | None:
        """The runtime that ran the program for this check and its verdict; None: no runtime ran it
        (a check read off the program's bytes: size, delegation, budgets)."""
        return None

    def to_json(self) -> dict:
        return {"check": self.kind, **super().to_json()}

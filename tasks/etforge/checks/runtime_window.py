"""The runtime window: which app runtimes (``manifests.app_runtime``) ExecuTorch's compatibility policy
promises will load the program (etforge.program.compat, a table: schemas/executorch_compat.json).

Derived when a cell's outcome is decided, from the plan and the version that built the program
(its export's record). It gates a release only: the program is right, the app's runtime is
too old or too new for it, and the release refuses to ship it there (one line per variant).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from etforge.checks.base import Check, ProgramFacts
from etforge.program.compat import load_window, outside_window


def app_runtimes(plan) -> tuple:
    """The versions of ``manifests.app_runtime`` (one or a list), or ()."""
    value = (plan.manifests or {}).get("app_runtime")
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


@dataclass(frozen=True, kw_only=True)
class RuntimeWindow(Check):
    kind: ClassVar[str] = "runtime_window"
    gates: ClassVar[str] = "release"

    built_by: str | None = None  # the ExecuTorch version that built the program
    first: str | None = None  # the window's oldest runtime ...
    last: str | None = None  # ... and newest
    outside: str | None = None  # why the first app runtime outside the window cannot load it

    def reason(self) -> str:
        return f"{self.outside} (manifests.app_runtime)" if self.outside else ""

    def heading(self) -> str:
        return "app runtime"

    def text(self) -> str:
        return "outside" if self.outside else "inside"

    def detail(self) -> str:
        return f"built by ExecuTorch {self.built_by}; loads on {self.first} to {self.last}" if self.first else ""


def derive(plan, cell, program: ProgramFacts) -> RuntimeWindow | None:
    """The check against every ``manifests.app_runtime`` version, or None when the pipeline names none."""
    runtimes = app_runtimes(plan)
    if not runtimes:
        return None
    built_by = program.executorch_version or plan.toolchain.get("executorch")
    window = load_window(built_by)
    outside = next((why for runtime in runtimes if (why := outside_window(built_by, runtime))), None)
    return RuntimeWindow(
        passed=outside is None,
        built_by=built_by,
        first=window[0] if window else None,
        last=window[1] if window else None,
        outside=outside,
    )

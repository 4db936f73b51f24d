"""The report's "judged by" column: one chip per runtime that ran a cell's program, coloured by verdict.

Read off the cell's checks through ``Check.judge()`` (etforge.checks.base): this host's ExecuTorch
runtime, each target profile (an aarch64 core under qemu-user), the TOSA reference model, a proxy,
the VGF scenario runner, the device for a bundled program, and the targets that could not run it
with why. The chip shows the runtime's short name; its title the whole line.
"""

from __future__ import annotations

from dataclasses import dataclass

from etforge.checks.base import Judge
from etforge.checks.numerics import HOST_RUNTIME

MARKS = {"passed": "✓", "failed": "✗", "not run": "–", "on device": "⇢"}


@dataclass(frozen=True)
class Chip:
    label: str  # the runtime's short name ("aarch64 cortex-a76", "TOSA reference model")
    verdict: str  # passed | failed | not run | on device: the chip's colour
    mark: str
    title: str  # "<runtime>: <verdict> (<why>)"


def short_name(runtime: str) -> str:
    """The runtime without its parenthesised details: "aarch64 cortex-a76 (qemu-user)" -> "aarch64 cortex-a76"."""
    if runtime == HOST_RUNTIME:
        return "host ExecuTorch"
    head = runtime.split(" (", 1)[0].strip()
    return head or runtime


def chip(judge: Judge) -> Chip:
    title = f"{judge.runtime}: {judge.verdict}" + (f" ({judge.why})" if judge.why else "")
    return Chip(short_name(judge.runtime), judge.verdict, MARKS.get(judge.verdict, "?"), title)


def judged_by(checks) -> list[Chip]:
    """One chip per check that names a runtime, in the checks' order (the cell's own runtime first)."""
    return [chip(j) for j in (c.judge() for c in checks) if j is not None]

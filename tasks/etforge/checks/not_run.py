"""A runtime that was to judge a cell's program and could not run it: what it lacks, in one line.

A cell's targets (etforge.config.targets: an aarch64 core under qemu-user) each give one check:
``Numerics`` with that ``target`` when the program ran there, else this one, keyed the same way
(``not_run@<target>``) and shown in the same column. It never fails the cell: the cell keeps the
verdicts of the runtimes that did run it, and its reason says which one did not and why (this host
lacks qemu, the runtime lacks an operator library the program needs, a delegate has no runtime for
that architecture).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from etforge.checks.base import Check, Judge


@dataclass(frozen=True, kw_only=True)
class NotRun(Check):
    kind: ClassVar[str] = "not_run"
    gates: ClassVar[str] = "never"

    target: str | None = None  # the runtime, e.g. "aarch64 cortex-a76 (qemu-user)"
    why: str | None = None  # one line: what was missing
    also: tuple = ()  # the cell's other targets that lacked the same: this check's note names them too
    repeats: bool = False  # another target's check says the same (its note names this one): no note of its own

    @property
    def key(self) -> str:
        return f"{self.kind}@{self.target}"

    def note(self) -> str:
        return "" if self.repeats else f"not checked on {', '.join((str(self.target), *self.also))}: {self.why}"

    def heading(self) -> str:
        return f"SQNR dB ({self.target})"  # the column its numerics would have filled

    def text(self) -> str:
        return "not run"

    def detail(self) -> str:
        return self.why or ""

    def manifest(self) -> dict:
        return {f"numerics@{self.target}": {"checked": "not run", "why": self.why}}

    def judge(self) -> Judge:
        return Judge(str(self.target), "not run", self.why or "")

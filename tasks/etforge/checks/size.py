"""The size gate: a quantized program must save what its scheme declares against its fp32 sibling.

Measured and judged by the sizegate stage (etforge.builders.gates.gates size_gate): the
stored size of the weights the scheme takes, against ``max_weight_ratio`` of their fp32
bytes plus ``overhead_bytes``. Its one-line ``failure`` names both programs' sizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from etforge.checks.base import Check, finite


@dataclass(frozen=True, kw_only=True)
class SizeGate(Check):
    kind: ClassVar[str] = "size"

    size_vs_fp32: float | None = None
    saved_bytes: int | None = None
    weight_bytes: int | None = None  # fp32 bytes of the weights the scheme takes
    weight_ratio: float | None = None  # those weights as stored / fp32
    max_weight_ratio: float | None = None
    overhead_bytes: int | None = None
    kept_float: tuple = ()  # {"layer", "reason"}: layers the scheme left in float (not judged)
    failure: str | None = None  # why it failed, one line

    def reason(self) -> str:
        return self.failure or ""

    def heading(self) -> str:
        return "vs fp32"

    def text(self) -> str:
        ratio = finite(self.size_vs_fp32)
        return "-" if ratio is None else f"{ratio:.2f}x"

    def detail(self) -> str:
        if finite(self.weight_ratio) is None:
            return ""
        return (
            f"weights stored at {self.weight_ratio:.2f}x of fp32 (gate: at most {self.max_weight_ratio}x "
            f"+ {self.overhead_bytes} B); {self.saved_bytes} B saved"
        )

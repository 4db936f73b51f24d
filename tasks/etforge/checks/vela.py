"""Vela's estimate of an Ethos-U program on its NPU: never a gate, what a board team sizes against.

The export records it (etforge.builders.arm.ethos_u_vela, the Ethos-U recipes' ``lowering.after``)
from Vela's summary for the configured accelerator, system config and memory mode, added over
the program's delegates; bytes are Vela's KiB x 1024.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from etforge.checks.base import Check, Figure, finite


@dataclass(frozen=True, kw_only=True)
class Vela(Check):
    kind: ClassVar[str] = "vela"
    gates: ClassVar[str] = "never"

    accelerator: str | None = None  # e.g. "ethos-u55-128"
    system_config: str | None = None
    memory_mode: str | None = None
    core_clock_hz: float | None = None
    npu_ops: int | None = None  # operators Vela put on the NPU
    cpu_ops: int | None = None  # and left to the CPU
    # peak use per memory area (added over delegates: an upper bound if the runtime shares one
    # scratch area); with U85's Sram_Only, Vela files the weights under on-chip flash, an alias of SRAM
    sram_bytes: int | None = None
    dram_bytes: int | None = None
    onchip_flash_bytes: int | None = None
    offchip_flash_bytes: int | None = None
    cycles_npu: int | None = None  # per inference
    cycles_total: int | None = None
    inference_time_s: float | None = None  # cycles_total / core clock
    delegates: tuple = ()  # per delegate: Vela's whole summary row, its op split, its TOSA size

    def heading(self) -> str:
        return "NPU estimate"

    def text(self) -> str:
        seconds = finite(self.inference_time_s)
        return "-" if seconds is None else f"{seconds * 1000:.3g} ms"

    def detail(self) -> str:
        return (
            f"Vela, {self.accelerator} ({self.system_config}, {self.memory_mode}): {self.npu_ops} NPU / "
            f"{self.cpu_ops} CPU operators, {self.cycles_total} cycles, SRAM {self.sram_bytes} B"
        )

    def figures(self) -> tuple[Figure, ...]:
        # estimates: a change is shown, never a regression (no tolerance)
        out = (
            Figure("NPU cycles", self.cycles_total, better="lower", digits=0),
            Figure("NPU SRAM", self.sram_bytes, " B", better="lower", digits=0),
        )
        return tuple(f for f in out if finite(f.value) is not None)

    def structure(self) -> dict:
        return {"NPU operators": self.npu_ops, "CPU operators": self.cpu_ops}

"""What a program costs, as its export measured it (etforge.builders.lowering.program_costs), and the
figures read off it without ExecuTorch.

ProgramCosts                 the record: size breakdown, planned buffers per method, delegate subgraphs
planned_peak(planned_bytes) -> the largest arena one method needs, or None
program_bytes(export) -> what a device stores: the .pte plus its .ptd
min_ram_bytes(export) -> planned memory plus constants: the least RAM a loader must have
"""

from __future__ import annotations

from dataclasses import dataclass, field

from etforge.core.typed import TypedRecord


@dataclass(frozen=True)
class ProgramCosts(TypedRecord):
    """{"constants", "delegates": {backend id: bytes}, "program", "total"}; method -> its planned
    buffers' bytes; what that figure is (a lower bound with delegates, at the maximum shape with
    dynamic dims); backend id -> delegated subgraphs over every method."""

    size_breakdown: dict = field(default_factory=dict)
    planned_bytes: dict = field(default_factory=dict)
    planned_note: str | None = None
    delegate_subgraphs: dict = field(default_factory=dict)

    @property
    def planned_peak(self) -> int | None:
        return planned_peak(self.planned_bytes)


def planned_peak(planned_bytes: dict) -> int | None:
    """The largest arena a method of the program needs (the sum of its planned buffers), or None."""
    sums = [sum(v) for v in (planned_bytes or {}).values() if isinstance(v, list | tuple)]
    return max(sums) if sums else None


def program_bytes(size_bytes: int | None, data_size_bytes: int | None) -> int | None:
    """The .pte's bytes plus its external weights' (.ptd), or None when not known."""
    return None if size_bytes is None else size_bytes + (data_size_bytes or 0)


def min_ram_bytes(planned_bytes: dict, size_breakdown: dict, data_size_bytes: int | None) -> int | None:
    """Planned memory plus constants (in the .pte or its .ptd): a lower bound of the RAM the
    program needs loaded; None when the planned memory is not known."""
    peak = planned_peak(planned_bytes)
    if peak is None:
        return None
    return peak + int((size_breakdown or {}).get("constants") or 0) + (data_size_bytes or 0)

"""What a lowered program costs, read from its bytes: where its size goes, the memory its methods plan.

    program_costs(pte, dynamic=False) -> (ProgramCosts, schema version)
        size_breakdown   {"constants", "delegates": {backend id: payload bytes}, "program", "total"}
        planned_bytes    {method: [bytes of each planned buffer]}
        planned_note     what the planned figure is (at the maximum shape; a lower bound)
        delegate_subgraphs  {backend id: delegated subgraphs, over every method}
    and the program's Program.version (etforge.program.compat)

Sizes are attributed as the file lays them out (ExecuTorch's extended header ``eh00``:
program_size, segment_base_offset): the flatbuffer, then data segments. Constants are the
constant segment, the deprecated inline ``constant_buffer`` and every named-data segment
(XNNPACK keeps its weights there, not in its payload); a delegate's payload is its segment
or its inline ``backend_delegate_data``; "program" is every other byte (the flatbuffer's
instructions and values, headers, alignment padding). The three add up to the file size.

Planned memory is ``execution_plan[i].non_const_buffer_sizes[1:]`` (index 0 is reserved for
constants): the arenas the runtime must hand a method, what C++ ``MethodMeta::
memory_planned_buffer_size(i)`` returns. It leaves out what a delegate allocates itself
(XNNPACK's packed weights and workspace, measured ~10-30x the arena), the method
allocator's metadata and temp memory: for a delegated program it is a lower bound. For
dynamic shapes the planner sizes every tensor at its upper bound.

Reads the flatbuffer with ExecuTorch's own (private, 1.5.1) readers WITHOUT restoring
segments: ``deserialize_pte_binary`` moves every segment back into the Program and so
loses where each byte lived. executorch is imported inside the function.
"""

from __future__ import annotations

from etforge.program.compat import program_schema_version
from etforge.program.costs import ProgramCosts


def program_costs(pte: bytes, dynamic: bool = False) -> tuple[ProgramCosts, int]:
    """(what the program ``pte`` costs, its schema version) (see the module docstring); ``dynamic``:
    the model has dynamic dims (the plan is at the maximum shape)."""
    from executorch.exir._serialize._flatbuffer_program import _flatbuffer_to_program
    from executorch.exir._serialize._program import _get_extended_header
    from executorch.exir.schema import DataLocation

    header = _get_extended_header(pte)
    program_size = header.program_size if header is not None else len(pte)
    program = _flatbuffer_to_program(pte[:program_size])
    segments = program.segments
    constant_segments = set()
    if program.constant_segment is not None and len(program.constant_segment.offsets) > 1:
        constant_segments.add(program.constant_segment.segment_index)  # offsets[0]: non-constant placeholder
    constant_segments |= {nd.segment_index for nd in program.named_data or ()}
    constants = sum(segments[i].size for i in constant_segments)
    constants += sum(len(b.storage) for b in program.constant_buffer)  # pre-0.4 inline constants
    delegates: dict = {}
    subgraphs: dict = {}
    planned: dict = {}
    for plan in program.execution_plan:
        planned[plan.name] = [int(n) for n in plan.non_const_buffer_sizes[1:]]
        for d in plan.delegates:
            ref = d.processed
            if ref.location == DataLocation.SEGMENT:
                size = segments[ref.index].size
            else:
                size = len(program.backend_delegate_data[ref.index].data)
            delegates[d.id] = delegates.get(d.id, 0) + size
            subgraphs[d.id] = subgraphs.get(d.id, 0) + 1
    delegated = sum(delegates.values())
    notes = []
    if dynamic:
        notes.append("at the maximum shape (dynamic dims are planned at their upper bound)")
    if subgraphs:
        notes.append("a lower bound: memory the delegates allocate themselves is not planned")
    costs = ProgramCosts(
        size_breakdown={
            "constants": constants,
            "delegates": dict(sorted(delegates.items())),
            "program": len(pte) - constants - delegated,
            "total": len(pte),
        },
        planned_bytes=planned,
        planned_note="; ".join(notes) or None,
        delegate_subgraphs=dict(sorted(subgraphs.items())),
    )
    return costs, program_schema_version(pte)

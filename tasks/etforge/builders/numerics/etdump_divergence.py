"""First divergent layer of a quantized cell from the program's own intermediate outputs (ETDump).

The cell's ``.pte`` runs once, on the worst validation sample, through the pybindings with the
event tracer on and a debug buffer (``enable_etdump=True, debug_buffer_size=...``: the pip runtime
has both, measured with executorch 1.5.1), so every portable kernel logs its output tensor. The
devtools ``Inspector`` reads the ETDump with its debug buffer and the export's ETRecord, which
resolves each event to its debug handle. A debug handle groups several nodes of the ETRecord's
edge-dialect graph (a linear's permute and addmm; a relu and the quantize/dequantize pair after
it): the handle's kernel events are matched to its nodes in graph order by operator name
(``native_call_addmm.out`` to ``aten.addmm.default``), and each layer's reading is taken from
those values as the graph replay takes it (etforge.builders.numerics.quantized_divergence
``readings_of``), then compared with eager fp32's reading of the same layer.

What a program cannot show: a delegate's ETDump logs only the delegate's outputs (XNNPACK,
measured: its inner events carry no tensors), so the layers it runs are not visible. When a
delegate runs any layer, or the program has no ETRecord, or the traced run fails, the record
falls back to the quantized-graph replay and says why (``why``).

Why not ``Inspector.calculate_numeric_gap``: it needs representative inputs in the ETRecord
(``ETRecord.update_representative_inputs``; without them it fails with "Expected a proper Tensor
but got None") and then compares the runtime with the ETRecord's own exported program, i.e. the
quantized graph the program was lowered from (measured on the fragile int8 portable program:
135 dB to identical), not with eager fp32, which is the question here.

The debug buffer is sized from the program, never guessed: one that runs out aborts the process
(measured: ``etdump_flatcc.cpp`` assert after "Ran out of space to store intermediate outputs").
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

from etforge.builders.numerics.quantized_divergence import (
    ETDUMP,
    REPLAY,
    compare_readings,
    first_below,
    first_divergent_layer,
    readings_of,
    threshold_of,
    with_layers,
)

METHOD = "forward"
ALIGN = 64  # bytes the debug buffer pads each tensor to (measured: 271,834 B of outputs took 272,064 B)
SLACK = 1 << 20
MAX_DEBUG_BUFFER = 1 << 30  # larger intermediate outputs: the replay instead
ITEM_BYTES = {0: 1, 1: 1, 2: 2, 3: 4, 4: 8, 5: 2, 6: 4, 7: 8, 11: 1, 15: 2}  # ExecuTorch ScalarType -> bytes
NATIVE_CALL = "native_call_"  # the event a portable kernel logs, with its output
DELEGATE_CALL = "DELEGATE_CALL"


def program_first_divergent_layer(
    pte: Path | None,
    etrecord: Path | None,
    quantized_pt2: Path,
    fp32_pt2: Path,
    cell,
    inputs: list,
    workdir: Path | None,
) -> dict:
    """The first layer below the threshold against eager fp32 (quantized_divergence ``first_below``
    plus ``layers``; ``{"layer": None}`` when none is), read from the program's (``pte``) ETDump where
    the program exposes its layers, else from the quantized graph's replay, with ``why``."""
    threshold = threshold_of(cell)
    why = "the program has no ETRecord to map its ETDump to layers"
    if pte is not None and etrecord is not None:
        from etforge.builders.lowering.lower import _register_transform_ops

        _register_transform_ops(cell)  # the ETRecord's graphs hold the scheme's ops (torchao's)
        try:
            layers, why = program_layer_sqnrs(pte, etrecord, fp32_pt2, inputs, workdir)
        except Exception as exc:  # the replay still answers
            from etforge.core.text import first_line

            layers, why = None, f"the ETDump run failed: {first_line(exc)}"
        if layers is not None:
            found = with_layers(first_below(layers, threshold, method=ETDUMP), layers)
            return found or {"layer": None, "method": ETDUMP, "layers_compared": len(layers)}
    found = first_divergent_layer(quantized_pt2, fp32_pt2, cell, inputs, threshold_db=threshold)
    return {**(found or {"layer": None, "method": REPLAY}), "why": why}


def program_layer_sqnrs(pte: Path, etrecord: Path, fp32_pt2: Path, inputs: list, workdir: Path | None):
    """(per layer, as quantized_divergence ``compare_readings``, of the program's own outputs against
    eager fp32's, None) or (None, why the program cannot show its layers)."""
    import torch
    from executorch.devtools.etrecord import parse_etrecord

    from etforge.builders.bench.profile import open_inspector
    from etforge.builders.numerics.quantized_divergence import as_tensors, layer_readings

    tensors = [t.contiguous() for t in as_tensors(inputs)]
    record = parse_etrecord(str(etrecord))
    edge = record.edge_dialect_program
    edge = edge[METHOD] if isinstance(edge, dict) else edge
    with tempfile.TemporaryDirectory(dir=workdir) as scratch:
        dump, buffer = run_traced(Path(pte), tensors, Path(scratch))
        inspector = open_inspector(dump, record, buffer)
        events = [event for block in inspector.event_blocks for event in block.events]
        values = node_values(events, edge.graph.nodes)
    program = readings_of(edge.graph.nodes, values)
    eager = layer_readings(torch.export.load(fp32_pt2).module(), tensors)
    hidden, backends = delegated_layers(events, eager, program)
    if hidden:
        shown = ", ".join(sorted(backends))
        seen = len(hidden) + sum(1 for path in eager if path in program)
        return None, f"the program's {shown} delegate is opaque to ETDump ({len(hidden)} of {seen} layers inside it)"
    layers = compare_readings(eager, program)
    if not layers:
        return None, "the program's ETDump logged no layer's output"
    return layers, None


def run_traced(pte: Path, tensors: list, out_dir: Path) -> tuple[Path, Path]:
    """Run ``pte``'s forward once with the event tracer and a debug buffer; (its ETDump, the buffer)."""
    from etforge.builders.runtime.determinism import deterministic, load_runtime_libraries
    from etforge.builders.runtime.program_io import checked_data_path
    from etforge.core.errors import Unsupported

    size = debug_buffer_bytes(pte.read_bytes())
    if size > MAX_DEBUG_BUFFER:
        raise Unsupported(f"its intermediate outputs need a {size >> 20} MiB debug buffer")
    data = checked_data_path(pte)
    load_runtime_libraries()  # the kernels the validation ran (quantized ops), in its load order
    from executorch.extension.pybindings import portable_lib

    module = portable_lib._load_for_executorch(
        str(pte), str(data) if data else None, enable_etdump=True, debug_buffer_size=size
    )
    with deterministic(runtime=True):  # as the validation ran it
        module.run_method(METHOD, tuple(tensors))
    dump, buffer = out_dir / "divergence.etdump", out_dir / "divergence.debug"
    module.write_etdump_result_to_file(str(dump), str(buffer))
    return dump, buffer


def debug_buffer_bytes(pte: bytes, method: str = METHOD) -> int:
    """A debug buffer that holds every output the method's kernels can log: each non-constant tensor
    value of its plan (dynamic dims at their upper bound), padded, twice over, plus SLACK."""
    from executorch.exir._serialize._flatbuffer_program import _flatbuffer_to_program
    from executorch.exir._serialize._program import _get_extended_header
    from executorch.exir.schema import Tensor

    header = _get_extended_header(pte)
    program = _flatbuffer_to_program(pte[: header.program_size] if header is not None else pte)
    plan = next((p for p in program.execution_plan if p.name == method), None)
    total = 0
    for value in plan.values if plan is not None else ():
        tensor = value.val
        if isinstance(tensor, Tensor) and tensor.data_buffer_idx == 0:  # 0: not a constant
            item = ITEM_BYTES.get(int(tensor.scalar_type), 8)
            total += math.prod(int(n) for n in tensor.sizes) * item + ALIGN
    return 2 * total + SLACK


def _operator(op: str) -> str:
    """'addmm' of 'aten.addmm.default', 'dequantize_per_tensor' of its quantized_decomposed op."""
    parts = op.split(".")
    return parts[-2] if len(parts) >= 3 else parts[0]


def node_values(events, nodes) -> dict:
    """Edge node name -> the float tensor its kernel logged: each debug handle's kernel events, in run
    order, matched to that handle's nodes in graph order by operator name."""
    from etforge.builders.numerics.quantized_divergence import op_name

    by_handle: dict = {}
    for node in nodes:
        handle = node.meta.get("debug_handle") if node.op == "call_function" else None
        if isinstance(handle, int):
            by_handle.setdefault(handle, []).append(node)
    cursor: dict = {}
    values: dict = {}
    for event in events:
        handles = event.debug_handles
        handles = [handles] if isinstance(handles, int) else list(handles or ())
        if not event.name.startswith(NATIVE_CALL) or event.is_delegated_op or len(handles) != 1:
            continue
        candidates, at = by_handle.get(handles[0], []), cursor.get(handles[0], 0)
        wanted = event.name.removeprefix(NATIVE_CALL).split(".")[0]
        while at < len(candidates) and _operator(op_name(candidates[at].target)) != wanted:
            at += 1
        if at == len(candidates):
            continue  # a kernel the edge graph does not name (added at to_executorch)
        cursor[handles[0]] = at + 1
        tensor = next(iter(event.debug_data or ()), None)
        if tensor is not None and getattr(tensor, "is_floating_point", lambda: False)():
            values[candidates[at].name] = tensor.detach().float()
    return values


def delegated_layers(events, eager: dict, program: dict) -> tuple[list, set]:
    """(the layers eager fp32 has that ran inside a delegate, whose outputs the ETDump does not hold;
    the delegates' backend names), from the ETRecord's mapping of each delegate call to its nodes."""
    inside: dict = {}
    backends = set()
    for event in events:
        if event.name != DELEGATE_CALL:
            continue
        backends.add(str(event.delegate_backend_name or "delegate"))
        for stack in (event.module_hierarchy or {}).values():
            paths = [entry[0] for entry in (stack or {}).values()] if isinstance(stack, dict) else []
            if paths and paths[-1]:
                inside[paths[-1]] = None
    return [path for path in eager if path in inside and path not in program], backends

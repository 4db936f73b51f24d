"""Find the first graph node where a lowered fp32 program diverges from eager.

Method (``executorch.devtools.intermediate_output_tap``): every call_function
node of the captured ``model.pt2`` whose value is one floating-point tensor is
tapped with ``FULL_TENSOR`` (its output becomes an extra program output); the
tapped ExportedProgram run in eager mode gives the reference value of every
node; the same tapped program is lowered with the cell's partitioners, the taps
stripped (``strip_taps_``), and run in the ExecuTorch runtime, which returns
the runtime value of every node. Each node's SQNR (runtime vs eager, dB) is
computed as in ``etforge.builders.numerics.compare``.

The first divergent node is the first in topological order whose SQNR is
below the threshold (the cell's ``sqnr_db``, else etforge.config.defaults DIVERGENCE_SQNR_DB, 40 dB) **and** whose error
persists: at least one of its nearest tapped consumers is below the threshold
too, or it has none (it feeds the outputs). A node whose own reading diverges
while its consumers agree with eager is a tap artifact, not a divergence:
XNNPACK, for one, folds a batch norm into the preceding convolution and then
reports a stale value for the batch norm's tap. Such nodes are listed under
``artifacts``. A node whose eager value is all zeros has no SQNR; it counts as
divergent when its max abs error exceeds ``ZERO_SIGNAL_ATOL``.

The tap comparison breaks on PT2E-quantized graphs: use it for fp32 cells.
compare_aot_runtime_dataframe is not used: it turns every tensor into a Python
list, which is slow on real activations; the metrics here are numpy.
"""

from __future__ import annotations

import math
import operator
from pathlib import Path

from etforge.config.defaults import DIVERGENCE_SQNR_DB

MAX_TAPS = 2000
ZERO_SIGNAL_ATOL = 1e-4


def lower_cell(exported_program, cell):
    """The cell's lowering (an EdgeProgramManager), as etforge.builders.lowering.lower does it."""
    from executorch.exir import to_edge_transform_and_lower

    from etforge.builders.lowering.lower import partitioners_for

    return to_edge_transform_and_lower(exported_program, partitioner=partitioners_for(cell.backend))


def first_divergence(
    program_path_pt2: Path,
    cell,
    inputs: list,
    *,
    threshold_db: float | None = None,
    lower=None,
    max_taps: int = MAX_TAPS,
) -> dict | None:
    """The first node whose lowered output diverges from eager, or None when none does.

    ``inputs``: one sample, numpy arrays or tensors shaped like the model inputs.
    ``lower(exported_program, cell) -> EdgeProgramManager``: the lowering to check
    (default: the cell's partitioners, as the export step lowers it).

    Returns ``{"node", "op_target", "module_path", "module_class", "sqnr_db",
    "max_abs_error", "index", "threshold_db", "nodes_compared", "artifacts", "nodes"}``
    where ``nodes`` lists every tapped node with its SQNR, in topological order.
    """
    nodes, threshold = node_sqnrs(
        program_path_pt2, cell, inputs, threshold_db=threshold_db, lower=lower, max_taps=max_taps
    )
    below = {n["node"] for n in nodes if n["below"]}
    artifacts = []
    for index, node in enumerate(nodes):
        if not node["below"]:
            continue
        successors = node["tapped_successors"]
        if successors and not any(s in below for s in successors):
            artifacts.append(node["node"])
            continue
        return {
            "node": node["node"],
            "op_target": node["op_target"],
            "module_path": node["module_path"],
            "module_class": node["module_class"],
            "sqnr_db": node["sqnr_db"],
            "max_abs_error": node["max_abs_error"],
            "index": index,
            "threshold_db": threshold,
            "nodes_compared": len(nodes),
            "artifacts": artifacts,
            "nodes": [_brief(n) for n in nodes],
        }
    return None


def node_sqnrs(
    program_path_pt2: Path,
    cell,
    inputs: list,
    *,
    threshold_db: float | None = None,
    lower=None,
    max_taps: int = MAX_TAPS,
) -> tuple[list, float]:
    """(per tapped node: name, op, module, SQNR, max abs error, below?, tapped successors; threshold)."""
    import numpy as np
    import torch
    import torch.utils._pytree as pytree
    from executorch.devtools.intermediate_output_tap import FULL_TENSOR, strip_taps_, tap_intermediate_outputs_

    from etforge.builders.numerics.compare import sqnr_db
    from etforge.builders.runtime.determinism import runtime

    threshold = float(
        threshold_db if threshold_db is not None else (cell.thresholds or {}).get("sqnr_db", DIVERGENCE_SQNR_DB)
    )
    tensors = [x if isinstance(x, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(x)) for x in inputs]
    exported = torch.export.load(program_path_pt2)
    tapped, specs = tap_intermediate_outputs_(exported, rules=[(_float_tensor_node, FULL_TENSOR)], max_taps=max_taps)
    successors = _tapped_successors(tapped.graph_module.graph, {s.node_name for s in specs})
    with torch.no_grad():
        aot_flat, _ = pytree.tree_flatten(tapped.module()(*tensors))
    edge = (lower or lower_cell)(tapped, cell)
    strip_taps_(edge)
    executorch_program = edge.to_executorch()
    runtime_program = runtime().load_program(executorch_program.buffer)
    method = runtime_program.load_method("forward")  # keep runtime_program alive while it runs
    rt_flat = method.execute([t.contiguous() for t in tensors])
    nodes = []
    for spec in specs:
        eager = aot_flat[spec.output_index].detach().double().numpy()
        actual = rt_flat[spec.output_index].detach().double().numpy()
        sqnr: float | None
        if eager.shape != actual.shape:
            sqnr, err, below = -math.inf, math.inf, True
        else:
            err = float(np.max(np.abs(eager - actual))) if eager.size else 0.0
            sqnr = sqnr_db(eager, actual)
            if sqnr is None:
                below = False
            elif sqnr == -math.inf:  # an all-zero eager value: judge by the absolute error
                below = not err <= ZERO_SIGNAL_ATOL  # NaN-safe: a NaN error is below
            else:
                below = not sqnr >= threshold  # NaN-safe: a NaN value is below
        nodes.append(
            {
                "node": spec.node_name,
                "op_target": spec.op_target,
                "module_path": spec.module_path,
                "module_class": spec.module_class,
                "sqnr_db": None if sqnr is None else (sqnr if math.isinf(sqnr) else round(sqnr, 2)),
                "max_abs_error": err,
                "below": below,
                "tapped_successors": successors.get(spec.node_name, []),
            }
        )
    return nodes, threshold


def _float_tensor_node(node) -> bool:
    """Tap call_function nodes producing one floating-point tensor (not getitem, not the taps)."""
    import torch

    if node.op != "call_function" or node.target is operator.getitem:
        return False
    value = node.meta.get("val")
    return isinstance(value, torch.Tensor) and value.is_floating_point()


def _tapped_successors(graph, tapped: set) -> dict:
    """Tapped node name -> names of the nearest tapped nodes downstream (through untapped ones)."""
    from executorch.devtools.intermediate_output_tap import is_tap_node

    by_name = {n.name: n for n in graph.nodes}
    out = {}
    for name in tapped:
        found, seen = [], set()
        stack = [u for u in by_name[name].users if not is_tap_node(u)]
        while stack:
            user = stack.pop()
            if user.name in seen or user.op == "output":
                continue
            seen.add(user.name)
            if user.name in tapped:
                found.append(user.name)
            else:
                stack.extend(u for u in user.users if not is_tap_node(u))
        out[name] = sorted(found)
    return out


def _brief(node: dict) -> dict:
    return {"node": node["node"], "op_target": node["op_target"], "sqnr_db": node["sqnr_db"]}

"""The gates a program must pass besides numerics: delegation coverage (export) and size (sizegate).

    delegation_coverage(graph_module)   how much of a lowered program's compute its delegates took
                                        (in FLOPs: etforge.builders.gates.compute_share; op counts as information)
    size_gate(cell, quantized, fp32, weights)   whether a quantized program saves what its scheme declares

The delegation gate itself is its check's (etforge.checks.delegation Delegation.judged).

Every comparison is written so that a NaN fails it. torch is imported inside functions.
"""

from __future__ import annotations

from etforge.builders.gates.compute_share import compute_coverage
from etforge.builders.quantization.layer_filter import describe_kept
from etforge.checks.size import SizeGate
from etforge.config.defaults import SIZE_GATE_OVERHEAD_BYTES
from etforge.core.errors import BuildError
from etforge.pipeline.results import BuildRequest, BuildResult, TaskStatus
from etforge.pipeline.stage_results import CaptureResult, ExportResult, GateResult, QuantizeResult

OVERHEAD_BYTES = SIZE_GATE_OVERHEAD_BYTES  # a recipe's size_gate.overhead_bytes wins


# Operators that run no kernel on tensor data: view_copy becomes a view in
# to_executorch (ReplaceViewCopyWithViewPass), the rest are symbolic-size
# queries and run-time asserts.
NOT_COMPUTE = frozenset(
    {
        "aten.view_copy",
        "aten.view",
        "aten._unsafe_view",
        "aten.sym_size",
        "aten.sym_numel",
        "aten.sym_stride",
        "aten.sym_storage_offset",
        "aten._assert_scalar",
        "aten._assert_tensor_metadata",
        "aten.sym_constrain_range",
        "aten.sym_constrain_range_for_size",
    }
)


def compute_op_name(node) -> str | None:
    """``aten.convolution`` for a node that is a compute op, else None.

    A compute op is a ``call_function`` node whose target is an ATen/Edge
    operator overload (a kernel that reads and writes tensor data), quantize and
    dequantize included: left outside a delegate they run as portable kernels.
    Not compute ops: placeholders, outputs and get_attr nodes; ``getitem``
    (tuple unpacking); the ``executorch_call_delegate`` node itself (the ops it
    stands for are counted inside the delegate); Python operators on symbolic
    sizes; and the operators in NOT_COMPUTE.
    """
    import torch

    if node.op != "call_function":
        return None
    target = getattr(node.target, "_op", node.target)  # an EdgeOpOverload wraps an OpOverload
    if not isinstance(target, torch._ops.OpOverload):
        return None
    name = str(target.overloadpacket)  # e.g. aten.convolution
    return None if name in NOT_COMPUTE else name


def delegation_coverage(graph_module) -> dict:
    """How much of a lowered edge program's compute the delegates took.

    Ops inside a delegate are counted in the graph the partitioner handed to it
    (``original_module``, before the backend's own rewrites); ops outside in the
    top-level graph, which the portable (or quantized) kernels run. A chain's
    coverage counts every member's delegates together.

    ``delegation_coverage``: delegated / (delegated + not delegated) compute ops
    (1.0 for a program with no compute op); ``compute_ops`` and
    ``delegated_compute_ops``: the counts; ``delegated_by_backend``: backend id
    -> compute ops it took; ``not_delegated``: op name -> count left outside.
    """
    delegated: dict = {}
    outside: dict = {}
    for node in graph_module.graph.nodes:
        if node.op == "get_attr" and node.name.startswith("lowered_module_"):
            lowered = getattr(graph_module, node.name)
            count = sum(1 for n in lowered.original_module.graph.nodes if compute_op_name(n))
            delegated[lowered.backend_id] = delegated.get(lowered.backend_id, 0) + count
        name = compute_op_name(node)
        if name:
            outside[name] = outside.get(name, 0) + 1
    taken, left = sum(delegated.values()), sum(outside.values())
    total = taken + left
    return {
        "delegation_coverage": round(taken / total, 4) if total else 1.0,
        "compute_ops": total,
        "delegated_compute_ops": taken,
        "delegated_by_backend": dict(sorted(delegated.items())),
        "not_delegated": dict(sorted(outside.items())),
        **compute_coverage(graph_module, compute_op_name),
    }


def _same_program(quantized: ExportResult, fp32: ExportResult) -> bool:
    """The same program but for the names its metadata carries (and the same .ptd, if any)."""

    def what(export):
        return export.sha256_without_metadata or export.sha256, export.data_sha256

    return what(quantized) == what(fp32)


def size_gate(cell, quantized: ExportResult, fp32: ExportResult, weights: dict, layers: dict | None = None) -> SizeGate:
    """The size gate's check of a quantized program against its fp32 sibling (``failure``: why not).

    ``quantized``/``fp32``: the two exports' results (size_bytes, sha256); ``weights``: the fp32
    capture's ``weight_bytes``; ``layers``: the quantize record's (a weight-group scheme's): when it
    says which weights the scheme actually took (``taken_weight_bytes``), only those are judged, and
    the layers it kept in float are listed, not counted. The scheme's recipe declares (``cell.size_gate``) which of
    the capture's weights it stores smaller, the largest stored/fp32 ratio of those weights
    that shows it was applied, and optionally ``overhead_bytes``. Only the saving counts,
    so what both programs share (the fixed overhead that makes linreg's program ~2 KB,
    layers the scheme does not take) cancels out:

        stored = fp32 bytes of the weights it takes - (fp32 size - quantized size)
        passes when stored <= max_ratio * those bytes + overhead_bytes

    ``weight_ratio`` (stored / fp32 bytes) goes into the check and the reason. So a program
    byte-identical to fp32, fp16 weights stored as fp32 (0.93x on a 110 KB CNN), and a
    scheme applied to a model with none of the weights it takes all fail, while a 20-byte
    linreg, whose saving is smaller than any program's bookkeeping, is not failed for it.
    """
    gate = cell.size_gate
    # A program with external weights ships with its .ptd: the two count together.
    q_size, f_size = ((export.size_bytes or 0) + (export.data_size_bytes or 0) for export in (quantized, fp32))
    facts: dict = {"size_vs_fp32": round(q_size / f_size, 4) if f_size else None, "saved_bytes": f_size - q_size}
    scheme = cell.quant.name
    if _same_program(quantized, fp32):
        return _judged(facts, f"identical to its fp32 sibling but for the names it carries: {scheme} was not applied")
    kinds = gate["weights"]
    taken = weights["all"] if "all" in kinds else sum(weights.get(k, 0) for k in kinds)
    what = "weights" if "all" in kinds else "/".join(kinds) + " weights"
    took = (layers or {}).get("taken_weight_bytes")
    kept = [e for e in (layers or {}).get("kept_float") or () if isinstance(e, dict)]
    if isinstance(took, dict):  # what the scheme took, not every weight of those kinds
        taken = sum(v for k, v in took.items() if "all" in kinds or k in kinds)
        what = f"the {what} {scheme} took"
        facts["kept_float"] = tuple(kept)
    overhead = gate.get("overhead_bytes", OVERHEAD_BYTES)
    facts.update(weight_bytes=taken, max_weight_ratio=gate["max_ratio"], overhead_bytes=overhead)
    if taken == 0:
        return _judged(
            facts,
            f"{scheme} stores {what} smaller and model {cell.model.name!r} has none: "
            f"the program is {facts['size_vs_fp32']:.2f}x its fp32 sibling",
        )
    stored = taken - facts["saved_bytes"]
    facts["weight_ratio"] = round(stored / taken, 4)
    if not stored <= gate["max_ratio"] * taken + overhead:  # NaN-safe
        return _judged(
            facts,
            f"{what} stored at {stored / taken:.2f}x of fp32 (gate: {scheme} at most "
            f"{gate['max_ratio']}x + {overhead} B): {q_size} B vs "
            f"{f_size} B saves {facts['saved_bytes']} B of {taken} B"
            + (f"; kept in float (not judged): {describe_kept(kept, len(kept))}" if kept else ""),
        )
    return _judged(facts, None)


def _judged(facts: dict, failure: str | None) -> SizeGate:
    return SizeGate.of({**facts, "passed": failure is None, "failure": failure})


def size_gate_stage(request: BuildRequest) -> BuildResult:
    """The sizegate stage's builder: the cell's program against its fp32 sibling's."""
    cell, up = request.cell, request.upstream
    if any(up[r].info.get("status") != TaskStatus.OK for r in ("export", "fp32_export")):
        raise BuildError(f"needs both {up['export'].task} and {up['fp32_export'].task} ok")
    weights = up["capture"].result(CaptureResult).weight_bytes
    layers = up["graph"].result(QuantizeResult).layers if "graph" in up else {}
    check = size_gate(
        cell, up["export"].result(ExportResult), up["fp32_export"].result(ExportResult), weights, layers or None
    )
    status = TaskStatus.FAILED if check.failed else TaskStatus.OK
    return BuildResult(result=GateResult(checks=(check,)), status=status, reason=check.reason())

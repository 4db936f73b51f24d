"""Lower one cell's graph (fp32 capture or its quantized form) to a .pte."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import sys
import time
from contextlib import ExitStack
from importlib import metadata
from pathlib import Path

from tasks.config.defaults import SIZE_GATE_OVERHEAD_BYTES
from tasks.core.paths import REPO_ROOT
from tasks.engine.cached_run import BuildResult

PTE = "program.pte"
INFO = "export.json"
FRESH_PROCESS_ENV = "ETFORGE_EXPORT_FRESH_PROCESS"  # set in the interpreter _build_in_fresh_process starts


def partitioners_for(backend) -> list:
    """Partitioners of every chain member, in priority order: later ones take what earlier ones leave."""
    from tasks.core.dotted_path import load_callable

    out = []
    for member in backend.members:
        if member.partitioner is not None:
            out.extend(load_callable(member.partitioner)(dict(member.options)))
    return out


def lowering_contexts(backend) -> list:
    """Context managers the chain's members need around lowering (tasks.build.partitioners.LOWERING_CONTEXTS)."""
    from tasks.build.partitioners import LOWERING_CONTEXTS
    from tasks.core.dotted_path import load_callable

    names = dict.fromkeys(LOWERING_CONTEXTS[m.partitioner] for m in backend.members
                          if m.partitioner in LOWERING_CONTEXTS)
    return [load_callable(name)() for name in names]


def build_export(cell, program_path: Path, workdir: Path) -> BuildResult:
    """Lower to program.pte; fail (with the .pte kept as evidence) when the delegates took too little."""
    from tasks.build.partitioners import FRESH_PROCESS

    if not os.environ.get(FRESH_PROCESS_ENV) and any(m.partitioner in FRESH_PROCESS for m in cell.backend.members):
        return _build_in_fresh_process(cell, program_path, workdir)
    import torch
    from executorch.devtools.backend_debug import get_delegation_info
    from executorch.exir import to_edge_transform_and_lower

    start = time.monotonic()
    program = torch.export.load(program_path)
    with ExitStack() as stack:
        for context in lowering_contexts(cell.backend):
            stack.enter_context(context)
        edge = to_edge_transform_and_lower(program, partitioner=partitioners_for(cell.backend))
    graph_module = edge.exported_program().graph_module
    delegation = get_delegation_info(graph_module)
    coverage = delegation_coverage(graph_module)
    if cell.transform is not None:
        # quantize/dequantize ops left outside a delegate need these out-variants.
        import executorch.kernels.quantized  # noqa: F401
    executorch_program = edge.to_executorch()
    lowering_s = time.monotonic() - start
    pte = workdir / PTE
    pte.write_bytes(executorch_program.buffer)
    info = {
        "size_bytes": pte.stat().st_size,
        "sha256": hashlib.sha256(pte.read_bytes()).hexdigest(),
        "lowering_s": round(lowering_s, 3),
        "delegated_ops": delegation.num_delegated_nodes,
        "non_delegated_ops": delegation.num_non_delegated_nodes,
        "delegated_subgraphs": delegation.num_delegated_subgraphs,
        **coverage,
        "delegates": list(cell.backend.delegates),
        "executorch_version": metadata.version("executorch"),
        "input_dtypes": [str(dtype).removeprefix("torch.") for dtype in _input_dtypes(program)],
    }
    (workdir / INFO).write_text(json.dumps({"cell": cell.canonical(), **info}, indent=2, sort_keys=True) + "\n",
                                encoding="utf-8")
    files = {PTE: pte, INFO: workdir / INFO}
    failure = delegation_gate(cell, info)
    if failure:
        return BuildResult(files=files, info=info, status="failed", reason=failure)
    if cell.backend.host_runnable:
        check_loads(pte)
    return BuildResult(files=files, info=info)


def _build_in_fresh_process(cell, program_path: Path, workdir: Path) -> BuildResult:
    """build_export in a new interpreter (see tasks.build.partitioners.FRESH_PROCESS for why).

    Its stdout goes where ours goes (the task log); its stderr is relayed there too,
    and its last line becomes the error when it fails."""
    request, result = workdir / ".fresh-process-request.pkl", workdir / ".fresh-process-result.pkl"
    request.write_bytes(pickle.dumps((cell, Path(program_path), workdir)))
    package_root = str(REPO_ROOT)
    env = {**os.environ, FRESH_PROCESS_ENV: "1",
           "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)}
    sys.stdout.flush()
    proc = subprocess.run([sys.executable, "-m", "tasks.build.lower", str(request), str(result)],
                          env=env, stderr=subprocess.PIPE, text=True, errors="replace")
    sys.stderr.write(proc.stderr)
    request.unlink()
    if proc.returncode != 0 or not result.is_file():
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"lowering in a fresh process failed (exit {proc.returncode}): {last}")
    built = pickle.loads(result.read_bytes())
    result.unlink()
    return built


# Operators that run no kernel on tensor data: view_copy becomes a view in
# to_executorch (ReplaceViewCopyWithViewPass), the rest are symbolic-size
# queries and run-time asserts.
NOT_COMPUTE = frozenset({
    "aten.view_copy", "aten.view", "aten._unsafe_view", "aten.sym_size", "aten.sym_numel", "aten.sym_stride",
    "aten.sym_storage_offset", "aten._assert_scalar", "aten._assert_tensor_metadata",
    "aten.sym_constrain_range", "aten.sym_constrain_range_for_size",
})


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
    return {"delegation_coverage": round(taken / total, 4) if total else 1.0,
            "compute_ops": total, "delegated_compute_ops": taken,
            "delegated_by_backend": dict(sorted(delegated.items())),
            "not_delegated": dict(sorted(outside.items()))}


def delegation_gate(cell, info: dict) -> str | None:
    """Why this program must not count as accelerated, or None (no delegate: no gate)."""
    minimum = cell.backend.min_coverage
    if minimum is None:
        return None
    coverage = info["delegation_coverage"]
    if not coverage >= minimum:  # NaN-safe: a coverage that is not a number fails
        left = ", ".join(f"{name} x{n}" for name, n in sorted(info["not_delegated"].items(), key=lambda kv: -kv[1])[:4])
        return (f"backend {cell.backend.name!r} took {info['delegated_compute_ops']} of {info['compute_ops']} "
                f"compute ops ({coverage:.0%}, gate: at least {minimum:.0%}); the rest runs on portable kernels"
                + (f" ({left})" if left else ""))
    return None


OVERHEAD_BYTES = SIZE_GATE_OVERHEAD_BYTES  # tasks/config/defaults.py


def size_gate(cell, quantized: dict, fp32: dict, weights: dict) -> tuple[dict, str | None]:
    """(facts, failure reason or None) of a quantized program against its fp32 sibling.

    ``quantized``/``fp32``: the two export infos (size_bytes, sha256); ``weights``: the fp32
    capture's ``weight_bytes``. The scheme's recipe declares (``cell.size_gate``) which of
    the capture's weights it stores smaller, the largest stored/fp32 ratio of those weights
    that shows it was applied, and optionally ``overhead_bytes``. Only the saving counts,
    so what both programs share (the fixed overhead that makes linreg's program ~2 KB,
    layers the scheme does not take) cancels out:

        stored = fp32 bytes of the weights it takes - (fp32 size - quantized size)
        passes when stored <= max_ratio * those bytes + overhead_bytes

    ``weight_ratio`` (stored / fp32 bytes) goes into the facts and the reason. So a program
    byte-identical to fp32, fp16 weights stored as fp32 (0.93x on a 110 KB CNN), and a
    scheme applied to a model with none of the weights it takes all fail, while a 20-byte
    linreg, whose saving is smaller than any program's bookkeeping, is not failed for it.
    """
    gate = cell.size_gate
    facts = {"size_vs_fp32": round(quantized["size_bytes"] / fp32["size_bytes"], 4),
             "saved_bytes": fp32["size_bytes"] - quantized["size_bytes"]}
    scheme = cell.quant.name
    if quantized["sha256"] == fp32["sha256"]:
        return facts, f"byte-identical to its fp32 sibling: {scheme} was not applied"
    kinds = gate["weights"]
    taken = weights["all"] if "all" in kinds else sum(weights.get(k, 0) for k in kinds)
    what = "weights" if "all" in kinds else "/".join(kinds) + " weights"
    overhead = gate.get("overhead_bytes", OVERHEAD_BYTES)
    facts.update(weight_bytes=taken, max_weight_ratio=gate["max_ratio"], overhead_bytes=overhead)
    if taken == 0:
        return facts, (f"{scheme} stores {what} smaller and model {cell.model.name!r} has none: "
                       f"the program is {facts['size_vs_fp32']:.2f}x its fp32 sibling")
    stored = taken - facts["saved_bytes"]
    facts["weight_ratio"] = round(stored / taken, 4)
    if not stored <= gate["max_ratio"] * taken + overhead:  # NaN-safe
        return facts, (f"{what} stored at {stored / taken:.2f}x of fp32 (gate: {scheme} at most "
                       f"{gate['max_ratio']}x + {overhead} B): {quantized['size_bytes']} B vs "
                       f"{fp32['size_bytes']} B saves {facts['saved_bytes']} B of {taken} B")
    return facts, None


def _input_dtypes(program) -> list:
    from torch.export.graph_signature import InputKind

    user = {s.arg.name for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT}
    return [node.meta["val"].dtype for node in program.graph.nodes
            if node.op == "placeholder" and node.name in user and "val" in node.meta]


def check_loads(pte: Path) -> None:
    """Load the program and its forward method in the ExecuTorch runtime."""
    from executorch.runtime import Runtime

    import executorch.kernels.quantized  # noqa: F401  (quantized out-variants a program may call)
    program = Runtime.get().load_program(pte.read_bytes())
    program.load_method("forward")


if __name__ == "__main__":  # the fresh interpreter started by _build_in_fresh_process
    _request, _result = (Path(arg) for arg in sys.argv[1:3])
    _built = build_export(*pickle.loads(_request.read_bytes()))
    _result.write_bytes(pickle.dumps(_built))

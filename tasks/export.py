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

from tasks.runner import BuildResult

PTE = "program.pte"
INFO = "export.json"
FRESH_PROCESS_ENV = "ETFORGE_EXPORT_FRESH_PROCESS"  # set in the interpreter _build_in_fresh_process starts


def partitioners_for(backend) -> list:
    """Partitioners of every chain member, in priority order: later ones take what earlier ones leave."""
    from tasks.recipes import load_callable

    out = []
    for member in backend.members:
        if member.partitioner is not None:
            out.extend(load_callable(member.partitioner)(dict(member.options)))
    return out


def lowering_contexts(backend) -> list:
    """Context managers the chain's members need around lowering (tasks.partitioners.LOWERING_CONTEXTS)."""
    from tasks.partitioners import LOWERING_CONTEXTS
    from tasks.recipes import load_callable

    names = dict.fromkeys(LOWERING_CONTEXTS[m.partitioner] for m in backend.members
                          if m.partitioner in LOWERING_CONTEXTS)
    return [load_callable(name)() for name in names]


def build_export(cell, program_path: Path, gates: dict, workdir: Path) -> BuildResult:
    from tasks.partitioners import FRESH_PROCESS

    if not os.environ.get(FRESH_PROCESS_ENV) and any(m.partitioner in FRESH_PROCESS for m in cell.backend.members):
        return _build_in_fresh_process(cell, program_path, gates, workdir)
    import torch
    from executorch.devtools.backend_debug import get_delegation_info
    from executorch.exir import to_edge_transform_and_lower

    start = time.monotonic()
    program = torch.export.load(program_path)
    with ExitStack() as stack:
        for context in lowering_contexts(cell.backend):
            stack.enter_context(context)
        edge = to_edge_transform_and_lower(program, partitioner=partitioners_for(cell.backend))
    delegation = get_delegation_info(edge.exported_program().graph_module)
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
        "delegates": list(cell.backend.delegates),
        "executorch_version": metadata.version("executorch"),
        "input_dtypes": [str(dtype).removeprefix("torch.") for dtype in _input_dtypes(program)],
    }
    (workdir / INFO).write_text(json.dumps({"cell": cell.canonical(), **info}, indent=2, sort_keys=True) + "\n",
                                encoding="utf-8")
    files = {PTE: pte, INFO: workdir / INFO}
    failure = delegation_gate(cell, info, gates)
    if failure:
        return BuildResult(files=files, info=info, status="failed", reason=failure)
    if cell.backend.host_runnable:
        check_loads(pte)
    return BuildResult(files=files, info=info)


def _build_in_fresh_process(cell, program_path: Path, gates: dict, workdir: Path) -> BuildResult:
    """build_export in a new interpreter (see tasks.partitioners.FRESH_PROCESS for why).

    Its stdout goes where ours goes (the task log); its stderr is relayed there too,
    and its last line becomes the error when it fails."""
    request, result = workdir / ".fresh-process-request.pkl", workdir / ".fresh-process-result.pkl"
    request.write_bytes(pickle.dumps((cell, Path(program_path), gates, workdir)))
    package_root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, FRESH_PROCESS_ENV: "1",
           "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)}
    sys.stdout.flush()
    proc = subprocess.run([sys.executable, "-m", "tasks.export", str(request), str(result)],
                          env=env, stderr=subprocess.PIPE, text=True, errors="replace")
    sys.stderr.write(proc.stderr)
    request.unlink()
    if proc.returncode != 0 or not result.is_file():
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"lowering in a fresh process failed (exit {proc.returncode}): {last}")
    built = pickle.loads(result.read_bytes())
    result.unlink()
    return built


def delegation_gate(cell, info: dict, gates: dict) -> str | None:
    """Why this program must not count as accelerated, or None."""
    if cell.backend.delegates and info["delegated_ops"] < gates["min_delegated_ops"]:
        return (f"backend {cell.backend.name!r} took {info['delegated_ops']} ops "
                f"(gate: at least {gates['min_delegated_ops']}); the program would run on portable kernels")
    return None


def size_gate(quantized_size: int, fp32_size: int, gates: dict) -> tuple[float, str | None]:
    """(size ratio to the fp32 sibling, failure reason or None)."""
    ratio = quantized_size / fp32_size
    if ratio >= gates["max_size_ratio"]:
        return ratio, f"{ratio:.2f}x the size of its fp32 sibling (gate: below {gates['max_size_ratio']}x)"
    return ratio, None


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

"""Lower a captured program for one cell (backend x quantization) to a .pte."""

from __future__ import annotations

import hashlib
import json
import time
from importlib import metadata
from pathlib import Path

from tasks.runner import BuildResult

PTE = "program.pte"
INFO = "export.json"


def build_export(cell, program_path: Path, workdir: Path) -> BuildResult:
    import torch
    from executorch.devtools.backend_debug import get_delegation_info
    from executorch.exir import to_edge_transform_and_lower

    from tasks.partitioners import partitioners_for

    if cell.quant.quantizer is not None:
        raise NotImplementedError(f"quantization scheme {cell.quant.name!r} has no lowering yet")
    start = time.monotonic()
    program = torch.export.load(program_path)
    edge = to_edge_transform_and_lower(program, partitioner=partitioners_for(cell.backend))
    delegation = get_delegation_info(edge.exported_program().graph_module)
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
    }
    (workdir / INFO).write_text(json.dumps({"cell": cell.canonical(), **info}, indent=2, sort_keys=True) + "\n",
                                encoding="utf-8")
    files = {PTE: pte, INFO: workdir / INFO}
    if cell.backend.delegates and delegation.num_delegated_nodes == 0:
        return BuildResult(files=files, info=info, status="failed",
                           reason=f"backend {cell.backend.name!r} took 0 ops: the program would run "
                                  f"entirely on portable kernels")
    if cell.backend.host_runnable:
        check_loads(pte)
    return BuildResult(files=files, info=info)


def check_loads(pte: Path) -> None:
    """Load the program and its forward method in the ExecuTorch runtime."""
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(pte.read_bytes())
    program.load_method("forward")

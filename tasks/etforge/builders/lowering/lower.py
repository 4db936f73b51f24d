"""Lower one cell's graph (fp32 capture or its quantized form) to a .pte with the backend's partitioners.

The delegation gate it applies is etforge.builders.gates.gates's; a program this host can
run is loaded once in the runtime (etforge.builders.runtime.program_io) before it counts.
"""

from __future__ import annotations

import functools
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

from etforge.builders.capture.capture import load_programs
from etforge.builders.gates.gates import delegation_coverage
from etforge.builders.lowering.oplist import program_operators, write_selected_operators
from etforge.builders.lowering.program_costs import program_costs
from etforge.builders.runtime.program_io import check_loads
from etforge.checks.delegation import Delegation
from etforge.core.errors import BuildError
from etforge.pipeline.results import BuildRequest, BuildResult, TaskStatus
from etforge.pipeline.stage_results import CaptureResult, ExportResult
from etforge.program.metadata import constant_methods, program_meta, stamp_data_sha256, without_meta

PTE = "program.pte"
PTD = "program.ptd"  # the external weights of a backend with `external_weights: true`
OPLIST = "selected_operators.yaml"  # its operators outside delegates, for a selective build
INFO = "export.json"
ETRECORD = "program.etrecord"  # a host-runnable program's: the devtools Inspector reads its ETDump with it
DATA_TAG = "etforge_weights"  # one tag: the runtime takes one data file per program
MIN_EXTERNAL_FRACTION = 0.5  # of the graph's constant bytes the .ptd must hold, else the option did nothing
FRESH_PROCESS_ENV = "ETFORGE_EXPORT_FRESH_PROCESS"  # set in the interpreter _build_in_fresh_process starts
_MATMUL_OPS = ("aten.mm", "aten.addmm", "aten.linear", "aten.bmm")  # an LLM note when left outside


def partitioners_for(backend) -> list:
    """Partitioners of every chain member, in priority order: later ones take what earlier ones leave."""
    from etforge.core.dotted_path import load_callable

    out = []
    for member in backend.members:
        if member.partitioner is not None:
            out.extend(load_callable(member.partitioner)(dict(member.options)))
    return out


def lowering_contexts(backend) -> list:
    """Context managers the chain's members need around lowering (their recipes' ``lowering.context``)."""
    from etforge.core.dotted_path import load_callable

    names = dict.fromkeys(m.lowering["context"] for m in backend.members if m.lowering.get("context"))
    return [load_callable(name)() for name in names]


def edge_lowering(backend):
    """What lowers the graph to an edge program: ``to_edge_transform_and_lower``, or the function a
    member's recipe names in ``lowering.edge`` (a backend that rewrites operators in place instead of
    delegating, e.g. Cortex-M: etforge.builders.cortex_m.lowering), called the same way with ``options``."""
    from executorch.exir import to_edge_transform_and_lower

    from etforge.core.dotted_path import load_callable

    named = [m for m in backend.members if m.lowering.get("edge")]
    if not named:
        return to_edge_transform_and_lower
    return functools.partial(load_callable(named[0].lowering["edge"]), options=dict(named[0].options))


def after_lowering(backend, edge, workdir: Path) -> tuple[dict, tuple]:
    """({blob: path}, checks) that the chain's recipes' ``lowering.after`` hooks record from the
    lowered program (e.g. Vela's estimate of an Ethos-U program: etforge.builders.arm.ethos_u_vela)."""
    from etforge.core.dotted_path import load_callable

    files: dict = {}
    checks: tuple = ()
    for name in dict.fromkeys(m.lowering["after"] for m in backend.members if m.lowering.get("after")):
        found_files, found_checks = load_callable(name)(edge, workdir)
        files.update(found_files)
        checks += tuple(found_checks)
    return files, checks


def export_stage(request: BuildRequest) -> BuildResult:
    """The export stage's builder for a module (an LLM's: etforge.builders.llm.stages): lower the graph of
    ``request.upstream["graph"]`` (quantized or fp32)."""
    capture = request.upstream["capture"].result(CaptureResult)
    graph = request.upstream["graph"]
    return build_export(request.cell, graph.files["model.pt2"], request.workdir, capture)


def _register_transform_ops(cell) -> None:
    """Import what registers the custom ops of the cell's quantized graph before loading it.

    The quantize task ran in another process; without this, a graph holding e.g.
    ``quant::dequantize_codebook`` fails to deserialize unless the same worker happened
    to quantize it first.
    """
    import importlib

    from etforge.core.dotted_path import load_callable

    if cell.transform is None or cell.transform.method != "torchao":
        return
    importlib.import_module("torchao")  # registers the torchao:: ops of every torchao scheme
    for module in getattr(load_callable(cell.transform.ref), "op_libraries", ()):
        importlib.import_module(module)


def build_export(
    cell,
    program_path: Path,
    workdir: Path,
    capture: CaptureResult | None = None,
    edge_options: dict | None = None,
    backend_options: dict | None = None,
) -> BuildResult:
    """Lower to program.pte; fail (with the .pte kept as evidence) when the delegates took too little.

    ``capture``: the capture's result (its outputs go into the program's metadata);
    ``edge_options``/``backend_options``: what an LLM's lowering adds (etforge.builders.llm.stages):
    to_edge_transform_and_lower's options (the runner's metadata methods, a partitioner) and
    ExecutorchBackendConfig settings. What the quantized graph kept in float is the quantize
    record's (the cell's outcome reads it there)."""
    capture = capture or CaptureResult()
    edge_options, backend_options = dict(edge_options or {}), dict(backend_options or {})
    if not os.environ.get(FRESH_PROCESS_ENV) and any(m.lowering.get("fresh_process") for m in cell.backend.members):
        return _build_in_fresh_process(cell, program_path, workdir, capture)
    from executorch.devtools.backend_debug import get_delegation_info

    start = time.monotonic()
    _register_transform_ops(cell)
    programs = load_programs(program_path)  # {"forward": ep}, or every method of a multi-method model
    first = next(iter(programs))
    program = programs[first]
    external = external_weights(cell.backend)
    input_dtypes = [str(dtype).removeprefix("torch.") for dtype in _input_dtypes(program)]
    meta = program_meta(cell, input_dtypes, capture, external)
    constant_bytes = max(_constant_bytes(p) for p in programs.values()) if external else 0
    if external:
        for each in programs.values():
            tag_delegate_constants(each)
    with ExitStack() as stack:
        for context in lowering_contexts(cell.backend):
            stack.enter_context(context)
        partitioners = edge_options.pop("partitioner", None) or partitioners_for(cell.backend)
        lowering = edge_lowering(cell.backend)
        # a program this host runs keeps an ETRecord: the benchmark's profile maps its ETDump through it
        etrecord = cell.backend.host_runnable and not isinstance(lowering, functools.partial)
        edge = lowering(
            program if len(programs) == 1 else programs,
            partitioner=partitioners,
            **({"generate_etrecord": True} if etrecord else {}),
            **{
                **edge_options,
                "constant_methods": {
                    **edge_options.get("constant_methods", {}),  # an LLM runner's
                    **constant_methods(meta),
                },
            },
        )
    graph_module = edge.exported_program(first).graph_module  # delegation of the first method
    recorded_files, recorded = after_lowering(cell.backend, edge, workdir)
    info = get_delegation_info(graph_module)
    coverage = delegation_coverage(graph_module)
    delegation = Delegation.of(
        {
            **coverage,
            "backend": cell.backend.name,
            "minimum": cell.backend.min_coverage,
            "delegated_ops": info.num_delegated_nodes,
            "non_delegated_ops": info.num_non_delegated_nodes,
            "delegated_subgraphs": info.num_delegated_subgraphs,
        }
    ).judged()
    if cell.transform is not None or backend_options:
        # quantize/dequantize ops left outside a delegate (and fused quantized embeddings) need these out-variants.
        import executorch.kernels.quantized  # noqa: F401
    executorch_program = edge.to_executorch(_backend_config(cell.transform, external, backend_options))
    lowering_s = time.monotonic() - start
    pte = workdir / PTE
    files = {PTE: pte, INFO: workdir / INFO, **recorded_files}
    data_info = {}
    if external:
        files[PTD] = workdir / PTD
        data_info = write_external_data(executorch_program, files[PTD], constant_bytes)
        pte.write_bytes(stamp_data_sha256(executorch_program.buffer, data_info["data_sha256"]))
    else:
        pte.write_bytes(executorch_program.buffer)
    if etrecord:
        files[ETRECORD] = workdir / ETRECORD
        executorch_program.get_etrecord().save(str(files[ETRECORD]))
    operators = program_operators(pte)
    files[OPLIST] = write_selected_operators(operators, workdir / OPLIST, cell.name)
    note = None
    llm_metadata = edge_options.get("constant_methods") or {}  # an LLM's runner metadata methods
    if llm_metadata:
        matmuls = sum(n for op, n in coverage["not_delegated"].items() if op in _MATMUL_OPS)
        if matmuls and cell.backend.delegates:  # e.g. bf16 on XNNPACK: it builds, but slowly
            note = f"linears not delegated: {matmuls} matmul op(s) run on portable kernels (slow)"
    program_bytes = pte.read_bytes()  # read once: its sha256, its sha256 without metadata, its costs
    costs, schema_version = program_costs(
        program_bytes, dynamic=any(i.dims for _, ins in cell.model.methods for i in ins)
    )
    result = ExportResult(
        size_bytes=len(program_bytes),
        sha256=hashlib.sha256(program_bytes).hexdigest(),
        # without its metadata (names, dtypes): the size gate tells a scheme that changed nothing by it
        sha256_without_metadata=hashlib.sha256(without_meta(program_bytes)).hexdigest(),
        lowering_s=round(lowering_s, 3),
        delegates=tuple(cell.backend.delegates),
        executorch_version=metadata.version("executorch"),
        input_dtypes=tuple(input_dtypes),
        **data_info,
        schema_version=schema_version,
        costs=costs,
        llm_metadata=llm_metadata,
        operators=operators,
        note=note,
        checks=(delegation, *recorded),
    )
    (workdir / INFO).write_text(
        json.dumps({"cell": cell.canonical(), **result.to_json()}, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    if delegation.failed:
        return BuildResult(files=files, result=result, status=TaskStatus.FAILED, reason=delegation.reason())
    if cell.backend.host_runnable:
        check_loads(pte, tuple(programs), files.get(PTD))
    return BuildResult(files=files, result=result)


def _build_in_fresh_process(cell, program_path: Path, workdir: Path, capture: CaptureResult) -> BuildResult:
    """build_export in a new interpreter (a recipe's ``lowering.fresh_process``: see recipes/backends/openvino.yaml).

    Its stdout goes where ours goes (the task log); its stderr is relayed there too,
    and its last line becomes the error when it fails."""
    request, result = workdir / ".fresh-process-request.pkl", workdir / ".fresh-process-result.pkl"
    request.write_bytes(pickle.dumps((cell, Path(program_path), workdir, capture)))
    env = {**os.environ, FRESH_PROCESS_ENV: "1"}
    sys.stdout.flush()
    proc = subprocess.run(
        [sys.executable, "-m", "etforge.builders.lowering.lower", str(request), str(result)],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
    )
    sys.stderr.write(proc.stderr)
    request.unlink()
    if proc.returncode != 0 or not result.is_file():
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise BuildError(f"lowering in a fresh process failed (exit {proc.returncode}): {last}")
    built = pickle.loads(result.read_bytes())
    result.unlink()
    return built


def external_weights(backend) -> bool:
    """Whether the backend entry asks for its constants in a separate .ptd (`external_weights: true`)."""
    return any(m.options.get("external_weights") for m in backend.members)


def tag_delegate_constants(program) -> None:
    """Tag every constant placeholder so that delegates (XNNPACK) put its bytes in the named data
    file; ``external_constants`` alone moves only the constants left outside delegates (measured)."""
    user = set(program.graph_signature.user_inputs)
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name not in user:
            node.meta.setdefault("custom", {})["delegate_constant_tag"] = DATA_TAG


def write_external_data(executorch_program, ptd: Path, constant_bytes: int) -> dict:
    """Write the program's one data file to ``ptd``; fail when it holds too little of the weights
    (a backend that ignored the tags keeps them inline, and the option would silently do nothing)."""
    import tempfile

    with tempfile.TemporaryDirectory(dir=ptd.parent) as out:
        executorch_program.write_tensor_data_to_file(out)
        written = sorted(Path(out).glob("*.ptd"))
        if len(written) > 1:
            raise BuildError(
                f"external_weights: the program needs {len(written)} data files "
                f"({', '.join(p.name for p in written)}); etforge ships one per program"
            )
        data = written[0].read_bytes() if written else b""
    if len(data) < MIN_EXTERNAL_FRACTION * constant_bytes:
        raise BuildError(
            f"external_weights: only {len(data)} of the graph's {constant_bytes} constant bytes "
            "went to the .ptd; the backend kept its weights inside the program"
        )
    ptd.write_bytes(data)
    return {
        "data_sha256": hashlib.sha256(data).hexdigest(),
        "data_size_bytes": len(data),
        "constant_bytes": constant_bytes,
    }


def _constant_bytes(program) -> int:
    tensors = {id(t): t for t in (*program.state_dict.values(), *program.constants.values()) if hasattr(t, "nbytes")}
    return sum(t.nbytes for t in tensors.values())


def _backend_config(transform, external: bool, settings: dict):
    """ExecutorchBackendConfig of the cell (``settings``: an LLM cell's), or None for the defaults.

    Quantized embeddings (torchao dequantize + embedding) become ExecuTorch's quantized embedding
    ops only with quant fusion; without it ``Missing out variants: {'torchao::dequantize_affine'}``.
    ``external``: every constant left outside a delegate goes to the one data file too (DATA_TAG)."""
    from etforge.builders.quantization.quantizers import quantizes_embeddings

    settings = dict(settings)
    if quantizes_embeddings(transform):
        settings["do_quant_fusion_and_const_prop"] = True
    if external:
        settings["external_constants"] = lambda node: DATA_TAG
    if not settings:
        return None
    from executorch.exir import ExecutorchBackendConfig

    return ExecutorchBackendConfig(**settings)


def _input_dtypes(program) -> list:
    from torch.export.graph_signature import InputKind

    user = {s.arg.name for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT}
    return [
        node.meta["val"].dtype
        for node in program.graph.nodes
        if node.op == "placeholder" and node.name in user and "val" in node.meta
    ]


if __name__ == "__main__":  # the fresh interpreter started by _build_in_fresh_process
    _request, _result = (Path(arg) for arg in sys.argv[1:3])
    _cell, _program, _workdir, _capture = pickle.loads(_request.read_bytes())
    _built = build_export(_cell, _program, _workdir, _capture)
    _result.write_bytes(pickle.dumps(_built))

"""The stage builders of a decoder-only LLM (a transformers ``text-generation`` model).

The engine picks them once, from the model's kind (``ModelSpec.kind``: the LLM Kind of
etforge.pipeline.stages KINDS), instead of every module builder branching on it. Each does what is
particular to an LLM and hands the rest to the shared builder:

    capture     a seeded prompt, eager greedy continuation and logits; the static-KV-cache program
                (etforge.builders.llm.export)
    quantize    the same schemes as any model, on the eager model; also the quantized eager
                model's logits, the reference a quantized cell is judged against (SAME_SCHEME)
    export      the runner's metadata methods and LLM lowering settings (a Core ML fp32 cell
                lowers a static capture without llama:: ops)
    validate    prefill, KV-cache decode steps, greedy continuation (etforge.builders.llm.numerics),
                or the prompt token by token in a .bpte for the device
    benchmark   load, prefill, decode and time to first token (etforge.builders.llm.bench) first,
                then the module benchmark
"""

from __future__ import annotations

import time
from pathlib import Path

from etforge.builders.capture.reference import REFERENCE
from etforge.builders.llm.numerics import SAME_SCHEME
from etforge.pipeline.results import BuildRequest, BuildResult, TaskStatus
from etforge.pipeline.stage_results import CaptureResult, QuantizeResult

PROGRAM = "model.pt2"
PTE = "program.pte"


def capture_stage(request: BuildRequest) -> BuildResult:
    import torch

    from etforge.builders.capture.capture import describe_outputs, nonfinite_eager, weight_bytes
    from etforge.builders.capture.reference import write_reference
    from etforge.builders.llm import export as llm_export
    from etforge.builders.loading.model_loading import build_model

    model_spec, workdir = request.model, request.workdir
    start = time.monotonic()
    model = build_model(model_spec, request.plan.root)
    samples, eager, names, source, extra = llm_export.eager_reference(
        model, model_spec, request.plan.seed, request.plan.root
    )
    failure = nonfinite_eager(model_spec.name, eager, names, source)
    if failure:
        return BuildResult(status=TaskStatus.FAILED, reason=failure)
    program = llm_export.export_llm(model, model_spec.source["transformers"]["llm"])
    torch.export.save(program, workdir / PROGRAM)
    write_reference(workdir / REFERENCE, samples, eager, names, source, extra=extra)
    result = CaptureResult(
        export_s=round(time.monotonic() - start, 3),
        inputs=source,
        samples=len(samples),
        outputs=tuple(describe_outputs(names, eager[0])),
        weight_bytes=weight_bytes(program),
        **llm_export.capture_notes(model_spec, extra),
    )
    return BuildResult(files={PROGRAM: workdir / PROGRAM, REFERENCE: workdir / REFERENCE}, result=result)


def quantize_stage(request: BuildRequest) -> BuildResult:
    import numpy as np
    import torch

    from etforge.builders.llm.export import cell_llm_options, cell_uses_custom_ops, export_llm, same_scheme_logits
    from etforge.builders.quantization.quantize import quantize_model

    cell, capture, workdir = request.cell, request.upstream["capture"], request.workdir
    start = time.monotonic()
    reference = capture.files[REFERENCE]
    model, _, facts = quantize_model(cell, request.plan.root, request.plan.seed, capture.files[PROGRAM], reference)
    np.save(workdir / SAME_SCHEME, same_scheme_logits(model, reference))
    torch.export.save(
        export_llm(model, cell_llm_options(cell), custom_ops=cell_uses_custom_ops(cell)), workdir / PROGRAM
    )
    result = QuantizeResult(quantize_s=round(time.monotonic() - start, 3), **facts)
    return BuildResult(files={PROGRAM: workdir / PROGRAM, SAME_SCHEME: workdir / SAME_SCHEME}, result=result)


def export_stage(request: BuildRequest) -> BuildResult:
    from etforge.builders.llm.export import lowering_options
    from etforge.builders.lowering.lower import build_export

    cell, graph = request.cell, request.upstream["graph"]
    program = _lowered_graph(cell, graph.files[PROGRAM], request.plan.root, request.workdir)
    edge_options, backend_options = lowering_options(cell)  # also registers the llama:: ops the graph holds
    capture = request.upstream["capture"].result(CaptureResult)
    result = build_export(cell, program, request.workdir, capture, edge_options, backend_options)
    if SAME_SCHEME in graph.files:  # the quantized eager logits, for validate
        result.files[SAME_SCHEME] = graph.files[SAME_SCHEME]
    return result


def _lowered_graph(cell, program: Path, root: Path, workdir: Path) -> Path:
    """The capture's graph holds llama:: custom ops and dynamic shapes; a Core ML fp32 cell lowers a
    static capture without them instead (a quantized one's quantize stage exported it that way)."""
    from etforge.builders.llm.export import cell_uses_custom_ops, static_capture

    if cell_uses_custom_ops(cell) or cell.transform is not None:
        return program
    import torch

    path = workdir / "static_capture.pt2"
    torch.export.save(static_capture(cell, root), path)
    return path


def validate_stage(request: BuildRequest) -> BuildResult:
    from etforge.builders.llm.numerics import build_llm_bundled, build_llm_validate

    cell, export, capture = request.cell, request.upstream["export"], request.upstream["capture"]
    sha256 = export.sha256.get(PTE)  # as the store verified it
    if not cell.backend.host_runnable:  # the prompt token by token through the static program
        return build_llm_bundled(cell, export.files[PTE], capture.files[REFERENCE], request.workdir, sha256)
    return build_llm_validate(
        cell, export.files[PTE], capture.files[REFERENCE], request.workdir, export.files.get(SAME_SCHEME), sha256
    )


def benchmark_stage(request: BuildRequest) -> BuildResult:
    from etforge.builders.bench.benchmark import benchmark_stage as module_benchmark
    from etforge.builders.llm.bench import measure
    from etforge.builders.llm.export import register_custom_ops

    register_custom_ops()  # else forward fails to load (0x14) in a process that has not imported them yet
    llm = request.model.source["transformers"]["llm"]
    return module_benchmark(request, llm_timing=lambda pte, inputs, opts: measure(pte, inputs[0], llm, opts))

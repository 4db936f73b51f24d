"""The stage builders of an encoder-decoder model (transformers ``automatic-speech-recognition`` and
``text2text-generation``: ModelKind.SEQ2SEQ, its Kind in etforge.pipeline.stages KINDS).

    capture     per encoder input (the encoder's validation data, else one seeded input) eager's greedy
                continuation and logits; the program's two methods, encoder and text_decoder
                (etforge.builders.seq2seq.export)
    quantize    the same schemes as any model, on the eager model; also the quantized eager
                model's logits, the reference a quantized cell is judged against (SAME_SCHEME)
    export      a multi-method module's (etforge.builders.lowering.lower) plus the runner's metadata methods
    validate    the encoder once, then the decoder step by step (etforge.builders.seq2seq.numerics)
    benchmark   a generation's figures, as an LLM's (etforge.builders.seq2seq.bench), then each
                method timed on its capture sample
"""

from __future__ import annotations

import time

from etforge.builders.capture.reference import REFERENCE
from etforge.builders.llm.numerics import SAME_SCHEME
from etforge.pipeline.results import BuildRequest, BuildResult, TaskStatus
from etforge.pipeline.stage_results import CaptureResult, QuantizeResult

PROGRAM = "model.pt2"
PTE = "program.pte"


def capture_stage(request: BuildRequest) -> BuildResult:
    from etforge.builders.capture.capture import (
        describe_outputs,
        nonfinite_eager,
        save_programs,
        weight_bytes,
        write_method_references,
    )
    from etforge.builders.loading.hf_models import RANDOM_WEIGHTS_NOTE, random_weights
    from etforge.builders.loading.model_loading import build_model
    from etforge.builders.seq2seq import export as seq2seq_export

    model_spec, workdir = request.model, request.workdir
    start = time.monotonic()
    model = build_model(model_spec, request.plan.root)
    try:
        eager = seq2seq_export.eager_reference(model, model_spec, request.plan.seed, request.plan.root)
    except ValueError as exc:  # a start token outside the vocabulary
        return BuildResult(status=TaskStatus.FAILED, reason=f"model {model_spec.name!r}: {exc}")
    methods = seq2seq_export.reference_methods(eager)
    for method, (_, outputs, names, source) in methods.items():
        failure = nonfinite_eager(f"{model_spec.name}.{method}", outputs, names, source)
        if failure:
            return BuildResult(status=TaskStatus.FAILED, reason=failure)
    programs = seq2seq_export.export_seq2seq(model, model_spec.source["transformers"], eager["states"][0])
    save_programs(workdir / PROGRAM, programs)
    write_method_references(workdir / REFERENCE, methods, extra=seq2seq_export.extra_arrays(eager))
    described = {m: describe_outputs(names, outputs[0]) for m, (_, outputs, names, _) in methods.items()}
    result = CaptureResult(
        export_s=round(time.monotonic() - start, 3),
        inputs=eager["source"],
        samples=len(eager["input"]),
        outputs=tuple(next(iter(described.values()))),
        weight_bytes=_weight_bytes([weight_bytes(p) for p in programs.values()]),
        methods={m: {"outputs": o} for m, o in described.items()},
        llm={
            "decode_steps": len(eager["tokens"][0]) - 1,
            "eager_tokens": eager["tokens"][0][1:],  # the first sample's
            "start_token": eager["tokens"][0][0],
        },
        note=RANDOM_WEIGHTS_NOTE if random_weights(model_spec) else None,
    )
    return BuildResult(files={PROGRAM: workdir / PROGRAM, REFERENCE: workdir / REFERENCE}, result=result)


def _weight_bytes(per_method: list) -> dict:
    """The program's weight bytes: each method's summed (the encoder's and the decoder's weights are
    their own; a table both use, T5's shared embedding, is stored by each and counted twice)."""
    return {kind: sum(m.get(kind, 0) for m in per_method) for kind in per_method[0]}


def quantize_stage(request: BuildRequest) -> BuildResult:
    import numpy as np
    import torch

    from etforge.builders.capture.capture import save_programs
    from etforge.builders.quantization.quantize import quantize_model
    from etforge.builders.seq2seq.export import eager_logits, export_seq2seq

    cell, capture, workdir = request.cell, request.upstream["capture"], request.workdir
    start = time.monotonic()
    reference = capture.files[REFERENCE]
    model, _, facts = quantize_model(cell, request.plan.root, request.plan.seed, capture.files[PROGRAM], reference)
    source = cell.model.source["transformers"]
    with np.load(reference) as data:  # one row per sample (etforge.builders.seq2seq.export extra_arrays)
        xs, rows = torch.from_numpy(data["s2s_input"]), data["s2s_tokens"].tolist()
        states = torch.from_numpy(data["s2s_states"][0])
    dtype = next(model.parameters()).dtype  # a dtype scheme (fp16) takes its float inputs in that dtype
    xs = xs.to(dtype) if xs.is_floating_point() else xs
    states = states.to(dtype)
    same = [eager_logits(model, source, x, tokens[:-1]).numpy() for x, tokens in zip(xs, rows)]
    np.save(workdir / SAME_SCHEME, np.stack(same))  # [N, steps, V]
    save_programs(workdir / PROGRAM, export_seq2seq(model, source, states))
    result = QuantizeResult(quantize_s=round(time.monotonic() - start, 3), **facts)
    return BuildResult(files={PROGRAM: workdir / PROGRAM, SAME_SCHEME: workdir / SAME_SCHEME}, result=result)


def export_stage(request: BuildRequest) -> BuildResult:
    """A multi-method module's export with the ASR runner's metadata methods
    (etforge.builders.seq2seq.export.runner_metadata); a quantized cell's same-scheme logits travel on
    to validate."""
    from etforge.builders.lowering.lower import build_export
    from etforge.builders.seq2seq.export import runner_metadata

    cell, graph = request.cell, request.upstream["graph"]
    capture = request.upstream["capture"].result(CaptureResult)
    edge_options = {"constant_methods": runner_metadata(cell.model, capture)}
    result = build_export(cell, graph.files[PROGRAM], request.workdir, capture, edge_options)
    if SAME_SCHEME in graph.files:
        result.files[SAME_SCHEME] = graph.files[SAME_SCHEME]
    return result


def validate_stage(request: BuildRequest) -> BuildResult:
    from etforge.builders.seq2seq.numerics import build_seq2seq_validate

    cell, export, capture = request.cell, request.upstream["export"], request.upstream["capture"]
    if not cell.backend.host_runnable:  # the plan admits only backends whose recipes measured seq2seq here
        return BuildResult(
            status=TaskStatus.NOT_RUNNABLE,
            reason=f"not runnable on this host (no {cell.backend.name} runtime); no bundled check for "
            "encoder-decoder programs yet",
        )
    return build_seq2seq_validate(
        cell,
        export.files[PTE],
        capture.files[REFERENCE],
        request.workdir,
        same_scheme=export.files.get(SAME_SCHEME),
        program_sha256=export.sha256.get(PTE),  # as the store verified it
    )


def benchmark_stage(request: BuildRequest) -> BuildResult:
    """A generation's figures (etforge.builders.seq2seq.bench: encoder as the prefill, decoder steps) first,
    then the module benchmark of each method on its capture sample."""
    from etforge.builders.bench.benchmark import benchmark_stage as module_benchmark
    from etforge.builders.seq2seq.bench import measure

    start = request.upstream["capture"].result(CaptureResult).llm["start_token"]
    cache = request.model.source["transformers"]["seq2seq"]["max_cache_len"]
    return module_benchmark(request, llm_timing=lambda pte, inputs, opts: measure(pte, inputs[0], start, cache, opts))

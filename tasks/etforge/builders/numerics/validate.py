"""Run a cell's .pte in the ExecuTorch runtime on every validation sample and compare with eager PyTorch.

``numerics.json`` holds, per output, the metrics of ``etforge.builders.numerics.compare.compare_samples``
over all N samples, the verdict against the cell's thresholds, where the inputs came
from, and, for an fp32 cell that misses, the first graph node where the program
diverges from eager (``etforge.builders.numerics.divergence``); for a quantized one that misses
or that keep_float auto changed, the first layer below the threshold against eager fp32, read
from the program's own intermediate outputs (an ETDump with debug buffers, mapped to layers by
the export's ETRecord: ``etforge.builders.numerics.etdump_divergence``) where the program exposes
its layers, else from the quantized graph replayed per layer
(``etforge.builders.numerics.quantized_divergence``), the record saying which and why. Only a
program this host runs gets either search; a diagnosis never fails the validation.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from etforge.builders.bench.profile import ETRECORD
from etforge.builders.capture.reference import REFERENCE
from etforge.builders.numerics.task_metrics import has_task_data, task_checks
from etforge.checks.numerics import Numerics
from etforge.core.errors import BadValue
from etforge.pipeline.results import BuildRequest, BuildResult, TaskStatus
from etforge.pipeline.stage_results import ExportResult, Verdict

NUMERICS = "numerics.json"
PROGRAM = "program.pte"
TOPK_THRESHOLDS = ("top1_agreement", "top5_agreement")


def validate_stage(request: BuildRequest) -> BuildResult:
    """The validate stage's builder for a module (an LLM's: etforge.builders.llm.stages): runs the
    program here, or bundles it for the device to check."""
    cell, export, capture = request.cell, request.upstream["export"], request.upstream["capture"]
    input_dtypes = list(export.result(ExportResult).input_dtypes)
    program_sha256 = export.sha256.get(PROGRAM)  # as the store verified it
    if not cell.backend.validated_here:
        from etforge.builders.numerics.bundle import build_bundled

        bundled = build_bundled(
            cell, export.files[PROGRAM], capture.files[REFERENCE], input_dtypes, request.workdir, program_sha256
        )
        if cell.backend.probe:  # measured: what this host lacks to run it (e.g. etforge.builders.arm.vgf_probe)
            from etforge.core.dotted_path import load_callable

            bundled.reason = f"{load_callable(cell.backend.probe)()}; {bundled.reason}"
        return bundled
    # the runtime runs it here, else what its recipe's runtime.validated_by names (no divergence search)
    here = cell.backend.host_runnable
    graph = request.upstream.get("graph") if cell.transform is not None else None  # the quantized graph
    return build_validate(
        cell,
        export.files[PROGRAM],
        capture.files[REFERENCE],
        input_dtypes,
        request.workdir,
        program=capture.files["model.pt2"] if here else None,
        runner=None if here else stand_in_runner(cell.backend, export.files),
        program_sha256=program_sha256,
        quantized=graph.files["model.pt2"] if here and graph is not None else None,
        rescued=bool(graph is not None and graph.info.get("rescue")),
        root=request.plan.root,
        etrecord=export.files.get(ETRECORD) if here else None,  # maps the program's ETDump to layers
    )


@dataclass(frozen=True)
class Runner:
    """What runs a program instead of this host's ExecuTorch runtime: ``run(pte, samples, method) ->
    outputs per sample``, named in the verdict (``name``, and ``proxy`` when it runs a stand-in for the
    program); ``target``: it is the ExecuTorch runtime of another CPU (an aarch64 core, etforge.builders.targets),
    whose verdict is that target's (Numerics ``target``), not a stand-in's."""

    run: Callable
    name: str
    proxy: str | None = None
    target: str | None = None


def stand_in_runner(backend, export_files: dict) -> Runner:
    """The Runner of a backend's recipe ``runtime.validated_by``, named with its runtime tools' versions."""
    from etforge.core.dotted_path import load_callable

    spec = backend.validated_by
    function = load_callable(spec["runner"])
    tools = ", ".join(f"{name} {version}" for name, version in sorted(backend.runtime_tools.items()) if version)
    return Runner(
        run=lambda pte, samples, method="forward": function(pte, samples, dict(export_files), method),
        name=spec["name"] + (f" ({tools})" if tools else ""),
        proxy=spec.get("proxy"),
    )


def build_validate(
    cell,
    pte: Path,
    reference: Path,
    input_dtypes: list,
    workdir: Path,
    program: Path | None = None,
    runner: Runner | None = None,
    program_sha256: str | None = None,
    quantized: Path | None = None,
    rescued: bool = False,
    root: Path | None = None,
    etrecord: Path | None = None,
) -> BuildResult:
    """Validate ``pte`` against the capture's ``reference``; ``program``: the capture's model.pt2,
    used to find the first divergent node when an fp32 cell misses a threshold; ``runner``: what
    runs it when the ExecuTorch runtime cannot (default: the runtime); ``quantized``: a quantized
    cell's graph (the quantize stage's model.pt2), used with ``program`` to find the first divergent
    layer when the cell misses a threshold or ``rescued`` (keep_float: auto changed it), from the
    program's ETDump mapped through ``etrecord`` (the export's) where the program shows its layers;
    ``root``: the project, whose labels and metric functions give the task checks
    (etforge.builders.numerics.task_metrics)."""
    import numpy as np

    from etforge.builders.capture.reference import load_reference_samples, reference_methods
    from etforge.builders.numerics.compare import compare_samples, finite_json, verdict
    from etforge.builders.runtime.program_io import cast_inputs, run_program_samples
    from etforge.config.io_spec import output_labels
    from etforge.core.digest import sha256_file

    # the bytes this verdict is about (it counts only for them): as the store verified them, else hashed
    program_sha256 = program_sha256 or sha256_file(pte)
    methods = reference_methods(reference)
    if methods != ["forward"]:
        return _validate_methods(cell, pte, reference, methods, workdir, runner, program_sha256)
    ref = load_reference_samples(reference)
    samples = [cast_inputs(ref.sample_inputs(n), input_dtypes) for n in range(ref.count)]
    results = runner.run(pte, samples) if runner is not None else run_program_samples(pte, samples)
    if any(len(r) != len(ref.outputs) for r in results):
        raise BadValue(f"program returned {len(results[0])} outputs, eager returned {len(ref.outputs)}")
    classification = getattr(cell.model, "task", "other") == "classification"
    labels = output_labels(ref.output_names) if ref.output_names else []
    if ref.ragged:  # dynamic dims: each sample is one size, judged on its own
        metrics, full = per_size_metrics(ref, results, labels, classification)
        program = None  # the divergence search replays one fixed-shape sample
        misses = verdict(metrics, cell.thresholds, labels=full)
    else:
        actual = [np.stack([r[i] for r in results]) for i in range(len(ref.outputs))]
        metrics = [compare_samples(e, a, classification) for e, a in zip(ref.outputs, actual)]
        for m, path, label in zip(metrics, ref.output_names, labels):
            m.update(path=path, name=label)
        misses = verdict(metrics, cell.thresholds, labels)
    notes, tasks = [], []
    if root is not None and has_task_data(cell):
        if ref.ragged:
            notes.append("labels and metrics not applied: outputs of dynamic-shape models are not stacked per sample")
        else:
            tasks = task_checks(cell, root, ref.count, list(ref.outputs), actual)
    if not classification and any(k in cell.thresholds for k in TOPK_THRESHOLDS):
        notes.append(
            f"top-k thresholds not applied: model task is {getattr(cell.model, 'task', 'other')!r}, "
            "not 'classification'"
        )
    if ref.is_random:
        notes.append(
            "validated on random inputs: name representative data under the model's 'validation' in pipeline.yaml"
        )
    report = {
        "cell": cell.canonical(),
        "program_sha256": program_sha256,
        "inputs": ref.source,
        "samples": ref.count,
        "task": getattr(cell.model, "task", "other"),
        "thresholds": cell.thresholds,
        "outputs": metrics,
        "passed": not misses,
        "misses": misses,
        "notes": notes,
        **({"task_metrics": [c.to_json() for c in tasks]} if tasks else {}),
    }
    if runner is not None and runner.target:  # another CPU's ExecuTorch runtime
        report["target"] = runner.target
    elif runner is not None:  # where the numbers come from, when not from the ExecuTorch runtime
        report["runner"] = runner.name
        notes.insert(0, runner_note(runner.name, runner.proxy))
        if runner.proxy:
            report["proxy"] = runner.proxy
    divergence_text = None
    if misses and cell.transform is None and program is not None:
        worst = _worst_sample(metrics)
        report["first_divergence"] = _diagnose(program, cell, samples[worst], worst)
        divergence_text = describe_divergence(report["first_divergence"])
    elif (misses or rescued) and quantized is not None and program is not None:
        worst = _worst_sample(metrics)
        report["first_divergence"] = _diagnose(
            program, cell, samples[worst], worst, quantized, (pte, etrecord, workdir)
        )
        divergence_text = describe_divergence(report["first_divergence"]) if misses else None
    out = workdir / NUMERICS
    out.write_text(json.dumps(finite_json(report), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    check = numerics_check(
        metrics, misses, inputs=ref.source, samples=ref.count, runner=runner, first_divergence=divergence_text
    )
    return _verdict(out, program_sha256, check, tasks)


def numerics_check(metrics: list, misses: list, runner: Runner | None = None, **fields) -> Numerics:
    """The cell's Numerics check from each output's metrics (etforge.builders.numerics.compare
    compare_samples): the worst output's figures (a NaN is the worst), each output's, the misses."""
    sqnrs = [m["sqnr_db"] for m in metrics if m["sqnr_db"] is not None]
    figures = {
        "sqnr_db": pick_worst(sqnrs, min) if sqnrs else None,
        "max_abs_error": pick_worst([m["max_abs_error"] for m in metrics], max),
        "cosine": pick_worst([m["cosine"] for m in metrics], min),
        "nonfinite_values": sum(m["nonfinite"]["nan"] + m["nonfinite"]["inf"] for m in metrics),
    }
    for key in TOPK_THRESHOLDS:
        values = [m[key] for m in metrics if key in m]
        if values:
            figures[key] = pick_worst(values, min)
    outputs = [
        {
            "output": str(m.get("name") or m.get("path") or i),
            **{k: m.get(k) for k in ("sqnr_db", "top1_agreement", "top5_agreement") if m.get(k) is not None},
        }
        for i, m in enumerate(metrics)
    ]
    if runner is not None and runner.target:
        fields.update(target=runner.target)
    elif runner is not None:
        fields.update(runner=runner.name, proxy=runner.proxy)
    return Numerics.of({**fields, **figures, "outputs": outputs, "misses": list(misses), "passed": not misses})


def _verdict(numerics: Path, program_sha256: str, check: Numerics, tasks: list | None = None) -> BuildResult:
    """The validate stage's result: numerics.json and the verdict, failed when a check failed."""
    verdict = Verdict(program_sha256=program_sha256, checks=(check, *(tasks or ())))
    failed = [c.reason() for c in verdict.checks if c.failed]
    if failed:
        reason = "; ".join(r for r in failed if r)
        return BuildResult(files={NUMERICS: numerics}, result=verdict, status=TaskStatus.FAILED, reason=reason)
    return BuildResult(files={NUMERICS: numerics}, result=verdict)


def _validate_methods(
    cell, pte: Path, reference: Path, methods: list, workdir: Path, runner: Runner | None, program_sha256: str
) -> BuildResult:
    """A program with several methods: each method's samples through that method, every output of
    every method judged (labels name the method); one numerics.json, one verdict."""
    import numpy as np

    from etforge.builders.capture.reference import load_reference_samples
    from etforge.builders.numerics.compare import compare_samples, finite_json, verdict
    from etforge.builders.runtime.program_io import cast_inputs, run_program_samples
    from etforge.config.io_spec import output_labels

    metrics, full, sources, counts = [], [], set(), {}
    for method in methods:
        ref = load_reference_samples(reference, method)
        samples = [cast_inputs(ref.sample_inputs(n), None) for n in range(ref.count)]
        results = runner.run(pte, samples, method) if runner else run_program_samples(pte, samples, method)
        if any(len(r) != len(ref.outputs) for r in results):
            raise BadValue(
                f"method {method}: program returned {len(results[0])} outputs, eager returned {len(ref.outputs)}"
            )
        labels = output_labels(ref.output_names) if ref.output_names else [""] * len(ref.outputs)
        if ref.ragged:
            found, found_labels = per_size_metrics(ref, results, labels, False)
        else:
            found = [compare_samples(e, np.stack([r[i] for r in results])) for i, e in enumerate(ref.outputs)]
            for m, path, label in zip(found, ref.output_names, labels):
                m.update(path=path, name=label)
            found_labels = [f"output {i}" + (f" ({label})" if label else "") for i, label in enumerate(labels)]
        for m in found:
            m["method"] = method
        metrics += found
        full += [f"method {method}: {label}" for label in found_labels]
        sources.add(ref.source)
        counts[method] = ref.count
    misses = verdict(metrics, cell.thresholds, labels=full)
    source = "; ".join(sorted(sources))
    report = {
        "cell": cell.canonical(),
        "program_sha256": program_sha256,
        "inputs": source,
        "samples": counts,
        "methods": methods,
        "task": getattr(cell.model, "task", "other"),
        "thresholds": cell.thresholds,
        "outputs": metrics,
        "passed": not misses,
        "misses": misses,
        "notes": ["validated on random inputs"] if source.startswith("random") else [],
    }
    if runner is not None and runner.target:  # another CPU's ExecuTorch runtime
        report["target"] = runner.target
    elif runner is not None:  # where the numbers come from, when not from the ExecuTorch runtime
        report.update(runner=runner.name, **({"proxy": runner.proxy} if runner.proxy else {}))
        report["notes"].insert(0, runner_note(runner.name, runner.proxy))
    out = workdir / NUMERICS
    out.write_text(json.dumps(finite_json(report), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    check = numerics_check(metrics, misses, inputs=source, samples=sum(counts.values()), methods=methods, runner=runner)
    return _verdict(out, report["program_sha256"], check)


def runner_note(name: str, proxy: str | None) -> str:
    """One line on where a verdict's numbers come from, when not from the ExecuTorch runtime."""
    return Numerics(runner=name, proxy=proxy).runner_note()


def per_size_metrics(ref, results: list, labels: list, classification: bool) -> tuple[list, list]:
    """(metrics, labels) per sample and output of a ragged reference: ``input_shapes`` says the size."""
    from etforge.builders.numerics.compare import compare_samples

    metrics, full = [], []
    for n in range(ref.count):
        shapes = [list(x.shape) for x in ref.sample_inputs(n)]
        named = ref.shapes[n] if n < len(ref.shapes) else ""  # validation: {shapes: {<name>: ...}}
        for i, expected in enumerate(ref.outputs):
            m = compare_samples(expected[n][None], results[n][i][None], classification)
            name = labels[i] if i < len(labels) else ""
            m.update(
                path=ref.output_names[i] if i < len(ref.output_names) else "",
                name=name,
                sample=n,
                input_shapes=shapes,
                **({"shape": named} if named else {}),
            )
            metrics.append(m)
            full.append(
                f"output {i}"
                + (f" ({name})" if name else "")
                + " at input shapes "
                + ", ".join("x".join(map(str, s)) for s in shapes)
                + (f" (shape {named})" if named else "")
            )
    return metrics, full


def pick_worst(values: list, pick):
    """``pick`` (min or max) of ``values``, or NaN when any is NaN (min/max would depend on the order)."""
    import math

    return math.nan if any(v != v for v in values) else pick(values)


def describe_divergence(found: dict | None) -> str | None:
    """One line for the failure reason, e.g. 'first divergence at node conv2d_3 (aten.conv2d), SQNR 12.0 dB'."""
    from etforge.builders.numerics.quantized_divergence import describe

    if not found:
        return None
    if "error" in found:
        return f"first divergence not found: {found['error']}"
    if "layer" in found:  # a quantized cell's, per layer (etforge.builders.numerics.quantized_divergence)
        if found["layer"] is None:
            return "first divergence not found: every layer matches eager fp32 within the threshold"
        return describe(found)
    if found.get("node") is None:
        return "first divergence not found: every node matches eager within the threshold"
    target = found["op_target"].removesuffix(".default")
    where = f", {found['module_path']}" if found.get("module_path") else ""
    sqnr = found["sqnr_db"]
    sqnr_text = "-inf" if sqnr is not None and sqnr == float("-inf") else f"{sqnr:.1f}"
    return f"first divergence at node {found['node']} ({target}{where}), SQNR {sqnr_text} dB"


def _worst_sample(metrics: list) -> int:
    worst = [
        (m["worst_sample_sqnr_db"], m["worst_sample"]) for m in metrics if m.get("worst_sample_sqnr_db") is not None
    ]
    # A NaN SQNR (a non-finite sample) is the worst; min() alone would depend on the order.
    return min(worst, key=lambda w: (-float("inf") if w[0] != w[0] else w[0], w[1]))[1] if worst else 0


def _diagnose(
    program: Path,
    cell,
    inputs: list,
    sample: int,
    quantized: Path | None = None,
    run: tuple[Path, Path | None, Path] | None = None,
) -> dict:
    """The first divergent node (of a quantized cell: layer), or why it could not be found; never
    fails the validation itself. ``run``: (the .pte, its ETRecord or None, a work dir) of a quantized
    cell, whose own intermediate outputs are read where it shows its layers."""
    from etforge.builders.numerics.divergence import first_divergence
    from etforge.builders.numerics.etdump_divergence import program_first_divergent_layer
    from etforge.core.text import first_line

    found: dict | None
    try:
        if quantized is not None:
            pte, etrecord, workdir = run or (None, None, None)
            found = program_first_divergent_layer(pte, etrecord, quantized, program, cell, inputs, workdir)
        else:
            found = first_divergence(program, cell, inputs)
    except Exception as exc:  # a diagnosis must not hide the verdict
        traceback.print_exc()
        return {"error": first_line(exc), "sample": sample}
    result = found or {"node": None}
    result["sample"] = sample
    return result

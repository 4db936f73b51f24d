#!/usr/bin/env python3
"""Wall time of etforge (`doit -n 2 -P process`) against a naive per-model export loop.

The naive loop is what typical export scripts do: one process per model that,
for every backend x scheme, runs a fresh torch.export (and quantization), then
lowers, one cell after the other. Both build the same matrix with the same
partitioners and quantizers, from an empty cache, in the same run:

    .venv/bin/python benchmarks/etforge_vs_naive.py            # default matrix
    .venv/bin/python benchmarks/etforge_vs_naive.py --workers 2 --keep /tmp/bench

Prints both wall times and their ratio (etforge / naive), but only after checking that the
two sides built the same cells and that every program loads in the ExecuTorch runtime (the
cells of backends that cannot run on this host are named as not load-checked). Otherwise it
exits 1 naming what failed: a cell that failed on one side (with its error), a cell built on
one side only, a program that does not load. ``--models``/``--backends``/``--schemes`` pick a
smaller matrix (tests/test_benchmarks.py runs one cell).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

PIPELINE = """\
name: bench
models:
{models}backends:
{backends}
quantization: [{schemes}]
"""
MODELS = {
    "small_cnn": "  small_cnn:\n    python: models.small_cnn:build\n"
    "    kwargs: {num_classes: 64, width: 16}\n    inputs: [{shape: [1, 3, 32, 32]}]\n",
    "tiny_transformer": "  tiny_transformer:\n    python: models.tiny_transformer:build\n"
    "    inputs: [{shape: [1, 16, 64]}]\n",
    "mobilenet_v3_small": "  mobilenet_v3_small:\n    torchvision: mobilenet_v3_small\n"
    "    inputs: [{shape: [1, 3, 224, 224]}]\n",
}


def naive_model(pipeline: Path, model_name: str, out_dir: Path) -> None:
    """One typical export script run: every cell of one model, each from a fresh torch.export.

    A failing cell does not stop the others (as in etforge), but it is never hidden: every
    cell's outcome goes to ``<out_dir>/<model>.naive.json`` ("ok" or the error's first line)."""
    sys.path.insert(0, str(REPO))
    from etforge.config.resolve import resolve

    plan = resolve(pipeline)
    outcomes = {}
    for cell in (c for c in plan.cells if c.model.name == model_name):
        try:
            naive_cell(plan, cell, out_dir)
            outcomes[cell.name] = "ok"
        except Exception as exc:  # noqa: BLE001  (recorded and reported by main, never swallowed)
            outcomes[cell.name] = (
                f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            )
        print(f"naive: {cell.name}: {outcomes[cell.name]}", flush=True)
    (out_dir / f"{model_name}.naive.json").write_text(json.dumps(outcomes, indent=1))


def naive_cell(plan, cell, out_dir: Path) -> None:
    import torch
    from executorch.exir import to_edge_transform_and_lower

    from etforge.builders.capture.capture import reference_samples
    from etforge.builders.capture.samples import calibration_batches
    from etforge.builders.loading.model_loading import build_model
    from etforge.builders.lowering.lower import lowering_contexts, partitioners_for
    from etforge.core.dotted_path import load_callable

    model = build_model(cell.model, plan.root)
    samples, _ = reference_samples(cell.model, plan.root, plan.seed)
    inputs = samples[len(samples) // 2]  # the sample etforge's capture exports with
    t = cell.transform
    if t is not None and t.method == "torchao":
        from torchao.quantization import quantize_

        quantize_(model, load_callable(t.ref)(dict(t.options)))
    elif t is not None and t.method == "dtype":
        model = model.to(getattr(torch, t.ref))
        inputs = tuple(x.to(getattr(torch, t.ref)) if x.is_floating_point() else x for x in inputs)
    program = torch.export.export(model, inputs, strict=False)
    if t is not None and t.method == "pt2e":
        import executorch.kernels.quantized  # noqa: F401
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

        factory = load_callable(t.ref)
        prepared = prepare_pt2e(program.module(check_guards=False), factory(dict(t.options)))
        for batch in calibration_batches(cell.model, plan.root, plan.seed)[0]:
            prepared(*(torch.from_numpy(x) for x in batch))
        converted = convert_pt2e(prepared, fold_quantize=getattr(factory, "fold_quantize", True))
        program = torch.export.export(converted, inputs, strict=False)
    with contextlib.ExitStack() as stack:
        for context in lowering_contexts(cell.backend):
            stack.enter_context(context)
        edge = to_edge_transform_and_lower(program, partitioner=partitioners_for(cell.backend))
        (out_dir / f"{cell.stem}.pte").write_bytes(edge.to_executorch().buffer)


def timed(cmd: list, **kwargs) -> float:
    """Wall time of a command; a cell failing in it is fine here (compare_sides reports it)."""
    start = time.monotonic()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **kwargs)
    if proc.returncode not in (0, 1):  # 1: some cell failed; anything else: the command itself broke
        raise SystemExit(f"{' '.join(map(str, cmd))} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    return time.monotonic() - start


def etforge_outcomes(plan) -> dict:
    """cell name -> "ok" or why etforge's export of it did not succeed (its state record)."""
    from etforge.cache.records import read_state
    from etforge.pipeline.specs import spec_of

    out = {}
    for cell in plan.cells:
        record = read_state(spec_of(plan, "export", cell).state_file) or {}
        status = record.get("status")
        out[cell.name] = "ok" if status == "ok" else f"{status or 'not run'}: {record.get('reason', '')}".strip()
    return out


def compare_sides(cells: list, etforge: dict, naive: dict) -> list:
    """Problems that make a ratio meaningless: a cell one side failed or did not build. Empty: comparable."""
    problems = []
    for name in cells:
        sides = {"etforge": etforge.get(name, "not built"), "naive": naive.get(name, "not built")}
        for side, outcome in sides.items():
            if outcome != "ok":
                problems.append(f"{name}: {side} side: {outcome}")
    if not cells:
        problems.append("the matrix has no cell to build")
    return problems


def time_breakdown(layout, wall: float, workers: int) -> list:
    """Lines saying where etforge's wall time went, from its task records and store entries: per
    stage, the actions' seconds split into the stage's own work (torch.export, quantization,
    lowering), the rest of the builder (imports, reading inputs, serializing, metadata, the load
    check, op costs) and the store (hashing, copying, records); then what no action measured
    (worker start-up, doit, scheduling, a worker waiting for the other)."""
    from etforge.cache.store import Store

    store = Store(layout.cache_dir)
    core = {"capture": "export_s", "quantize": "quantize_s", "export": "lowering_s"}
    stages: dict = {}
    for path in sorted(layout.state_dir.glob("*.json")):
        record = json.loads(path.read_text())
        stage = record.get("task", "").split(":")[0]
        if stage not in core or record.get("cached"):
            continue
        elapsed = record.get("elapsed_s") or 0.0
        built = store.build_seconds(record.get("key", "")) or elapsed
        own = (record.get("info") or {}).get(core[stage]) or 0.0
        row = stages.setdefault(stage, [0, 0.0, 0.0, 0.0])
        row[0] += 1
        row[1] += elapsed
        row[2] += own
        row[3] += built
    lines = [f"where etforge's {wall:.1f} s x {workers} workers went (task records):"]
    in_actions = 0.0
    for stage, (count, elapsed, own, built) in stages.items():
        in_actions += elapsed
        lines.append(
            f"  {stage:<8} {count:3d} tasks {elapsed:7.1f} s: {core[stage]} {own:6.1f} s, rest of the builder "
            f"{built - own:5.1f} s, store and records {elapsed - built:4.1f} s"
        )
    lines.append(
        f"  outside the actions (worker start-up, doit, scheduling, waiting): {wall * workers - in_actions:.1f} s"
    )
    return lines


def load_problems(programs: dict) -> list:
    """Programs (label -> .pte path) that do not load in the ExecuTorch runtime, with why."""
    from etforge.builders.runtime.program_io import check_loads

    problems = []
    for label, path in programs.items():
        try:
            check_loads(path)
        except Exception as exc:  # noqa: BLE001  (named in the output)
            problems.append(f"{label}: does not load: {type(exc).__name__}: {str(exc).strip()[:200]}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="small_cnn,tiny_transformer,mobilenet_v3_small")
    parser.add_argument("--backends", default="xnnpack,portable,coreml")
    parser.add_argument("--schemes", default="fp32,int8")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--keep", type=Path, help="work in this directory and keep it")
    parser.add_argument("--naive-model", help=argparse.SUPPRESS)
    parser.add_argument("--pipeline", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.naive_model:
        naive_model(args.pipeline, args.naive_model, args.out)
        return 0

    work = args.keep or Path(tempfile.mkdtemp(prefix="etforge-bench-"))
    if work.exists():
        shutil.rmtree(work)
    project = work / "project"
    shutil.copytree(REPO / "models", project / "models", ignore=shutil.ignore_patterns("__pycache__"))
    pipeline = project / "pipeline.yaml"
    pipeline.write_text(pipeline_text(args.models.split(","), args.backends.split(","), args.schemes.split(",")))
    sys.path.insert(0, str(REPO))
    from etforge.config.resolve import resolve
    from etforge.pipeline.layout import layout_of

    plan = resolve(pipeline)
    models = list(plan.models)
    print(
        f"matrix: {len(models)} models x {len(plan.backends)} backends x {len(plan.quantizations)} schemes "
        f"= {len(plan.cells)} cells to build ({len(plan.rejected)} rejected by the recipes)",
        flush=True,
    )
    shutil.rmtree(project / "artifacts", ignore_errors=True)

    naive_out = work / "naive"
    naive_out.mkdir(parents=True)
    naive = sum(
        timed([sys.executable, __file__, "--naive-model", m, "--pipeline", str(pipeline), "--out", str(naive_out)])
        for m in models
    )
    env = {**os.environ, "ETFORGE_PIPELINE": str(pipeline)}
    etforge = timed(
        [sys.executable, "-m", "etforge", "-n", str(args.workers), "-P", "process", "export"],
        cwd=project,
        env=env,
    )
    noop = timed([sys.executable, "-m", "etforge", "export"], cwd=project, env=env)

    naive_outcomes: dict = {}
    for m in models:
        path = naive_out / f"{m}.naive.json"
        naive_outcomes.update(json.loads(path.read_text()) if path.is_file() else {})
    cells = [c.name for c in plan.cells]
    problems = compare_sides(cells, etforge_outcomes(plan), naive_outcomes)
    layout = layout_of(plan)
    runnable = [c for c in plan.cells if c.backend.host_runnable]
    programs = {f"etforge {c.name}": layout.pte_path(c) for c in runnable}
    programs.update({f"naive {c.name}": naive_out / f"{c.stem}.pte" for c in runnable})
    if not problems:
        problems = load_problems(programs)
    unchecked = [c.name for c in plan.cells if not c.backend.host_runnable]
    if problems:
        print(f"not comparable: {len(problems)} problem(s); no ratio printed", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    print(f"both sides built the same {len(cells)} cells; {len(programs)} programs load in the ExecuTorch runtime")
    if unchecked:
        print(f"not load-checked (their runtime is not on this host): {', '.join(unchecked)}")
    print(f"naive loop (fresh torch.export per cell, sequential): {naive:7.1f} s  ({len(cells)} .pte)")
    print(f"etforge (etforge export -n {args.workers} -P process):         {etforge:7.1f} s  ({len(cells)} .pte)")
    print(f"etforge / naive: {etforge / naive:.2f}")
    print("\n".join(time_breakdown(layout, etforge, args.workers)))
    print(f"etforge second run (nothing to do): {noop:.2f} s")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def pipeline_text(models: list, backends: list, schemes: list) -> str:
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        raise SystemExit(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    return PIPELINE.format(
        models="".join(MODELS[m] for m in models),
        backends="\n".join(f"  {b}: {{}}" for b in backends),
        schemes=", ".join(schemes),
    )


if __name__ == "__main__":
    sys.exit(main())

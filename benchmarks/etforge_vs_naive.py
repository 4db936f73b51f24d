#!/usr/bin/env python3
"""Wall time of etforge (`doit -n 2 -P process`) against a naive per-model export loop.

The naive loop is what typical export scripts do: one process per model that,
for every backend x scheme, runs a fresh torch.export (and quantization), then
lowers, one cell after the other. Both build the same matrix with the same
partitioners and quantizers, from an empty cache, in the same run:

    .venv/bin/python benchmarks/etforge_vs_naive.py            # default matrix
    .venv/bin/python benchmarks/etforge_vs_naive.py --workers 2 --keep /tmp/bench

Prints both wall times and their ratio (etforge / naive).
"""

from __future__ import annotations

import argparse
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
  small_cnn:
    python: models.small_cnn:build
    kwargs: {{num_classes: 64, width: 16}}
    inputs: [{{shape: [1, 3, 32, 32]}}]
  tiny_transformer:
    python: models.tiny_transformer:build
    inputs: [{{shape: [1, 16, 64]}}]
  mobilenet_v3_small:
    torchvision: mobilenet_v3_small
    inputs: [{{shape: [1, 3, 224, 224]}}]
backends:
{backends}
quantization: [{schemes}]
"""


def naive_model(pipeline: Path, model_name: str, out_dir: Path) -> None:
    """One typical export script run: every cell of one model, each from a fresh torch.export."""
    sys.path.insert(0, str(REPO))
    from etforge.config.resolve import resolve

    plan = resolve(pipeline)
    for cell in (c for c in plan.cells if c.model.name == model_name):
        try:
            naive_cell(plan, cell, out_dir)
            print(f"naive: {cell.name}", flush=True)
        except Exception as exc:  # etforge carries on past a failing cell; so does this loop
            print(f"naive: {cell.name} failed: {type(exc).__name__}", flush=True)


def naive_cell(plan, cell, out_dir: Path) -> None:
    import torch
    from executorch.exir import to_edge_transform_and_lower

    from etforge.builders.lower import partitioners_for
    from etforge.builders.model_loading import build_model, example_inputs
    from etforge.builders.samples import calibration_batches
    from etforge.core.dotted_path import load_callable

    model = build_model(cell.model, plan.root)
    inputs = example_inputs(cell.model, plan.seed)
    t = cell.transform
    if t is not None and t.method == "torchao":
        from torchao.quantization import quantize_

        quantize_(model, load_callable(t.ref)(dict(t.options)))
    elif t is not None and t.method == "dtype":
        model = model.to(getattr(torch, t.ref))
        inputs = tuple(x.to(getattr(torch, t.ref)) for x in inputs)
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
    edge = to_edge_transform_and_lower(program, partitioner=partitioners_for(cell.backend))
    (out_dir / f"{cell.stem}.pte").write_bytes(edge.to_executorch().buffer)


def timed(cmd: list, **kwargs) -> float:
    """Wall time of a command; a cell failing in it is fine (both sides carry on past it)."""
    start = time.monotonic()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **kwargs)
    if proc.returncode not in (0, 1):  # 1: some cell failed; anything else: the command itself broke
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    return time.monotonic() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="xnnpack,portable,openvino")
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
    backends = "\n".join(f"  {b}: {{}}" for b in args.backends.split(","))
    pipeline = project / "pipeline.yaml"
    pipeline.write_text(PIPELINE.format(backends=backends, schemes=", ".join(args.schemes.split(","))))
    sys.path.insert(0, str(REPO))
    from etforge.config.resolve import resolve

    plan = resolve(pipeline)
    models = list(plan.models)
    print(
        f"matrix: {len(models)} models x {len(plan.backends)} backends x {len(plan.quantizations)} schemes "
        f"= {len(plan.cells)} cells built ({len(plan.rejected)} rejected by the recipes)"
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
    built = len(list((project / "artifacts" / "bench").rglob("*.pte")))
    print(
        f"naive loop (fresh torch.export per cell, sequential): {naive:7.1f} s  ({len(list(naive_out.glob('*.pte')))} .pte)"
    )
    print(f"etforge (doit export -n {args.workers} -P process):           {etforge:7.1f} s  ({built} .pte)")
    print(f"etforge / naive: {etforge / naive:.2f}")
    print(f"etforge second run (only failed cells, if any, run again): {noop:.2f} s")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""How planning grows with the matrix: ``etforge list`` on generated pipelines of 150, 1,500 and 6,000 cells.

    .venv/bin/python benchmarks/plan_scaling.py                  # 10, 100 and 400 models
    .venv/bin/python benchmarks/plan_scaling.py --models 10 100 --max-ratio 4.5

Each pipeline has N copies of the small CNN (models/small_cnn.py) x 5 backends x 3 schemes, so
15 cells per model. ``etforge list`` resolves it, selects every cell and computes every task's
key and record paths (what a run does before doit starts), then lists the stages. Each size
runs in a fresh project directory, as a whole process, twice: the first run fills the digest
memo (artifacts/.etforge/digests.json, as a team's first run does), the second is timed. The
script prints the wall time and the peak RSS of that process per size, and each size's time
against the previous one with its cell ratio; it exits 1 when the largest size took more
than ``--max-ratio`` times the one before it for 4x the cells (planning must be linear in cells:
at most 4.5x from 1,500 to 6,000 cells). Nothing is built: no torch is imported.
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
BACKENDS = ("xnnpack", "portable", "coreml", "vulkan", "openvino")
SCHEMES = ("fp32", "int8", "fp16")
# Runs etforge in this process and reports its own peak RSS (KiB on Linux) after planning.
PROBE = """\
import resource, sys, time
from etforge.app.cli import main
start = time.perf_counter()
code = main(["list", "--pipeline", sys.argv[1]])
elapsed = time.perf_counter() - start
print(f"ETFORGE_PLAN {code} {elapsed:.3f} {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}", file=sys.stderr)
"""


def pipeline(models: int) -> str:
    lines = ["name: scaling", "version: 0.0.1", "models:"]
    for i in range(models):
        lines += [
            f"  cnn_{i}:",
            "    python: models.small_cnn:build",
            f"    kwargs: {{num_classes: 3, width: {4 + i % 4}}}",
            "    inputs: [{name: image, shape: [1, 3, 8, 8]}]",
        ]
    lines += ["backends:"] + [f"  {b}: {{}}" for b in BACKENDS]
    lines += [f"quantization: [{', '.join(SCHEMES)}]"]
    return "\n".join(lines) + "\n"


def plan_once(project: Path) -> tuple[float, int]:
    """(seconds, peak RSS in MiB) of one ``etforge list`` of the project, in a fresh process."""
    run = subprocess.run(
        [sys.executable, "-c", PROBE, str(project / "pipeline.yaml")],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=3600,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tasks"), str(project)])},
    )
    line = next((x for x in run.stderr.splitlines() if x.startswith("ETFORGE_PLAN ")), None)
    if line is None:
        raise SystemExit(f"etforge list failed on {project}:\n{run.stderr[-2000:]}")
    _, code, seconds, rss_kib = line.split()
    if code != "0":
        raise SystemExit(f"etforge list exited {code} on {project}:\n{run.stderr[-2000:]}")
    return float(seconds), int(rss_kib) // 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=int, nargs="+", default=[10, 100, 400])
    parser.add_argument("--max-ratio", type=float, default=4.5, help="largest size's time / the one before (0: off)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="etforge-plan-scaling-") as tmp:
        for models in args.models:
            project = Path(tmp) / f"m{models}"
            shutil.copytree(REPO / "models", project / "models")
            (project / "pipeline.yaml").write_text(pipeline(models))
            start = time.perf_counter()
            plan_once(project)  # fills the digest memo, as a first run does
            cold = time.perf_counter() - start
            seconds, rss = plan_once(project)
            cells = models * len(BACKENDS) * len(SCHEMES)
            rows.append((cells, seconds, rss, cold))
            print(f"{cells:6d} cells: etforge list {seconds:7.2f} s, peak RSS {rss:5d} MiB (first run {cold:.1f} s)")
    for (c0, s0, _, _), (c1, s1, _, _) in zip(rows, rows[1:]):
        print(f"{c0} -> {c1} cells ({c1 / c0:.0f}x): {s1 / s0:.2f}x the time")
    if args.max_ratio and len(rows) >= 2:
        (c0, s0, _, _), (c1, s1, _, _) = rows[-2], rows[-1]
        if c1 / c0 <= 4 and s1 / s0 > args.max_ratio:
            print(f"FAIL: {c1} cells took {s1 / s0:.2f}x the time of {c0} (bound {args.max_ratio}x)")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

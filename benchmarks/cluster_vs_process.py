#!/usr/bin/env python3
"""The same pipeline built by ``etforge -n 2 -P process`` and by the cluster runner (``-P dask``) on a
local cluster of two worker processes (127.0.0.1 only), from an empty cache each; prints wall times
and the scheduling overhead of every task of the cluster run.

    .venv/bin/python benchmarks/cluster_vs_process.py                      # linreg, small_cnn on xnnpack fp32
    .venv/bin/python benchmarks/cluster_vs_process.py --models linreg,small_cnn,tiny_transformer --keep /tmp/b

Each mode gets its own copy of the repository's pipeline (the selected cells, ``export validate``),
so neither restores what the other built. The cluster (a scheduler and two ``--nthreads 1`` workers,
started here like ``dask scheduler`` / ``dask worker`` would be) is started before its run and not
counted; its workers start cold, as the process runner's do.

Scheduling overhead of a task = (the worker started it - the driver submitted it) + (the driver had
its result - the worker finished it): what the cluster adds around the task's own time
(``ETFORGE_CLUSTER_STATS``, etforge.engine.cluster). The bound checked: below 5 % for every task
that takes more than 5 s. Exit 1 when a task breaks it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BOUND = 0.05  # overhead / task seconds, for tasks longer than LONG_S
LONG_S = 5.0


def project(dest: Path) -> Path:
    """A copy of the repository's pipeline and models (the cells are chosen on the command line)."""
    dest.mkdir(parents=True)
    shutil.copy(REPO / "pipeline.yaml", dest / "pipeline.yaml")
    for name in ("models", "data"):
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, dest / name)
    return dest


def entry_sizes(root: Path) -> dict:
    """stage -> bytes of the store entries of its tasks (what a worker uploads, and its consumers fetch)."""
    out: dict = {}
    for path in root.glob("artifacts/*/.state/*.json"):
        record = json.loads(path.read_text())
        stage = record["task"].split(":", 1)[0]
        size = sum(blob.get("size", 0) for blob in (record.get("entry") or {}).values())
        out.setdefault(stage, []).append(size)
    return out


def etforge(root: Path, args: list, env: dict) -> tuple[int, float, str]:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "etforge", *args], cwd=root, env=env, capture_output=True, text=True, timeout=3600
    )
    return done.returncode, time.perf_counter() - start, done.stdout + done.stderr


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="linreg,small_cnn")
    parser.add_argument("--backends", default="xnnpack")
    parser.add_argument("--schemes", default="fp32")
    parser.add_argument("--keep", help="build here (kept) instead of a temporary directory")
    opts = parser.parse_args()
    base = Path(opts.keep or tempfile.mkdtemp(prefix="etforge-cluster-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    select = ["--models", opts.models, "--backends", opts.backends, "--schemes", opts.schemes, "export", "validate"]
    env = {k: v for k, v in os.environ.items() if k != "ETFORGE_CACHE_REMOTE"}  # each mode builds from scratch
    try:
        code, process_wall, out = etforge(project(base / "process"), ["-n", "2", "-P", "process", *select], env)
        if code != 0:
            print(out, file=sys.stderr)
            return 2
        from distributed import LocalCluster

        start = time.perf_counter()
        cluster = LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
            memory_limit=0,
        )
        cluster_start = time.perf_counter() - start
        stats_file = base / "cluster-stats.json"
        try:
            cenv = {**env, "ETFORGE_CLUSTER_STATS": str(stats_file)}
            args = ["-n", "2", "-P", "dask", "--scheduler", cluster.scheduler_address, *select]
            code, cluster_wall, out = etforge(project(base / "dask"), args, cenv)
            if code != 0:
                print(out, file=sys.stderr)
                return 2
            noop_code, noop_wall, _ = etforge(base / "dask", args, env)
        finally:
            cluster.close()
        stats = json.loads(stats_file.read_text())
        sizes = entry_sizes(base / "dask")
    finally:
        if not opts.keep:
            shutil.rmtree(base, ignore_errors=True)
    rows = []
    for t in stats["tasks"]:
        own = t["ended"] - t["started"]
        overhead = (t["started"] - t["submitted"]) + (t["seen"] - t["ended"])
        rows.append((t["task"], t["worker"], own, overhead))
    print(f"cells: {opts.models} x {opts.backends} x {opts.schemes}, `export validate`, {len(rows)} tasks, 2 slots")
    print(f"  -n 2 -P process          wall {process_wall:7.2f} s")
    print(
        f"  -n 2 -P dask (2 workers) wall {cluster_wall:7.2f} s  (connect {stats['connect_s']:.2f} s; "
        f"cluster start {cluster_start:.2f} s, not counted; no-op rerun {noop_wall:.2f} s, exit {noop_code})"
    )
    print(
        f"  difference {cluster_wall - process_wall:+.2f} s = {(cluster_wall - process_wall) / len(rows):+.3f} s/task"
    )
    print(f"  {'task':<40} {'worker':<28} {'task s':>7} {'overhead ms':>12} {'%':>6}")
    broken = []
    for name, worker, own, overhead in rows:
        pct = overhead / own if own > 0 else float("inf")
        print(f"  {name:<40} {worker[-28:]:<28} {own:7.2f} {1000 * overhead:12.1f} {100 * pct:6.2f}")
        if own > LONG_S and not pct < BOUND:
            broken.append(name)
    overheads = [o for *_, o in rows]
    print(
        f"  overhead per task: mean {1000 * statistics.mean(overheads):.1f} ms, max {1000 * max(overheads):.1f} ms; "
        f"tasks > {LONG_S:g} s: {sum(own > LONG_S for _, _, own, _ in rows)}, "
        f"over {100 * BOUND:g} %: {', '.join(broken) or 'none'}"
    )
    for stage, values in sorted(sizes.items()):
        print(f"  cache entry of {stage:<9} {len(values)} x, mean {statistics.mean(values) / 1024:.1f} KiB")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())

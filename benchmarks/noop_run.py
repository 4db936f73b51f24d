#!/usr/bin/env python3
"""What an unchanged pipeline costs: a no-op ``etforge`` run against a bare doit with as many up-to-date tasks.

    .venv/bin/python benchmarks/noop_run.py                      # this repository's pipeline.yaml
    .venv/bin/python benchmarks/noop_run.py --project DIR --repeats 9

The project must be built already (run ``etforge`` there once). The script runs
``python -m etforge`` (the default stages) ``--repeats`` times and checks that no run
started a task; then a bare doit project in a temporary directory, with as many tasks as
etforge reported up to date, each ``uptodate: [True]`` and run once first, on doit's SQLite
backend as etforge's. Both sides are timed as whole processes (interpreter start-up
included). It prints the median wall times and their ratio, and exits 1, naming what failed,
when an etforge run started a task, when the two sides did not have the same number of
up-to-date tasks, or when etforge's median is over ``--max-seconds`` or the ratio over
``--max-ratio`` (issue 22: under 0.5 s and at most 3x; 0 turns a bound off). It also prints
each side's median CPU time (user + sys): on a shared machine the wall clock moves with the
load, the CPU time much less; the bounds are on the wall clock.

Both sides run without ``PYTHONDONTWRITEBYTECODE``: an installed etforge, like doit, has its
bytecode, and with that variable set every run compiled etforge's ~100 modules again (0.4 s
of a no-op here). Each side is run once untimed first, so that its bytecode exists.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
UP_TO_DATE = re.compile(r"(\d+) task\(s\) run, (\d+) up to date")
START = re.compile(r"^\[\d\d:\d\d:\d\d\] start\s+(\S+)$", re.M)
BARE_DODO = """\
import os

DOIT_CONFIG = {"backend": "sqlite3", "dep_file": ".doit.sqlite3", "verbosity": 0}


def _noop():
    return True


def task_t():
    for i in range(int(os.environ["NOOP_TASKS"])):
        yield {"name": str(i), "actions": [(_noop,)], "uptodate": [True]}
"""


def run(cmd: list, cwd: Path, env: dict | None = None) -> tuple[float, subprocess.CompletedProcess, float]:
    """(wall seconds, the finished process, its CPU seconds: user + sys)."""
    env = {k: v for k, v in (os.environ if env is None else env).items() if k != "PYTHONDONTWRITEBYTECODE"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return elapsed, proc, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def etforge_side(project: Path, repeats: int) -> tuple[list, int, list, list]:
    """(wall times, up-to-date tasks, problems, CPU times) of ``repeats`` no-op etforge runs."""
    times, counts, problems, cpu = [], set(), [], []
    run([sys.executable, "-m", "etforge", "list"], project)  # bytecode, untimed (and never builds)
    for i in range(repeats):
        elapsed, proc, cpu_seconds = run([sys.executable, "-m", "etforge"], project)
        found = UP_TO_DATE.search(proc.stdout)
        started = START.findall(proc.stdout)
        if proc.returncode != 0:
            problems.append(f"etforge run {i + 1} exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
        if started:
            problems.append(
                f"etforge run {i + 1} is not a no-op: it started {len(started)} task(s): {', '.join(started[:5])}"
            )
        if found is None:
            problems.append(f"etforge run {i + 1} printed no 'task(s) run, up to date' line")
        else:
            counts.add(int(found.group(2)))
        times.append(elapsed)
        cpu.append(cpu_seconds)
    if len(counts) > 1:
        problems.append(f"the etforge runs reported different numbers of up-to-date tasks: {sorted(counts)}")
    return times, (counts.pop() if len(counts) == 1 else 0), problems, cpu


def doit_side(tasks: int, repeats: int) -> tuple[list, list, list]:
    """(wall times, problems, CPU times) of ``repeats`` no-op runs of a bare doit with ``tasks`` up-to-date tasks."""
    times, problems, cpu = [], [], []
    with tempfile.TemporaryDirectory(prefix="noop-doit-") as tmp:
        work = Path(tmp)
        (work / "dodo.py").write_text(BARE_DODO)
        env = {**os.environ, "NOOP_TASKS": str(tasks)}
        run([sys.executable, "-m", "doit", "list"], work, env)  # bytecode, untimed
        _, first, _ = run([sys.executable, "-m", "doit"], work, env)
        if first.returncode != 0:
            return [], [f"bare doit's first run failed: {first.stderr.strip()[-300:]}"], []
        for i in range(repeats):
            elapsed, proc, cpu_seconds = run([sys.executable, "-m", "doit"], work, env)
            ran = proc.stdout.count(".  t:")  # doit's line for an executed task
            skipped = proc.stdout.count("-- t:")  # and for one up to date
            if proc.returncode != 0 or ran or skipped != tasks:
                problems.append(f"bare doit run {i + 1}: exit {proc.returncode}, {ran} ran, {skipped} up to date")
            times.append(elapsed)
            cpu.append(cpu_seconds)
    return times, problems, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--project", type=Path, default=REPO, help="a built etforge project [default: this repo]")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--max-seconds", type=float, default=0.5, help="etforge's median bound; 0: none")
    parser.add_argument("--max-ratio", type=float, default=3.0, help="etforge / bare doit bound; 0: none")
    args = parser.parse_args()

    times, tasks, problems, cpu_ours = etforge_side(args.project, args.repeats)
    if not problems and tasks == 0:
        problems.append("etforge reported 0 up-to-date tasks: build the project first (`etforge`)")
    if problems:
        print("no figure printed: the etforge side is not a no-op of a built project", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    bare, problems, cpu_theirs = doit_side(tasks, args.repeats)
    if problems:
        print("no figure printed: the bare doit side did not run as a no-op", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    ours, theirs = statistics.median(times), statistics.median(bare)
    ratio = ours / theirs
    print(f"project: {args.project}; {tasks} tasks up to date on both sides, 0 started; {args.repeats} runs each")
    print(f"etforge no-op:   median {ours:.3f} s (min {min(times):.3f}, max {max(times):.3f})")
    print(f"bare doit no-op: median {theirs:.3f} s (min {min(bare):.3f}, max {max(bare):.3f})")
    print(f"etforge / bare doit: {ratio:.2f}")
    ours_cpu, theirs_cpu = statistics.median(cpu_ours), statistics.median(cpu_theirs)
    if theirs_cpu > 0:
        print(
            f"CPU (user + sys), median: etforge {ours_cpu:.3f} s, bare doit {theirs_cpu:.3f} s, "
            f"ratio {ours_cpu / theirs_cpu:.2f}"
        )
    load = os.getloadavg()[0]
    if load > (os.cpu_count() or 1):
        print(f"note: load average {load:.1f} on {os.cpu_count()} cores: other work competed for the CPU")
    failed = []
    if args.max_seconds and not ours <= args.max_seconds:
        failed.append(f"etforge's no-op median {ours:.3f} s is over {args.max_seconds} s")
    if args.max_ratio and not ratio <= args.max_ratio:
        failed.append(f"etforge / bare doit {ratio:.2f} is over {args.max_ratio}")
    for line in failed:
        print(f"OVER BOUND: {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

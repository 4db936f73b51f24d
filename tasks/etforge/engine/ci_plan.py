"""CI jobs for a matrix: cells grouped by the worker labels they need, balanced by recorded durations.

``etforge ci-matrix`` (etforge.app.ci_matrix) prints these as a GitHub Actions matrix or a
GitLab child pipeline. Each job runs an exact list of cells (``etforge --cells a,b,...``), not
a hash shard, on a runner that offers the labels its cells need (etforge.config.labels).

A cell's cost on a job is its own tasks' seconds (export, sizegate, validate, benchmark) plus
those of the upstream tasks (capture, quantize) the job does not run yet: cells of one model
share its capture. Cells are placed longest first onto the job that ends earliest with them
(LPT, longest-processing-time first, with that affinity). Seconds come from the state records
of this checkout (``elapsed_s`` of the last build, not of a restore from the cache), else from
the cache (the build seconds each store entry keeps: the local entry's, else the remote's
manifest, so a fresh CI checkout plans from what other machines built), then a durations
file (``{task name: seconds}``), and for a task never built here: the median of the recorded tasks of its stage and model kind, else a
stage estimate (DEFAULT_S, times LLM_FACTOR for an LLM). Every number read from elsewhere is
range-checked (etforge.cache.entries seconds_of: from 0 to a week), so no sum of them overflows.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field

from etforge.config.model import ModelKind
from etforge.core.errors import BadValue
from etforge.pipeline.stages import STAGE, STAGES, task_name, upstream_of

# Seconds of a task never built (measured on this project's small models: capture 4 s, export 10 s).
DEFAULT_S = {"capture": 10.0, "quantize": 20.0, "export": 30.0, "sizegate": 1.0, "validate": 10.0, "benchmark": 15.0}
LLM_FACTOR = 20.0  # an LLM export takes minutes (the 135 M-parameter example: 26 minutes)
GITHUB_DEFAULT = ("ubuntu-24.04",)
GITHUB_MACOS = ("macos-14",)
GITHUB_MAX_JOBS = 256  # a matrix may have at most 256 jobs


@dataclass(frozen=True)
class CellCost:
    name: str
    needs: frozenset  # worker labels
    own_s: float  # its own tasks
    upstream: Mapping  # upstream task name -> seconds (shared with the cells of the same model)

    @property
    def total_s(self) -> float:
        return self.own_s + sum(self.upstream.values())


@dataclass
class Job:
    needs: frozenset
    cells: list = field(default_factory=list)
    upstream: set = field(default_factory=set)
    load_s: float = 0.0

    def cost(self, cell: CellCost) -> float:
        return cell.own_s + sum(s for task, s in cell.upstream.items() if task not in self.upstream)

    def add(self, cell: CellCost) -> None:
        self.load_s += self.cost(cell)
        self.cells.append(cell.name)
        self.upstream |= set(cell.upstream)


def cell_needs(cell) -> frozenset:
    """The labels a runner must offer to build and run ``cell`` (its model's, its backend's)."""
    return frozenset(cell.model.labels | cell.backend.labels | cell.backend.runtime_labels)


def estimator(durations: Mapping, kinds: Mapping):
    """(task name, model kind) -> seconds: recorded, else the median of its stage and kind, else DEFAULT_S."""
    by_stage: dict = {}
    for name, measured in durations.items():
        by_stage.setdefault((name.split(":", 1)[0], kinds.get(name)), []).append(measured)
    medians = {group: statistics.median(values) for group, values in by_stage.items()}

    def seconds(name: str, kind: ModelKind) -> float:
        if name in durations:
            return float(durations[name])
        stage = name.split(":", 1)[0]
        if (stage, kind) in medians:
            return medians[(stage, kind)]
        return DEFAULT_S.get(stage, 10.0) * (LLM_FACTOR if kind == ModelKind.LLM else 1.0)

    return seconds


def cell_costs(plan, cells, specs: Mapping, durations: Mapping) -> list:
    """A CellCost per cell: its tasks in ``specs`` (the selection's), priced by ``durations``."""
    tasks = {}  # cell name -> (its own task names, its upstream task names)
    for cell in cells:
        own = [task_name(s, cell) for s in STAGES if s.subject == "cell" and task_name(s, cell) in specs]
        upstream = [task_name(STAGE["capture"], cell.model)]
        upstream += [
            task_name(st, sub) for _, st, sub in upstream_of(plan, STAGE["export"], cell) if st.subject != "cell"
        ]
        tasks[cell.name] = (own, list(dict.fromkeys(upstream)))
    kinds = {t: cell.model.kind for cell in cells for group in tasks[cell.name] for t in group}
    seconds = estimator(durations, kinds)
    out = []
    for cell in cells:
        own, upstream = tasks[cell.name]
        kind = cell.model.kind
        costs = {t: seconds(t, kind) for t in upstream}
        out.append(CellCost(cell.name, cell_needs(cell), sum(seconds(t, kind) for t in own), costs))
    return out


def balance(cells: list, jobs: int, needs: frozenset = frozenset()) -> list:
    """``cells`` onto at most ``jobs`` Jobs: longest first, each onto the job that then ends earliest."""
    out = [Job(needs) for _ in range(max(1, min(jobs, len(cells))))]
    for cell in sorted(cells, key=lambda c: (-c.total_s, c.name)):
        best = min(out, key=lambda j: (j.load_s + j.cost(cell), j.load_s))
        best.add(cell)
    return out


def plan_jobs(costs: list, jobs_per_group: int) -> list:
    """Jobs for every group of cells that need the same labels (the baseline group first)."""
    groups: dict = {}
    for cost in costs:
        groups.setdefault(cost.needs, []).append(cost)
    out = []
    for needs in sorted(groups, key=lambda n: (len(n), sorted(n))):
        out += balance(groups[needs], jobs_per_group, needs)
    return out


def parse_runs_on(text: str | None) -> dict:
    """``qnn_sdk:self-hosted/qnn,macos+mem64:macos-15`` -> {frozenset(labels): runner labels}."""
    table = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        labels, sep, runner = part.partition(":")
        if not sep or not runner.strip():
            raise BadValue(f"--runs-on: expected LABELS:RUNNER[/RUNNER...], got {part.strip()!r}")
        key = frozenset(label.strip() for label in labels.split("+") if label.strip() and label.strip() != "linux")
        table[key] = tuple(r.strip() for r in runner.split("/") if r.strip())
    return table


def runs_on(needs: frozenset, table: Mapping) -> tuple:
    """The runner labels of a job: the table's, else GitHub's hosted Linux or macOS, else self-hosted."""
    if needs in table:
        return tuple(table[needs])
    if not needs:
        return GITHUB_DEFAULT
    if needs == {"macos"}:
        return GITHUB_MACOS
    return ("self-hosted", *sorted(needs))


def entries(jobs: list, table: Mapping) -> list:
    """One dict per job: its name, runner, labels, estimated seconds and exact cells."""
    out: list = []
    counts: dict = {}
    for job in jobs:
        group = "-".join(sorted(job.needs)) or "linux"
        counts[group] = counts.get(group, 0) + 1
        out.append(
            {
                "job": f"{group}-{counts[group]}",
                "runs_on": list(runs_on(job.needs, table)),
                "labels": ",".join(sorted(job.needs)),
                "est_s": round(job.load_s),
                "cells": ",".join(sorted(job.cells)),
            }
        )
    return out


def github(rows: list) -> dict:
    """``strategy: {matrix: ${{ fromJSON(needs.plan.outputs.matrix) }}}``."""
    if len(rows) > GITHUB_MAX_JOBS:
        raise BadValue(f"{len(rows)} jobs: a GitHub Actions matrix holds at most {GITHUB_MAX_JOBS}; use fewer --jobs")
    return {"include": rows}


def gitlab(rows: list) -> dict:
    """A child pipeline (JSON is YAML) for ``trigger: {include: [{artifact: matrix.yml, job: plan}]}``."""
    doc: dict = {
        ".etforge": {
            "stage": "build",
            "script": ["make setup", '.venv/bin/etforge --cells "$ETFORGE_CELLS"'],
        },
    }
    for row in rows:
        job: dict = {
            "extends": ".etforge",
            "variables": {"ETFORGE_CELLS": row["cells"], "ETFORGE_WORKER_LABELS": row["labels"]},
        }
        if row["labels"]:
            job["tags"] = row["labels"].split(",")  # runners registered with these tags
        doc[f"etforge:{row['job']}"] = job
    return {"stages": ["build"], **doc}


def table(rows: list) -> str:
    lines = [f"{'job':<24} {'runs-on':<28} {'est s':>7}  cells"]
    for row in rows:
        count = len(row["cells"].split(","))
        lines.append(f"{row['job']:<24} {'/'.join(row['runs_on']):<28} {row['est_s']:>7}  {count}: {row['cells']}")
    return "\n".join(lines)

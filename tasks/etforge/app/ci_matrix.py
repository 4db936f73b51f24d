"""``etforge ci-matrix``: the CI jobs of a matrix, as a GitHub Actions matrix or a GitLab child pipeline.

    etforge ci-matrix                          GitHub: {"include": [{job, runs_on, labels, est_s, cells}]}
    etforge ci-matrix --format gitlab          a child pipeline (JSON, which GitLab reads as YAML)
    etforge ci-matrix --format table           for people
    --jobs 4                                   at most this many jobs per group of labels
    --durations FILE                           {task: seconds} beside the recorded ones
    --runs-on 'qnn_sdk:self-hosted/qnn'        runner labels of a group (default: etforge.engine.ci_plan)

Planning reads the pipeline, the state records and stats; it imports no torch and needs no SDK
(a QNN cell is planned on a host without the SDK: its labels come from its recipe). The jobs
(etforge.engine.ci_plan) each run ``etforge --cells <their list>`` on a runner with their labels.
"""

from __future__ import annotations

import json
from pathlib import Path

from doit.cmd_base import Command

from etforge.app.loader import SELECTION_OPTIONS, request_from
from etforge.cache.opening import reading_store
from etforge.core.console import say
from etforge.core.errors import BadValue
from etforge.engine import ci_plan
from etforge.engine.entry import load_selection

FORMATS = {"github": ci_plan.github, "gitlab": ci_plan.gitlab}
OPTIONS = (
    {
        "name": "format",
        "long": "format",
        "type": str,
        "default": "github",
        "help": "github (a matrix for strategy.matrix), gitlab (a child pipeline) or table [default: %(default)s]",
    },
    {
        "name": "jobs",
        "long": "jobs",
        "type": int,
        "default": 4,
        "help": "at most this many jobs per group of cells that need the same labels [default: %(default)s]",
    },
    {
        "name": "durations",
        "long": "durations",
        "type": str,
        "default": None,
        "help": "a JSON file {task name: seconds}: durations measured elsewhere (the state records win)",
    },
    {
        "name": "runs_on",
        "long": "runs-on",
        "type": str,
        "default": None,
        "help": "runner labels per group: 'qnn_sdk:self-hosted/qnn,macos+mem64:macos-15' (doit reads NAME=VALUE as a variable)",
    },
)


class CiMatrix(Command):
    doc_purpose = "print CI jobs for the matrix: grouped by worker labels, balanced by recorded durations"
    doc_usage = "[--format github|gitlab|table] [--jobs N] [--durations FILE] [--runs-on SPEC]"
    doc_description = __doc__
    cmd_options = tuple(o for o in SELECTION_OPTIONS if o["name"] != "dodo_file") + OPTIONS

    def execute(self, params, args):
        if args:
            say(f"etforge: error: ci-matrix takes no task names, got {' '.join(args)}")
            return 3
        if params["format"] not in (*FORMATS, "table"):
            say(f"etforge: error: --format {params['format']!r}: expected github, gitlab or table")
            return 3
        try:
            table = ci_plan.parse_runs_on(params["runs_on"])
            extra = _durations(params["durations"])
        except ValueError as exc:
            say(f"etforge: error: {exc}")
            return 3
        request, _ = request_from(dict(params))
        selection = load_selection(request)
        store = reading_store(selection.plan)  # entries keep their build seconds: a fresh checkout plans from them
        durations = {**extra, **ci_plan.recorded_durations(selection.specs, store.build_seconds)}
        costs = ci_plan.cell_costs(selection.plan, selection.cells, selection.specs, durations)
        rows = ci_plan.entries(ci_plan.plan_jobs(costs, max(1, params["jobs"])), table)
        if params["format"] == "table":
            print(ci_plan.table(rows))
            return 0
        try:
            doc = FORMATS[params["format"]](rows)
        except ValueError as exc:
            say(f"etforge: error: {exc}")
            return 3
        print(json.dumps(doc, separators=(",", ":")) if params["format"] == "github" else json.dumps(doc, indent=1))
        return 0


def _durations(path: str | None) -> dict:
    if not path:
        return {}
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BadValue(f"--durations {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if not isinstance(data, dict) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in data.values()
    ):
        raise BadValue(f"--durations {path}: expected a JSON object of task name -> seconds (>= 0)")
    return {str(k): float(v) for k, v in data.items()}

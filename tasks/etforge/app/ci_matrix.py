"""``etforge ci-matrix``: the CI jobs of a matrix, as a GitHub Actions matrix or a GitLab child pipeline.

    etforge ci-matrix                          GitHub: {"include": [{job, runs_on, labels, est_s, cells}]}
    etforge ci-matrix --format gitlab          a child pipeline (JSON, which GitLab reads as YAML)
    etforge ci-matrix --format table           for people
    --jobs 4                                   at most this many jobs per group of labels
    --durations FILE                           {task: seconds (0 to a week)} beside the recorded ones
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
from etforge.cache.durations import recorded_durations
from etforge.cache.entries import MAX_SECONDS, seconds_of
from etforge.cache.opening import reading_store
from etforge.core.console import say
from etforge.core.errors import BadValue
from etforge.core.jsonfile import parse_json, read_regular
from etforge.core.text import one_line
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
    name = "ci-matrix"  # doit would name it after the class: "cimatrix"
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
        durations = {**extra, **recorded_durations(selection.specs, store.build_seconds)}
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
    """{task name: seconds} of a durations file; BadValue naming the file for anything else (a number
    that is not finite, negative or beyond a week, JSON nested too deep): no sum of them can overflow."""
    if not path:
        return {}
    try:
        data = parse_json(read_regular(Path(path)))
    except OSError as exc:
        raise BadValue(f"--durations: {exc.strerror or exc}", file=path) from None
    except BadValue as exc:  # not a regular file, not JSON, nested too deep
        raise BadValue(f"--durations: not a JSON object of task name -> seconds: {one_line(exc)}", file=path) from None
    if not isinstance(data, dict):
        raise BadValue("--durations: expected a JSON object of task name -> seconds", file=path)
    out = {}
    for task, value in data.items():
        seconds = seconds_of(value)
        if seconds is None:
            shown = (
                "an object" if isinstance(value, dict) else "an array" if isinstance(value, list) else json.dumps(value)
            )
            raise BadValue(
                f"--durations: {one_line(repr(task), 80)}: {one_line(shown, 80)} is not a number of seconds "
                f"from 0 to {MAX_SECONDS} (a week)",
                file=path,
            )
        out[task] = seconds
    return out

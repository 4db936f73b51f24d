"""``etforge diff --baseline <release archive | release dir | git revision>``: this run against a release.

Prints a console table and writes markdown (``artifacts/<pipeline>/diff.md``, or ``--markdown
FILE``, and appended to ``$GITHUB_STEP_SUMMARY`` when CI sets it). Exit status: 0 without a
regression, 1 on a regression beyond tolerance or a lost cell, 2 when the baseline cannot be
compared with (missing, truncated, damaged, another pipeline's, a newer etforge's: one line
saying which, naming the file and the key when it is damaged), 3 on a bad pipeline.yaml.
``doit diff baseline=<...>`` is taken too. It reads the cells' current records and runs
nothing: run ``etforge`` first.
"""

from __future__ import annotations

import os
from pathlib import Path

from doit import get_var
from doit.cmd_base import Command

from etforge.app.loader import SELECTION_OPTIONS, request_from
from etforge.core.atomic import atomic_write_text
from etforge.core.console import say
from etforge.core.text import first_line
from etforge.engine.entry import load_selection
from etforge.publish import diff, diff_baseline, diff_section, outcome

OPTIONS = (
    {
        "section": "diff",
        "name": "baseline",
        "long": "baseline",
        "type": str,
        "default": None,
        "help": "the release to compare with: its .tar.gz, its directory, or a git revision it was built from",
    },
    {
        "section": "diff",
        "name": "markdown",
        "long": "markdown",
        "type": str,
        "default": None,
        "help": "write the markdown here [default: artifacts/<pipeline>/diff.md]",
    },
)


class Diff(Command):
    doc_purpose = "compare this run with a release: states, size, numerics, delegation, latency, memory, programs"
    doc_usage = "--baseline <release .tar.gz | release dir | git revision>"
    doc_description = (
        "Cell by cell, with the tolerances of pipeline.yaml `diff:`. Exit 1 on a regression beyond "
        "tolerance or a lost cell, 2 when the baseline is missing, truncated, damaged, another pipeline's "
        "or a newer etforge's. The report gains a 'changes since' section against this baseline."
    )
    cmd_options = SELECTION_OPTIONS + OPTIONS

    def execute(self, params, args):
        given = params.get("baseline") or get_var("baseline", None) or (args[0] if args else None)
        if not given:
            say("etforge: error: diff needs a baseline: etforge diff --baseline <release .tar.gz | dir | git revision>")
            return 2
        request, _ = request_from(params)
        selection = load_selection(request)
        plan = selection.plan
        try:
            baseline = diff_baseline.load(plan, given)
        except diff_baseline.BaselineError as exc:
            say(f"etforge: error: {first_line(exc)}")
            return 2
        changes = diff_section.compare(plan, selection.cells, selection.host, baseline)
        pending = [
            o.cell for o in outcome.outcomes(plan, selection.cells, selection.host) if o.status in outcome.PENDING
        ]
        if pending:
            say(
                f"etforge: diff: {len(pending)} cell(s) have no current verdict ({', '.join(pending[:3])}"
                f"{', ...' if len(pending) > 3 else ''}): run `etforge` first to compare what this checkout builds"
            )
        print(diff.console_table(changes, baseline.label), end="")
        text = diff.markdown(changes, baseline.label)
        target = Path(params["markdown"]) if params.get("markdown") else selection.layout.out_dir / "diff.md"
        summary = os.environ.get("GITHUB_STEP_SUMMARY")
        try:
            atomic_write_text(target, text)
            if summary:
                with open(summary, "a", encoding="utf-8") as f:
                    f.write(text)
            diff_section.remember(plan, baseline)
        except OSError as exc:
            say(f"etforge: error: cannot write {exc.filename or target}: {exc.strerror or exc}")
            return 1
        failing = [c for c in changes if c.fails]
        if failing:
            say(f"etforge: diff: {len(failing)} regression(s) beyond tolerance since {baseline.label}")
            return 1
        return 0

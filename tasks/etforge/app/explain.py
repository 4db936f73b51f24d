"""``etforge explain TASK...``: why a task would run, from the named inputs its last record kept.

    $ etforge explain export:small_cnn/xnnpack/fp32
    export:small_cnn/xnnpack/fp32: models/blocks.py changed (sha 1a2b3c4d…→5e6f7a8b…, via capture:small_cnn); torch 2.13.0+cpu, executorch 1.5.1 unchanged

A stage name (``etforge explain validate``) explains each of its tasks in the selection. The
comparison itself is etforge.cache.why; this command resolves the plan and names the tasks.
"""

from __future__ import annotations

from doit.cmd_base import Command

from etforge.app.loader import SELECTION_OPTIONS, request_from
from etforge.cache.why import why
from etforge.core.console import say
from etforge.core.text import one_line
from etforge.engine.cached_run import is_up_to_date
from etforge.engine.entry import load_selection
from etforge.pipeline.stages import STAGE


class Explain(Command):
    doc_purpose = "say why a task would run: what changed in the inputs of its key since its last recorded run"
    doc_usage = "TASK|STAGE [TASK|STAGE ...]"
    doc_description = (
        "Compares the named inputs of each task's key (pipeline facts, tool versions, etforge's code, "
        "the project's model modules, upstream keys) with those its last record kept, and prints one "
        "line per task: what changed, or `up to date`. Exit 3 when a name is no task of the selection."
    )
    cmd_options = SELECTION_OPTIONS

    def execute(self, params, args):
        if not args:
            say("etforge: error: explain takes the names of tasks (or stages): etforge explain export:<cell>")
            return 3
        request, _ = request_from(params)
        selection = load_selection(request)
        specs = selection.specs
        names: list = []
        for arg in args:
            found = [arg] if arg in specs else [n for n in specs if arg in STAGE and n.startswith(arg + ":")]
            if not found:  # any argument is one line: its repr (a newline shown as \n), cut to 80 characters
                shown = one_line(repr(arg), 80)
                what = f"stage {shown} has no task" if arg in STAGE else f"no task named {shown}"
                say(f"etforge: error: explain: {what} in this selection; `etforge list --all` lists them")
                return 3
            names += found

        def current_inputs(task: str):
            spec = specs.get(task)
            return spec.inputs if spec is not None else None

        for name in dict.fromkeys(names):
            spec = specs[name]
            if spec.key is None:  # manifest, report, release: keyed by what they render
                print(f"{name}: keyed by what it renders (the cells' current records); it runs when one changes")
                continue
            explanation = why(spec, current_inputs)
            line = explanation.line()
            if explanation.up_to_date and not is_up_to_date(spec, selection.store):
                line = f"{name}: its key is unchanged, but its outputs are not all in place: they are restored"
            print(line)
        return 0

"""The ``etforge`` command: doit's ``DoitMain`` with etforge's loader, commands, database and reporter.

    etforge                       every stage of pipeline.yaml but release (doit's default tasks)
    etforge export                one stage, for every cell (validate, benchmark, report, ...)
    etforge release --allow-failures
    etforge list | info TASK | init [DIR] | ci-matrix | help [COMMAND]
    etforge explain TASK          what changed in the task's key inputs since its last recorded run
    etforge setup-targets         install qemu-user, the aarch64 runtime and its runner (docs/targets.md)
    etforge diff --baseline R     this run against a release (archive, directory or git revision)

Everything is registered through doit's documented extension API: the task loader is
handed to ``DoitMain``, the rest are plugins (``DOIT_PLUGINS``). The same table, in this
repository's pyproject.toml, makes ``doit`` run the same implementation.

doit parses options POSIX-style (they end at the first task name); etforge moves its
selection flags and the run options to the front, so ``etforge export --models linreg -n 2``
works as it reads. Options after a task name that the task declares (``release
--allow-failures``) stay where they are.
"""

from __future__ import annotations

import sys

from doit.cmd_base import DoitCmdBase
from doit.doit_cmd import DoitMain

from etforge.app.loader import SELECTION_OPTIONS, PipelineLoader
from etforge.core.console import say
from etforge.core.errors import BadValue, EtforgeError
from etforge.core.text import first_line
from etforge.engine.run_command import Run
from etforge.pipeline.stages import DEFAULT_TABLE, STAGES, StageTable

DOIT_PLUGINS = {
    "COMMAND": {
        "run": "etforge.engine.run_command:Run",
        "help": "etforge.app.help_command:Help",
        "list": "etforge.app.doit_commands:List",
        "info": "etforge.app.doit_commands:Info",
        "init": "etforge.app.init:Init",
        "ci-matrix": "etforge.app.ci_matrix:CiMatrix",
        "explain": "etforge.app.explain:Explain",
        "diff": "etforge.app.diff_command:Diff",
        "setup-targets": "etforge.app.setup_targets:SetupTargets",
        "repro": "etforge.app.repro_command:Repro",
    },
    "BACKEND": {"etforge": "etforge.engine.doit_db:EtforgeDB"},
    "REPORTER": {"etforge": "etforge.publish.progress:EtforgeReporter"},
}


class EtforgeMain(DoitMain):
    BIN_NAME = "etforge"

    def get_cmds(self):
        """doit's commands and the plugins', found once per run: each call scans the entry points
        of every installed distribution (tens of ms here), and main() asks before DoitMain.run does."""
        if getattr(self, "_cmds", None) is None:
            self._cmds = super().get_cmds()
        return self._cmds


def main(argv: list | None = None, table: StageTable = DEFAULT_TABLE) -> int:
    """Run ``etforge ARGS``; its tasks run the builders of ``table`` (a test hands in fakes). An error
    etforge raises on purpose that reaches here is one line and its exit code (the one handler)."""
    args = list(sys.argv[1:] if argv is None else argv)
    app = EtforgeMain(PipelineLoader(table), config_filenames=(), extra_config=DOIT_PLUGINS)
    try:
        if "" in args:  # doit reads each argument's first character: an empty one is an IndexError there
            raise BadValue(f"argument {args.index('') + 1} is empty: leave it out or give it a value")
        # the names only: loading every command would import explain's, diff's and ci-matrix's modules
        commands = set(app.get_cmds())
        asked = help_args(args, commands)
        if asked is not None:
            return app.run(asked)
        check_flags(app, args, commands)
        return app.run(options_first(args, commands))
    except EtforgeError as exc:
        say(f"etforge: error: {first_line(exc)}")
        return exc.exit_code


HELP_FLAGS = ("--help", "-h")


def help_args(args: list, commands: set) -> list | None:
    """``etforge X --help`` (or ``-h``, anywhere before ``--``) is ``etforge help X``: the same text
    for a command, a stage or a task; None when no help is asked for."""
    upto = args[: args.index("--")] if "--" in args else args
    if not any(a in HELP_FLAGS for a in upto):
        return None
    named = [a for a in upto if not a.startswith("-")]
    if named[:1] == ["help"]:  # `etforge help X --help` is X's; `etforge help --help`, help's own
        named = named[1:] or named
    return ["help", *named[:1]]


def check_flags(app: EtforgeMain, args: list, commands: set) -> None:
    """Refuse a flag the command does not have, in one line naming it and the flags that exist
    (doit's own message is its parser's internal reprs). A stage's own flags (``release
    --allow-failures``) count: they follow the stage's name."""
    upto = args[: args.index("--")] if "--" in args else args
    flags = [a for a in upto if a.startswith("-") and len(a) > 1 and not a[1:2].isdigit()]
    if not flags:
        return
    name = args[0] if args and args[0] in commands else "run"
    command = app.get_cmds().get_plugin(name)
    # the options DoitCmdBase.get_options parses, read off the class: instantiating a command scans
    # the installed plugins again, on every run that has a flag
    options = tuple(command.cmd_options)
    if issubclass(command, DoitCmdBase):
        options = tuple(command.base_options) + tuple(app.task_loader.cmd_options) + options
    known = {f"--{o['long']}" for o in options if o.get("long")}
    known |= {f"--{o['inverse']}" for o in options if o.get("inverse")}
    short = {f"-{o['short']}" for o in options if o.get("short")}
    if name == "run":  # a stage's own flags; and `etforge export --x` names the stage the user typed
        known |= {f"--{opt.replace('_', '-')}" for stage in STAGES for opt, _ in stage.matrix.options}
        name = next((a for a in upto if not a.startswith("-") and a != "run"), "run")
    for flag in flags:
        if flag.split("=", 1)[0] in known or flag[:2] in short:
            continue
        raise BadValue(
            f"unknown flag {flag.split('=', 1)[0]} for `etforge {name}`; its flags: "
            f"{', '.join(sorted(known | short))} (etforge help {name})"
        )


def _option_table() -> dict:
    """'--name'/'-x' -> whether it takes a value, for the selection and run options."""
    table = {}
    for opt in SELECTION_OPTIONS + Run.cmd_options:
        takes_value = opt["type"] is not bool
        if opt.get("long"):
            table[f"--{opt['long']}"] = takes_value
        if opt.get("short"):
            table[f"-{opt['short']}"] = takes_value
    return table


def options_first(args: list, commands: set) -> list:
    """``args`` with the selection and run options (and their values) moved before the first
    positional argument, after the command name when one comes first; the rest keep their order."""
    table = _option_table()
    command = args[:1] if args and args[0] in commands else []
    front, rest = [], []
    i = len(command)
    while i < len(args):
        arg = args[i]
        if arg == "--":
            rest += args[i:]
            break
        name = arg.split("=", 1)[0]
        if name not in table and arg[:2] in table and not arg.startswith("--"):
            name = arg[:2]  # -n2: the value attached
        if name in table:
            front.append(arg)
            if table[name] and arg == name and i + 1 < len(args):
                front.append(args[i + 1])
                i += 1
        else:
            rest.append(arg)
        i += 1
    return command + front + rest

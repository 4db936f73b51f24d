"""``etforge help [COMMAND|STAGE|TASK]`` and ``etforge CMD --help``: etforge's own help.

doit's ``help`` opens with "doit -- automation tool" and lists its database maintenance commands
in alphabetical order among etforge's. This one opens with etforge, lists its commands in the
order a user meets them, and then doit's maintenance commands under their own heading. A stage
(``export``, ``validate``, ...) gets its purpose, its flags with their defaults and an example;
a command, doit's own rendering of its ``cmd_options`` plus its examples. Registered as the
``help`` command plugin (doit's extension API), which replaces doit's.
"""

from __future__ import annotations

import textwrap

from doit.cmd_help import Help as DoitHelp
from doit.cmdparse import CmdOption

from etforge import __version__
from etforge.app.loader import SELECTION_OPTIONS
from etforge.engine.run_command import Run
from etforge.pipeline.stages import STAGE, STAGES

INTRO = (
    "etforge {version}: export PyTorch models to ExecuTorch programs for every backend and quantization "
    "scheme pipeline.yaml declares; check each program against eager PyTorch, benchmark it, write the "
    "app manifests and pack byte-reproducible releases. Every output is cached by a hash of its inputs."
)
# etforge's commands in the order a user meets them: (name, usage after the name)
COMMANDS = (
    ("init", "[DIR]"),
    ("run", "[STAGE|TASK ...] [--models M] [--backends B] [--schemes S] [-n N]"),
    ("list", ""),
    ("explain", "TASK|STAGE"),
    ("diff", "--baseline RELEASE"),
    ("release", "[--allow-failures] [--strict]"),
    ("repro", "CELL"),
    ("ci-matrix", "[--format github|gitlab|table] [--jobs N]"),
    ("setup-targets", ""),
    ("info", "TASK"),
    ("help", "[COMMAND|STAGE|TASK]"),
)
MAINTENANCE_HEADING = "doit's maintenance commands (the task database behind incremental runs; rarely needed):"
EXAMPLE_CELL = "--models linreg --backends xnnpack --schemes fp32"
EXAMPLES = {
    "init": ("etforge init myproject",),
    "run": ("etforge", "etforge run --models linreg -n 2", "etforge export validate --backends xnnpack"),
    "list": ("etforge list", "etforge list --all export"),
    "explain": ("etforge explain export:linreg/xnnpack/fp32", "etforge explain validate"),
    "diff": ("etforge diff --baseline artifacts/release/demo-0.1.0.tar.gz", "etforge diff --baseline v0.1.0"),
    "repro": ("etforge repro cnn/xnnpack/int8",),
    "ci-matrix": ("etforge ci-matrix --format github --jobs 4",),
    "setup-targets": ("etforge setup-targets",),
    "info": ("etforge info export:linreg/xnnpack/fp32",),
    "help": ("etforge help export", "etforge diff --help"),
    "forget": ("etforge forget export:linreg/xnnpack/fp32",),
    "clean": ("etforge clean export",),
}


def _option_lines(options) -> list[str]:
    """Each flag with its help and default, as doit renders a command's options."""
    lines = []
    for opt in (CmdOption(o) for o in options):
        if not (opt.short or opt.long):
            continue
        lines.append(f"  {opt.help_param()}")
        text = opt.help % {"default": opt.default} if "%(default)" in opt.help else opt.help
        if "default" not in text and opt.default not in (None, False, "", [], ()):
            text += f" [default: {opt.default}]"
        lines += textwrap.wrap(text, 96, initial_indent="      ", subsequent_indent="      ")
    return lines


def stage_help(stage) -> str:
    """A stage's purpose, usage, flags (the selection and run flags, and its own) and an example."""
    own = [
        {"name": name, "short": "", "long": name.replace("_", "-"), "type": bool, "default": False, "help": text}
        for name, text in stage.matrix.options
    ]
    out = ["PURPOSE", f"    {stage.doc}", "", "USAGE", f"    etforge {stage.name} [FLAGS]", ""]
    if own:
        out += [f"FLAGS OF {stage.name.upper()}", *_option_lines(own), ""]
    out += ["SELECTION FLAGS (every stage and run)", *_option_lines(SELECTION_OPTIONS), ""]
    out += ["RUN FLAGS", *_option_lines(Run.cmd_options), ""]
    out += ["EXAMPLE", f"    etforge {stage.name} {EXAMPLE_CELL}"]
    if own:
        out.append(f"    etforge {stage.name} --{own[0]['long']}")
    return "\n".join(out)


class Help(DoitHelp):
    name = "help"
    doc_purpose = "show etforge's commands, or one command's or stage's flags, defaults and an example"
    doc_usage = "[COMMAND|STAGE|TASK]"
    doc_description = "EXAMPLES\n    etforge help\n    etforge help export\n    etforge diff --help"

    def print_usage(self, cmds):
        """etforge's overview: what it is, its commands in order, its stages, then doit's own."""
        print("\n".join(textwrap.wrap(INTRO.format(version=__version__), 96)))
        print("\nCOMMANDS")
        ours = [(name, usage) for name, usage in COMMANDS if name in cmds or name == "release"]
        for name, usage in ours:
            purpose = cmds[name].doc_purpose if name in cmds else "pack the release (a stage: see below)"
            print(f"  etforge {name} {usage}".rstrip())
            print(f"      {purpose}")
        print("\nSTAGES (each one runs for every selected cell: `etforge STAGE`, `etforge help STAGE`)")
        width = max(len(s.name) for s in STAGES)
        for stage in STAGES:
            print(f"  {stage.name:<{width}}  {stage.doc}")
        rest = sorted(set(cmds) - {name for name, _ in COMMANDS})
        print(f"\n{MAINTENANCE_HEADING}")
        print("  " + ", ".join(rest))
        print("\nOne command's or stage's flags, defaults and an example: etforge help NAME, or etforge NAME --help")

    def execute(self, params, args):
        if len(args) == 1 and args[0] in STAGE and args[0] not in self.cmds:
            print(stage_help(STAGE[args[0]]))
            return 0
        if len(args) == 1 and args[0] in self.cmds:  # doit's rendering of its flags, then examples
            print(self.cmds[args[0]](cmds=self._cmds, **self.init_kwargs).help())
            examples = EXAMPLES.get(args[0], (f"etforge {args[0]}",))
            print("\nEXAMPLES\n" + "\n".join(f"    {e}" for e in examples))
            return 0
        return super().execute(params, args)

"""``etforge setup-targets``: install what judging programs on aarch64 targets needs (docs/targets.md).

Debian's qemu-user and aarch64 cross compiler, the aarch64 ExecuTorch wheel (pinned by version and
sha256) and the runner cross-built against it: etforge.builders.targets.setup, reached by its
dotted path (the app never imports a builder). Idempotent: what is there already is kept.
"""

from __future__ import annotations

from doit.cmd_base import Command

from etforge.core.console import say
from etforge.core.dotted_path import load_callable
from etforge.core.errors import EtforgeError
from etforge.core.text import first_line

SETUP = "etforge.builders.targets.setup:setup_targets"


class SetupTargets(Command):
    name = "setup-targets"  # doit would name it after the class: "setuptargets"
    doc_purpose = "install qemu-user, the aarch64 ExecuTorch runtime and the cross-built runner (targets)"
    doc_usage = ""
    doc_description = (
        "Installs what the target stage needs to judge CPU cells on aarch64 cores under qemu-user "
        "(docs/targets.md): Debian's qemu-user, g++-aarch64-linux-gnu and cmake (apt-get, as root or "
        "through sudo -n), the aarch64 executorch wheel from PyPI (pinned sha256) and "
        "cpp/program_runner built for it. Keeps what is already there."
    )

    def execute(self, params, args):
        if args:
            say(f"etforge: error: setup-targets takes no arguments, got: {' '.join(args)}")
            return 3
        try:
            load_callable(SETUP)()
        except EtforgeError as exc:  # here, not in etforge's main: `doit setup-targets` runs this too
            say(f"etforge: error: {first_line(exc)}")
            return exc.exit_code
        return 0

"""etforge's own help: the overview, `CMD --help` equal to `help CMD` on every command and stage,
usage lines under the command's real name, and an unknown flag refused in one line."""

from __future__ import annotations

import pytest

from etforge import __version__
from etforge.app.cli import DOIT_PLUGINS, main
from etforge.app.help_command import COMMANDS, MAINTENANCE_HEADING
from etforge.pipeline.stages import STAGES

NAMES = sorted(DOIT_PLUGINS["COMMAND"]) + ["clean", "forget", "ignore", "dumpdb", "reset-dep"]
STAGE_NAMES = [s.name for s in STAGES]


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_overview_is_etforges_with_its_commands_in_the_order_a_user_meets_them(capsys):
    code, text, _ = run(capsys, "--help")
    assert code == 0
    assert text.startswith(f"etforge {__version__}: ") and "doit -- automation tool" not in text
    listed = [line.split()[1] for line in text.splitlines() if line.startswith("  etforge ")]
    assert listed == [name for name, _ in COMMANDS], listed
    ours, maintenance = text.split(MAINTENANCE_HEADING)
    assert "dumpdb" in maintenance and "reset-dep" in maintenance and "dumpdb" not in ours
    for stage in STAGE_NAMES:
        assert f"\n  {stage} " in ours, stage
    assert run(capsys, "help")[1] == text and run(capsys, "-h")[1] == text


@pytest.mark.parametrize("name", NAMES + STAGE_NAMES)
def test_dash_dash_help_after_a_command_or_stage_is_its_help(capsys, name):
    code, text, err = run(capsys, name, "--help")
    assert code == 0, err
    assert run(capsys, "help", name)[1] == text
    assert "PURPOSE" in text and "EXAMPLE" in text and f"etforge {name}" in text, text
    assert "not recognized" not in text + err


def test_usage_lines_name_the_command_as_it_is_typed(capsys):
    for name in ("ci-matrix", "setup-targets"):
        text = run(capsys, "help", name)[1]
        assert f"etforge {name} " in text.replace("\n", " ") and f"etforge {name.replace('-', '')}" not in text


def test_a_stage_help_gives_each_flag_its_default_and_an_example(capsys):
    text = run(capsys, "release", "--help")[1]
    for flag in ("--allow-failures", "--strict", "--models", "--backends", "--schemes", "-n ARG, --process=ARG"):
        assert flag in text, flag
    assert "[default: 0]" in text  # the run flags' defaults
    assert "etforge release --models linreg" in text


@pytest.mark.parametrize(
    "args, flag, named",
    [
        (["export", "--frobnicate"], "--frobnicate", "etforge export"),
        (["ci-matrix", "--bogus=1"], "--bogus", "etforge ci-matrix"),
        (["release", "--allow-failures", "--nope"], "--nope", "etforge release"),
        (["--colour"], "--colour", "etforge run"),
    ],
)
def test_an_unknown_flag_is_one_line_naming_it_and_the_flags_that_exist(capfd, args, flag, named):
    code, out, err = run(capfd, *args)  # the one handler writes to the process's stderr
    assert code != 0 and out == ""
    assert err.count("\n") == 1, err
    assert f"unknown flag {flag} for `{named}`" in err and "--models" in err, err

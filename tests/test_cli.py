"""The ``etforge`` command: its help, its flags, ``etforge init``, and ``doit`` in this repository
running the same implementation (doit's loader and plugin interfaces)."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest
from conftest import REPO

from etforge.app.cli import DOIT_PLUGINS, options_first
from etforge.app.init import scaffold

COMMANDS = {"run", "list", "info", "init", "help", "clean", "forget", "ignore", "dumpdb", "strace", "reset-dep"}


def etforge(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "etforge", *args], cwd=cwd or REPO, capture_output=True, text=True, timeout=120
    )


def test_help_lists_the_commands():
    run = etforge("--help")
    assert run.returncode == 0, run.stderr
    listed = {line.split()[1] for line in run.stdout.splitlines() if line.startswith("  etforge ")}
    assert {"run", "init", "list", "info"} <= listed, run.stdout


@pytest.mark.parametrize("command", sorted(COMMANDS - {"strace"}))
def test_every_command_has_help(command):
    run = etforge("help", command)
    assert run.returncode == 0, run.stderr
    assert "PURPOSE" in run.stdout and f"etforge {command}" in run.stdout


def test_run_help_shows_the_selection_flags_and_the_refused_parallel_type():
    text = etforge("help", "run").stdout
    for flag in ("--pipeline", "--models", "--backends", "--schemes", "--shard", "--file"):
        assert flag in text, flag
    assert "'thread' is refused" in text


def test_release_flags_are_task_parameters_with_help():
    text = etforge("help", "release").stdout
    assert "--allow-failures" in text and "--strict" in text


def test_doit_in_this_repository_runs_the_same_loader_and_plugins():
    doit = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["doit"]
    assert doit["loader"] == "etforge"
    assert doit["plugins"]["loader"] == {"etforge": "etforge.app.loader:PipelineLoader"}
    assert {kind.upper(): table for kind, table in doit["plugins"].items() if kind != "loader"} == DOIT_PLUGINS
    listed = subprocess.run(
        [sys.executable, "-m", "doit", "list"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout == etforge("list").stdout
    # the pipeline's tasks, and this repository's own from dodo.py (a project's doit file)
    assert "export " in listed.stdout and "docs        build the documentation site" in listed.stdout


COMMANDS_SET = {"run", "list", "info"}


@pytest.mark.parametrize(
    "args, expected",
    [
        (["export", "--models", "linreg", "-n", "2"], ["--models", "linreg", "-n", "2", "export"]),
        (["release", "--allow-failures"], ["release", "--allow-failures"]),  # a task parameter stays
        (["list", "--all", "--shard=2/4"], ["list", "--shard=2/4", "--all"]),
        (["-n2", "validate", "--schemes", "fp32"], ["-n2", "--schemes", "fp32", "validate"]),
        (["export", "--", "--models"], ["export", "--", "--models"]),
    ],
)
def test_selection_and_run_options_may_follow_task_names(args, expected):
    assert options_first(args, COMMANDS_SET) == expected


def test_init_writes_a_project_and_keeps_what_exists(tmp_path):
    (tmp_path / "pipeline.yaml").write_text("mine\n")
    written, kept = scaffold(tmp_path)
    assert kept == ["pipeline.yaml"] and (tmp_path / "pipeline.yaml").read_text() == "mine\n"
    assert set(written) == {"models/__init__.py", "models/tiny_classifier.py", ".gitignore"}
    assert "/artifacts/" in (tmp_path / ".gitignore").read_text().splitlines()


def test_init_then_list_in_an_empty_directory(tmp_path):
    assert etforge("init", str(tmp_path / "app")).returncode == 0
    listed = etforge("list", "--all", cwd=tmp_path / "app")
    assert listed.returncode == 0, listed.stderr
    assert "export:tiny_classifier/xnnpack/fp32" in listed.stdout

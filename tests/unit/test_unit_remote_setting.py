"""The shared cache's URL is checked when the plan is resolved: an unknown protocol is one
``file:line: cache.remote`` line naming the known ones and their packages, and nothing runs."""

from __future__ import annotations

import importlib.util
import re

import pytest

from etforge.app.cli import main
from etforge.config.remote_url import remote_problem
from etforge.core.errors import PipelineError
from unit.support import PIPELINE

KNOWN = ("s3:// or s3a:// (s3fs)", "gs:// or gcs:// (gcsfs)", "abfs:// or az:// (adlfs)", "file:// (built in)")


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_an_unknown_protocol_in_pipeline_yaml_is_a_file_line_key_error(unit_project, monkeypatch):
    monkeypatch.chdir(unit_project.root)
    unit_project.write_pipeline(PIPELINE + 'cache:\n  read_only: true\n  remote: "nosuchproto://bucket/x"\n')
    with pytest.raises(PipelineError) as err:
        unit_project.plan()
    line = _line_of(unit_project.pipeline.read_text(), "nosuchproto")
    message = str(err.value)
    assert message.startswith(f"pipeline.yaml:{line}: cache.remote: unknown remote protocol nosuchproto:// in ")
    assert all(known in message for known in KNOWN), message
    assert "\n" not in message


def test_an_unknown_protocol_in_the_environment_says_so(unit_project, monkeypatch):
    monkeypatch.chdir(unit_project.root)
    monkeypatch.setenv("ETFORGE_CACHE_REMOTE", "nosuchproto://bucket/x")
    with pytest.raises(PipelineError) as err:
        unit_project.plan()
    assert str(err.value).startswith("pipeline.yaml: cache.remote: $ETFORGE_CACHE_REMOTE: unknown remote protocol")
    # The environment wins over a good cache.remote in the file, and the line is that key's.
    unit_project.write_pipeline(PIPELINE + "cache: {remote: shared}\n")
    with pytest.raises(PipelineError, match=r"^pipeline\.yaml:\d+: cache\.remote: \$ETFORGE_CACHE_REMOTE: unknown"):
        unit_project.plan()


def test_the_command_refuses_it_with_one_line_and_runs_nothing(unit_project, monkeypatch, capfd):
    monkeypatch.chdir(unit_project.root)
    unit_project.write_pipeline(PIPELINE + 'cache: {remote: "nosuchproto://bucket/x"}\n')
    with pytest.raises(SystemExit) as exit_:
        main(["export"])
    assert exit_.value.code == 3
    err = capfd.readouterr().err
    assert re.fullmatch(r"etforge: error: pipeline\.yaml:\d+: cache\.remote: unknown remote protocol .*\n", err), err
    assert not (unit_project.root / "artifacts" / "t").exists()


def test_known_protocols_pass_or_name_their_package():
    assert remote_problem("/mnt/share/cache") is None
    assert remote_problem("file:///mnt/share/cache") is None
    assert remote_problem("memory://x") is None  # fsspec's own
    for url, package in (("s3://b/p", "s3fs"), ("gs://b/p", "gcsfs"), ("az://b/p", "adlfs")):
        expected = None if importlib.util.find_spec(package) else f"needs {package}: pip install {package}"
        problem = remote_problem(url)
        assert problem == expected or (expected and expected in problem), (url, problem)

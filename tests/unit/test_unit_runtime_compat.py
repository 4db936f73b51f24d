"""Runtime compatibility: the schema version read off a program's bytes, the policy's window as
data, and a release that refuses variants outside ``manifests.app_runtime``'s window."""

from __future__ import annotations

import hashlib
import struct

import pytest

from etforge.cache.records import write_state
from etforge.checks.numerics import Numerics
from etforge.core.errors import PipelineError
from etforge.pipeline.results import TaskStatus
from etforge.pipeline.specs import spec_of
from etforge.pipeline.stage_results import CaptureResult, ExportResult, Verdict
from etforge.program.compat import load_window, outside_window, program_schema_version, table
from etforge.publish.release import ReleaseRefused, build_release
from unit.support import HOST, make_unit_project

PIPELINE = """\
name: t
version: 0.0.1
models:
  a:
    python: models.a:build
    inputs: [{name: x, shape: [1, 4]}]
backends: {xnnpack: {},
  portable: {}}
quantization: [fp32]
targets: false  # same line count: tests name pipeline.yaml lines
"""
SHA = hashlib.sha256(b"p").hexdigest()


def _flatbuffer(version: int | None) -> bytes:
    """A root table whose field 0 (Program.version) is ``version``, or absent (None)."""
    if version is None:
        vtable = struct.pack("<HH", 4, 4)  # no slot for field 0
        return struct.pack("<I", 12) + b"ET12" + vtable + struct.pack("<i", 4)
    vtable = struct.pack("<HHH", 6, 8, 4) + b"\0\0"
    return struct.pack("<I", 16) + b"ET12" + vtable + struct.pack("<iI", 8, version)


def test_the_schema_version_is_read_from_the_bytes():
    assert program_schema_version(_flatbuffer(1)) == 1
    assert program_schema_version(_flatbuffer(None)) == 0


def test_the_window_comes_from_the_table():
    assert load_window("1.5.1+cpu") == ("1.5", "1.6")
    assert load_window("1.4.1") == ("1.4", "1.5")
    assert load_window("0.4.0") is None  # before the policy: no guarantee known
    assert all(len(row["window"]) == 2 for row in table()["exporters"])
    assert outside_window("1.5.1", "1.6.0") is None
    assert outside_window("1.5.1", "1.4.0") == (
        "built by ExecuTorch 1.5.1: runtime 1.4.0 is outside its load window 1.5.x-1.6.x "
        "(ExecuTorch's compatibility policy)"
    )
    assert "outside" in outside_window("1.5.1", "1.7")


def _records(project, versions: dict):
    plan = project.plan()
    for cell in plan.cells:

        def write(stage, result, cell=cell):
            spec = spec_of(plan, stage, cell, HOST)
            write_state(spec, TaskStatus.OK, key=None, info=result.to_json(), reason="", log=spec.log_file)

        write("capture", CaptureResult(inputs="random (seeded)"))
        write("export", ExportResult(sha256=SHA, size_bytes=1, executorch_version=versions[cell.backend.name]))
        check = Numerics(passed=True, inputs="npz d.npz", samples=1, sqnr_db=60.0)
        write("validate", Verdict(program_sha256=SHA, checks=(check,)))
    return plan


def test_a_release_refuses_each_variant_outside_the_app_runtime_window(tmp_path):
    project = make_unit_project(tmp_path / "p", PIPELINE + 'manifests: {app_runtime: ["1.5.0", "1.4.0"]}\n', ("a",))
    plan = _records(project, {"xnnpack": "1.5.1", "portable": "1.4.1"})
    with pytest.raises(ReleaseRefused) as refused:
        build_release(plan, plan.cells, allow_failures=False, host=HOST)
    assert str(refused.value) == (
        "1 variant(s) may not load on the app's runtime:\n"
        "  a/xnnpack/fp32: built by ExecuTorch 1.5.1: runtime 1.4.0 is outside its load window 1.5.x-1.6.x "
        "(ExecuTorch's compatibility policy) (manifests.app_runtime)"
    )


def test_a_runtime_inside_every_window_passes_that_check(tmp_path):
    project = make_unit_project(tmp_path / "p", PIPELINE + "manifests: {app_runtime: 1.5.0}\n", ("a",))
    plan = _records(project, {"xnnpack": "1.5.1", "portable": "1.5.1"})
    with pytest.raises(ReleaseRefused) as refused:  # then it goes on to read the (absent) programs
        build_release(plan, plan.cells, allow_failures=False, host=HOST)
    assert "load window" not in str(refused.value)


@pytest.mark.parametrize(
    "value, expected",
    [
        ("one", 'expected an ExecuTorch version such as 1.4.0, or a list of them, got "one"'),
        ('["1.4.0", "latest"]', 'expected an ExecuTorch version such as 1.4.0, got "latest"'),
        ("[]", "expected at least 1 item, got []"),
    ],
)
def test_an_app_runtime_that_is_not_a_version_is_one_line(tmp_path, value, expected):
    project = make_unit_project(tmp_path / "p", PIPELINE + f"manifests: {{app_runtime: {value}}}\n", ("a",))
    with pytest.raises(PipelineError) as raised:
        project.plan()
    message = str(raised.value)
    assert "\n" not in message and "pipeline.yaml:11: manifests.app_runtime" in message
    assert message.endswith(expected)

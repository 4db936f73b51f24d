"""``etforge diff`` and ``etforge explain``, in-process with fake builders (no torch).

End to end: two releases of a small pipeline that differ by one model edit (a helper module
of model a), one threshold change (fp16) and one removed cell (b/portable/fp32); the diff shows
exactly those, exits 1 on the lost cell, writes markdown, and the report gains its section.
Timing tolerances are checked on recorded figures (no real timing), baselines that cannot be
compared on hand-made releases, and explain after the same edits.
"""

from __future__ import annotations

import json
import shutil

import pytest

from etforge.app.cli import main
from etforge.config import defaults
from etforge.publish import diff, diff_baseline
from unit.support import PIPELINE, make_unit_project
from unit.test_unit_engine_run import Etforge, Run

HELPER = "SCALE = {}\n"
MODEL_A = "from models import blocks\n\n\ndef build():\n    return blocks.SCALE\n"
THRESHOLDS = "thresholds:\n  fp16: {sqnr_db: 30}\n"
REMOVED = "matrix:\n  exclude: [{model: b, backend: portable, quantization: fp32}]\n"


@pytest.fixture
def project(tmp_path):
    project = make_unit_project(tmp_path / "proj")
    project.write("models/blocks.py", HELPER.format(1))
    project.write("models/a.py", MODEL_A)
    project.write_pipeline(PIPELINE + THRESHOLDS)
    return project


@pytest.fixture
def etforge(project, monkeypatch, capfd):
    return Etforge(project, monkeypatch, capfd)


def cli(etforge, *args: str) -> Run:
    """``etforge ARGS`` for a command other than run (``etforge diff``, ``explain``): no -o."""
    etforge.capfd.readouterr()
    try:
        code = main(list(args))
    except SystemExit as exc:  # a bad pipeline.yaml: one line, exit 3
        code = exc.code
    out, err = etforge.capfd.readouterr()
    return Run(code=code, out=out, err=err, calls=[])


def _keep_release(etforge, where: str = "baseline"):
    """Copy the release (archive, directory, .bench.json) aside: the next release overwrites it."""
    releases = etforge.project.root / "artifacts" / "release"
    target = etforge.project.root / where
    shutil.copytree(releases, target, ignore=shutil.ignore_patterns(".*"))
    return target


def _edit(project):
    project.write("models/blocks.py", HELPER.format(2))  # model a's helper module
    project.edit_pipeline("fp16: {sqnr_db: 30}", "fp16: {sqnr_db: 31}")  # one threshold
    project.write_pipeline(project.pipeline.read_text() + REMOVED)  # one removed cell


def test_diff_of_two_releases_shows_exactly_the_edits_and_fails_on_the_lost_cell(etforge, project, monkeypatch):
    assert etforge("release").code == 0
    kept = _keep_release(etforge)
    provenance = json.loads((kept / "t-0.0.1" / "provenance.json").read_text())
    cell = next(c for c in provenance["cells"] if c["model"] == "a" and c["backend"] == "xnnpack")
    assert {"program", "checks", "model_sha256"} <= set(cell["metrics"])  # what a later diff needs
    assert {"numerics", "delegation"} <= set(cell["metrics"]["checks"])
    assert provenance["pipeline"]["name"] == "t" and provenance["toolchain"]
    assert "latency_p50_ms" in json.loads((kept / "t-0.0.1.bench.json").read_text())["a/xnnpack/fp32"]

    _edit(project)
    assert etforge("release").code == 0
    summary = project.root / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    run = cli(etforge, "diff", "--baseline", "baseline/t-0.0.1.tar.gz")
    assert run.code == 1, run.out + run.err
    changes = {(c.cell, c.what, c.kind) for c in _changes(project, "baseline/t-0.0.1.tar.gz")}
    a_cells = ("a/xnnpack/fp32", "a/xnnpack/fp16", "a/portable/fp32")
    assert changes == (
        {(c, "program", "changed") for c in a_cells}
        | {(c, "model", "changed") for c in a_cells}
        | {(c, "thresholds", "changed") for c in ("a/xnnpack/fp16", "b/xnnpack/fp16")}
        | {("b/portable/fp32", "state", "regression")}
    )
    assert "1 regression(s) (1 lost cell(s))" in run.out + run.err
    markdown = (project.out / "diff.md").read_text()
    assert markdown.startswith("## Changes since baseline/t-0.0.1.tar.gz\n")
    assert "| b/portable/fp32 | state | provisional | - | **regression** | cell removed: a lost cell |" in markdown
    assert "| a/xnnpack/fp16 | thresholds | sqnr_db 30 | sqnr_db 31 | changed | sqnr_db 30 -> 31 |" in markdown
    assert markdown.count("\n| ") == 1 + len(changes)  # the header and one row per change
    assert summary.read_text() == markdown  # the CI step summary

    # The same release, named by its directory: the same changes; and the report gains the section.
    assert cli(etforge, "diff", "--baseline", str(kept / "t-0.0.1")).code == 1
    assert etforge("report").code == 0
    report = (project.out / "report.html").read_text()
    assert "Changes since " in report and 'data-cell="b/portable/fp32"' in report
    shutil.rmtree(kept)  # the baseline is gone: the section leaves the report rather than compare with nothing
    assert etforge("report").code == 0
    assert "Changes since " not in (project.out / "report.html").read_text()


def _changes(project, baseline: str) -> list:
    plan = project.plan()
    found = diff_baseline.load(plan, str(project.root / baseline))
    from etforge.publish import diff_section

    return diff_section.compare(plan, plan.cells, None, found)


def test_a_baseline_that_cannot_be_compared_is_one_line_and_exit_2(etforge, project):
    assert etforge("release").code == 0
    kept = _keep_release(etforge)
    archive = kept / "t-0.0.1.tar.gz"
    truncated = project.root / "truncated.tar.gz"
    truncated.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    other = shutil.copytree(kept / "t-0.0.1", project.root / "other")
    newer = shutil.copytree(kept / "t-0.0.1", project.root / "newer")
    for directory, edit in ((other, {"pipeline": {"name": "u"}}), (newer, {"format": "etforge-provenance/9"})):
        data = json.loads((directory / "provenance.json").read_text())
        data.update(edit)
        (directory / "provenance.json").write_text(json.dumps(data))
    for given, says in (
        ("nowhere.tar.gz", "baseline nowhere.tar.gz is missing"),
        (str(truncated), "is truncated or damaged"),
        (str(other), "is a release of another pipeline (u), not of 't'"),
        (str(newer), "was made by a newer etforge"),
    ):
        run = cli(etforge, "diff", "--baseline", given)
        assert run.code == 2, (given, run.err)
        lines = [line for line in run.err.splitlines() if line.strip()]
        assert len(lines) == 1 and says in lines[0] and "Traceback" not in run.err, run.err


def test_an_older_release_is_read_as_far_as_it_goes(project):
    plan = project.plan()
    older = project.root / "old" / "t-0.0.1"
    older.mkdir(parents=True)
    cell = {"model": "a", "backend": "xnnpack", "quantization": "fp32", "status": "ok", "sha256": "1" * 64}
    cell.update(size_bytes=1000, delegated_ops=3, non_delegated_ops=1, verdict={"sqnr_db": 60.0})
    provenance = {"format": "etforge-provenance/2", "release": "t-0.0.1", "cells": [cell]}
    (older / "provenance.json").write_text(json.dumps(provenance))
    baseline = diff_baseline.load(plan, str(older))
    metrics = {
        "size": {"bytes": 1100},
        "numerics": {"sqnr_db": 50.0},
        "delegation": {"coverage": 0.75},
    }
    current = {"cells": {"a/xnnpack/fp32": {"status": "ok", "sha256": "1" * 64, "metrics": metrics}}}
    found = {(c.what, c.kind) for c in diff.compare(baseline.cells, {}, current, defaults.DIFF_TOLERANCES)}
    assert found == {("size", "regression"), ("sqnr_db", "regression")}  # coverage 3/4 is unchanged


# ---------------------------------------------------------------- timing tolerances, on recorded figures


def _timed(p50: float, stdev: float | None = None, host: str = "h", **more) -> dict:
    figures = {"latency_p50_ms": p50, "latency_p90_ms": p50 * 1.1, "host_id": host, **more}
    if stdev is not None:
        figures["latency_stdev_ms"] = stdev
    return figures


def _latency_kinds(before: dict, after: dict, **tolerances) -> dict:
    cell = {"status": "ok", "metrics": {}}
    tol = {**defaults.DIFF_TOLERANCES, **tolerances}
    changes = diff.compare(
        {"m/x/fp32": cell}, {"m/x/fp32": before}, {"cells": {"m/x/fp32": cell}, "timings": {"m/x/fp32": after}}, tol
    )
    return {c.what: c.kind for c in changes}


def test_a_latency_regression_beyond_tolerance_is_caught_and_one_within_is_not():
    assert _latency_kinds(_timed(1.0), _timed(1.2)) == {"p50": "regression", "p90": "regression"}
    assert _latency_kinds(_timed(1.0), _timed(1.08)) == {"p50": "changed", "p90": "changed"}
    assert _latency_kinds(_timed(1.0), _timed(0.8))["p50"] == "improvement"
    # the pipeline's tolerance: 25 % lets +20 % pass
    assert _latency_kinds(_timed(1.0), _timed(1.2), latency_pct=25)["p50"] == "changed"


def test_the_baselines_own_spread_widens_the_timing_tolerance():
    noisy = _timed(1.0, stdev=0.1)  # 10 % + 2 x 0.1 ms
    assert _latency_kinds(noisy, _timed(1.25))["p50"] == "changed"
    assert _latency_kinds(noisy, _timed(1.35))["p50"] == "regression"


def test_timings_of_another_host_are_not_compared_and_llm_tokens_per_second_are():
    assert _latency_kinds(_timed(1.0), _timed(3.0, host="other")) == {"latency": "changed"}
    slower = _latency_kinds(_timed(1.0, llm={"decode_tok_s": 100.0}), _timed(1.0, llm={"decode_tok_s": 80.0}))
    assert slower == {"decode tok/s": "regression"}
    rss = _latency_kinds(_timed(1.0, peak_rss_mb=100.0), _timed(1.0, peak_rss_mb=130.0))
    assert rss == {"peak RSS": "regression"}


def test_a_non_finite_figure_is_never_compared():
    kinds = _latency_kinds(_timed(1.0), {"latency_p50_ms": float("nan"), "host_id": "h"})
    assert "p50" not in kinds


def test_diff_tolerances_are_checked_by_the_schema_with_file_line_and_key(project, capfd):
    project.write_pipeline(PIPELINE + "diff:\n  size_pct: 2\n  latency_pct: fast\n")
    with pytest.raises(SystemExit) as exited:
        main(["diff", "--pipeline", str(project.pipeline), "--baseline", "x"])
    assert exited.value.code == 3
    err = capfd.readouterr().err.strip()
    assert err.startswith(f"etforge: error: {project.pipeline}:") and "diff.latency_pct" in err, err
    project.write_pipeline(PIPELINE + "diff:\n  size_pct: 5\n")
    assert project.plan().diff["size_pct"] == 5 and project.plan().diff["sqnr_db"] == 1.0


# ---------------------------------------------------------------- explain


def test_explain_names_a_changed_model_helper_module_and_a_changed_threshold(etforge, project):
    assert etforge("export", "validate").code == 0
    project.write("models/blocks.py", HELPER.format(2))
    project.edit_pipeline("fp16: {sqnr_db: 30}", "fp16: {sqnr_db: 31}")
    run = cli(etforge, "explain", "export:a/xnnpack/fp32", "validate:a/xnnpack/fp16", "export:b/xnnpack/fp32")
    assert run.code == 0, run.err
    lines = dict(line.split(": ", 1) for line in run.out.splitlines() if line.startswith(("export:", "validate:")))
    assert lines["export:a/xnnpack/fp32"].startswith("models/blocks.py changed (sha "), lines
    assert "via capture:a" in lines["export:a/xnnpack/fp32"]
    assert "thresholds.sqnr_db 30 → 31" in lines["validate:a/xnnpack/fp16"]
    assert lines["validate:a/xnnpack/fp16"].count("models/blocks.py changed") == 1  # once, by its shortest path
    assert lines["export:b/xnnpack/fp32"] == "up to date"
    # after the upstream capture ran again, the export still says why (keys kept by key)
    assert etforge("capture:a").code == 0
    again = cli(etforge, "explain", "export:a/xnnpack/fp32")
    assert "models/blocks.py changed (sha " in again.out, again.out
    assert etforge("export", "validate").code == 0
    assert cli(etforge, "explain", "export:a/xnnpack/fp32").out.strip() == "export:a/xnnpack/fp32: up to date"


def test_a_git_revision_names_the_release_built_from_it(etforge, project):
    import subprocess

    def git(*args):
        return subprocess.run(
            ["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
            cwd=project.root,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()

    git("init", "-q")
    git("add", "pipeline.yaml", "models")
    git("commit", "-q", "-m", "the models")
    assert etforge("release").code == 0
    run = cli(etforge, "diff", "--baseline", "HEAD")
    assert run.code == 0, run.out + run.err
    assert "0 regression(s)" in run.out
    assert cli(etforge, "diff", "baseline=HEAD").code == 0  # the doit form: `doit diff baseline=<...>`
    unknown = cli(etforge, "diff", "--baseline", "HEAD~3")
    assert unknown.code == 2 and "baseline HEAD~3 is missing" in unknown.err, unknown.err
    git("commit", "-q", "--allow-empty", "-m", "later")
    later = cli(etforge, "diff", "--baseline", "HEAD")
    assert later.code == 2 and "no release of revision" in later.err, later.err


# ---------------------------------------------------------------- states, outputs, structure, on recorded figures


def _kinds(base: dict, now: dict, **tolerances) -> set:
    tol = {**defaults.DIFF_TOLERANCES, **tolerances}
    return {(c.cell, c.what, c.kind) for c in diff.compare(base, {}, {"cells": now}, tol)}


def test_state_transitions_new_lost_broken_fixed_and_no_longer_provisional():
    base = {"a": {"status": "ok"}, "b": {"status": "failed"}, "c": {"status": "provisional"}, "d": {"status": "ok"}}
    now = {"a": {"status": "failed"}, "b": {"status": "ok"}, "c": {"status": "ok"}, "e": {"status": "ok"}}
    assert _kinds(base, now) == {
        ("a", "state", "regression"),
        ("b", "state", "improvement"),
        ("c", "state", "improvement"),
        ("d", "state", "regression"),  # shipped, and gone: a lost cell
        ("e", "state", "new"),
    }


def _shipped(**metrics) -> dict:
    return {"status": "ok", "sha256": metrics.pop("sha256", "1" * 64), "metrics": metrics}


def test_each_output_is_judged_on_its_own():
    outputs = [{"output": "boxes", "sqnr_db": 40.0}, {"output": "logits", "sqnr_db": 40.0, "top1_agreement": 1.0}]
    worse = [{"output": "boxes", "sqnr_db": 39.5}, {"output": "logits", "sqnr_db": 30.0, "top1_agreement": 0.9}]
    base = {"m": _shipped(numerics={"sqnr_db": 40.0, "outputs": outputs})}
    now = {"m": _shipped(numerics={"sqnr_db": 30.0, "outputs": worse})}
    assert _kinds(base, now) == {
        ("m", "sqnr_db", "regression"),
        ("m", "boxes sqnr_db", "changed"),  # 0.5 dB: within the default 1 dB
        ("m", "logits sqnr_db", "regression"),
        ("m", "logits top1_agreement", "regression"),
    }
    assert ("m", "logits sqnr_db", "changed") in _kinds(base, now, sqnr_db=20)


def test_a_changed_program_is_summarised_by_its_structure():
    before = {
        "size": {"bytes": 1000, "breakdown": {"constants": 600, "delegates": {"XnnpackBackend": 300}, "program": 100}},
        "delegation": {"not_delegated": {"aten.atan.default": 1}, "delegated_by_backend": {"XnnpackBackend": 4}},
        "memory": {"planned_bytes": {"forward": [1024]}},
    }
    after = {
        "size": {"bytes": 1010, "breakdown": {"constants": 600, "delegates": {"XnnpackBackend": 310}, "program": 100}},
        "delegation": {"not_delegated": {}, "delegated_by_backend": {"XnnpackBackend": 5}},
        "memory": {"planned_bytes": {"forward": [2048]}},
    }
    changes = diff.compare(
        {"m": _shipped(**before)}, {}, {"cells": {"m": _shipped(sha256="2" * 64, **after)}}, defaults.DIFF_TOLERANCES
    )
    found = {c.what: c for c in changes}
    assert found["size"].kind == "changed" and "delegates.XnnpackBackend 300 B -> 310 B" in found["size"].note
    assert found["planned memory"].kind == "regression"  # twice the arena
    program = found["program"].note
    assert "portable op aten.atan.default x1 -> x0" in program
    assert "ops delegated to XnnpackBackend x4 -> x5" in program
    assert "planned buffers of forward [1024] -> [2048]" in program


def test_explain_says_when_the_last_run_under_these_inputs_failed(etforge, project):
    etforge.control(fail={"validate:a/xnnpack/fp32": "raise"})
    assert etforge("export", "validate").code == 1
    run = cli(etforge, "explain", "validate:a/xnnpack/fp32", "validate")
    assert run.code == 0, run.err
    lines = run.out.splitlines()
    assert lines[0] == (
        "validate:a/xnnpack/fp32: inputs unchanged since its last run, which failed: RuntimeError: fake validate broke on purpose"
    )
    assert "validate:b/xnnpack/fp32: up to date" in lines  # a stage name explains each of its tasks
    assert cli(etforge, "explain", "nosuch:task").code == 3


def test_toolchain_and_recipe_tool_versions_that_changed_are_named():
    base = {"m": _shipped(tools={"openvino": "2025.3.0"})}
    now = {"m": _shipped(tools={"openvino": "2025.4.1"})}
    current = {"cells": now, "toolchain": {"torch": "2.13.0", "executorch": "1.5.1"}}
    changes = diff.compare(base, {}, current, defaults.DIFF_TOLERANCES, {"torch": "2.12.0", "executorch": "1.5.1"})
    found = {(c.cell, c.what, c.before, c.after, c.kind) for c in changes}
    assert found == {
        ("toolchain", "torch", "2.12.0", "2.13.0", "changed"),
        ("m", "openvino", "2025.3.0", "2025.4.1", "changed"),
    }
    assert not any(c.fails for c in changes)  # context for the other changes, not a regression

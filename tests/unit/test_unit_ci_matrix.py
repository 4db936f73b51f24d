"""``etforge ci-matrix``: jobs grouped by worker labels, balanced by recorded durations, each cell once."""

from __future__ import annotations

import json
import random

import pytest

from etforge.app.cli import main
from etforge.app.loader import request_from
from etforge.cache.durations import recorded_durations
from etforge.cache.opening import reading_store
from etforge.engine.ci_plan import CellCost, plan_jobs
from etforge.engine.entry import load_selection
from unit.support import make_unit_project
from unit.test_unit_engine_run import Etforge

MODELS = [f"m{i}" for i in range(8)]


def fake_costs(seed: int = 7) -> list:
    """8 models x (xnnpack, portable, vulkan, coreml) x (fp32, int8): made-up seconds shaped like real ones."""
    rng = random.Random(seed)
    costs = []
    for model in MODELS:
        weight = rng.uniform(1, 12)  # a model 12x the cost of another
        for backend, needs in (("xnnpack", ()), ("portable", ()), ("vulkan", ()), ("coreml", ("macos",))):
            for scheme in ("fp32", "int8"):
                upstream = {f"capture:{model}": 4.0 * weight}
                if scheme == "int8":
                    upstream[f"quantize:{model}/int8/pt2e"] = 6.0 * weight
                costs.append(
                    CellCost(f"{model}/{backend}/{scheme}", frozenset(needs), rng.uniform(5, 15) * weight, upstream)
                )
    return costs


@pytest.mark.parametrize("seed", [1, 7, 23])
def test_jobs_are_balanced_within_20_percent_and_every_cell_runs_exactly_once(seed):
    costs = fake_costs(seed)
    jobs = plan_jobs(costs, 4)
    placed = [cell for job in jobs for cell in job.cells]
    assert sorted(placed) == sorted(c.name for c in costs)  # each exactly once
    groups: dict = {}
    for job in jobs:
        groups.setdefault(job.needs, []).append(job.load_s)
        needs = {c.needs for c in costs if c.name in job.cells}
        assert needs == {job.needs}  # a job's cells all need what its runner offers
    assert sorted(groups) == [frozenset(), frozenset({"macos"})]
    for needs, loads in groups.items():
        assert len(loads) == 4
        assert max(loads) <= 1.2 * min(loads), (sorted(needs), loads)
    # Cells of a model share its capture: a job runs each upstream task it needs once, and the
    # split runs less upstream work than running every cell on its own would.
    upstream_alone = sum(sum(c.upstream.values()) for c in costs)
    upstream_jobs = sum(job.load_s for job in jobs) - sum(c.own_s for c in costs)
    assert upstream_jobs < 0.75 * upstream_alone


PIPELINE = """\
name: t
version: 0.0.1
models:
  a:
    python: models.a:build
    inputs: [{name: x, shape: [1, 4]}]
  b:
    python: models.b:build
    inputs: [{name: x, shape: [1, 4]}]
backends:
  xnnpack: {}
  portable: {}
  metal: {}
quantization: [fp32]
"""


@pytest.fixture
def etforge(tmp_path, monkeypatch, capfd):
    return Etforge(make_unit_project(tmp_path / "proj", PIPELINE), monkeypatch, capfd)


def ci_matrix(capfd, *args) -> tuple:
    capfd.readouterr()
    code = main(["ci-matrix", *args])
    out, err = capfd.readouterr()
    return code, out, err


def test_the_github_matrix_groups_cells_by_label_with_recorded_durations(etforge, capfd, tmp_path):
    durations = tmp_path / "durations.json"
    seconds = {"export:a/xnnpack/fp32": 100, "export:b/xnnpack/fp32": 90, "capture:a": 30, "capture:b": 30}
    seconds |= {"export:a/portable/fp32": 5, "export:b/portable/fp32": 5}  # (metal: the median, 50)
    durations.write_text(json.dumps(seconds))
    code, out, err = ci_matrix(capfd, "--jobs", "2", "--durations", str(durations))
    assert code == 0, err
    assert out.count("\n") == 1  # one line for $GITHUB_OUTPUT
    rows = json.loads(out)["include"]
    cells = [c for row in rows for c in row["cells"].split(",")]
    assert sorted(cells) == sorted(f"{m}/{b}/fp32" for m in "ab" for b in ("xnnpack", "portable", "metal"))
    macos = [row for row in rows if row["labels"] == "macos"]
    assert [row["runs_on"] for row in macos] == [["macos-14"], ["macos-14"]]
    assert {c for row in macos for c in row["cells"].split(",")} == {"a/metal/fp32", "b/metal/fp32"}
    linux = sorted((row for row in rows if row["labels"] == ""), key=lambda r: r["job"])
    assert [row["runs_on"] for row in linux] == [["ubuntu-24.04"], ["ubuntu-24.04"]]
    # The two long exports (100 s, 90 s) land on different jobs.
    assert sum("a/xnnpack/fp32" in row["cells"] or "b/xnnpack/fp32" in row["cells"] for row in linux) == 2
    # Each job runs exactly its list of cells.
    first = linux[0]["cells"].split(",")
    run = etforge("export", "--cells", linux[0]["cells"])
    assert run.code == 0, run.out + run.err
    assert {task.split(":", 1)[1] for task in run.started if task.startswith("export:")} == set(first)


def test_the_gitlab_child_pipeline_tags_jobs_by_label_and_runs_their_cells(etforge, capfd):
    code, out, err = ci_matrix(capfd, "--format", "gitlab", "--jobs", "1")
    assert code == 0, err
    doc = json.loads(out)
    jobs = {name: job for name, job in doc.items() if name.startswith("etforge:")}
    assert set(jobs) == {"etforge:linux-1", "etforge:macos-1"}
    assert jobs["etforge:macos-1"]["tags"] == ["macos"]
    assert jobs["etforge:macos-1"]["variables"] == {
        "ETFORGE_CELLS": "a/metal/fp32,b/metal/fp32",
        "ETFORGE_WORKER_LABELS": "macos",
    }
    assert "tags" not in jobs["etforge:linux-1"]
    assert doc[".etforge"]["script"][-1] == '.venv/bin/etforge --cells "$ETFORGE_CELLS"'


def test_a_cell_name_that_is_no_cell_is_one_line(etforge, capfd):
    with pytest.raises(SystemExit) as exit_:
        etforge("export", "--cells", "a/xnnpack/fp32,a/xnnpak/fp32")
    assert exit_.value.code == 3
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith(
        "--cells: 'a/xnnpak/fp32' is no cell of the matrix; did you mean 'a/xnnpack/fp32'?"
    )


def test_a_fresh_checkout_plans_from_the_build_seconds_the_remote_entries_keep(etforge, capfd, tmp_path, monkeypatch):
    (tmp_path / "remote").mkdir()
    monkeypatch.setenv("ETFORGE_CACHE_REMOTE", f"file://{tmp_path / 'remote'}")
    run = etforge("export", "--backends", "xnnpack,portable")
    assert run.code == 0, run.out + run.err
    built = {task: etforge.record(task)["elapsed_s"] for task in run.started}
    # A fresh checkout has no records and an empty local store: its seconds come from the remote.
    fresh = make_unit_project(tmp_path / "fresh", PIPELINE)
    monkeypatch.chdir(fresh.root)
    assert not list(fresh.root.glob("artifacts/*/.state/*"))
    selection = load_selection(request_from({"pipeline": "pipeline.yaml"})[0])
    seconds = recorded_durations(selection.specs, reading_store(selection.plan).build_seconds)
    assert set(seconds) == set(built)  # the metal cells were never built: estimated, not recorded
    for task, elapsed in built.items():
        assert seconds[task] == pytest.approx(elapsed, abs=0.25)  # measured when the entry was stored (before its copy)
    assert not list(fresh.root.glob("artifacts/cache/*/*"))  # looked up, never downloaded

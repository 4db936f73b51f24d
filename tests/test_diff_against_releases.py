"""``etforge diff`` and ``explain`` on a real build: a release of linreg, then a model edit that
puts an op outside XNNPACK. What a user sees: the edit explained before anything runs, then
the diff naming the lost coverage, the larger program and the operator that moved to portable
kernels, with exit status 1 and markdown. (One cell, built once per session by built_linreg;
this file adds one release and one re-export, about 30 s on 2 cores.)"""

from __future__ import annotations

import json
import shutil

from conftest import copy_project


def test_a_model_edit_is_explained_and_diffed_against_the_last_release(built_linreg, tmp_path):
    project = copy_project(built_linreg, tmp_path / "proj")
    assert project.doit("release").returncode == 0
    shutil.copytree(project.root / "artifacts" / "release", project.root / "baseline")
    provenance = json.loads((project.root / "baseline" / "t-0.0.1" / "provenance.json").read_text())
    metrics = provenance["cells"][0]["metrics"]
    delegation = metrics["checks"]["delegation"]
    assert delegation["figures"]["coverage"]["value"] == 1.0 and delegation["structure"]["ops delegated to"]
    assert metrics["program"]["bytes"] == provenance["cells"][0]["size_bytes"]

    same = project.doit("diff", "--baseline", "baseline/t-0.0.1.tar.gz")
    assert same.returncode == 0, same.stdout + same.stderr
    assert "0 regression(s)" in same.stdout

    model = project.root / "models" / "linreg.py"
    model.write_text(model.read_text().replace("return self.linear(x)", "return torch.atan(self.linear(x))"))
    explained = project.doit("explain", "export:linreg/xnnpack/fp32")
    assert explained.returncode == 0, explained.stderr
    assert explained.stdout.startswith("export:linreg/xnnpack/fp32: models/linreg.py changed (sha "), explained.stdout

    assert project.doit("export", "validate").returncode == 0
    run = project.doit("diff", "--baseline", "baseline/t-0.0.1")
    assert run.returncode == 1, run.stdout + run.stderr
    rows = {line.split()[1]: line for line in run.stdout.splitlines() if line.startswith("linreg/xnnpack/fp32 ")}
    assert "regression" in rows["coverage"] and "100.00%" in rows["coverage"]
    assert "aten.atan x0 -> x1" in rows["program"]
    assert "model" in rows
    markdown = (project.out / "diff.md").read_text()
    assert "| linreg/xnnpack/fp32 | coverage | 100.00% |" in markdown and "**regression**" in markdown

"""What the unit tier's tests share: small projects resolved in-process, their task keys.

Nothing here imports torch, executorch or a model's code: a project's model modules are
files that resolve digests and never imports (``FAKE_MODEL``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from etforge.config.resolve import resolve
from etforge.pipeline.specs import run_specs

# A host fingerprint for benchmark keys (the real one reads /proc/cpuinfo): any fixed dict will do.
HOST = {"cpu_model": "unit-test cpu", "logical_cores": 2, "usable_cores": 2, "machine": "x86_64", "system": "Linux"}

# A model factory resolve can digest: the unit tier never runs a model.
FAKE_MODEL = 'def build():\n    """Never called by the unit tier."""\n    return None\n'

# Two models with modules of their own, on two backends, fp32 and fp16 (fp16: xnnpack only,
# quantized by its own task, with a size gate): 6 cells, 2 refused combinations.
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
quantization: [fp32, fp16]
"""


@dataclass
class UnitProject:
    """A throwaway project: pipeline.yaml and model modules that are never imported."""

    root: Path

    @property
    def pipeline(self) -> Path:
        return self.root / "pipeline.yaml"

    @property
    def out(self) -> Path:
        return self.root / "artifacts" / "t"

    def write(self, relative: str, text: str) -> Path:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        # A new inode and a later mtime: an edit is never hidden by the digest memo's stat signature.
        tmp = path.with_name(path.name + ".new")
        tmp.write_text(text)
        os.replace(tmp, path)
        return path

    def write_pipeline(self, text: str) -> None:
        self.write("pipeline.yaml", text)

    def edit_pipeline(self, old: str, new: str) -> None:
        text = self.pipeline.read_text()
        assert old in text, f"{old!r} is not in pipeline.yaml"
        self.write_pipeline(text.replace(old, new))

    def plan(self):
        return resolve(self.pipeline)

    def cell(self, plan, name: str):
        return next(c for c in plan.cells if c.name == name)


def make_unit_project(root: Path, pipeline: str = PIPELINE, models=("a", "b")) -> UnitProject:
    project = UnitProject(root)
    project.write("models/__init__.py", "")
    for model in models:
        project.write(f"models/{model}.py", FAKE_MODEL)
    project.write_pipeline(pipeline)
    return project


def task_keys(plan, cells=None) -> dict:
    """task name -> key of every task of ``cells`` (default all) that has one before anything runs."""
    specs, _ = run_specs(plan, plan.cells if cells is None else cells, HOST)
    return {name: spec.key for name, spec in specs.items() if spec.key is not None}


def changed_keys(before: dict, after: dict) -> set:
    """The task names whose key differs (or that exist on one side only)."""
    return {name for name in before.keys() | after.keys() if before.get(name) != after.get(name)}

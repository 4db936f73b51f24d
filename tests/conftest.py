"""Shared helpers: a throwaway etforge project and a way to run doit on it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
START_LINE = re.compile(r"^\[\d\d:\d\d:\d\d\] start\s+(\S+)$", re.M)

SMALL_PIPELINE = """\
name: t
version: 0.0.1
models:
  linreg:
    python: models.linreg:build
    inputs: [{name: features, shape: [1, 4]}]
  cnn:
    python: models.small_cnn:build
    kwargs: {num_classes: 3, width: 4}
    inputs: [{name: image, shape: [1, 3, 8, 8]}]
backends:
  xnnpack: {}
  portable: {}
quantization: [fp32]
"""


@dataclass
class DoitRun:
    returncode: int
    stdout: str
    stderr: str

    @property
    def started(self) -> set:
        """Names of the tasks whose actions ran."""
        return set(START_LINE.findall(self.stdout))


@dataclass
class Project:
    root: Path

    @property
    def pipeline(self) -> Path:
        return self.root / "pipeline.yaml"

    @property
    def out(self) -> Path:
        return self.root / "artifacts" / "t"

    def write_pipeline(self, text: str) -> None:
        self.pipeline.write_text(text)

    def doit(self, *args: str, extra_env: dict | None = None) -> DoitRun:
        env = {**os.environ, "ETFORGE_PIPELINE": str(self.pipeline), **(extra_env or {})}
        proc = subprocess.run([sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), *args],
                              cwd=self.root, env=env, capture_output=True, text=True, timeout=900)
        return DoitRun(proc.returncode, proc.stdout, proc.stderr)


def make_project(path: Path, pipeline: str = SMALL_PIPELINE) -> Project:
    shutil.copytree(REPO / "models", path / "models", ignore=shutil.ignore_patterns("__pycache__"))
    project = Project(path)
    project.write_pipeline(pipeline)
    return project


@pytest.fixture
def project(tmp_path) -> Project:
    return make_project(tmp_path / "proj")

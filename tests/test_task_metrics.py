"""Task metrics on labelled data: a real classifier, trained here, whose int8 program loses accuracy.

The classifier reads four informative features beside four large nuisance features (an input with
outliers, a known int8 failure): static int8's one input scale, stretched over the nuisance range,
rounds the informative features coarsely, so the int8 program misclassifies samples eager fp32 gets
right. ``max_accuracy_drop: 0.01`` fails that cell; the same program under a lax bound passes. A user
metric (the project's own function) is a check with its own bound: one passes, one fails.
"""

from __future__ import annotations

import hashlib
import json
import re

import numpy as np
import pytest
from conftest import check, make_project, state

MODEL = """\
import torch
from torch import nn


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 8))

    def forward(self, x):
        return self.body(x)


def build():
    return Classifier().eval()
"""

METRIC = """\
import numpy as np


def accuracy(outputs, labels):
    return float((outputs.reshape(len(labels), -1).argmax(axis=1) == labels).mean())


def not_a_float(outputs, labels):
    return "high"
"""

MODEL_ENTRY = """\
    python: models.labelled:build
    weights: {{path: data/classifier.pt, sha256: {sha}}}
    task: classification
    inputs: [{{name: x, shape: [1, 8]}}]
    calibration: {{npz: data/calib.npz}}
"""

PIPELINE = """\
name: t
version: 0.0.1
models:
  strict:
{entry}    validation:
      npz: data/val.npz
      labels: labels
      samples: 400
      metrics: {{accuracy: {{function: models.metric:accuracy, min: 0.5}}}}
    thresholds:
      int8: {{sqnr_db: -100, max_accuracy_drop: 0.01}}
  lax:
{entry}    validation:
      npz: data/val.npz
      labels: labels
      samples: 400
      metrics: {{accuracy: {{function: models.metric:accuracy, min: 0.5}}}}
    thresholds:
      int8: {{sqnr_db: -100, max_accuracy_drop: 0.5}}
  picky:
{entry}    validation:
      npz: data/val.npz
      labels: labels
      samples: 400
      metrics: {{accuracy: {{function: models.metric:accuracy, min: 0.999}}}}
backends:
  xnnpack: {{}}
quantization: [fp32, int8]
matrix:
  exclude: [{{model: picky, quantization: int8}}, {{model: lax, quantization: fp32}}]
targets: false
"""
CLASSES = 8


def dataset(rng, count: int):
    """Eight classes, centred on corners of a cube in the first three features (plus a fourth, noise),
    beside four nuisance features of scale 100 that carry nothing."""
    labels = rng.integers(0, CLASSES, count)
    corners = np.array([[(c >> b) & 1 for b in range(3)] for c in range(CLASSES)], dtype=np.float32) * 2 - 1
    x = np.zeros((count, 8), dtype=np.float32)
    x[:, :3] = corners[labels] + rng.normal(0, 0.45, (count, 3))
    x[:, 3] = rng.normal(0, 0.45, count)
    x[:, 4:] = rng.uniform(-100, 100, (count, 4))
    return x, labels


def train(project_models):
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("labelled", project_models / "labelled.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    model = module.build().train()
    x, y = dataset(np.random.default_rng(0), 4000)
    xs, ys = torch.from_numpy(x), torch.from_numpy(y)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    for _ in range(300):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(xs), ys).backward()
        optimizer.step()
    with torch.no_grad():
        model.body[0].weight[:, 4:] = 0  # exactly: eager fp32 is blind to them, as the labels are
    return model.eval().state_dict()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    import torch

    project = make_project(tmp_path_factory.mktemp("task") / "proj", "")
    models, data = project.root / "models", project.root / "data"
    (models / "labelled.py").write_text(MODEL)
    (models / "metric.py").write_text(METRIC)
    data.mkdir()
    torch.save(train(models), data / "classifier.pt")
    sha = hashlib.sha256((data / "classifier.pt").read_bytes()).hexdigest()
    rng = np.random.default_rng(1)
    calib, _ = dataset(rng, 64)
    np.savez(data / "calib.npz", x=calib)
    x, labels = dataset(rng, 400)
    np.savez(data / "val.npz", x=x, labels=labels)
    project.write_pipeline(PIPELINE.format(entry=MODEL_ENTRY.format(sha=sha)))
    run = project.doit("validate", "report")  # no benchmark: timing is not what this judges
    assert run.returncode != 0, run.stdout  # two cells fail on purpose
    project.run = run
    return project


def verdict(project, cell: str) -> dict:
    return state(project, f"validate:{cell}")


def test_int8_accuracy_drop_fails_a_strict_bound_and_passes_a_lax_one(built):
    strict = verdict(built, "strict/xnnpack/int8")
    lax = verdict(built, "lax/xnnpack/int8")
    fp32 = verdict(built, "strict/xnnpack/fp32")
    accuracy = check(strict.get("info"), "accuracy")
    assert accuracy["eager_top1"] > 0.8, accuracy  # a real classifier: eager fp32 gets most samples right
    assert accuracy["drop"] > 0.05, accuracy  # int8 loses measurably
    assert accuracy["passed"] is False
    assert "max_accuracy_drop" in strict["reason"] and "below eager fp32" in strict["reason"]
    lax_accuracy = check(lax.get("info"), "accuracy")
    assert lax_accuracy["passed"] is True and lax_accuracy["drop"] == accuracy["drop"]
    assert check(fp32.get("info"), "accuracy")["drop"] == 0.0


def test_a_user_metric_is_a_check_with_its_own_bound(built):
    passing = check(verdict(built, "strict/xnnpack/fp32").get("info"), "metric")
    assert passing["passed"] is True and passing["name"] == "accuracy"
    assert passing["value"] == passing["eager_value"] > 0.8  # fp32 gets the samples eager gets
    picky = verdict(built, "picky/xnnpack/fp32")
    failing = check(picky.get("info"), "metric")
    assert failing["passed"] is False and failing["min"] == 0.999
    assert f"metric accuracy {failing['value']:.4g} < min 0.999" in picky["reason"]
    # the int8 cell's own accuracy metric is lower than fp32's: it judged the program's outputs
    assert check(verdict(built, "strict/xnnpack/int8").get("info"), "metric")["value"] < passing["value"]


def test_the_cells_state_and_numerics_json_say_it(built):
    table = dict(re.findall(r"^(\w+/xnnpack/\w+)\s+(\w+)\s", built.run.stdout, flags=re.M))
    assert table == {
        "strict/xnnpack/fp32": "ok",
        "strict/xnnpack/int8": "failed",
        "lax/xnnpack/int8": "ok",
        "picky/xnnpack/fp32": "failed",
    }
    record = verdict(built, "strict/xnnpack/int8")
    numerics = json.loads(open(record["outputs"]["numerics.json"]["path"]).read())
    kinds = [c["check"] for c in numerics["task_metrics"]]
    assert kinds == ["accuracy", "metric"], kinds

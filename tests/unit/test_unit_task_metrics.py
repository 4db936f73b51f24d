"""Labels and user metrics under a model's validation: one-line errors at planning, keys, the checks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from etforge.builders.numerics.task_metrics import accuracy_check, load_labels, user_metric
from etforge.checks.table import CHECKS
from etforge.checks.task_metrics import Accuracy, UserMetric
from etforge.core.errors import BadValue, PipelineError
from tests.unit.support import PIPELINE, changed_keys, make_unit_project, task_keys

VALIDATION = "    inputs: [{name: x, shape: [1, 4]}]\n"
METRIC = "def score(outputs, labels):\n    return float((outputs.argmax(axis=1) == labels).mean())\n"


def project_with(tmp_path, validation: str, labels=(0, 1, 2, 3)):
    text = PIPELINE.replace(VALIDATION, VALIDATION + validation, 1)
    project = make_unit_project(tmp_path, text, models=("a", "b"))
    (project.root / "data").mkdir()
    np.savez(project.root / "data" / "val.npz", x=np.zeros((4, 4), np.float32), labels=np.array(labels))
    project.write("models/metric.py", METRIC)
    return project


def error(project) -> str:
    with pytest.raises(PipelineError) as err:
        project.plan()
    return str(err.value)


def test_labels_of_the_wrong_length_name_the_file_line_and_key(tmp_path):
    project = project_with(tmp_path, "    validation: {npz: data/val.npz, labels: labels}\n", labels=(0, 1, 2))
    message = error(project)
    assert "\n" not in message
    assert message.endswith(
        "pipeline.yaml:7: models.a.validation.labels: data/val.npz labels array 'labels' has 3 labels, "
        "the inputs have 4 samples"
    )
    project.edit_pipeline("labels: labels}", "labels: classes}")
    assert error(project).endswith("has no labels array 'classes' (has: x, labels)")


def test_a_metric_that_is_not_module_function_is_one_line(tmp_path):
    project = project_with(
        tmp_path, "    validation: {npz: data/val.npz, metrics: {f1: {function: models.metric.score, min: 0.8}}}\n"
    )
    assert error(project).endswith(
        "pipeline.yaml:7: models.a.validation.metrics.f1.function: "
        "expected module:function (e.g. models.mymetric:score), got 'models.metric.score'"
    )
    project.edit_pipeline("models.metric.score", "models.nowhere:score")
    assert "module 'models.nowhere' not found in the project" in error(project)


def test_labels_belong_under_validation_only(tmp_path):
    project = project_with(tmp_path, "    calibration: {npz: data/val.npz, labels: labels}\n")
    assert error(project).endswith(
        "models.a.calibration.labels: 'labels' belongs under the model's validation, not calibration"
    )


def test_a_labels_file_for_images_names_its_bad_line(tmp_path):
    project = project_with(tmp_path, "    validation: {images: data/img, labels: data/labels.csv}\n")
    for name in ("cat.png", "dog.png"):
        project.write(f"data/img/{name}", "not read at planning")
    project.write("data/labels.csv", "# image,class\ncat.png,3\ndog.png;4\n")
    assert error(project).endswith(
        "models.a.validation.labels: labels.csv line 3: expected '<image file>,<class index>', got 'dog.png;4'"
    )
    project.write("data/labels.csv", "cat.png,3\n")
    assert error(project).endswith("labels.csv has 1 labels for 2 images: no label for dog.png")
    project.write("data/labels.csv", "cat.png,3\ndog.png,4\n")
    found, source = load_labels(project.plan().models["a"].validation, project.root, 2)
    assert found.tolist() == [3, 4] and source == "labels file data/labels.csv"


def test_labels_by_folder_follow_image_folder(tmp_path):
    project = project_with(tmp_path, "    validation: {images: data/img, labels: folders}\n")
    for name in ("zebra/1.png", "ant/2.png", "ant/1.png"):
        project.write(f"data/img/{name}", "x")
    found, _ = load_labels({"images": "data/img", "labels": "folders"}, project.root, 3)
    assert found.tolist() == [0, 0, 1]  # ant/1, ant/2, zebra/1: classes sorted by folder name
    project.write("data/img/loose.png", "x")
    assert error(project).endswith("labels: folders needs every image in a class subfolder; loose.png is not")


def test_the_labels_file_and_the_metric_source_join_the_validate_key(tmp_path):
    project = project_with(
        tmp_path,
        "    validation: {images: data/img, labels: data/labels.csv,"
        " metrics: {acc: {function: models.metric:score, min: 0.5}}}\n",
    )
    project.write("data/img/cat.png", "x")
    project.write("data/labels.csv", "cat.png,3\n")
    before = task_keys(project.plan())
    project.write("data/labels.csv", "cat.png,4\n")
    after_labels = task_keys(project.plan())
    assert "validate:a/xnnpack/fp32" in changed_keys(before, after_labels)
    assert not any(name.startswith(("validate:b", "export:b")) for name in changed_keys(before, after_labels))
    project.write("models/metric.py", METRIC.replace("mean()", "mean() * 1.0"))
    assert "validate:a/xnnpack/fp32" in changed_keys(after_labels, task_keys(project.plan()))


def logits(rows: list) -> np.ndarray:
    return np.array(rows, dtype=np.float32)


def test_accuracy_drop_gates_and_a_nan_fails_whatever_the_bound():
    labels = np.array([0, 1, 1, 0])
    eager = logits([[2, 0], [0, 2], [0, 2], [2, 0]])
    program = logits([[2, 0], [2, 0], [0, 2], [2, 0]])  # one sample flipped: 100% -> 75%
    failed = accuracy_check(eager, program, labels, "npz v.npz array labels", 0.01)
    assert (failed.top1, failed.eager_top1, failed.drop, failed.passed) == (0.75, 1.0, 0.25, False)
    assert failed.reason() == (
        "top-1 accuracy 75.0% is 25.0% below eager fp32's 100.0% (max_accuracy_drop 1.0%; 4 labelled samples)"
    )
    assert accuracy_check(eager, program, labels, "x", 0.3).passed is True
    program[1, 0] = np.nan
    nan = accuracy_check(eager, program, labels, "x", None)  # no bound: a NaN still fails
    assert nan.failed and math.isnan(nan.top1)
    back = CHECKS.parse(nan.to_json())
    assert isinstance(back, Accuracy) and back.failed and back.top1 is None
    with pytest.raises(BadValue, match="class index 7 outside the output's 2 classes"):
        accuracy_check(eager, program, np.array([0, 1, 7, 0]), "x", None)


def test_a_user_metric_passes_fails_and_a_non_float_is_one_line(tmp_path):
    root = tmp_path / "proj"
    (root / "metrics").mkdir(parents=True)
    (root / "metrics" / "__init__.py").write_text("")
    (root / "metrics" / "m.py").write_text(
        METRIC + "\ndef words(outputs, labels):\n    return 'high'\n\ndef broken(outputs, labels):\n    return 1 / 0\n"
    )
    labels = np.array([0, 1])
    eager, program = [logits([[2, 0], [0, 2]])], [logits([[2, 0], [2, 0]])]
    spec = {"function": "metrics.m:score", "min": 0.4}
    passing = user_metric("acc", spec, root, eager, program, labels)
    assert (passing.value, passing.eager_value, passing.passed, passing.key) == (0.5, 1.0, True, "metric:acc")
    failing = user_metric("acc", {**spec, "min": 0.9}, root, eager, program, labels)
    assert failing.failed and failing.reason() == "metric acc 0.5 < min 0.9 (eager fp32: 1)"
    assert isinstance(CHECKS.parse(failing.to_json()), UserMetric)
    with pytest.raises(BadValue) as err:
        user_metric("w", {"function": "metrics.m:words"}, root, eager, program, labels)
    assert str(err.value) == "metric w (metrics.m:words) returned str, expected a float"
    with pytest.raises(BadValue) as err:
        user_metric("b", {"function": "metrics.m:broken"}, root, eager, program, labels)
    assert str(err.value) == "metric b (metrics.m:broken) raised ZeroDivisionError: division by zero"

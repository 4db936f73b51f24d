"""Task metrics of a cell on labelled validation data: the Accuracy and UserMetric checks
(etforge.checks.task_metrics), from the program's outputs and eager fp32's (the capture's reference).

The labels are read again here from the files planning checked (etforge.config.task_data), for the
samples the reference holds: the first ``ref.count`` of the npz's arrays, or of the sorted images.
Accuracy reads the model's first output as class scores, one row per sample.
"""

from __future__ import annotations

import math
from pathlib import Path

from etforge.checks.task_metrics import Accuracy, UserMetric
from etforge.core.errors import BadValue

MAX_DROP = "max_accuracy_drop"


def has_task_data(cell) -> bool:
    validation = cell.model.validation or {}
    return bool(validation.get("labels") or validation.get("metrics"))


def task_checks(cell, root: Path, count: int, eager: list, program: list) -> list:
    """The cell's task checks; ``eager``/``program``: per output, ``[N, ...]`` arrays of ``count`` samples."""
    validation = cell.model.validation or {}
    labels, source = load_labels(validation, root, count) if validation.get("labels") else (None, "")
    checks: list = []
    if labels is not None:
        checks.append(accuracy_check(eager[0], program[0], labels, source, cell.thresholds.get(MAX_DROP)))
    for name, spec in (validation.get("metrics") or {}).items():
        checks.append(user_metric(name, spec, root, eager, program, labels))
    return checks


def load_labels(validation: dict, root: Path, count: int) -> tuple:
    """(int64 ``[count]`` array, where they came from) for the first ``count`` validation samples."""
    import numpy as np

    from etforge.builders.capture.samples import image_files
    from etforge.config.task_data import FOLDERS, folder_labels, image_labels

    name = validation["labels"]
    if "npz" in validation:
        with np.load(root / validation["npz"]) as data:
            if name not in data.files:
                raise BadValue(f"{validation['npz']} has no labels array {name!r}")
            array = data[name]
        if array.dtype.kind not in "iu":
            raise BadValue(f"{validation['npz']} labels array {name!r} holds {array.dtype}, expected integers")
        source = f"npz {validation['npz']} array {name}"
    else:
        folder = root / validation["images"]
        images = image_files(folder)
        if name == FOLDERS:
            array, source = np.array(folder_labels(folder, images)), f"images {validation['images']} by folder"
        else:
            array, source = np.array(image_labels(root / name, folder, images)), f"labels file {name}"
    if len(array) < count:
        raise BadValue(f"{source}: {len(array)} labels for {count} samples")
    return array[:count].astype(np.int64), source


def scores(output, count: int):
    """The output as ``[count, classes]`` class scores (a sample's batch axis of 1 dropped)."""
    import numpy as np

    array = np.asarray(output, dtype=np.float64)
    if array.ndim < 2 or array.size != count * array.shape[-1]:
        raise BadValue(
            f"accuracy needs one row of class scores per sample; output 0 has shape {list(array.shape[1:])} per sample"
        )
    return array.reshape(count, -1)


def topk_accuracy(logits, labels, k: int) -> float:
    """The share of rows whose label is among their ``k`` highest scores; NaN when any score is not finite."""
    import numpy as np

    from etforge.builders.numerics.compare import in_top_k

    if not np.isfinite(logits).all():
        return math.nan
    return float(in_top_k(logits, labels, k).mean())


def accuracy_check(eager, program, labels, source: str, max_drop: float | None) -> Accuracy:
    count = len(labels)
    expected, actual = scores(eager, count), scores(program, count)
    classes = actual.shape[1]
    if labels.min() < 0 or labels.max() >= classes:
        raise BadValue(f"{source}: class index {int(labels.max())} outside the output's {classes} classes")
    top1, eager_top1 = topk_accuracy(actual, labels, 1), topk_accuracy(expected, labels, 1)
    five = classes > 5  # with five classes or fewer, top-5 says nothing
    drop = eager_top1 - top1
    misses = []
    if not math.isfinite(drop):  # a NaN fails the gate whatever the bound
        misses.append("top-1 accuracy is not a number (non-finite outputs)")
    elif max_drop is not None and not drop <= max_drop:
        misses.append(
            f"top-1 accuracy {top1:.1%} is {drop:.1%} below eager fp32's {eager_top1:.1%} "
            f"(max_accuracy_drop {max_drop:.1%}; {count} labelled samples)"
        )
    return Accuracy.of(
        {
            "labels": source,
            "samples": count,
            "top1": top1,
            "top5": topk_accuracy(actual, labels, 5) if five else None,
            "eager_top1": eager_top1,
            "eager_top5": topk_accuracy(expected, labels, 5) if five else None,
            "drop": drop,
            "max_drop": max_drop,
            "misses": misses,
            "passed": not misses,
        }
    )


def user_metric(name: str, spec: dict, root: Path, eager: list, program: list, labels) -> UserMetric:
    """The user's ``function(outputs, labels)`` on the program's outputs and eager fp32's: outputs is the
    one output's ``[N, ...]`` array, or a tuple of them for a model with several."""
    from etforge.builders.loading.model_loading import _import_from_project

    module_name, function_name = spec["function"].split(":")
    function = getattr(_import_from_project(module_name, root), function_name, None)
    if not callable(function):
        raise BadValue(f"metric {name}: {module_name} has no function {function_name!r}")
    value, eager_value = (
        _call(name, spec["function"], function, outs[0] if len(outs) == 1 else tuple(outs), labels)
        for outs in (program, eager)
    )
    bounds = {k: spec[k] for k in ("min", "max") if k in spec}
    misses = []
    if not math.isfinite(value):
        misses.append(f"metric {name} is {value} (not finite)")
    elif "min" in bounds and not value >= bounds["min"]:
        misses.append(f"metric {name} {value:.4g} < min {bounds['min']} (eager fp32: {eager_value:.4g})")
    elif "max" in bounds and not value <= bounds["max"]:
        misses.append(f"metric {name} {value:.4g} > max {bounds['max']} (eager fp32: {eager_value:.4g})")
    return UserMetric.of(
        {
            "name": name,
            "function": spec["function"],
            "value": value,
            "eager_value": eager_value,
            **bounds,
            "misses": misses,
            "passed": not misses,
        }
    )


def _call(name: str, ref: str, function, outputs, labels) -> float:
    import numpy as np

    from etforge.core.text import first_line

    try:
        value = function(outputs, labels)
    except Exception as exc:  # the user's code: one line naming it, not a traceback into etforge
        raise BadValue(f"metric {name} ({ref}) raised {first_line(exc)}") from exc
    if isinstance(value, np.ndarray) and value.shape == ():
        value = value[()]
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | float | np.integer | np.floating):
        raise BadValue(f"metric {name} ({ref}) returned {type(value).__name__}, expected a float")
    return float(value)

"""``torchvision:`` names resolve through torchvision's model registry (get_model / list_models),
not only the builders at the top of ``torchvision.models``.

- A segmentation model (LR-ASPP MobileNetV3, 3 classes, 64x64 input) is captured by name: its
  ``OrderedDict`` output is the leaf ``['out']``.
- A detection model (SSDlite320 MobileNetV3, 3 classes) is built by name and runs eagerly (its
  ``list[dict]`` output is flattened and named like any pytree), and its capture fails with
  torch.export's first reason and where it came from (NMS guarding on a data-dependent count).
- A name the registry lacks is one plan-time line with the closest names (no torch imported).
- A project factory that imports torchvision at its top works in a fresh task process.
Captures run in-process on the resolved plan (no lowering): a few seconds each.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import make_project

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from etforge.config.resolve import resolve  # noqa: E402
from etforge.core.errors import PipelineError  # noqa: E402

PIPELINE = """\
name: t
version: 0.0.1
models:
  seg:
    torchvision: lraspp_mobilenet_v3_large
    kwargs: {num_classes: 3}
    inputs: [{name: image, shape: [1, 3, 64, 64]}]
  det:
    torchvision: ssdlite320_mobilenet_v3_large
    kwargs: {num_classes: 3}
    inputs: [{name: image, shape: [1, 3, 64, 64]}]
backends:
  xnnpack: {}
quantization: [fp32]
targets: false  # aarch64 verdicts: tests/test_aarch64_targets.py
"""


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("tv") / "proj", PIPELINE)
    return resolve(project.pipeline)


def test_segmentation_model_is_captured_by_registry_name(plan, tmp_path):
    from etforge.builders.capture.capture import build_capture
    from etforge.pipeline.results import TaskStatus

    built = build_capture(plan.models["seg"], plan.root, plan.seed, tmp_path)
    assert built.status == TaskStatus.OK, built.reason
    assert [o["path"] for o in built.result.outputs] == ["['out']"]
    assert built.result.outputs[0]["shape"] == [1, 3, 64, 64]


def test_detection_outputs_are_named_and_its_capture_says_why_it_fails(plan, tmp_path):
    import torch

    from etforge.builders.capture.capture import build_capture, output_names
    from etforge.builders.loading.model_loading import build_model
    from etforge.pipeline.results import TaskStatus

    model = build_model(plan.models["det"], plan.root)  # BN recalibration must not need targets
    with torch.no_grad():
        out = model(torch.randn(1, 3, 64, 64))
    assert isinstance(out, list) and isinstance(out[0], dict)
    assert output_names(out) == ["[0]['boxes']", "[0]['scores']", "[0]['labels']"]
    built = build_capture(plan.models["det"], plan.root, plan.seed, tmp_path)
    assert built.status == TaskStatus.FAILED
    assert built.reason.startswith("model 'det': torch.export cannot capture its graph: GuardOnDataDependentSymNode")
    assert "torchvision/ops/boxes.py" in built.reason  # where: batched_nms on a data-dependent box count


def test_unknown_registry_name_is_one_plan_time_line(tmp_path):
    project = make_project(tmp_path / "proj", PIPELINE.replace("lraspp_mobilenet_v3_large", "lraspp_mobilenet_v3"))
    with pytest.raises(PipelineError) as info:
        resolve(project.pipeline)
    line = str(info.value)
    assert "\n" not in line.strip() and line.endswith("did you mean 'lraspp_mobilenet_v3_large'?")
    assert ":5: models.seg.torchvision: torchvision's model registry has no model 'lraspp_mobilenet_v3'" in line


def test_every_registry_name_is_known_at_plan_time():
    """The plan-time reading of torchvision's source agrees with its registry."""
    from etforge.builders.loading.torchvision_compat import import_torchvision
    from etforge.config.torchvision_names import registered_models

    assert registered_models() == frozenset(import_torchvision().models.list_models())


FACTORY = """\
import torch
import torchvision  # at the top, before etforge's code ran in this process


def build():
    return torch.nn.Sequential(torchvision.ops.Conv2dNormActivation(3, 4, 3), torch.nn.Flatten())
"""


def test_factory_importing_torchvision_itself_captures(tmp_path):
    project = make_project(
        tmp_path / "proj",
        "name: t\nmodels:\n  tvf:\n    python: models.tvf:build\n"
        "    inputs: [{name: image, shape: [1, 3, 8, 8]}]\nbackends:\n  xnnpack: {}\nquantization: [fp32]\n",
    )
    (project.root / "models" / "tvf.py").write_text(FACTORY)
    run = project.doit("capture")
    assert run.returncode == 0, run.stdout + run.stderr

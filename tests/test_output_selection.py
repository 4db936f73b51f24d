"""``outputs:`` on a model: the program returns, and is judged on, only what the app reads.

A YOLO-like detector returns its predictions, two feature maps and an auxiliary head whose eager
values overflow (inf). Without a selection the capture fails on that auxiliary output; with
``outputs: ["[0]", 1.feats.1]`` the program returns only the two selected outputs, the auxiliary head
(a large dead branch) is not in it, only those are validated, and the manifests list only those.
One real XNNPACK fp32 build of a tiny model.
"""

from __future__ import annotations

import json

import pytest
from conftest import make_project, state

DETECTOR = """\
import torch
from torch import nn


class Detector(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.p3, self.p4 = nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.pred = nn.Conv2d(8, 6, 1)
        self.aux = nn.Linear(8 * 16 * 16, 512)  # 4 MB of weights that only the auxiliary output needs

    def forward(self, x):
        x = torch.relu(self.stem(x))
        p3 = torch.relu(self.p3(x))
        p4 = torch.relu(self.p4(p3))
        aux = torch.exp(self.aux(x.flatten(1)) * 1e4)  # overflows: no program could match it
        return self.pred(p4).flatten(2), {"feats": [p3, p4], "aux": aux}


def build():
    torch.manual_seed(0)
    return Detector()
"""
PIPELINE = """\
name: t
models:
  everything:
    python: models.detector:build
    inputs: [{name: image, shape: [1, 3, 16, 16]}]
  detector:
    python: models.detector:build
    inputs: [{name: image, shape: [1, 3, 16, 16]}]
    outputs: ["[0]", 1.feats.1]
backends:
  xnnpack: {}
quantization: [fp32]
targets: false  # aarch64 verdicts: tests/test_aarch64_targets.py
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("outputs") / "proj", PIPELINE)
    (project.root / "models" / "detector.py").write_text(DETECTOR)
    return project, project.doit()


def test_without_a_selection_every_output_is_judged(built):
    project, run = built
    assert run.returncode == 1  # the auxiliary output's eager values are not finite
    capture = state(project, "capture:everything")
    assert capture["status"] == "failed" and "output 3 (output_1_aux)" in capture["reason"], capture


def test_a_selection_drops_the_auxiliary_output_from_the_program_and_the_verdict(built):
    project, _ = built
    capture = state(project, "capture:detector")
    assert capture["status"] == "ok", capture
    assert [o["path"] for o in capture["info"]["outputs"]] == ["[0]", "[1]['feats'][1]"]
    assert [o["shape"] for o in capture["info"]["outputs"]] == [[1, 6, 16], [1, 8, 4, 4]]
    # the program returns only those: the runtime gives two outputs, and the dead head is gone
    from executorch.runtime import Runtime

    pte = project.out / "detector" / "detector_xnnpack_fp32.pte"
    assert pte.stat().st_size < 100_000  # the auxiliary head alone holds 4 MB of weights
    program = Runtime.get().load_program(pte.read_bytes())
    assert program.metadata("forward").num_outputs() == 2
    # only those are validated
    validate = state(project, "validate:detector/xnnpack/fp32")
    assert validate["status"] == "ok", validate
    numerics = json.loads((project.out / "detector" / "detector_xnnpack_fp32.numerics.json").read_text())
    assert [o["path"] for o in numerics["outputs"]] == ["[0]", "[1]['feats'][1]"], numerics
    # and the manifests list only those
    index = json.loads((project.out / "manifests" / "index.json").read_text())
    entry = next(e for e in index["models"] if e["modelName"] == "detector")
    assert [o["path"] for o in entry["outputs"]] == ["[0]", "[1]['feats'][1]"], entry["outputs"]


def test_a_selection_that_names_no_output_fails_the_capture_naming_them():
    torch = pytest.importorskip("torch")
    from etforge.builders.capture.output_select import select_outputs

    namespace: dict = {}
    exec(DETECTOR, namespace)
    model = select_outputs(namespace["build"](), ["logits"])
    with pytest.raises(ValueError, match=r"no output 'logits'; the model's outputs are \[0\], \[1\]\['feats'\]\[0\]"):
        model(torch.zeros(1, 3, 16, 16))
    assert select_outputs(namespace["build"](), [3])(torch.zeros(1, 3, 16, 16))[0].shape == (1, 512)

"""Integer and bounded inputs sampled by one generator (etforge.builders.capture.samples).

The built project: a model with an nn.Embedding on int64 ids plus an image, lowered to XNNPACK in
fp32 and in PT2E static int8. Static int8 calibration used to draw normal samples cast to int64
(negative ids: `IndexError: index out of range in self`).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import make_project

PIPELINE = """\
name: t
version: 0.0.1
models:
  tokens:
    python: models.token_image:build
    inputs:
      - {name: ids, shape: [1, 12], dtype: int64, range: [0, 100]}
      - {name: image, shape: [1, 3, 8, 8], range: [0, 1]}
  unranged:
    python: models.token_image:build
    inputs:
      - {name: ids, shape: [1, 12], dtype: int64}
      - {name: image, shape: [1, 3, 8, 8]}
backends:
  xnnpack: {}
quantization: [fp32, int8]
targets: false  # aarch64 verdicts: tests/test_aarch64_targets.py
matrix:
  exclude: [{model: unranged, quantization: int8}]
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("io_inputs") / "proj", PIPELINE)
    run = project.doit()
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    return project


def rows(project) -> dict:
    return {r["cell"]: r for r in json.loads((project.out / "summary.json").read_text())}


def test_static_int8_calibrates_an_embedding_on_int64_ids(built):
    from etforge.builders.capture.reference import load_reference_samples

    table = rows(built)
    for cell in ("tokens/xnnpack/int8", "unranged/xnnpack/fp32", "tokens/xnnpack/fp32"):
        assert table[cell]["status"] in ("ok", "provisional"), table[cell]
    captures = list(built.root.rglob("reference.npz"))
    assert len(captures) == 2
    for path in captures:
        ref = load_reference_samples(path)
        ids, image = ref.inputs
        assert ids.dtype == np.int64 and ids.min() >= 0
    numerics = [json.loads(p.read_text()) for p in built.root.rglob("numerics.json")]
    int8 = [n for n in numerics if n["cell"]["quantization"] == "int8"]
    assert len(int8) == 1 and all(n["passed"] for n in int8)


def test_summary_says_when_integer_inputs_took_the_default_range(built):
    table = rows(built)
    note = "sampled in the default range [0, 2)"
    assert note in table["unranged/xnnpack/fp32"]["note"], table["unranged/xnnpack/fp32"]
    assert "ids (int64)" in table["unranged/xnnpack/fp32"]["note"]
    assert note not in table["tokens/xnnpack/fp32"]["note"]


def test_one_generator_honours_dtype_range_and_seed():
    from etforge.builders.capture.samples import load_samples, random_inputs
    from etforge.config.model import InputSpec, ModelSpec

    inputs = (
        InputSpec("ids", (4, 500), "int64", (0, 32000)),
        InputSpec("mask", (4, 500), "bool"),
        InputSpec("small", (4, 500), "int32"),
        InputSpec("x", (4, 500), "float32", (-2.0, 3.0)),
        InputSpec("n", (4, 500), "float16"),
        InputSpec("u", (4, 500), "uint8", (250, 256)),
    )
    ((ids, mask, small, x, n, u),) = random_inputs(inputs, seed=3)
    assert str(ids.dtype) == "torch.int64" and 0 <= int(ids.min()) and int(ids.max()) < 32000
    assert int(ids.max()) > 30000  # the whole range is used, not a corner of it
    assert str(mask.dtype) == "torch.bool" and 0 < int(mask.sum()) < mask.numel()
    assert str(small.dtype) == "torch.int32" and set(small.unique().tolist()) == {0, 1}  # default [0, 2)
    assert -2.0 <= float(x.min()) and float(x.max()) < 3.0 and float(x.max()) > 2.5
    assert str(n.dtype) == "torch.float16" and float(n.min()) < -1  # standard normal
    assert set(u.unique().tolist()) == set(range(250, 256))
    (again,) = random_inputs(inputs, seed=3)
    assert all(bool((a == b).all()) for a, b in zip(again, (ids, mask, small, x, n, u)))
    (other,) = random_inputs(inputs, seed=4)
    assert not bool((other[0] == ids).all())
    # calibration and validation without data draw from the same generator
    spec = ModelSpec(
        name="m", source={}, kwargs={}, weights=None, inputs=inputs, calibration=None, validation=None, task="other"
    )
    batches, source = load_samples(spec, None, None, seed=3, samples=2)
    assert source == "random (seeded)" and len(batches) == 2
    np.testing.assert_array_equal(batches[0][0], ids.numpy())


RANGE_CASES = [
    ("{name: m, shape: [1, 2], dtype: bool, range: [0, 2]}", "a bool input takes no range"),
    ("{name: m, shape: [1, 2], dtype: int64, range: [0, 2.5]}", "an int64 input needs integer bounds"),
    ("{name: m, shape: [1, 2], dtype: int8, range: [0, 300]}", "[0, 300) does not fit int8 ([-128, 128))"),
    ("{name: m, shape: [1, 2], dtype: int32, range: [5, 5]}", "expected lo < hi (integers: hi is exclusive)"),
    ("{name: m, shape: [1, 2], range: [1.0, -1.0]}", "expected lo < hi"),
    ("{name: m, shape: [1, 2], range: [1]}", "expected at least 2 items, got [1]"),
    ("{name: m, shape: [1, 2], range: [a, 1]}", 'range[0]: expected a number, got "a"'),
]


@pytest.mark.parametrize("item,message", RANGE_CASES)
def test_a_bad_range_is_one_line_with_file_line_key(item, message, tmp_path, monkeypatch):
    from etforge.config.resolve import resolve
    from etforge.core.errors import PipelineError

    text = (
        "name: t\nmodels:\n  m:\n    python: models.linreg:build\n    inputs:\n"
        f"      - {item}\nbackends:\n  xnnpack: {{}}\nquantization: [fp32]\n"
    )
    project = make_project(tmp_path / "proj", text)
    monkeypatch.chdir(project.root)
    with pytest.raises(PipelineError) as info:
        resolve(project.pipeline)
    text = str(info.value)
    assert text.startswith("pipeline.yaml:6: models.m.inputs[0].range"), text
    assert message in text and "\n" not in text


# ---------------------------------------------------------------- any output structure

PATHS = ["['logits']", "['features'][0]", "['features'][1]"]
NAMES = ["logits", "features_0", "features_1"]


def test_structured_outputs_are_validated_per_named_output(built):
    numerics = [json.loads(p.read_text()) for p in built.root.rglob("numerics.json")]
    assert len(numerics) == 3
    for report in numerics:
        assert [o["path"] for o in report["outputs"]] == PATHS
        assert [o["name"] for o in report["outputs"]] == NAMES
        assert [o["shape"] for o in report["outputs"]] == [[1, 5], [1, 16], [1, 16]]


def test_manifests_and_header_name_outputs_by_their_path(built):
    run = built.doit("manifest")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    index = json.loads((built.out / "manifests" / "index.json").read_text())
    entries = {(e["modelName"], e["backend"], e["quantization"]): e for e in index["models"]}
    tokens = entries[("tokens", "xnnpack", "int8")]
    assert [(o["name"], o["path"]) for o in tokens["outputs"]] == list(zip(NAMES, PATHS))
    assert tokens["inputs"] == [
        {"name": "ids", "shape": [1, 12], "dtype": "int64", "range": [0, 100]},
        {"name": "image", "shape": [1, 3, 8, 8], "dtype": "float32", "range": [0, 1]},
    ]
    header = (built.out / "manifests" / "etforge_models.h").read_text()
    assert '{"features_0", ' in header and '{"logits", ' in header
    dart = next((built.out / "manifests").glob("*.dart")).read_text()
    assert "TensorSpec(name: 'features_1'" in dart


def test_output_identifiers_follow_pytree_paths():
    from etforge.config.io_spec import output_identifiers, output_labels

    paths = ["", "[0]", "[1][2]", "['boxes']", "['extra'][1][0]", "['a b']"]
    assert output_identifiers(paths) == ["output_0", "output_0_1", "output_1_2", "boxes", "extra_1_0", "a_b"]
    assert output_labels(["['logits']", "[1]"]) == ["logits", "output_1"]
    assert output_labels(["logits"]) == ["logits"]  # a name from an older reference.npz
    assert output_labels([""]) == [""]


def test_a_non_tensor_output_fails_the_capture_with_the_reason(tmp_path):
    project = make_project(
        tmp_path / "proj",
        """\
name: t
version: 0.0.1
models:
  counts:
    python: models.counts:build
    inputs: [{name: x, shape: [1, 4]}]
backends:
  portable: {}
quantization: [fp32]
targets: false  # aarch64 verdicts: tests/test_aarch64_targets.py
""",
    )
    (project.root / "models" / "counts.py").write_text(
        "import torch\n\nclass M(torch.nn.Module):\n"
        "    def forward(self, x):\n        return {'y': x * 2, 'n': 3}\n\ndef build():\n    return M()\n"
    )
    run = project.doit("capture")
    assert run.returncode != 0
    assert "['n'] is int" in run.stdout + run.stderr, run.stdout[-2000:]

"""Trustworthy numerics: representative inputs, top-k agreement, BundledProgram, first divergent node.

Real torch.export, XNNPACK lowering and the ExecuTorch runtime on a small CNN
fed scikit-image's sample photos; EfficientNet-Lite0 with its real ImageNet
weights for the preprocessing check. Builders are called directly on a
resolved plan (no doit subprocess), so one process imports torch once.
"""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
from conftest import check, make_project

from etforge.config.resolve import resolve

PIPELINE = """\
name: t
models:
  cnn:
    python: models.small_cnn:build
    kwargs: {num_classes: 10, width: 8}
    inputs: [{name: image, shape: [1, 3, 32, 32]}]
    task: classification
    validation: {images: data/images, samples: 4}
  reg:
    python: models.linreg:build
    inputs: [{name: features, shape: [1, 4]}]
backends:
  xnnpack: {}
quantization: [fp32]
targets: false  # aarch64 verdicts: tests/test_aarch64_targets.py
thresholds:
  fp32: {sqnr_db: 60, cosine: 0.9999, top1_agreement: 1.0, top5_agreement: 1.0}
"""
IMAGES = 4
BROKEN_LAYER = "features.1.0"  # the second convolution of models/small_cnn.py


# ----------------------------------------------------------------------------- metrics


def test_topk_agreement_counts_matching_argmax_and_eager_top1_in_program_top5():
    from etforge.builders.numerics.compare import compare_samples

    eager = np.array(
        [
            [[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]],  # top-1: class 6
            [[9.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]],  # top-1: class 0
            [[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]],  # top-1: class 6
            [[5.0, 4.0, 3.0, 2.0, 1.0, 0.0, -1.0]],
        ]
    )  # top-1: class 0
    program = eager.copy()
    program[1, 0, 0] = 5.5  # argmax moves to class 6; class 0 is still in the top 5
    program[3, 0, :] = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]  # class 0 drops out of the top 5
    m = compare_samples(eager, program, classification=True)
    assert m["predictions"] == 4
    assert m["top1_agreement"] == 0.5
    assert m["top5_agreement"] == 0.75
    assert m["shape"] == [1, 7]
    assert m["worst_sample"] == 3
    assert "top1_agreement" not in compare_samples(eager, program, classification=False)


def test_pooled_sqnr_and_worst_sample():
    from etforge.builders.numerics.compare import compare_samples

    eager = np.ones((3, 1, 100))
    program = eager.copy()
    program[2] += 0.01  # only sample 2 has noise: 40 dB on its own, 44.8 dB pooled
    m = compare_samples(eager, program)
    assert m["worst_sample"] == 2
    assert m["worst_sample_sqnr_db"] == pytest.approx(40.0, abs=1e-6)
    assert m["sqnr_db"] == pytest.approx(40.0 + 10 * np.log10(3), abs=0.005)  # stored to 0.01 dB
    assert m["max_abs_error"] == pytest.approx(0.01)
    assert compare_samples(eager, eager.copy())["sqnr_db"] is None


def test_verdict_fails_on_any_missed_threshold():
    from etforge.builders.numerics.compare import verdict

    metrics = [
        {"sqnr_db": 70.0, "cosine": 0.99999, "max_abs_error": 1e-4, "top1_agreement": 0.75, "top5_agreement": 1.0}
    ]
    assert verdict(metrics, {"sqnr_db": 60, "top5_agreement": 1.0}) == []
    misses = verdict(metrics, {"sqnr_db": 80, "max_abs_error": 1e-5, "top1_agreement": 0.9})
    assert misses == [
        "output 0: SQNR 70.0 dB < 80 dB",
        "output 0: max abs error 0.0001 > 1e-05",
        "output 0: top-1 agreement 0.750 < 0.9",
    ]
    # A regression output has no top-k: a top-k threshold cannot fail it.
    assert verdict([{"sqnr_db": 70.0, "cosine": 1.0, "max_abs_error": 0.0}], {"top1_agreement": 1.0}) == []


def test_nonfinite_program_values_fail_whatever_the_thresholds():
    from etforge.builders.numerics.compare import compare_samples, verdict

    eager = np.ones((2, 1, 20))
    program = eager.copy()
    program[1, 0, :3] = np.nan
    program[1, 0, 7] = -np.inf
    m = compare_samples(eager, program)
    assert m["nonfinite"] == {"values": 40, "nan": 3, "inf": 1}
    assert m["worst_sample"] == 1  # the sample with the non-finite values, not the exact one
    message = "4 of 40 values are non-finite (3 NaN, 1 inf)"
    assert verdict([m], {}) == [f"output 0: {message}"]  # no threshold needed to fail
    assert verdict([m], {"sqnr_db": 10, "cosine": 0.5}, names=["logits"]) == [f"output 0 (logits): {message}"]
    assert compare_samples(eager, eager.copy())["nonfinite"] == {"values": 40, "nan": 0, "inf": 0}


def test_every_threshold_comparison_fails_a_nan_metric():
    from etforge.builders.numerics.compare import verdict

    nan = float("nan")
    metrics = [{"sqnr_db": nan, "cosine": nan, "max_abs_error": nan, "top1_agreement": nan, "top5_agreement": nan}]
    thresholds = {"sqnr_db": 60, "cosine": 0.99, "max_abs_error": 1e-3, "top1_agreement": 0.9, "top5_agreement": 0.9}
    misses = verdict(metrics, thresholds)
    assert len(misses) == 5, misses
    assert misses[0] == "output 0: SQNR nan dB < 60 dB"


def test_topk_agreement_counts_a_nonfinite_prediction_as_a_miss():
    from etforge.builders.numerics.compare import topk_agreement

    eager = np.array([[[0.0, 1.0, 2.0]], [[3.0, 0.0, 0.0]]])  # top-1: class 2, class 0
    program = np.array([[[0.0, 1.0, np.nan]], [[3.0, 0.0, 0.0]]])  # argmax of row 0 is the NaN's index, 2
    m = topk_agreement(eager, program)
    assert m["top1_agreement"] == 0.5 and m["top5_agreement"] == 0.5


def test_bundled_tolerances_come_from_finite_values_only():
    from etforge.builders.numerics.bundle import tolerances

    expected = [np.array([[1.0, np.nan, -2.0, np.inf]])]
    assert tolerances({"sqnr_db": 40}, expected)["atol"] == pytest.approx(2.0 * 0.01)
    assert tolerances({}, expected)["atol"] == pytest.approx(2e-5)
    assert tolerances({"sqnr_db": 40}, [np.full((1, 3), np.nan)])["atol"] == 1e-8


# ----------------------------------------------------------------------------- inputs


def test_image_samples_are_resized_normalized_and_counted(tmp_path):
    from etforge.builders.capture.samples import load_samples
    from etforge.config.model import InputSpec, ModelSpec
    from models.sample_images import copy_sample_images

    folder = tmp_path / "imgs"
    copy_sample_images(folder, count=3)
    (folder / "notes.txt").write_text("not an image")
    spec = ModelSpec(
        name="m",
        source={},
        kwargs={},
        weights=None,
        inputs=(InputSpec("image", (1, 3, 20, 30), "float32"),),
        calibration=None,
        validation=None,
        task="classification",
    )
    data = {"images": "imgs", "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25], "samples": 2}
    batches, source = load_samples(spec, data, tmp_path, seed=0)
    assert source == "images imgs"
    assert len(batches) == 2  # samples caps the three images
    (x,) = batches[0]
    assert x.shape == (1, 3, 20, 30) and x.dtype == np.float32 and x.flags.c_contiguous
    assert -2.0 - 1e-6 <= x.min() and x.max() <= 2.0 + 1e-6  # ([0, 1] - 0.5) / 0.25
    batches, _ = load_samples(spec, {**data, "samples": 16}, tmp_path, seed=0)
    assert len(batches) == 3  # every image once
    same, _ = load_samples(spec, {**data, "resize": 20}, tmp_path, seed=0)  # 30 x 20 already: no crop
    cropped, _ = load_samples(spec, {**data, "resize": 60}, tmp_path, seed=0)
    np.testing.assert_array_equal(same[0][0], x)
    assert cropped[0][0].shape == x.shape and not np.array_equal(cropped[0][0], x)
    random, source = load_samples(spec, None, tmp_path, seed=5, samples=2)
    assert source == "random (seeded)" and len(random) == 2
    again, _ = load_samples(spec, None, tmp_path, seed=5, samples=2)
    np.testing.assert_array_equal(random[1][0], again[1][0])


def test_efficientnet_lite0_real_weights_see_the_cat():
    """chelsea.png through the pipeline's preprocessing: ImageNet 285 (Egyptian cat), p ~0.79."""
    import torch

    from etforge.builders.capture.samples import preprocess_image
    from models.efficientnet_lite0 import build
    from models.sample_images import skimage_data_dir

    model = build()
    x = preprocess_image(
        skimage_data_dir() / "chelsea.png",
        3,
        224,
        224,
        {"resize": 224, "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]},
    )
    with torch.no_grad():
        probs = model(torch.from_numpy(x[None])).softmax(-1)[0]
    assert int(probs.argmax()) == 285
    assert float(probs[285]) == pytest.approx(0.79, abs=0.02)


# ----------------------------------------------------------------------------- one built project


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A resolved plan, the cnn's capture on 4 photos and its XNNPACK fp32 .pte."""
    from etforge.builders.capture.capture import build_capture
    from etforge.builders.lowering.lower import build_export
    from models.sample_images import copy_sample_images

    project = make_project(tmp_path_factory.mktemp("numerics") / "proj", PIPELINE)
    copy_sample_images(project.root / "data" / "images", count=IMAGES)
    plan = resolve(project.pipeline)
    cell = next(c for c in plan.cells if c.name == "cnn/xnnpack/fp32")
    work = project.root / "work"
    capture_dir, export_dir = work / "capture", work / "export"
    capture_dir.mkdir(parents=True)
    export_dir.mkdir()
    capture = build_capture(cell.model, plan.root, plan.seed, capture_dir)
    export = build_export(cell, capture.files["model.pt2"], export_dir)
    assert export.status == "ok", export.reason
    return {"project": project, "plan": plan, "cell": cell, "capture": capture, "export": export, "work": work}


def _workdir(built, name: str):
    path = built["work"] / name
    if path.exists():
        shutil.rmtree(path)
    path.mkdir()
    return path


def test_capture_records_every_validation_sample_and_where_it_came_from(built):
    from etforge.builders.capture.reference import load_reference, load_reference_samples

    capture = built["capture"]
    assert capture.info["inputs"] == "images data/images"
    assert capture.info["samples"] == IMAGES
    ref = load_reference_samples(capture.files["reference.npz"])
    assert ref.count == IMAGES and ref.source == "images data/images"
    assert ref.inputs[0].shape == (IMAGES, 1, 3, 32, 32)
    assert ref.outputs[0].shape == (IMAGES, 1, 10)
    assert len({ref.inputs[0][n].tobytes() for n in range(IMAGES)}) == IMAGES  # four different photos
    # load_reference keeps its callers (quantize, benchmark) working: the first sample, model-shaped.
    inputs, outputs = load_reference(capture.files["reference.npz"])
    assert inputs[0].shape == (1, 3, 32, 32) and outputs[0].shape == (1, 10)


def test_format1_reference_still_loads(tmp_path):
    from etforge.builders.capture.reference import load_reference, load_reference_samples

    path = tmp_path / "reference.npz"
    np.savez(path, input_0=np.zeros((1, 4), np.float32), output_0=np.ones((1, 1), np.float32))
    ref = load_reference_samples(path)
    assert ref.count == 1 and ref.source == "random (seeded)" and ref.inputs[0].shape == (1, 1, 4)
    assert load_reference(path)[0][0].shape == (1, 4)


def test_random_fallback_is_one_seeded_sample_flagged_as_random(built):
    from etforge.builders.capture.capture import build_capture

    model = built["plan"].models["reg"]
    result = build_capture(model, built["plan"].root, built["plan"].seed, _workdir(built, "reg"))
    assert result.info["inputs"] == "random (seeded)" and result.info["samples"] == 1


def test_validate_runs_every_sample_and_reports_topk(built):
    from etforge.builders.numerics.validate import build_validate

    result = build_validate(
        built["cell"],
        built["export"].files["program.pte"],
        built["capture"].files["reference.npz"],
        [],
        _workdir(built, "validate"),
    )
    assert result.status == "ok", result.reason
    info = check(result.info, "numerics")
    assert info["passed"] is True
    assert info["inputs"] == "images data/images" and info["samples"] == IMAGES
    assert info["top1_agreement"] == 1.0 and info["top5_agreement"] == 1.0
    assert info["sqnr_db"] > 100  # fp32 XNNPACK vs eager
    report = json.loads(result.files["numerics.json"].read_text())
    (output,) = report["outputs"]
    assert output["predictions"] == IMAGES
    assert {"sqnr_db", "cosine", "max_abs_error", "mean_abs_error", "worst_sample_sqnr_db"} <= set(output)
    assert report["samples"] == IMAGES and report["task"] == "classification"


def test_bundled_program_verifies_on_the_runtime_and_rejects_wrong_outputs(built):
    from etforge.builders.numerics.bundle import build_bundled, verify_bundled

    pte = built["export"].files["program.pte"]
    reference = built["capture"].files["reference.npz"]
    result = build_bundled(built["cell"], pte, reference, [], _workdir(built, "bundled"))
    assert result.status == "not-runnable"
    bpte = result.files["program.bpte"].read_bytes()
    assert bpte[4:8] == b"BP08"  # the bundled-program flatbuffer identifier
    side = json.loads(result.files["bundled.json"].read_text())
    assert side["test_cases"] == IMAGES
    assert side["rtol"] == 0.0 and 0 < side["atol"] < 1e-2  # sqnr_db 60 -> peak * 1e-3
    assert sorted(side["not_checked_on_device"]) == ["cosine", "top1_agreement", "top5_agreement"]
    assert verify_bundled(bpte, side["rtol"], side["atol"], side["test_cases"]) == IMAGES

    from executorch.extension.pybindings import portable_lib

    module = portable_lib._load_bundled_program_from_buffer(bpte)
    module.verify_result_with_bundled_expected_output("forward", 0, side["rtol"], side["atol"])
    with pytest.raises(RuntimeError):  # exactly IMAGES test cases: one past the end does not exist
        module.verify_result_with_bundled_expected_output("forward", IMAGES, side["rtol"], side["atol"])

    # The same program with wrong expected outputs must fail the device-side check.
    with np.load(reference) as data:
        arrays = {k: data[k] for k in data.files}
    arrays["output_0"] = arrays["output_0"] + 0.5
    wrong = built["work"] / "wrong_reference.npz"
    np.savez(wrong, **arrays)
    bad = build_bundled(built["cell"], pte, wrong, [], _workdir(built, "bundled_wrong"))
    bad_bytes = bad.files["program.bpte"].read_bytes()
    with pytest.raises(RuntimeError, match="verification failed"):
        portable_lib._load_bundled_program_from_buffer(bad_bytes).verify_result_with_bundled_expected_output(
            "forward", 0, side["rtol"], side["atol"]
        )


def test_first_divergence_names_the_corrupted_layer_and_validate_reports_it(built, monkeypatch):
    import torch

    from etforge.builders.numerics import divergence as debug_numerics
    from etforge.builders.numerics.validate import build_validate

    cell = built["cell"]
    program = built["capture"].files["model.pt2"]
    # A .pte lowered with the broken lowering, checked against the true eager reference.
    broken_pte = built["work"] / "broken.pte"
    broken_lower = _make_broken(debug_numerics.lower_cell)
    broken_pte.write_bytes(broken_lower(torch.export.load(program), cell).to_executorch().buffer)
    monkeypatch.setattr(debug_numerics, "lower_cell", broken_lower)
    result = build_validate(
        cell,
        broken_pte,
        built["capture"].files["reference.npz"],
        [],
        _workdir(built, "validate_broken"),
        program=program,
    )
    assert result.status == "failed"
    report = json.loads(result.files["numerics.json"].read_text())
    found = report["first_divergence"]
    assert found["node"] == "conv2d_1", found
    assert found["module_path"] == BROKEN_LAYER
    assert found["op_target"] == "aten.conv2d.default"
    assert found["sqnr_db"] < 60
    # Every node before it matches eager closely (taps that are artifacts aside).
    before = found["nodes"][: found["index"]]
    assert before and all(n["sqnr_db"] is None or n["sqnr_db"] > 60 or n["node"] in found["artifacts"] for n in before)
    assert "first divergence at node conv2d_1 (aten.conv2d, features.1.0), SQNR" in result.reason
    assert check(result.info, "numerics")["first_divergence"].startswith("first divergence at node conv2d_1")


def _make_broken(original):
    """``original`` lowering, but corrupting one layer first: noise on the second convolution's weights."""

    def broken(exported_program, cell):
        import torch

        name = f"{BROKEN_LAYER}.weight"
        weight = exported_program.state_dict[name]
        noise = torch.randn(weight.shape, generator=torch.Generator().manual_seed(0)) * weight.abs().mean() * 0.3
        with torch.no_grad():
            exported_program.state_dict[name] = torch.nn.Parameter(weight + noise, requires_grad=False)
        return original(exported_program, cell)

    return broken


def test_first_divergence_of_a_correct_lowering_is_none(built):
    from etforge.builders.capture.reference import load_reference
    from etforge.builders.numerics.divergence import first_divergence, node_sqnrs

    inputs, _ = load_reference(built["capture"].files["reference.npz"])
    program = built["capture"].files["model.pt2"]
    assert first_divergence(program, built["cell"], inputs) is None
    nodes, threshold = node_sqnrs(program, built["cell"], inputs)
    assert threshold == 60 and len(nodes) >= 10
    assert nodes[-1]["op_target"] == "aten.linear.default" and not nodes[-1]["below"]


# ----------------------------------------------------------------------------- through doit

E2E_PIPELINE = """\
name: t
models:
  cnn:
    python: models.small_cnn:build
    kwargs: {num_classes: 10, width: 8}
    inputs: [{name: image, shape: [1, 3, 32, 32]}]
    task: classification
    validation: {images: data/images, samples: 3}
backends:
  xnnpack: {}
  vulkan: {}
quantization: [fp32]
targets: false  # aarch64 verdicts: tests/test_aarch64_targets.py
thresholds:
  fp32: {sqnr_db: 60, top1_agreement: 1.0}
"""


def test_doit_validates_on_photos_and_bundles_the_cell_this_host_cannot_run(tmp_path):
    from models.sample_images import copy_sample_images

    project = make_project(tmp_path / "proj", E2E_PIPELINE)
    copy_sample_images(project.root / "data" / "images", count=3)
    plan = resolve(project.pipeline)
    vulkan = next(c for c in plan.cells if c.backend.name == "vulkan")
    if vulkan.backend.missing:
        pytest.skip(f"vulkan cannot lower here: {vulkan.backend.missing}")
    run = project.doit("-n", "2", "-P", "process")
    assert run.returncode == 0, run.stdout + run.stderr
    states = project.out / ".state"
    ok = json.loads((states / "validate__cnn__xnnpack__fp32.json").read_text())
    assert ok["status"] == "ok"
    numerics = check(ok["info"], "numerics")
    assert numerics["inputs"] == "images data/images" and numerics["samples"] == 3
    assert numerics["top1_agreement"] == 1.0 and numerics["passed"] is True
    bundled = json.loads((states / "validate__cnn__vulkan__fp32.json").read_text())
    assert bundled["status"] == "not-runnable"
    assert "3 test case(s)" in bundled["reason"]
    assert (project.out / "cnn" / "cnn_vulkan_fp32.bpte").read_bytes()[4:8] == b"BP08"
    side = json.loads((project.out / "cnn" / "cnn_vulkan_fp32.bundled.json").read_text())
    assert side["test_cases"] == 3 and side["not_checked_on_device"] == ["top1_agreement"]


# ----------------------------------------------------------------------------- non-finite values through doit

AMPLIFY = '''\
"""Fine in fp32; beyond fp16's largest value (65504) after the second layer."""
import torch
from torch import nn


class Amplify(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(4, 16)
        self.down = nn.Linear(16, 4)
        with torch.no_grad():
            for layer in (self.up, self.down):
                layer.weight.fill_(100.0)
                layer.bias.zero_()

    def forward(self, x):
        # |x| + 1 >= 1: up gives >= 400, down >= 640000 (fp16 overflows to inf).
        return {"logits": self.down(self.up(x.abs() + 1.0))}


def build():
    return Amplify()
'''
DIVERGES = '''\
"""NaN for every input below 10, in eager PyTorch: the model is wrong, not a backend."""
import torch
from torch import nn


class Diverges(nn.Module):
    def forward(self, x):
        return {"scores": torch.log(x - 10.0)}


def build():
    return Diverges()
'''
NONFINITE_PIPELINE = """\
name: t
models:
  amplify:
    python: models.amplify:build
    inputs: [{name: x, shape: [1, 4]}]
  diverges:
    python: models.diverges:build
    inputs: [{name: x, shape: [1, 4]}]
backends:
  xnnpack: {}
quantization: [fp32, fp16]
targets: false  # aarch64 verdicts: tests/test_aarch64_targets.py
matrix:
  exclude: [{model: diverges, quantization: fp16}]
"""


@pytest.fixture(scope="module")
def nonfinite_run(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("nonfinite") / "proj", NONFINITE_PIPELINE)
    (project.root / "models" / "amplify.py").write_text(AMPLIFY)
    (project.root / "models" / "diverges.py").write_text(DIVERGES)
    return project, project.doit("validate", "sizegate")


def _state(project, task: str) -> dict:
    return json.loads((project.out / ".state" / (task.replace(":", "__").replace("/", "__") + ".json")).read_text())


def test_an_fp16_overflow_fails_its_cell_with_the_count_of_nonfinite_values(nonfinite_run):
    project, run = nonfinite_run
    assert run.returncode == 1, run.stdout + run.stderr
    fp16 = _state(project, "validate:amplify/xnnpack/fp16")
    assert fp16["status"] == "failed"
    # the miss, then where the fp16 graph leaves eager fp32: the layer that overflows
    assert re.fullmatch(
        r"output 0 \(logits\): 4 of 4 values are non-finite \(\d NaN, \d inf\); "
        r"first divergence at layer down \(aten\.linear\), SQNR -inf dB .*",
        fp16["reason"],
    ), fp16
    report = json.loads((project.out / "amplify" / "amplify_xnnpack_fp16.numerics.json").read_text())
    assert report["passed"] is False and report["misses"] == [fp16["reason"].split("; first divergence")[0]]
    assert report["outputs"][0]["nonfinite"]["values"] == 4
    assert report["outputs"][0]["sqnr_db"] == "nan"  # strict JSON: non-finite floats are spelled out
    # The same model in fp32 is fine: the overflow is the fp16 program's.
    fp32 = _state(project, "validate:amplify/xnnpack/fp32")
    assert fp32["status"] == "ok" and check(fp32["info"], "numerics")["nonfinite_values"] == 0
    assert "amplify/xnnpack/fp16" in run.stdout and "non-finite" in run.stdout


def test_a_model_that_is_nonfinite_in_eager_fails_its_capture_not_a_backend(nonfinite_run):
    project, _ = nonfinite_run
    capture = _state(project, "capture:diverges")
    assert capture["status"] == "failed"
    assert capture["reason"] == (
        "model 'diverges' itself is non-finite in eager PyTorch: output 0 (scores): 4 of 4 values are "
        "non-finite (4 NaN, 0 inf) on the validation inputs (random (seeded)); fix the model or its inputs, "
        "no backend can match it"
    )
    assert _state(project, "export:diverges/xnnpack/fp32")["status"] == "blocked"
    assert not (project.out / "diverges" / "diverges_xnnpack_fp32.pte").exists()

"""Write a cell's repro directory: repro.py, inputs.npz and what its flow starts from.

``model.pt2`` (the capture's program) for fp32 and PT2E schemes, which etforge lowers or quantizes
from that graph; the model's source package and its state_dict (``weights.pt``) for torchao and
dtype schemes, which etforge applies to the eager nn.Module. The options are etforge's own: the
quantizer factory's arguments, the layers etforge's layer filter chose, the partitioner options.
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
from pathlib import Path

from etforge.builders.repro.cover import refusal
from etforge.builders.repro.script import INPUTS, PROGRAM, SCRIPT, SOURCE_DIR, WEIGHTS, ReproScript, render
from etforge.config.io_spec import output_labels
from etforge.core.atomic import atomic_copy, atomic_write_bytes, atomic_write_text
from etforge.core.errors import Unsupported

JUDGED = ("sqnr_db", "cosine", "max_abs_error")  # the thresholds the script judges (top-k is not written out)


def write_repro(cell, root: Path, seed: int, program: Path, reference: Path, numerics: Path, out: Path) -> Path:
    """Write the repro of ``cell`` into ``out`` from its capture (``program``, ``reference``) and its
    verdict (``numerics``: numerics.json); returns the script's path."""
    why = refusal(cell)
    if why:
        raise Unsupported(why)
    report = json.loads(numerics.read_text())
    out.mkdir(parents=True, exist_ok=True)
    flow = "fp32" if cell.transform is None else cell.transform.method
    model_code, quantizer_code = "", ""
    layers: list = []
    if flow in ("fp32", "pt2e"):
        atomic_copy(program, out / PROGRAM)
    if flow == "pt2e":
        quantizer_code = _pt2e_quantizer(cell)
    if flow in ("torchao", "dtype"):
        model = _eager_model(cell, root, out)
        model_code = _model_code(cell, root, out)
        if flow == "torchao":
            quantizer_code, layers = _torchao_step(cell, model)
    _write_inputs(cell, root, seed, reference, out / INPUTS, calibrated=flow == "pt2e")
    names = [m.get("path", "") for m in report["outputs"]]
    labels = [f"output {i}" + (f" ({n})" if n else "") for i, n in enumerate(output_labels(names))]
    member = cell.backend.members[0]
    spec = ReproScript(
        cell=cell.name,
        flow=flow,
        model_code=model_code,
        quantizer_code=quantizer_code,
        quantized_layers=tuple(layers),
        dtype=cell.transform.ref if flow == "dtype" else "float32",
        partitioner=member.recipe if member.partitioner else "",
        partitioner_options={"per_op_mode": bool(member.options.get("per_op_mode", False))},
        built_with=_versions(flow),
        thresholds={k: v for k, v in cell.thresholds.items() if k in JUDGED},
        recorded=tuple((label, m.get("sqnr_db")) for label, m in zip(labels, report["outputs"])),
        runtime=report.get("runner") or "this host's ExecuTorch runtime",
    )
    atomic_write_text(out / SCRIPT, render(spec))
    return out / SCRIPT


def _versions(flow: str) -> dict:
    names = ["torch", "executorch", "numpy"] + (["torchao"] if flow in ("pt2e", "torchao") else [])
    return {name: importlib.metadata.version(name) for name in names}


def _pt2e_quantizer(cell) -> str:
    """The XNNPACKQuantizer etforge's factory makes (etforge.builders.quantization.quantizers), written out."""
    per_channel = bool(cell.transform.options.get("per_channel", True))
    dynamic = cell.transform.ref.endswith("dynamic")
    return (
        f"XNNPACKQuantizer().set_global(get_symmetric_quantization_config("
        f"is_per_channel={per_channel}, is_dynamic={dynamic}))"
    )


def _torchao_step(cell, model) -> tuple[str, list]:
    """(the config as an expression, the layers it takes): etforge's own choice of layers, and a
    config expression proven equal to the one etforge's factory makes."""
    import torch
    from torchao.quantization.granularity import PerAxis, PerGroup
    from torchao.quantization.quant_api import Int8DynamicActivationIntxWeightConfig

    from etforge.builders.quantization.quantize import torchao_steps

    steps, _ = torchao_steps(cell.quant.name, cell.transform, model)
    taken = [(config, choice) for config, choice in steps if not choice.empty]
    if len(taken) != 1:
        raise Unsupported(
            f"repro does not cover {cell.name}: its layers take {len(taken)} configs (one is written out)"
        )
    config, choice = taken[0]
    granularity = config.weight_granularity
    group = getattr(granularity, "group_size", None)
    weight = f"PerGroup({group})" if group else f"PerAxis({granularity.axis})"
    text = f"Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.{str(config.weight_dtype).removeprefix('torch.')}, weight_granularity={weight})"
    namespace = {"torch": torch, "PerAxis": PerAxis, "PerGroup": PerGroup}
    namespace["Int8DynamicActivationIntxWeightConfig"] = Int8DynamicActivationIntxWeightConfig
    if eval(text, namespace) != config:  # noqa: S307 (our own text): a field the text leaves out differs
        raise Unsupported(f"repro cannot write out {cell.name}'s torchao config yet: {config!r}")
    return text, list(choice.quantized)


def _eager_model(cell, root: Path, out: Path):
    """etforge's eager model (weights file, BatchNorm recalibration and all); its state_dict goes to weights.pt."""
    import io

    import torch

    from etforge.builders.loading.model_loading import build_model

    model = build_model(cell.model, root)
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    atomic_write_bytes(out / WEIGHTS, buffer.getvalue())
    return model


def _model_code(cell, root: Path, out: Path) -> str:
    """The lines of ``eager_model`` that make the architecture: the copied source, or torchvision's builder."""
    kwargs = dict(cell.model.kwargs)
    if "torchvision" in cell.model.source:
        name = cell.model.source["torchvision"]
        return (
            "    import torchvision  # a CUDA torchvision wheel beside a CPU torch may fail to import\n\n"
            f"    name, kwargs = {name!r}, {kwargs!r}\n"
            "    builder = torchvision.models.get_model_builder(name)\n"
            '    if "weights_backbone" in __import__("inspect").signature(builder).parameters:\n'
            '        kwargs = {"weights_backbone": None, **kwargs}\n'
            "    model = torchvision.models.get_model(name, weights=None, **kwargs)"
        )
    module_name, function = cell.model.source["python"].split(":")
    top = module_name.split(".")[0]
    package, single = root / top, root / f"{top}.py"
    target = out / SOURCE_DIR
    shutil.rmtree(target, ignore_errors=True)
    if package.is_dir():
        shutil.copytree(package, target / top, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    else:
        target.mkdir(parents=True)
        atomic_copy(single, target / single.name)
    return (
        f'    sys.path.insert(0, str(HERE / "{SOURCE_DIR}"))  # the model\'s source, copied from its project\n'
        f"    from {module_name} import {function}\n\n"
        f"    model = {function}(**{kwargs!r})"
    )


def _write_inputs(cell, root: Path, seed: int, reference: Path, target: Path, calibrated: bool) -> None:
    """inputs.npz: the reference's samples and eager outputs, and for PT2E etforge's calibration batches."""
    import io

    import numpy as np

    from etforge.builders.capture.reference import load_reference_samples
    from etforge.builders.capture.samples import calibration_batches

    ref = load_reference_samples(reference)
    arrays = {f"input_{i}": x for i, x in enumerate(ref.inputs)}
    arrays.update({f"output_{i}": y for i, y in enumerate(ref.outputs)})
    arrays["samples"] = np.array(ref.count, dtype=np.int64)
    if calibrated:
        batches, _ = calibration_batches(cell.model, root, seed)
        arrays.update({f"calib_{b}_{i}": np.asarray(x) for b, batch in enumerate(batches) for i, x in enumerate(batch)})
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    atomic_write_bytes(target, buffer.getvalue())

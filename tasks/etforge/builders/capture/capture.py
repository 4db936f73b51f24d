"""Capture a model once: torch.export program plus eager reference outputs.

Every backend cell of the model lowers from this one ``model.pt2``; the
validation of every cell compares against ``reference.npz``, which holds the
validation samples and the eager nn.Module's outputs on them.

The format of ``reference.npz`` is etforge.builders.capture.reference's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from etforge.builders.capture.reference import RANDOM_SOURCE, REFERENCE, write_reference
from etforge.core.errors import BadValue
from etforge.pipeline.results import BuildRequest, BuildResult, TaskStatus
from etforge.pipeline.stage_results import CaptureResult

PROGRAM = "model.pt2"


def flatten_outputs(outputs) -> list:
    """The tensor leaves of an output pytree, in leaf order (what the ExecuTorch runtime returns)."""
    import torch

    leaves, _ = torch.utils._pytree.tree_flatten(outputs)
    return [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]


def output_names(outputs) -> list:
    """Each tensor leaf's pytree key path (etforge.config.io_spec): '' for a bare tensor,
    '[0]', "['boxes']", "['extra'][1][0]"."""
    import torch

    pytree = torch.utils._pytree
    leaves, _ = pytree.tree_flatten_with_path(outputs)
    return [pytree.keystr(path) for path, leaf in leaves if isinstance(leaf, torch.Tensor)]


def non_tensor_outputs(model_name: str, outputs) -> str | None:
    """Why the output pytree cannot be validated (a leaf that is not a tensor: None, an int), or None."""
    import torch

    pytree = torch.utils._pytree
    leaves, _ = pytree.tree_flatten_with_path(outputs)
    bad = [
        f"{pytree.keystr(path) or 'the output'} is {type(leaf).__name__}"
        for path, leaf in leaves
        if not isinstance(leaf, torch.Tensor)
    ]
    if not bad:
        return None
    return (
        f"model {model_name!r} returns non-tensor outputs ({', '.join(bad)}): etforge validates and "
        "ships tensor outputs only; return tensors (or drop the constants) from forward"
    )


@dataclass(frozen=True)
class Samples:
    """One method's validation samples: per sample a tuple of input tensors, where they came from and,
    for data per named shape, the shape each sample came from."""

    samples: list
    source: str
    shapes: tuple = ()


def validation_samples(model_spec, root: Path, seed: int, method: str = "forward", inputs=None) -> Samples:
    """The validation data of ``method`` (its ``inputs``: InputSpecs, default the model's first method's)
    as torch tensors, or seeded random samples: one, or one per measured size of dynamic dims."""
    import torch

    from etforge.builders.capture.samples import (
        dynamic_random_inputs,
        load_samples,
        load_shapes,
        method_data,
        random_inputs,
    )

    inputs = model_spec.inputs if inputs is None else inputs
    entry = method_data(model_spec, method)
    if entry is None:
        dynamic = any(i.dims for i in inputs)
        return Samples(dynamic_random_inputs(inputs, seed) if dynamic else random_inputs(inputs, seed), RANDOM_SOURCE)
    names: list = []
    if "shapes" in entry:
        batches, source, names = load_shapes(entry, root, inputs)
    else:
        batches, source = load_samples(model_spec, entry, root, seed, inputs=inputs)
    if model_spec.multi_method:  # the verdict joins every method's source: name each
        source = f"{method}: {source}"
    return Samples([tuple(torch.from_numpy(x) for x in batch) for batch in batches], source, tuple(names))


def reference_samples(model_spec, root: Path, seed: int, inputs=None, method: str = "forward") -> tuple[list, str]:
    """(list of input tuples as torch tensors, source) of :func:`validation_samples`."""
    found = validation_samples(model_spec, root, seed, method, inputs)
    return found.samples, found.source


def export_sample(samples: list, inputs) -> int:
    """The index of the sample torch.export traces: the middle one; with dynamic dims the nearest to it whose
    dynamic sizes are all above 1 (torch.export specializes a dim it sees at 0 or 1)."""
    middle = len(samples) // 2
    axes = [[axis for axis, *_ in item.dims] for item in inputs]
    if not any(axes):
        return middle

    def free(n: int) -> bool:
        return all(samples[n][i].shape[a] > 1 for i, each in enumerate(axes) for a in each)

    return min((n for n in range(len(samples)) if free(n)), key=lambda n: abs(n - middle), default=middle)


def capture_stage(request: BuildRequest) -> BuildResult:
    """The capture stage's builder (etforge.pipeline.stages)."""
    return build_capture(request.model, request.plan.root, request.plan.seed, request.workdir)


def method_module(model, name: str):
    """``model`` itself for forward, else a module whose forward calls ``model.<name>`` (one per method)."""
    import torch

    if name == "forward":
        return model

    class Method(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.core = model

        def forward(self, *args):
            return getattr(self.core, name)(*args)

    if not callable(getattr(model, name, None)):
        raise BadValue(f"the model has no method {name!r} (pipeline.yaml declares it under methods)")
    return Method()


def build_capture(model_spec, root: Path, seed: int, workdir: Path) -> BuildResult:
    import torch

    from etforge.builders.capture.output_select import select_outputs, selected_names
    from etforge.builders.loading.model_loading import build_model
    from etforge.builders.runtime.determinism import deterministic

    start = time.monotonic()
    model = build_model(model_spec, root)
    captured = {}  # method -> (program, samples, eager, names, source)
    for method, inputs in model_spec.methods or (("forward", model_spec.inputs),):
        module = select_outputs(method_module(model, method), model_spec.outputs)  # outputs: (forward only)
        data = validation_samples(model_spec, root, seed, method, inputs)
        samples, source = data.samples, data.source
        eager = []
        with torch.no_grad(), deterministic():  # the reference every verdict is measured against
            for sample in samples:
                result = module(*sample)
                eager.append(flatten_outputs(result))
        names = selected_names(module) or output_names(result)
        label = model_spec.name if method == "forward" else f"{model_spec.name}.{method}"
        failure = non_tensor_outputs(label, result) or nonfinite_eager(label, eager, names, source)
        if failure:  # the model itself, not a backend: nothing downstream can be judged against it
            return BuildResult(status=TaskStatus.FAILED, reason=failure)
        try:
            program = torch.export.export(
                module,
                samples[export_sample(samples, inputs)],
                strict=False,
                dynamic_shapes=export_dynamic_shapes(inputs),
            )
        except torch._dynamo.exc.UserError as exc:  # a dynamic dim the model cannot take as declared
            return BuildResult(status=TaskStatus.FAILED, reason=constraint_failure(label, exc))
        except Exception as exc:  # the graph itself: data-dependent control flow, an untraceable op
            return BuildResult(status=TaskStatus.FAILED, reason=export_failure(label, exc))
        captured[method] = (program, samples, eager, names, source, data.shapes)
    if not model_spec.multi_method:
        program, samples, eager, names, source, shapes = captured["forward"]
        torch.export.save(program, workdir / PROGRAM)
        write_reference(workdir / REFERENCE, samples, eager, names, source, shape_names=shapes)
    else:
        save_programs(workdir / PROGRAM, {m: c[0] for m, c in captured.items()})
        write_method_references(workdir / REFERENCE, {m: c[1:] for m, c in captured.items()})
    first = next(iter(captured.values()))
    outputs = {m: describe_outputs(c[3], c[2][0]) for m, c in captured.items()}
    result = CaptureResult(
        export_s=round(time.monotonic() - start, 3),
        inputs="; ".join(dict.fromkeys(c[4] for c in captured.values())),
        samples=sum(len(c[1]) for c in captured.values()),
        outputs=tuple(next(iter(outputs.values()))),
        weight_bytes=weight_bytes(first[0]),
        methods={m: {"outputs": o} for m, o in outputs.items()} if model_spec.multi_method else {},
    )
    return BuildResult(files={PROGRAM: workdir / PROGRAM, REFERENCE: workdir / REFERENCE}, result=result)


def describe_outputs(names: list, tensors: list) -> list:
    """``{"path", "shape", "dtype"}`` of each eager output: what a CaptureResult's ``outputs`` hold."""
    return [
        {"path": n, "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
        for n, t in zip(names, tensors)
    ]


METHODS_INDEX = "etforge_methods.json"


def save_programs(path: Path, programs: dict) -> None:
    """Several methods' ExportedPrograms in one model.pt2: a zip of ``<method>.pt2`` files plus
    ``etforge_methods.json`` (their order). :func:`load_programs` reads both forms."""
    import io
    import json
    import zipfile

    import torch

    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr(METHODS_INDEX, json.dumps(list(programs)))
        for name, program in programs.items():
            buffer = io.BytesIO()
            torch.export.save(program, buffer)
            archive.writestr(f"{name}.pt2", buffer.getvalue())


def load_programs(path: Path) -> dict:
    """method -> ExportedProgram of a model.pt2 (one ``forward``, or every method of a multi-method model)."""
    import io
    import json
    import zipfile

    import torch

    with zipfile.ZipFile(path) as archive:
        if METHODS_INDEX not in archive.namelist():
            return {"forward": torch.export.load(path)}
        names = json.loads(archive.read(METHODS_INDEX))
        return {n: torch.export.load(io.BytesIO(archive.read(f"{n}.pt2"))) for n in names}


def write_method_references(path: Path, methods: dict, extra: dict | None = None) -> None:
    """reference.npz of a multi-method model: ``methods`` (their names) and, per method, ``method_<name>``
    holding the bytes of that method's own reference.npz (etforge.builders.capture.reference); ``methods``:
    name -> (samples, eager, names, source[, per-sample shape names]); ``extra``: more named arrays a stage's
    own reader wants (a seq2seq model's step-by-step reference)."""
    import io

    import numpy as np

    arrays = {"methods": np.array(list(methods), dtype=str)}
    for name, (samples, eager, names, source, *shapes) in methods.items():
        buffer = io.BytesIO()
        write_reference(buffer, samples, eager, names, source, shape_names=shapes[0] if shapes else ())
        arrays[f"method_{name}"] = np.frombuffer(buffer.getvalue(), dtype=np.uint8)
    arrays.update(extra or {})
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def export_dynamic_shapes(inputs):
    """torch.export's ``dynamic_shapes`` for InputSpecs: one Dim per dim name, shared; None if static."""
    import torch

    if not any(i.dims for i in inputs):
        return None
    named: dict = {}
    for item in inputs:
        for _, lo, hi, name in item.dims:
            named.setdefault(name, torch.export.Dim(name, min=lo, max=hi))
    return tuple({axis: named[name] for axis, _, _, name in item.dims} or None for item in inputs)


def constraint_failure(model_name: str, exc) -> str:
    """One line from torch.export's constraint violation, with its suggested fix when it gives one."""
    text = str(exc)
    fixes = text.split("Suggested fixes:", 1)
    fix = " ".join(fixes[1].split()) if len(fixes) > 1 else ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = lines[0].split(" For more information")[0] if lines else type(exc).__name__
    why = next((line.removeprefix("- ") for line in lines if line.startswith("- ")), "")
    return (
        f"model {model_name!r}: torch.export rejects its dynamic dims: {first}"
        + (f" {why}" if why else "")
        + (f"; suggested fix: {fix}" if fix else "")
        + " (change min/max in pipeline.yaml)"
    )


def export_failure(model_name: str, exc: BaseException) -> str:
    """torch.export's first reason, and the deepest frame of the model's own code (outside torch and
    etforge) it came from: e.g. a detection model's NMS guarding on a data-dependent box count."""
    import traceback

    import torch

    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    first = lines[0] if lines else type(exc).__name__
    # torch's symbolic-shape errors name the user frame themselves: "Caused by: (file.py:103 in fn)"
    cause = next((line.removeprefix("Caused by: ") for line in lines if line.startswith("Caused by: (")), "")
    where = f" {cause}" if cause else ""
    here = Path(__file__).parent.parent
    skip = (str(Path(torch.__file__).parent), str(here), str(here.resolve()), "<")
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(skip)]
    if frames and not cause:
        frame = frames[-1]
        where = f" (at {frame.filename.split('site-packages/')[-1]}:{frame.lineno}, in {frame.name})"
    return f"model {model_name!r}: torch.export cannot capture its graph: {type(exc).__name__}: {first}{where}"


def nonfinite_eager(model_name: str, eager: list, names: list, source: str) -> str | None:
    """Why eager PyTorch's own outputs cannot serve as the reference (NaN or inf in any), or None."""
    import torch

    from etforge.config.io_spec import output_labels

    names = output_labels(names)
    for i in range(len(eager[0])):
        values = torch.cat([out[i].detach().reshape(-1) for out in eager])  # samples may differ in shape
        if not values.is_floating_point():
            continue
        nan, inf = int(torch.isnan(values).sum()), int(torch.isinf(values).sum())
        if nan or inf:
            label = f"output {i}" + (f" ({names[i]})" if i < len(names) and names[i] else "")
            return (
                f"model {model_name!r} itself is non-finite in eager PyTorch: {label}: {nan + inf} of "
                f"{values.numel()} values are non-finite ({nan} NaN, {inf} inf) on the validation "
                f"inputs ({source}); fix the model or its inputs, no backend can match it"
            )
    return None


# The weights a quantization scheme can store smaller, by the ATen op that uses them
# (what PT2E quantizers and torchao's filters look at), and "all" floating-point
# parameters, buffers and constants (what fp16 stores at half size).
WEIGHT_OPS = {
    "linear": ("aten.linear",),
    "conv": (
        "aten.conv1d",
        "aten.conv2d",
        "aten.conv3d",
        "aten.convolution",
        "aten.conv_transpose1d",
        "aten.conv_transpose2d",
        "aten.conv_transpose3d",
    ),
    "embedding": ("aten.embedding",),
}


def weight_bytes(program) -> dict:
    """Bytes of the captured fp32 program's floating-point weights: ``all``, and those used as
    the weight (second argument; the table for an embedding) of a linear, conv or embedding op.
    A tensor used by several ops (tied weights) is counted once."""
    sig = program.graph_signature
    named = {**sig.inputs_to_parameters, **sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}
    tensors = {**program.state_dict, **program.constants}

    def size(t) -> int:
        return t.numel() * t.element_size() if t.is_floating_point() else 0

    out = {"all": 0, **{kind: 0 for kind in WEIGHT_OPS}}
    seen: set = set()
    for t in tensors.values():
        if hasattr(t, "untyped_storage") and id(t) not in seen:
            seen.add(id(t))
            out["all"] += size(t)
    counted: set = set()
    for node in program.graph.nodes:
        if node.op != "call_function":
            continue
        op = str(getattr(node.target, "overloadpacket", ""))
        for kind, names in WEIGHT_OPS.items():
            if op in names:
                arg = node.args[0 if kind == "embedding" else 1] if len(node.args) > 1 else None
                fqn = named.get(getattr(arg, "name", None))
                tensor = tensors.get(fqn)
                if tensor is not None and id(tensor) not in counted:
                    counted.add(id(tensor))
                    out[kind] += size(tensor)
    return out

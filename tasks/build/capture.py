"""Capture a model once: torch.export program plus eager reference outputs.

Every backend cell of the model lowers from this one ``model.pt2``; the
validation of every cell compares against ``reference.npz``, which holds the
validation samples and the eager nn.Module's outputs on them.

``reference.npz`` (format 2):

- ``samples``: 0-d int64, N, the number of samples (its presence marks format 2)
- ``source``: 0-d unicode string, where the inputs came from: ``random (seeded)``,
  ``images data/images`` or ``npz data/val.npz``
- ``input_<i>``: ``[N, *shape of input i]`` (the declared shape, batch axis included)
- ``output_<i>``: ``[N, *shape of output i]``, eager outputs (pytree leaves in order)
- ``output_names``: 1-d unicode, the name of each output where the model's output pytree
  gives one (a dict key or attribute, e.g. ``logits``), else "" (optional)

Sample ``n`` of input ``i`` is ``input_<i>[n]``, exactly what the program takes.
Format 1 (no ``samples`` key: one sample, ``input_<i>`` without the N axis) still loads.
Without ``validation`` data in pipeline.yaml, N = 1 and the sample is seeded random.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from tasks.engine.cached_run import BuildResult

PROGRAM = "model.pt2"
REFERENCE = "reference.npz"
RANDOM_SOURCE = "random (seeded)"


@dataclass
class Reference:
    """The contents of a reference.npz: N samples of inputs and eager outputs."""

    inputs: list  # per input: [N, *shape]
    outputs: list  # per output: [N, *shape]
    source: str
    output_names: list = field(default_factory=list)  # per output: its pytree name, or ""

    @property
    def count(self) -> int:
        return int(self.inputs[0].shape[0]) if self.inputs else 0

    def sample_inputs(self, n: int) -> list:
        return [x[n] for x in self.inputs]

    def sample_outputs(self, n: int) -> list:
        return [y[n] for y in self.outputs]

    @property
    def is_random(self) -> bool:
        return self.source.startswith("random")


def flatten_outputs(outputs) -> list:
    import torch

    leaves, _ = torch.utils._pytree.tree_flatten(outputs)
    return [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]


def output_names(outputs) -> list:
    """Each tensor leaf's name in the output pytree: its dict keys and attributes ('logits',
    'hidden[1]'), or "" where there is none (a bare tensor, a plain tuple)."""
    import torch

    pytree = torch.utils._pytree
    leaves, _ = pytree.tree_flatten_with_path(outputs)
    names = []
    for path, leaf in leaves:
        if not isinstance(leaf, torch.Tensor):
            continue
        name = ""
        for key in path:
            if isinstance(key, pytree.SequenceKey):
                name += f"[{key.idx}]"
            else:
                label = str(key.key if isinstance(key, pytree.MappingKey) else getattr(key, "name", key))
                name += ("." if name else "") + label
        names.append(name if any(not isinstance(k, pytree.SequenceKey) for k in path) else "")
    return names


def reference_samples(model_spec, root: Path, seed: int) -> tuple[list, str]:
    """(list of input tuples as torch tensors, source): the model's validation data or one seeded input."""
    import torch

    from tasks.build.model_loading import example_inputs

    if model_spec.validation is None:
        return [example_inputs(model_spec, seed)], RANDOM_SOURCE
    from tasks.build.samples import load_samples

    batches, source = load_samples(model_spec, model_spec.validation, root, seed)
    return [tuple(torch.from_numpy(x) for x in batch) for batch in batches], source


def build_capture(model_spec, root: Path, seed: int, workdir: Path) -> BuildResult:
    import numpy as np
    import torch

    from tasks.build.model_loading import build_model

    start = time.monotonic()
    model = build_model(model_spec, root)
    samples, source = reference_samples(model_spec, root, seed)
    eager = []
    with torch.no_grad():
        for inputs in samples:
            result = model(*inputs)
            eager.append(flatten_outputs(result))
    names = output_names(result)
    failure = nonfinite_eager(model_spec.name, eager, names, source)
    if failure:  # the model itself, not a backend: nothing downstream can be judged against it
        return BuildResult(status="failed", reason=failure)
    program = torch.export.export(model, samples[0], strict=False)
    torch.export.save(program, workdir / PROGRAM)
    arrays = {f"input_{i}": np.stack([s[i].detach().numpy() for s in samples])
              for i in range(len(samples[0]))}
    arrays.update({f"output_{i}": np.stack([out[i].detach().numpy() for out in eager])
                   for i in range(len(eager[0]))})
    arrays["samples"] = np.array(len(samples), dtype=np.int64)
    arrays["output_names"] = np.array(names, dtype=str)
    arrays["source"] = np.array(source)
    with open(workdir / REFERENCE, "wb") as f:
        np.savez(f, **arrays)
    info = {"export_s": round(time.monotonic() - start, 3), "inputs": source, "samples": len(samples),
            "outputs": [{"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")} for t in eager[0]],
            "weight_bytes": weight_bytes(program)}
    return BuildResult(files={PROGRAM: workdir / PROGRAM, REFERENCE: workdir / REFERENCE}, info=info)


def nonfinite_eager(model_name: str, eager: list, names: list, source: str) -> str | None:
    """Why eager PyTorch's own outputs cannot serve as the reference (NaN or inf in any), or None."""
    import torch

    for i in range(len(eager[0])):
        values = torch.stack([out[i].detach() for out in eager])
        if not values.is_floating_point():
            continue
        nan, inf = int(torch.isnan(values).sum()), int(torch.isinf(values).sum())
        if nan or inf:
            label = f"output {i}" + (f" ({names[i]})" if i < len(names) and names[i] else "")
            return (f"model {model_name!r} itself is non-finite in eager PyTorch: {label}: {nan + inf} of "
                    f"{values.numel()} values are non-finite ({nan} NaN, {inf} inf) on the validation "
                    f"inputs ({source}); fix the model or its inputs, no backend can match it")
    return None


# The weights a quantization scheme can store smaller, by the ATen op that uses them
# (what PT2E quantizers and torchao's filters look at), and "all" floating-point
# parameters, buffers and constants (what fp16 stores at half size).
WEIGHT_OPS = {
    "linear": ("aten.linear",),
    "conv": ("aten.conv1d", "aten.conv2d", "aten.conv3d", "aten.convolution", "aten.conv_transpose1d",
             "aten.conv_transpose2d", "aten.conv_transpose3d"),
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


def load_reference_samples(path: Path) -> Reference:
    """Every sample of a reference.npz (format 1 files load as one sample)."""
    import numpy as np

    with np.load(path) as data:
        inputs = [data[k] for k in _numbered(data.files, "input_")]
        outputs = [data[k] for k in _numbered(data.files, "output_")]
        if "samples" not in data.files:
            return Reference([x[None] for x in inputs], [y[None] for y in outputs], RANDOM_SOURCE)
        source = str(data["source"]) if "source" in data.files else RANDOM_SOURCE
        names = [str(n) for n in data["output_names"]] if "output_names" in data.files else []
    return Reference(inputs, outputs, source, names)


def load_reference(path: Path) -> tuple[list, list]:
    """(inputs, outputs) of the first sample: example inputs shaped like the model's inputs."""
    reference = load_reference_samples(path)
    return reference.sample_inputs(0), reference.sample_outputs(0)


def _numbered(files: list, prefix: str) -> list:
    """``prefix<i>`` keys in index order (``output_names`` is not one)."""
    return sorted((k for k in files if k.startswith(prefix) and k[len(prefix):].isdigit()),
                  key=lambda k: int(k[len(prefix):]))

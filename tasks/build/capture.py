"""Capture a model once: torch.export program plus eager reference outputs.

Every backend cell of the model lowers from this one ``model.pt2``; the
validation of every cell compares against ``reference.npz``, which holds the
validation samples and the eager nn.Module's outputs on them.

The format of ``reference.npz`` is tasks/build/reference.py's.
"""

from __future__ import annotations

import time
from pathlib import Path

from tasks.build.reference import RANDOM_SOURCE, REFERENCE, write_reference
from tasks.store.results import BuildRequest, BuildResult

PROGRAM = "model.pt2"


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


def capture_stage(request: BuildRequest) -> BuildResult:
    """The capture stage's builder (tasks/store/stages.py)."""
    return build_capture(request.subject, request.plan.root, request.plan.seed, request.workdir)


def build_capture(model_spec, root: Path, seed: int, workdir: Path) -> BuildResult:
    import torch

    from tasks.build.model_loading import build_model
    from tasks.config.hf_source import is_llm

    start = time.monotonic()
    model = build_model(model_spec, root)
    llm, extra = None, {}
    if is_llm(model_spec):  # a prompt + eager greedy continuation; a static KV cache program
        from tasks.build import llm_export

        llm = llm_export
        samples, eager, names, source, extra = llm.eager_reference(model, model_spec, seed)
    else:
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
    program = llm.export_llm(model, model_spec.source["transformers"]["llm"]) if llm else torch.export.export(model, samples[0], strict=False)
    torch.export.save(program, workdir / PROGRAM)
    write_reference(workdir / REFERENCE, samples, eager, names, source, extra=extra)
    info = {"export_s": round(time.monotonic() - start, 3), "inputs": source, "samples": len(samples),
            "outputs": [{"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")} for t in eager[0]],
            "weight_bytes": weight_bytes(program)}
    if llm:
        info.update(llm.capture_notes(model_spec, extra))
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

"""A model's interface as data: input and output names, dtypes, shapes, ranges, per method.

Outputs of any structure (tuple, list, dict, nested) are flattened once, in
``torch.utils._pytree`` leaf order (what the ExecuTorch runtime returns, dicts in
insertion order), and named by their pytree key path (``keystr``): ``''`` for a
bare tensor, ``[0]`` for a tuple element, ``['boxes']`` for a dict entry,
``['extra'][1][0]`` nested. Those paths are what reference.npz and the capture's
record hold; :func:`output_identifiers` turns them into names every generated
language accepts (``output_0``, ``boxes``, ``extra_1_0``).

:func:`describe_io` is the one JSON-able description of a model's interface
(manifests, and the program's own metadata method). Imports nothing heavy.
"""

from __future__ import annotations

import re

METHOD = "forward"
_KEY = re.compile(r"\[('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^\]]*)\]|\.([A-Za-z_][A-Za-z0-9_]*)")


def output_identifier(path: str, index: int) -> str:
    """An identifier for the output at pytree key path ``path`` (``index``: its leaf position)."""
    parts = [(m.group(1) or m.group(2) or "").strip("'\"") for m in _KEY.finditer(path)]
    ident = re.sub(r"[^A-Za-z0-9]+", "_", "_".join(parts)).strip("_")
    if not ident:
        return f"output_{index}"
    return f"output_{ident}" if ident[0].isdigit() else ident


def output_identifiers(paths: list) -> list:
    """:func:`output_identifier` for each path, made distinct (a later clash gets ``_<index>``)."""
    out: list = []
    for i, path in enumerate(paths):
        name = output_identifier(path, i)
        out.append(name if name not in out else f"{name}_{i}")
    return out


def describe_outputs(outputs: list) -> list:
    """``[{"name", "path", "shape", "dtype"}]`` from the capture record's outputs
    (``{"path", "shape", "dtype"}`` each; a record without paths names them ``output_<i>``)."""
    paths = [str(o.get("path", "")) for o in outputs]
    return [
        {"name": name, "path": path, "shape": list(o.get("shape", [])), "dtype": str(o.get("dtype", ""))}
        for name, path, o in zip(output_identifiers(paths), paths, outputs)
    ]


def describe_inputs(inputs, dtypes: list | None = None) -> list:
    """``[{"name", "shape", "dtype"[, "range"][, "dynamic"]}]`` of InputSpecs; ``dtypes``: as the program
    takes them. A dynamic dim's entry in ``shape`` is its max; ``dynamic`` lists ``{axis, min, max, name}``."""
    dtypes = list(dtypes or [])
    if len(dtypes) != len(inputs):
        dtypes = [i.dtype for i in inputs]
    out = []
    for item, dtype in zip(inputs, dtypes):
        entry = {"name": item.name, "shape": list(item.shape), "dtype": str(dtype)}
        if item.range is not None:
            entry["range"] = list(item.range)
        if item.dims:
            entry["dynamic"] = [{"axis": a, "min": lo, "max": hi, "name": n} for a, lo, hi, n in item.dims]
        out.append(entry)
    return out


def describe_io(
    model_spec, outputs: list | None = None, input_dtypes: list | None = None, method_outputs: dict | None = None
) -> dict:
    """``{"methods": [{"name", "inputs": [...], "outputs": [...]}]}``, JSON-able, in declaration order
    (a list: JSON written with sorted keys keeps it).

    ``outputs``: the capture record's ``outputs`` (the first method's; None: not known yet, an empty
    list); ``method_outputs``: the capture record's ``methods`` outputs (method -> outputs) for a model
    with several; ``input_dtypes``: the first method's as the program takes them (an fp16 program
    takes float16), default the declared ones.
    """
    methods = model_spec.methods or ((METHOD, model_spec.inputs),)
    described = []
    for k, (name, inputs) in enumerate(methods):
        outs = (method_outputs or {}).get(name, outputs if k == 0 else None)
        described.append(
            {
                "name": name,
                "inputs": describe_inputs(inputs, input_dtypes if k == 0 else None),
                "outputs": describe_outputs(outs or []),
            }
        )
    return {"methods": described}


def output_labels(paths: list) -> list:
    """Per output, the name messages show ("" for a bare tensor): its identifier, e.g.
    ``logits`` for ``['logits']``; a name from an older reference.npz (no brackets) as it is."""
    idents = output_identifiers(paths)
    return ["" if not p else ident if p[0] in "[." else p for p, ident in zip(paths, idents)]

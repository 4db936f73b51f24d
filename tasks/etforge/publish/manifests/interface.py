"""A shipped cell's interface as every manifest shows it, computed in this one place.

index.json, models.g.dart, models.cmake and etforge_models.h all take a
variant's methods, inputs and outputs from :func:`cell_interface`, so they
cannot disagree: each method with its inputs (name, dtype, shape whose dynamic
dims hold their max, ``dynamic`` with each such dim's axis, min, max and name,
the declared value ``range``) and its outputs (named by pytree path), in the
model's declaration order (``forward`` alone unless it declares several). The
variant's own ``inputs`` and ``outputs`` are its first method's (the same lists).

This module must not import torch or executorch.
"""

from __future__ import annotations

from etforge.config.io_spec import describe_io


def cell_interface(cell, facts) -> dict:
    """``{"inputs", "outputs", "methods", "outputs_known"}`` of ``cell`` from its outcome's facts.

    Input dtypes are the program's (an fp16 program takes float16) when the export recorded one
    per input, else the declared ones; outputs are the capture's (``outputs_known`` False and empty
    lists when there is no current capture record)."""
    dtypes = list(facts.program.input_dtypes) if facts.program is not None else []
    if len(dtypes) != len(cell.model.inputs):
        dtypes = [i.dtype for i in cell.model.inputs]
    capture = facts.capture
    outputs = [o for o in capture.outputs if isinstance(o, dict)] if capture is not None else []
    method_outputs = (
        {m: list(v.get("outputs") or []) for m, v in capture.methods.items() if isinstance(v, dict)} if capture else {}
    )
    methods = describe_io(cell.model, outputs, dtypes, method_outputs)["methods"]
    return {
        "inputs": methods[0]["inputs"],
        "outputs": methods[0]["outputs"],
        "methods": methods,
        "outputs_known": bool(outputs),
    }

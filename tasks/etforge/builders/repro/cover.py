"""What ``etforge repro`` covers, decided from the plan alone (no torch): each refusal is one line."""

from __future__ import annotations

from etforge.config.model import Cell

QUANTIZERS = "etforge.builders.quantization.quantizers:"
PARTITIONERS = "etforge.builders.lowering.partitioners:"
# scheme -> the factory its recipe names on xnnpack and portable: the script writes each one out
SCHEMES = {
    "fp32": None,
    "fp16": "float16",
    "int8": QUANTIZERS + "xnnpack_int8_static",
    "int8_dynamic": QUANTIZERS + "xnnpack_int8_dynamic",
    "8da4w": QUANTIZERS + "torchao_8da4w",
}
BACKENDS = {"xnnpack": PARTITIONERS + "xnnpack", "portable": None}  # recipe -> its partitioner factory
SOURCES = ("python", "torchvision")
# options the script does not write out yet: a cell using one is refused rather than misreported
UNCOVERED_OPTIONS = ("keep_float", "embedding", "min_weight_elements")


def refusal(cell: Cell) -> str | None:
    """Why repro cannot write a script for ``cell`` (one line), or None when it can."""
    backend = cell.backend
    if not backend.host_runnable:
        where = ", ".join(m.recipe for m in backend.members)
        return f"repro needs a host-runnable cell; {cell.name} runs on {where}"
    if len(backend.members) != 1 or backend.members[0].recipe not in BACKENDS:
        return f"repro covers the backends {', '.join(BACKENDS)} only yet, not {backend.name}"
    member = backend.members[0]
    if member.partitioner != BACKENDS[member.recipe]:
        return f"repro does not cover {backend.name} with the partitioner {member.partitioner} yet"
    if member.options.get("external_weights"):
        return f"repro does not cover external_weights on {backend.name} yet"
    source = next((s for s in SOURCES if s in cell.model.source), None)
    if source is None or cell.model.multi_method or cell.model.outputs:
        what = "multi-method models" if cell.model.multi_method else "an outputs: selection"
        what = what if source else f"{', '.join(cell.model.source)} models"
        return f"repro covers single-method python and torchvision models only yet, not {what} ({cell.model.name})"
    if any(i.dims for i in cell.model.inputs):
        return f"repro does not cover models with dynamic dims yet ({cell.model.name})"
    scheme = cell.quant.name
    if scheme not in SCHEMES:
        return f"repro covers the schemes {', '.join(SCHEMES)} only yet, not {scheme}"
    transform = cell.transform
    ref = None if transform is None else transform.ref
    if ref != SCHEMES[scheme]:
        return f"repro does not cover {scheme} made by {ref} yet"
    options = {} if transform is None else transform.options
    used = [name for name in UNCOVERED_OPTIONS if options.get(name)]
    if used:  # (a fallback config is fine while one config takes every layer: the writer checks)
        return f"repro does not cover the {scheme} option {used[0]} yet"
    return None

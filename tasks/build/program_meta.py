"""The metadata constant methods every lowered program carries (format: tasks/store/program_meta.py).

:func:`io_description` is the one place that says what a method's interface is;
everything else here is the cell's identity and the .ptd it needs.
"""

from __future__ import annotations

from importlib import metadata

import tasks
from tasks.store.program_meta import (DATA_SHA256_PLACEHOLDER, META_METHOD, VERSION_METHOD, META_VERSION,
                                      ProgramMetaError, encode)


def io_description(cell, program) -> dict:
    """{method name: {"inputs": [{name, dtype, shape}], "outputs": [{name, shape}]}} of ``program``
    (a torch ExportedProgram), named from the model's InputSpecs; dtypes as the program takes them."""
    from torch.export.graph_signature import InputKind, OutputKind

    user_in = {s.arg.name for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT}
    dtypes = [str(n.meta["val"].dtype).removeprefix("torch.") for n in program.graph.nodes
              if n.op == "placeholder" and n.name in user_in and "val" in n.meta]
    user_out = [i for i, s in enumerate(program.graph_signature.output_specs) if s.kind == OutputKind.USER_OUTPUT]
    values = next(n for n in program.graph.nodes if n.op == "output").args[0]
    outputs = [{"name": f"output_{k}", "shape": list(getattr(values[i].meta.get("val"), "shape", ()))}
               for k, i in enumerate(user_out)]
    inputs = [{"name": spec.name, "dtype": dtype, "shape": list(spec.shape)}
              for spec, dtype in zip(cell.model.inputs, dtypes)]
    return {"forward": {"inputs": inputs, "outputs": outputs}}


def program_meta(cell, program, external_data: bool) -> dict:
    """The cell's identity and interface; with ``external_data``, a placeholder for the .ptd's
    sha256 that :func:`stamp_data_sha256` fills in once the data file exists."""
    return {"model": cell.model.name, "backend": cell.backend.name, "scheme": cell.quant.name,
            "etforge_version": tasks.__version__, "executorch_version": metadata.version("executorch"),
            "methods": io_description(cell, program),
            "data_file": {"sha256": DATA_SHA256_PLACEHOLDER} if external_data else None}


def constant_methods(meta: dict) -> dict:
    """``constant_methods=`` of to_edge_transform_and_lower (ExecuTorch silently drops one named
    like a real method, so the names carry the etforge_ prefix)."""
    return {META_METHOD: encode(meta), VERSION_METHOD: META_VERSION}


def stamp_data_sha256(pte: bytes, sha256: str) -> bytes:
    """The program with its metadata naming the .ptd it needs (same length: the flatbuffer stays valid)."""
    placeholder = f'"sha256": "{DATA_SHA256_PLACEHOLDER}"'.encode()
    if pte.count(placeholder) != 1:
        raise ProgramMetaError(f"cannot name the .ptd in the program: its metadata placeholder occurs "
                               f"{pte.count(placeholder)} times")
    return pte.replace(placeholder, f'"sha256": "{sha256}"'.encode())

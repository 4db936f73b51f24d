"""The operators a .pte runs outside its delegates, read with ExecuTorch's own selective-build tools.

ExecuTorch's ``executorch.codegen.tools.gen_oplist`` (shipped in the wheel) parses the program
with its C++ reader (``selective_build``, no torch needed) and lists every operator the
execution plans call through a kernel, i.e. outside every delegate, with the kernel keys
(``v1/<dtype>;<dim order>|...`` per tensor argument) the calls need. :func:`program_operators`
returns that, and :func:`write_selected_operators` writes it as the program's
``selected_operators.yaml`` with the same tool's writer: the upstream selective-build format that
``executorch.codegen.gen --op-selection-yaml-path`` and ``gen_all_oplist`` read.

The prim operators (``executorch_prim::*``, ``aten::sym_size.int``, ...) are listed too, as
upstream does; etforge.program.kernels says which library provides each operator.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path


def program_operators(pte: Path) -> dict:
    """Operator (``namespace::name.overload``) -> its sorted kernel keys, for every operator the program
    calls outside its delegates (an empty dict for a fully delegated program)."""
    from executorch.codegen.tools import gen_oplist

    with contextlib.redirect_stdout(io.StringIO()):  # the tool prints every operator it reads
        names = gen_oplist._get_operators(str(pte))
        keys = gen_oplist._get_kernel_metadata_for_model(str(pte))
    return {op: sorted(set(keys.get(op, ()))) for op in sorted(names)}


def write_selected_operators(operators: dict, path: Path, source: str) -> Path:
    """``operators`` (:func:`program_operators`) as upstream's selected_operators.yaml; ``source`` is
    what its ``debug_info`` names (the cell, not a machine's path: the file is reproducible)."""
    from executorch.codegen.tools import gen_oplist

    gen_oplist._dump_yaml(sorted(operators), Path(path), source, {op: list(k) for op, k in operators.items()})
    return Path(path)

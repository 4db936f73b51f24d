"""Which kernel libraries a set of programs needs, and their operators in ExecuTorch's selective-build format.

A program's operators outside its delegates (etforge.builders.lowering.oplist, recorded in its
export.json as ``operators``: op -> kernel keys) decide which of the pip wheel's libraries an
app must link (``executorch::<component>`` targets, ``lib/libexecutorch_<component>.so`` files):

    runtime            libexecutorch.so: the runtime and the prim operators (executorch_prim::*,
                       aten::sym_size.int, aten::sym_numel, aten::_local_scalar_dense), always
    kernels_optimized  every aten:: (and dim_order_ops::, et_copy::) out-variant kernel
    kernels_quantized  quantized_decomposed::* (quantize/dequantize outside a delegate)
    backend_<name>     each delegate's library (its recipe's ``cmake_targets.wheel``)

Measured on executorch 1.5.1: the wheel's kernels_optimized registers the 200 ops of
kernels/portable/functions.yaml plus dim_order_ops:: and et_copy::; libexecutorch.so the 28
prim ops; kernels_quantized the ops of kernels/quantized/quantized.yaml. An operator of any other
namespace (an LLM's llama::, a custom op) is in no wheel library: it is listed as unresolved,
and the app must link the library that registers it.

:func:`union_selection` merges per-program selections as upstream's ``gen_all_oplist`` does
(torchgen's combine_selective_builders), with sorted debug_info so the file is reproducible.

This module must not import torch or executorch.
"""

from __future__ import annotations

RUNTIME = "runtime"
OPTIMIZED = "kernels_optimized"
QUANTIZED = "kernels_quantized"
# Registered by libexecutorch.so itself (runtime/kernel/prim_ops/register_prim_ops.cpp).
PRIM_NAMESPACES = ("executorch_prim",)
PRIM_OPS = frozenset({"aten::sym_size.int", "aten::sym_numel", "aten::_local_scalar_dense"})
LIBRARY_OF_NAMESPACE = {
    "aten": OPTIMIZED,
    "dim_order_ops": OPTIMIZED,
    "et_copy": OPTIMIZED,
    "quantized_decomposed": QUANTIZED,
}
WHEEL_TARGET_PREFIX = "executorch::"


def library_of(op: str) -> str | None:
    """The wheel component that registers ``op`` (``namespace::name.overload``), or None: in none."""
    namespace = op.split("::", 1)[0] if "::" in op else "aten"
    if op in PRIM_OPS or namespace in PRIM_NAMESPACES:
        return RUNTIME
    return LIBRARY_OF_NAMESPACE.get(namespace)


def kernel_components(operators) -> tuple:
    """(components, unresolved): the wheel's kernel libraries ``operators`` need (besides the runtime,
    which every program needs), in link order; and the operators no wheel library registers."""
    libraries = {library_of(op) for op in operators}
    unresolved = tuple(sorted(op for op in operators if library_of(op) is None))
    return tuple(c for c in (OPTIMIZED, QUANTIZED) if c in libraries), unresolved


def package_components(operators, package_targets) -> tuple:
    """Every wheel component a program needs: the runtime, its kernel libraries, its delegates'
    libraries (``executorch::backend_xnnpack`` -> ``backend_xnnpack``), in link order."""
    kernels, _ = kernel_components(operators)
    backends = [t.removeprefix(WHEEL_TARGET_PREFIX) for t in package_targets if t.startswith(WHEEL_TARGET_PREFIX)]
    return (RUNTIME, *kernels, *dict.fromkeys(backends))


def union_components(per_program) -> tuple:
    """The components of several programs (each a :func:`package_components` tuple), in link order."""
    seen = dict.fromkeys(c for components in per_program for c in components)
    order = [RUNTIME, OPTIMIZED, QUANTIZED]
    return tuple([c for c in order if c in seen] + sorted(c for c in seen if c not in order))


def selection(operators: dict, sources) -> dict:
    """One program's (or several programs') operators as a selected_operators.yaml document, in the
    shape upstream's gen_oplist writes; ``sources``: what each operator's debug_info names."""
    names = sorted(sources)
    return {
        "build_features": [],
        "custom_classes": [],
        "et_kernel_metadata": {op: sorted(set(keys)) for op, keys in sorted(operators.items())},
        "include_all_non_op_selectives": False,
        "include_all_operators": False,
        "kernel_metadata": {},
        "operators": {
            op: {
                "debug_info": names,
                "include_all_overloads": False,
                "is_root_operator": True,
                "is_used_for_training": True,
            }
            for op in sorted(operators)
        },
    }


def union_selection(programs: dict) -> dict:
    """The union of several programs' operators (source -> its operators, as :func:`program_operators`
    returns them): each operator once, its kernel keys merged, its debug_info naming the programs
    that run it (gen_all_oplist's merge, sorted)."""
    keys: dict = {}
    users: dict = {}
    for source, operators in sorted(programs.items()):
        for op, op_keys in operators.items():
            keys.setdefault(op, set()).update(op_keys)
            users.setdefault(op, []).append(source)
    document = selection({op: sorted(k) for op, k in keys.items()}, ())
    for op, entry in document["operators"].items():
        entry["debug_info"] = sorted(users[op])
    return document

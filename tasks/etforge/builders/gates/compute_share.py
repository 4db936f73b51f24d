"""How much of a lowered program's compute its delegates run, in FLOPs rather than op counts.

Counting ops treats a 1x1 reshape like a 768x768 matmul: a BERT-like encoder on
XNNPACK leaves ~50% of its ops (expand_copy, unsqueeze_copy, layer norms) outside
the delegate and 0% of its matmul FLOPs, and a program whose every matmul runs on
portable kernels still counts 40% of its ops delegated. So the gate weighs each op:

    compute(node) = torch.utils.flop_counter's FLOPs for matmuls, convolutions and
                    attention (2 per multiply-accumulate), else one per output element
                    (elementwise ops, norms, copies: what they touch, not nothing)

Each node is re-run once on fake tensors shaped like its ``meta["val"]`` inputs (a dynamic size at
its example value), inside
``FlopCounterMode`` (no data, no memory; a node that cannot be re-run counts its output
elements). Nodes inside a delegate are counted in the graph the partitioner handed over
(``original_module``); the top-level graph holds what portable kernels run. Measure this
before ``to_executorch()``, which rewrites the edge graph in place (out variants): after it,
nothing looks like compute outside the delegates.
"""

from __future__ import annotations

from etforge.core.errors import BadValue

COMPUTE_UNIT = "FLOPs"  # matmul-like ops by formula; every other compute op one per output element


def _dims(shape) -> tuple:
    """Concrete sizes of a shape: a symbolic (dynamic) size counts at its example value (its hint)."""
    out = []
    for size in shape:
        if isinstance(size, int):
            out.append(size)
        else:
            hint = getattr(getattr(size, "node", None), "hint", None)
            out.append(int(hint) if isinstance(hint, int) else 1)
    return tuple(out)


def _tensor_meta(value):
    import torch

    return value if isinstance(value, torch.Tensor) else None


def _signature(node) -> tuple:
    """What a node's compute depends on: its op and its inputs' shapes and dtypes (and the other args)."""
    import torch

    def one(arg):
        if isinstance(arg, torch.fx.Node):
            meta = _tensor_meta(arg.meta.get("val"))
            return ("T", _dims(meta.shape), str(meta.dtype)) if meta is not None else ("N", arg.name)
        if isinstance(arg, (list, tuple)):
            return tuple(one(a) for a in arg)
        return repr(arg)

    return (str(node.target), one(tuple(node.args)), one(tuple(sorted(node.kwargs.items()))))


def _output_elements(node) -> int:
    import torch

    values = node.meta.get("val")
    values = values if isinstance(values, (list, tuple)) else (values,)
    total = 0
    for value in values:
        if isinstance(value, torch.Tensor):
            elements = 1
            for size in _dims(value.shape):
                elements *= size
            total += elements
    return total


def _flops(node) -> int:
    """FLOPs torch's counter assigns to ``node`` re-run on fake tensors (0: no formula)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._pytree import tree_map
    from torch.utils.flop_counter import FlopCounterMode

    def fake_of(value):
        if isinstance(value, torch.fx.Node):
            meta = _tensor_meta(value.meta.get("val"))
            if meta is None:
                raise BadValue(f"no tensor metadata on {value.name}")
            return torch.empty(_dims(meta.shape), dtype=meta.dtype)
        return value

    with FakeTensorMode(allow_non_fake_inputs=True):
        args, kwargs = tree_map(fake_of, node.args), tree_map(fake_of, node.kwargs)
        counter = FlopCounterMode(display=False)
        with counter, torch.no_grad():
            node.target(*args, **kwargs)
    return int(counter.get_total_flops())


def node_compute(node, cache: dict) -> int:
    """The compute of one compute op (see the module docstring); ``cache``: signature -> value."""
    key = _signature(node)
    if key not in cache:
        try:
            flops = _flops(node)
        except Exception:  # noqa: BLE001  (a custom op without a fake kernel: count what it writes)
            flops = 0
        cache[key] = flops if flops > 0 else _output_elements(node)
    return cache[key]


def compute_coverage(graph_module, is_compute) -> dict:
    """The share of ``graph_module``'s compute its delegates run.

    ``is_compute(node) -> op name or None``: which nodes are compute ops (etforge.builders.gates.gates
    compute_op_name). Returns ``compute_coverage`` (delegated / all, 1.0 when there is none),
    ``flops``, ``delegated_flops`` and ``flops_not_delegated`` (op name -> its FLOPs outside)."""
    cache: dict = {}
    inside = 0
    outside: dict = {}
    for node in graph_module.graph.nodes:
        if node.op == "get_attr" and node.name.startswith("lowered_module_"):
            lowered = getattr(graph_module, node.name)
            inside += sum(node_compute(n, cache) for n in lowered.original_module.graph.nodes if is_compute(n))
        name = is_compute(node)
        if name:
            outside[name] = outside.get(name, 0) + node_compute(node, cache)
    total = inside + sum(outside.values())
    return {
        "compute_coverage": round(inside / total, 4) if total else 1.0,
        "flops": total,
        "delegated_flops": inside,
        "flops_not_delegated": dict(sorted(outside.items())),
    }

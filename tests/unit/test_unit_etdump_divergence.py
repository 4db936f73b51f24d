"""The pure parts of reading a quantized program's own intermediate outputs (ETDump) per layer (fake
events and graphs; no torch)."""

from __future__ import annotations

from types import SimpleNamespace

from etforge.builders.numerics.etdump_divergence import delegated_layers, node_values
from etforge.builders.numerics.quantized_divergence import ETDUMP, REPLAY, describe, first_below, readings_of


class Value:
    """A logged tensor: float or not, as the debug buffer holds it."""

    def __init__(self, name: str, floating: bool = True):
        self.name, self.floating = name, floating

    def is_floating_point(self) -> bool:
        return self.floating

    def detach(self):
        return self

    def float(self):
        return self


class Node:
    """An edge-dialect graph node as the ETRecord holds it (hashable, as fx nodes are: users are a dict)."""

    def __init__(self, name: str, target: str, handle: int, path: str | None):
        stack = {"L__self__": ("", "Model")}
        if path:
            stack[path] = (path, "torch.nn.Module")
        self.name, self.op, self.target, self.users = name, "call_function", target, {}
        self.meta = {"debug_handle": handle, "nn_module_stack": stack}


def _event(name: str, handle, *data, delegated: bool = False, backend=None, hierarchy=None):
    return SimpleNamespace(
        name=name,
        debug_handles=handle,
        debug_data=list(data),
        is_delegated_op=delegated,
        delegate_backend_name=backend,
        module_hierarchy=hierarchy or {},
    )


def _edge_graph() -> list:
    """A linear (permute + addmm: one debug handle) and a relu requantized after it (another handle)."""
    permute = Node("permute", "aten.permute_copy.default", 6, "blocks.0.proj")
    addmm = Node("addmm", "aten.addmm.default", 6, "blocks.0.proj")
    relu = Node("relu", "aten.relu.default", 7, "blocks.0.act")
    quant = Node("q", "quantized_decomposed.quantize_per_tensor.default", 7, None)
    dequant = Node("dq", "quantized_decomposed.dequantize_per_tensor.default", 7, None)
    relu.users, quant.users = {quant: None}, {dequant: None}
    return [permute, addmm, relu, quant, dequant]


def test_kernel_events_map_to_the_edge_nodes_of_their_debug_handle_in_order():
    nodes = _edge_graph()
    events = [
        _event("native_call_permute_copy.out", 6, Value("w")),
        _event("OPERATOR_CALL", 6, Value("w")),  # the same output, logged around the kernel: not counted twice
        _event("native_call__to_dim_order_copy.out", 6, Value("x")),  # a kernel the edge graph does not name
        _event("native_call_addmm.out", [6], Value("a")),
        _event("native_call_relu.out", 7, Value("r")),
        _event("native_call_quantize_per_tensor.out", 7, Value("q8", floating=False)),
        _event("native_call_dequantize_per_tensor.out", 7, Value("d")),
        _event("native_call_addmm.out", 99, Value("elsewhere")),  # no node has this handle
    ]
    values = node_values(events, nodes)
    assert {name: value.name for name, value in values.items()} == {
        "permute": "w",
        "addmm": "a",
        "relu": "r",
        "dq": "d",
    }
    readings = readings_of(nodes, values)
    # a layer's reading is its last node's value, after the requantization the next layer sees
    assert {path: (op, value.name) for path, (op, value) in readings.items()} == {
        "blocks.0.proj": ("aten.addmm.default", "a"),
        "blocks.0.act": ("aten.relu.default", "d"),
    }
    assert list(readings) == ["blocks.0.proj", "blocks.0.act"]


def test_events_inside_a_delegate_or_with_several_handles_are_not_read():
    nodes = _edge_graph()
    events = [
        _event("native_call_addmm.out", 6, Value("a"), delegated=True),
        _event("native_call_relu.out", [7, 8], Value("r")),
    ]
    assert node_values(events, nodes) == {}


def test_layers_a_delegate_runs_are_hidden_unless_the_etdump_logged_them():
    hierarchy = {
        "aten_linear_default_": {"L__self__": ("", "M"), "head": ("head", "Linear")},
        "aten_relu_default_": {"L__self__": ("", "M"), "act": ("act", "ReLU")},
        "quantized_decomposed_quantize_per_tensor_default_": {"L__self__": ("", "M")},
    }
    events = [_event("DELEGATE_CALL", [1, 2], backend="XnnpackBackend", hierarchy=hierarchy)]
    eager = {"body": None, "act": None, "head": None}
    hidden, backends = delegated_layers(events, eager, program={"act": None})
    assert hidden == ["head"] and backends == {"XnnpackBackend"}
    assert delegated_layers([], eager, program={}) == ([], set())


def _layer(name: str, sqnr) -> dict:
    return {"layer": name, "op_target": "aten.linear.default", "sqnr_db": sqnr, "max_abs_error": 0.1}


def test_the_phrase_names_the_method_and_why_the_program_could_not_show_its_layers():
    layers = [_layer("a", 40.0), _layer("b", 3.0)]
    etdump = first_below(layers, 20.0, method=ETDUMP)
    assert etdump is not None and describe(etdump).endswith(
        "(the program's own intermediate outputs (ETDump), per layer, against eager fp32)"
    )
    replay = first_below(layers, 20.0)
    assert replay is not None and replay["method"] == REPLAY
    replay["why"] = "the program's XnnpackBackend delegate is opaque to ETDump (2 of 2 layers inside it)"
    assert describe(replay).endswith(
        "(quantized graph, per layer, against eager fp32: the program's XnnpackBackend delegate is opaque "
        "to ETDump (2 of 2 layers inside it))"
    )

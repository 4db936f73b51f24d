"""Run a .pte's execution plan in Python, for programs whose delegate the pip runtime lacks.

The pip ExecuTorch runtime has no TOSA or Ethos-U backend, and a Python-side backend cannot
be registered in it. :class:`PteInterpreter` walks the program's own instructions instead:

- a ``KernelCall`` runs the very ``.out`` overload the program names (``aten::mean.out``,
  ``quantized_decomposed::quantize_per_tensor.out`` from ``executorch.kernels.quantized``)
  through torch, with the program's own argument values and constants; the semantics are
  ExecuTorch's portable kernels', the kernels are ATen's;
- a ``DelegateCall`` hands its payload to ``delegate(backend_id, payload)``, which returns the
  TOSA flatbuffer to run on the TOSA reference model (etforge.builders.arm.tosa_graph).

So a partially delegated program (ops left outside the delegate, e.g. the IO quantize and
dequantize of a TOSA-1.0+INT program) is checked whole, from its bytes alone. Limits: one
chain (no control flow), static shapes, no mutable buffers or external .ptd data; a program
outside them raises NotImplementedError naming what it has.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from etforge.core.errors import BadValue, Unsupported

# ExecuTorch ScalarType codes (executorch/exir/scalar_type.py) -> torch dtype names
SCALAR_TYPES = {
    0: "uint8",
    1: "int8",
    2: "int16",
    3: "int32",
    4: "int64",
    5: "float16",
    6: "float32",
    7: "float64",
    11: "bool",
    15: "bfloat16",
}


class PteInterpreter:
    """One method of a .pte, run instruction by instruction (see the module docstring)."""

    def __init__(self, pte: bytes, delegate: Callable[[str, bytes], bytes], method: str = "forward"):
        import executorch.kernels.quantized  # noqa: F401  (registers the quantized out variants)
        from executorch.exir._serialize._program import deserialize_pte_binary

        self.program = deserialize_pte_binary(pte).program  # delegate segments restored inline
        plans = {p.name: p for p in self.program.execution_plan}
        if method not in plans:
            raise BadValue(f"the program has no {method!r} method (has: {', '.join(plans)})")
        self.plan = plans[method]
        if len(self.plan.chains) != 1:
            raise Unsupported(f"{method} has {len(self.plan.chains)} chains; only one is interpreted")
        self.delegate = delegate
        self.trace: list = []  # what ran, in order: "aten::mean.out", "delegate:TOSABackend"

    def run(self, inputs: list) -> list:
        """The method's outputs (torch tensors) for ``inputs`` (torch tensors, as the program takes them)."""
        from executorch.exir import schema

        env = {i: x.contiguous() for i, x in zip(self.plan.inputs, inputs)}
        for instruction in self.plan.chains[0].instructions:
            args = instruction.instr_args
            if isinstance(args, schema.KernelCall):
                self._kernel(args, env)
            elif isinstance(args, schema.DelegateCall):
                self._delegate(args, env)
            else:
                raise Unsupported(f"instruction {type(args).__name__} is not interpreted")
        return [env[i] for i in self.plan.outputs]

    # ------------------------------------------------------------------ values

    def _meta(self, tensor) -> tuple:
        import torch

        return [int(s) for s in tensor.sizes], getattr(torch, SCALAR_TYPES[int(tensor.scalar_type)])

    def _value(self, index: int, env: dict, want: str | None = None):
        import torch
        from executorch.exir import schema

        value = self.plan.values[index].val
        if isinstance(value, schema.Tensor):
            if index not in env:
                sizes, dtype = self._meta(value)
                if value.data_buffer_idx > 0:  # a constant
                    raw = bytearray(bytes(self.program.constant_buffer[value.data_buffer_idx].storage))
                    count = 1
                    for s in sizes:
                        count *= s
                    flat = torch.frombuffer(raw, dtype=dtype)[:count] if count else torch.empty(0, dtype=dtype)
                    env[index] = flat.reshape(sizes).clone()
                else:
                    env[index] = torch.empty(sizes, dtype=dtype)  # an out= tensor
            return env[index]
        if isinstance(value, schema.Int):
            return getattr(torch, SCALAR_TYPES[value.int_val]) if want == "ScalarType" else value.int_val
        if isinstance(value, schema.Double):
            return float(value.double_val)
        if isinstance(value, schema.Bool):
            return value.bool_val
        if isinstance(value, schema.Null):
            return None
        if isinstance(value, schema.String):
            return value.string_val
        if isinstance(value, schema.IntList | schema.TensorList):
            return [self._value(j, env) for j in value.items]
        if isinstance(value, schema.DoubleList | schema.BoolList):
            return list(value.items)
        if isinstance(value, schema.OptionalTensorList):
            return [None if j == -1 else self._value(j, env) for j in value.items]
        raise Unsupported(f"value {type(value).__name__} is not interpreted")

    # ------------------------------------------------------------------ instructions

    def _kernel(self, call, env: dict) -> None:
        import torch

        op = self.plan.operators[call.op_index]
        namespace, name = op.name.split("::")
        overload = getattr(getattr(getattr(torch.ops, namespace), name), op.overload or "default")
        args, kwargs = [], {}
        for argument, index in zip(overload._schema.arguments, call.args):
            value = self._value(index, env, want=str(argument.type).rstrip("?"))
            if argument.kwarg_only:
                kwargs[argument.name] = value
            else:
                args.append(value)
        overload(*args, **kwargs)  # writes the out= tensor(s) held in env
        self.trace.append(f"{op.name}.{op.overload}")

    def _stored(self, index: int, env: dict):
        """Value ``index`` as a delegate takes it: in its dim order (channels-last stays channels-last)."""
        order = list(self.plan.values[index].val.dim_order)
        x = self._value(index, env)
        return x.permute(order) if order and order != sorted(order) else x

    def _logical(self, index: int, array):
        """A delegate's output for value ``index`` (written in its dim order) at the value's logical sizes."""
        import numpy as np
        import torch

        tensor = self.plan.values[index].val
        sizes, dtype = self._meta(tensor)
        order = list(tensor.dim_order)
        out = torch.from_numpy(np.ascontiguousarray(array)).to(dtype)
        if order and order != sorted(order):  # written in dim order: back to the logical sizes
            out = out.reshape([sizes[k] for k in order]).permute(list(np.argsort(order))).contiguous()
        return out.reshape(sizes)

    def _delegate(self, call, env: dict) -> None:
        from etforge.builders.arm.tosa_graph import run_tosa, tosa_io

        entry = self.plan.delegates[call.delegate_index]
        payload = bytes(self.program.backend_delegate_data[entry.processed.index].data)
        tosa = self.delegate(entry.id, payload)
        inputs, _, _ = tosa_io(tosa)
        given = [self._stored(index, env) for index in call.args[: len(inputs)]]
        outputs = run_tosa(tosa, [x.detach().contiguous().numpy() for x in given])
        for index, y in zip(call.args[len(inputs) :], outputs):
            env[index] = self._logical(index, y)
        self.trace.append(f"delegate:{entry.id}")


def run_samples(pte: Path, samples: list, delegate: Callable[[str, bytes], bytes], method: str = "forward") -> list:
    """Outputs (numpy arrays) of ``pte``'s ``method`` for each sample, as run_program_samples gives them."""
    interpreter = PteInterpreter(Path(pte).read_bytes(), delegate, method)
    return [[o.detach().numpy() for o in interpreter.run(list(inputs))] for inputs in samples]

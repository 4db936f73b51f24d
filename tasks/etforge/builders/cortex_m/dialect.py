"""A Cortex-M program run here: its own instructions, with ExecuTorch's Python implementations of
the ``cortex_m::`` operators standing in for CMSIS-NN's kernels.

No runtime on this host has the Cortex-M kernels (the pip runtime registers no ``cortex_m::``
operator; CMSIS-NN's MVE and DSP kernels run on the core, or on a Corstone FVP). What upstream
checks its dialect against instead is ``backends/cortex_m/ops/operators.py``: each operator's
Python implementation, written to CMSIS-NN's contract (its requantization, rounding and
activation clamping), as ``CortexMTester.test_dialect`` uses them. That is the proxy here, but
run from the .pte's bytes, not from the in-memory graph (:class:`DialectInterpreter`):

- the program's own instructions in order, with its own constants and argument values;
- every non-constant tensor a view into the method's planned buffers at its planned offset, as the
  runtime lays them out, so the memory plan (scratch buffers, reuse, views the emitter turned into
  aliases) is exercised too;
- a ``cortex_m::X.out`` call runs ``cortex_m::X`` and copies the result into its ``out`` tensor;
  any other operator runs its own ``.out`` overload through torch (etforge.builders.runtime.pte_interpreter).

Before running, the program must be one a Cortex-M build of ExecuTorch loads
(:func:`foreign_operators`): no delegate, and every operator registered by the Cortex-M kernel
library (``ops/operators.yaml``) or by the portable (``kernels/portable``) and quantized
(``kernels/quantized``) kernel libraries such a build selects from. Not checked here: CMSIS-NN's
own kernels (their SIMD paths) and any timing.

:func:`cortex_m_dialect` is the runner the Cortex-M recipes name (``runtime.validated_by``).
"""

from __future__ import annotations

from pathlib import Path

from etforge.builders.runtime.pte_interpreter import PteInterpreter
from etforge.core.errors import BuildError, Unsupported
from etforge.program.kernels import PRIM_NAMESPACES, PRIM_OPS

NAMESPACE = "cortex_m"
# The kernel libraries a Cortex-M build registers operators from, in the executorch package: its
# own (CMake cortex_m_ops_lib), then the portable and quantized ones (selective build).
KERNEL_YAMLS = (
    "backends/cortex_m/ops/operators.yaml",
    "kernels/portable/functions.yaml",
    "kernels/portable/custom_ops.yaml",
    "kernels/portable/et_copy_ops.yaml",
    "kernels/quantized/quantized.yaml",
)


def cortex_m_dialect(pte: Path, samples: list, export_files: dict, method: str = "forward") -> list:
    """Outputs (numpy arrays) per sample of ``pte``'s ``method``, run by :class:`DialectInterpreter`
    (the validate stage's runner for Cortex-M cells; ``export_files`` is not needed)."""
    interpreter = DialectInterpreter(Path(pte).read_bytes(), method)
    return [[o.detach().numpy() for o in interpreter.run(list(inputs))] for inputs in samples]


def registered_operators() -> frozenset:
    """``namespace::name.overload`` of every operator a Cortex-M build can register (KERNEL_YAMLS)."""
    import importlib.util

    import yaml

    spec = importlib.util.find_spec("executorch")  # located, not imported (a namespace package)
    if spec is None or not spec.submodule_search_locations:
        raise BuildError("executorch is not installed: no Cortex-M kernel library to check the program against")
    root = Path(next(iter(spec.submodule_search_locations)))
    found = set()
    for relative in KERNEL_YAMLS:
        for entry in yaml.safe_load((root / relative).read_text(encoding="utf-8")) or ():
            if "op" in entry:  # aten operators are named without their namespace
                found.add(f"aten::{entry['op']}")
            elif "func" in entry:
                found.add(entry["func"].split("(", 1)[0])
    return frozenset(found)


def foreign_operators(program, registered: frozenset) -> list:
    """What in ``program`` (a deserialized Program) a Cortex-M build of ExecuTorch cannot load:
    delegates, and operators outside ``registered`` and the runtime's own prim operators."""
    problems = []
    for plan in program.execution_plan:
        problems += [f"a {d.id} delegate" for d in plan.delegates]
        for op in plan.operators:
            name = f"{op.name}.{op.overload}" if op.overload else op.name
            if name not in registered and name not in PRIM_OPS and op.name.split("::")[0] not in PRIM_NAMESPACES:
                problems.append(name)
    return sorted(set(problems))


def _no_delegate(backend_id: str, payload: bytes) -> bytes:
    raise Unsupported(f"a {backend_id} delegate in a Cortex-M program")


class DialectInterpreter(PteInterpreter):
    """One method of a Cortex-M .pte, run as the module docstring says."""

    def __init__(self, pte: bytes, method: str = "forward"):
        import torch
        from executorch.backends.cortex_m import passes  # noqa: F401  (registers the cortex_m:: operators)

        super().__init__(pte, _no_delegate, method)
        foreign = foreign_operators(self.program, registered_operators())
        if foreign:
            raise BuildError(
                "not a program a Cortex-M build of ExecuTorch loads: it holds "
                + ", ".join(foreign)
                + " (a Cortex-M build registers the cortex_m:: kernels and the portable and quantized ones)"
            )
        # index 0 is reserved for constants (ExecuTorch's memory planning); the rest are the arenas
        self.arenas = [torch.zeros(int(n), dtype=torch.uint8) for n in self.plan.non_const_buffer_sizes]

    def run(self, inputs: list) -> list:
        """The method's outputs (torch tensors) for ``inputs``, each copied in where the plan puts it."""
        for arena in self.arenas:
            arena.zero_()
        env: dict = {}
        for index, x in zip(self.plan.inputs, inputs):
            planned = self._planned(index)
            if planned is None:
                env[index] = x.contiguous()
            else:
                planned.copy_(x)
                env[index] = planned
        return [y.clone() for y in self._run_instructions(env)]

    def _run_instructions(self, env: dict) -> list:
        from executorch.exir import schema

        for instruction in self.plan.chains[0].instructions:
            args = instruction.instr_args
            if not isinstance(args, schema.KernelCall):
                raise Unsupported(f"instruction {type(args).__name__} in a Cortex-M program is not interpreted")
            self._kernel(args, env)
        return [self._value(i, env) for i in self.plan.outputs]

    def _planned(self, index: int):
        """The tensor value ``index`` as a view of its planned buffer, or None: it has no planned place."""
        import math

        import torch
        from executorch.exir import schema

        tensor = self.plan.values[index].val
        info = getattr(tensor, "allocation_info", None)
        if not isinstance(tensor, schema.Tensor) or info is None or tensor.data_buffer_idx > 0:
            return None
        sizes, dtype = self._meta(tensor)
        order = list(tensor.dim_order) or list(range(len(sizes)))
        start = (int(info.memory_offset_high) << 32) | int(info.memory_offset_low)
        end = start + math.prod(sizes) * torch.empty((), dtype=dtype).element_size()
        arena = self.arenas[info.memory_id]
        if end > arena.numel():
            raise BuildError(
                f"value {index} lies outside its planned buffer {info.memory_id} ({end} > {arena.numel()})"
            )
        # laid out in its dim order: the physical sizes, permuted back to the logical ones
        physical = arena[start:end].view(dtype).reshape([sizes[d] for d in order])
        return physical.permute([order.index(d) for d in range(len(order))])

    def _value(self, index: int, env: dict, want: str | None = None):
        if index not in env:
            planned = self._planned(index)
            if planned is not None:
                env[index] = planned
        return super()._value(index, env, want)

    def _kernel(self, call, env: dict) -> None:
        import torch

        op = self.plan.operators[call.op_index]
        namespace, name = op.name.split("::")
        if namespace != NAMESPACE:
            super()._kernel(call, env)
            return
        packet = getattr(torch.ops.cortex_m, name)
        overload = getattr(packet, op.overload or "default")
        kwargs, outs = {}, []
        for argument, index in zip(overload._schema.arguments, call.args):
            value = self._value(index, env, want=str(argument.type).rstrip("?"))
            if argument.is_out:
                outs.append(value)
            else:
                kwargs[argument.name] = value
        result = packet.default(**kwargs)  # the Python implementation, CMSIS-NN's contract
        for out, value in zip(outs, result if isinstance(result, tuple | list) else (result,)):
            out.copy_(value)
        self.trace.append(f"{op.name}.{op.overload}")

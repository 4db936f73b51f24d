"""Feeding a .pte and reading it back: the one input cast, program loading, the program's own dtypes.

:func:`cast_inputs` is the one rule for what a program is given (validation,
benchmark, bundled test cases alike): a floating-point sample is cast to the
dtype the program takes (an fp16 program takes fp16), in torch, so bfloat16
works too; integer and boolean inputs are given as they are. Outputs are
compared in float64 either way.

torch and executorch are imported inside the functions.
"""

from __future__ import annotations

from pathlib import Path

METHOD = "forward"


def as_dtype(dtype):
    """A torch dtype from a name ("float16", as export.json records it), a torch dtype, or None."""
    import torch

    return getattr(torch, dtype) if isinstance(dtype, str) else dtype


def cast_inputs(inputs: list, dtypes: list | None) -> list:
    """Contiguous tensors from numpy arrays, each floating-point one cast to the program's dtype.

    ``dtypes``: per input, a dtype name or torch dtype (None or missing: as it is).
    """
    import torch

    dtypes = list(dtypes or [])
    dtypes += [None] * (len(inputs) - len(dtypes))
    out = []
    for x, dtype in zip(inputs, dtypes):
        tensor = torch.from_numpy(x) if not isinstance(x, torch.Tensor) else x
        if dtype and tensor.is_floating_point():
            tensor = tensor.to(as_dtype(dtype))
        out.append(tensor.contiguous())
    return out


def load_method(pte_bytes: bytes, method: str = METHOD):
    """(program, method) of a .pte in the ExecuTorch runtime: keep ``program`` alive while the method runs."""
    import executorch.kernels.quantized  # noqa: F401  (quantized out-variants a program may call)
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(pte_bytes)
    return program, program.load_method(method)


def check_loads(pte: Path, methods: tuple = (METHOD,)) -> None:
    """Load the program and each of its ``methods`` in the ExecuTorch runtime."""
    data = Path(pte).read_bytes()
    for name in methods:
        load_method(data, name)


def run_program_samples(pte: Path, samples: list, method_name: str = METHOD) -> list:
    """Outputs of ``pte``'s method (numpy arrays) for each sample (a list of input tensors); one program load."""
    import torch

    program, method = load_method(Path(pte).read_bytes(), method_name)  # `program` stays alive while `method` runs
    results = []
    for inputs in samples:
        outputs = method.execute(list(inputs))
        results.append([o.detach().float().numpy() if isinstance(o, torch.Tensor) and o.dtype == torch.bfloat16
                        else o.detach().numpy() if isinstance(o, torch.Tensor) else o for o in outputs])
    del method, program
    return results


def program_io_dtypes(pte_bytes: bytes, method: str = METHOD) -> tuple[list, list]:
    """(input dtypes, output dtypes) of one of the program's methods; None for a non-tensor value."""
    from executorch.exir._serialize._program import deserialize_pte_binary
    from executorch.exir.schema import Tensor
    from executorch.exir.tensor import get_scalar_type

    program = deserialize_pte_binary(pte_bytes).program
    plan = next((p for p in program.execution_plan if p.name == method), None)
    if plan is None:
        raise ValueError(f"the program has no {method!r} method "
                         f"(has: {', '.join(p.name for p in program.execution_plan)})")

    def dtype(index):
        value = plan.values[index].val
        return get_scalar_type(value.scalar_type) if isinstance(value, Tensor) else None

    return [dtype(i) for i in plan.inputs], [dtype(i) for i in plan.outputs]

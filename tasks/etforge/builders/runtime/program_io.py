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

from etforge.core.errors import BadValue

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


def data_file_of(pte: Path) -> Path:
    """Where a program's .ptd is, when it has one: beside it, as the export stage writes it
    (program.pte/program.ptd in the store, <stem>.pte/<stem>.ptd in artifacts/)."""
    return Path(pte).with_suffix(".ptd")


def checked_data_path(pte: Path | bytes, data_path: Path | None = None) -> Path | None:
    """The data file to load ``pte`` with (default: the .ptd beside a .pte path), or None when its
    weights are inline. Refuses, in one line, a program without the .ptd its metadata names or
    with another one: XNNPACK segfaults in load_method without it, and portable kernels run
    silently with the wrong weights given another (measured with executorch 1.5.1)."""
    from etforge.core.digest import sha256_file
    from etforge.program.metadata import ProgramMetaError, read_meta, required_data_sha256

    shown = "the program" if isinstance(pte, bytes) else str(pte)
    if data_path is None and not isinstance(pte, bytes):
        data_path = data_file_of(pte)
    needed = required_data_sha256(read_meta(pte if isinstance(pte, bytes) else Path(pte).read_bytes()))
    if needed is None:
        return None
    if data_path is None or not Path(data_path).is_file():
        raise ProgramMetaError(
            f"{shown} keeps its weights in a separate .ptd (sha256 {needed}) and it was "
            f"not given{f' ({data_path} is missing)' if data_path else ''}"
        )
    actual = sha256_file(Path(data_path))
    if actual != needed:
        raise ProgramMetaError(f"{shown} needs the .ptd with sha256 {needed}; {data_path} has {actual}")
    return Path(data_path)


def load_program(pte: Path | bytes, data_path: Path | None = None):
    """The program in the ExecuTorch runtime, with its data file (checked_data_path)."""
    import executorch.kernels.quantized  # noqa: F401  (quantized out-variants a program may call)

    from etforge.builders.runtime.determinism import runtime

    data_path = checked_data_path(pte, data_path)
    source = pte if isinstance(pte, bytes) else str(pte)
    if data_path is None:
        return runtime().load_program(source)
    return runtime().load_program(source, data_path=str(data_path))


def load_method(pte: Path | bytes, method: str = METHOD, data_path: Path | None = None):
    """(program, method) of a .pte in the ExecuTorch runtime: keep ``program`` alive while the method runs."""
    program = load_program(pte, data_path)
    return program, program.load_method(method)


def check_loads(pte: Path, methods: tuple = (METHOD,), data_path: Path | None = None) -> None:
    """Load the program (with its data file) and each of its ``methods`` in the ExecuTorch runtime."""
    program = load_program(Path(pte), data_path)
    for name in methods:
        program.load_method(name)


def run_program_samples(pte: Path, samples: list, method_name: str = METHOD) -> list:
    """Outputs of ``pte``'s method (numpy arrays) for each sample (a list of input tensors); one program load.

    On one runtime thread (etforge.builders.runtime.determinism): the outputs are what a verdict that
    ships is computed from. The program is loaded and released inside (a loaded XNNPACK method
    holds the threadpool)."""
    import torch

    from etforge.builders.runtime.determinism import deterministic
    from etforge.builders.runtime.kernel_log import kernel_failures

    results = []
    with deterministic(runtime=True), kernel_failures():  # a failed kernel is named, not just its code
        program, method = load_method(Path(pte), method_name)  # `program` stays alive while `method` runs
        for inputs in samples:
            outputs = method.execute(list(inputs))
            results.append(
                [
                    o.detach().float().numpy()
                    if isinstance(o, torch.Tensor) and o.dtype == torch.bfloat16
                    else o.detach().numpy()
                    if isinstance(o, torch.Tensor)
                    else o
                    for o in outputs
                ]
            )
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
        raise BadValue(
            f"the program has no {method!r} method (has: {', '.join(p.name for p in program.execution_plan)})"
        )

    def dtype(index):
        value = plan.values[index].val
        return get_scalar_type(value.scalar_type) if isinstance(value, Tensor) else None

    return [dtype(i) for i in plan.inputs], [dtype(i) for i in plan.outputs]

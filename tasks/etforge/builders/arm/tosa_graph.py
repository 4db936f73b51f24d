"""A TOSA 1.0 flatbuffer: its interface, and a run on the TOSA reference model (``tosa-tools``),
as ExecuTorch's Arm tests run one (``backends/arm/test/runner_utils.py`` ``run_tosa_graph``)."""

from __future__ import annotations

import os
import sys

from etforge.core.errors import BuildError


def tosa_io(tosa: bytes) -> tuple:
    """([(name, shape, dtype)] of the inputs, the same of the outputs, operator count) of a TOSA 1.0 graph."""
    from tosa import DType
    from tosa.TosaGraph import TosaGraph

    names = {v: k for k, v in vars(DType.DType).items() if not k.startswith("_")}
    block = TosaGraph.GetRootAsTosaGraph(tosa, 0).Regions(0).Blocks(0)
    tensors = {}
    for i in range(block.TensorsLength()):
        t = block.Tensors(i)
        tensors[t.Name().decode()] = (list(t.ShapeAsNumpy()) if not t.ShapeIsNone() else [], names.get(t.Type()))
    inputs = [(n, *tensors[n]) for n in (block.Inputs(i).decode() for i in range(block.InputsLength()))]
    outputs = [(n, *tensors[n]) for n in (block.Outputs(i).decode() for i in range(block.OutputsLength()))]
    return inputs, outputs, block.OperatorsLength()


def run_tosa(tosa: bytes, inputs: list) -> list:
    """The graph's outputs (numpy arrays) on the TOSA reference model for ``inputs`` (numpy arrays of
    the graph's exact dtypes and shapes: int8 for a TOSA INT graph's quantized inputs)."""
    import tosa_reference_model as ref

    # The model prints a spec-version warning from C++ on every run: keep it out of the task log.
    sys.stdout.flush()
    saved, null = os.dup(1), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        outputs, status = ref.run(tosa, inputs)
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)
    if status != ref.GraphStatus.TOSA_VALID:
        raise BuildError(f"TOSA reference model: {status}")
    return list(outputs)

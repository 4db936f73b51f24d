"""Cortex-M programs the way ExecuTorch's backends/cortex_m builds them (CMSIS-NN, no delegate).

Named by the Cortex-M recipes (``lowering.edge``) and called by the export stage instead of a
plain ``to_edge_transform_and_lower``. Upstream's path (backends/arm/scripts/aot_arm_compiler.py
``_to_edge_cortex_m``, and ``CortexMTester``): the graph quantized by ``CortexMQuantizer``
(etforge.builders.quantization.quantizers ``cortex_m_int8``) goes to edge with
``cortex_m_edge_compile_config()`` (keeps linear and the hard activations whole) and no
partitioner; ``CortexMPassManager`` then rewrites it in place to ``cortex_m::`` operators, each a
CMSIS-NN kernel on the device, for the recipe's core (``CortexMTargetConfig``: the core picks
CMSIS-NN's MVE, DSP or scalar kernels, whose scratch buffers the memory plan holds).

etforge takes upstream's explicit-layout mode (``use_explicit_layout=True``): the program keeps
the model's own contiguous (NCHW) inputs and holds explicit ``cortex_m::transpose`` copies to the
NHWC layout the kernels use. Upstream's default mode wants channels-last inputs instead, which
etforge's capture does not produce (its convolutions would stay float). Upstream marks explicit
layout experimental in 1.5.1, and says it becomes the default (backends/cortex_m/README.md).

executorch is imported inside the functions only.
"""

from __future__ import annotations

from etforge.core.errors import BadValue, Unsupported

EXPLICIT_LAYOUT = True  # what the quantizer and the passes must agree on (see the module docstring)


def target_config(options: dict):
    """The ``CortexMTargetConfig`` of recipe options: ``cpu`` (cortex-m55, cortex-m7, ...) and
    ``isa`` (MVE, DSP or SCALAR; null: what CMSIS-NN resolves for the core)."""
    from executorch.backends.cortex_m.library import cmsis_nn
    from executorch.backends.cortex_m.target_config import CortexMTargetConfig

    cpu = str(options.get("cpu") or "")
    isa = options.get("isa")
    families = cmsis_nn.Backend.__members__  # a pybind enum: MVE, DSP, SCALAR
    if isa and str(isa) not in families:
        raise BadValue(f"cortex_m: unknown kernel family {isa!r}; CMSIS-NN has {sorted(families)}")
    try:
        config = CortexMTargetConfig.from_target_string(cpu)
        if isa:
            config = CortexMTargetConfig(cpu=config.cpu, isa=families[str(isa)])
        config.backend  # noqa: B018 (resolves the ISA now: an unknown one is an error here, not later)
    except (ValueError, AttributeError) as exc:
        raise BadValue(f"cortex_m: {exc}") from None
    return config


def lower_to_edge(programs, options: dict, partitioner=None, constant_methods=None, **edge_options):
    """The edge program of ``programs`` (an ExportedProgram or {method: ExportedProgram}) rewritten
    to cortex_m:: operators for the core of ``options``; called as ``to_edge_transform_and_lower``
    is (etforge.builders.lowering.lower)."""
    from executorch.backends.cortex_m.edge_compile_config import cortex_m_edge_compile_config
    from executorch.backends.cortex_m.passes.cortex_m_pass_manager import CortexMPassManager
    from executorch.exir import EdgeProgramManager, to_edge_transform_and_lower

    if partitioner:
        raise Unsupported("cortex_m delegates nothing: it cannot follow another backend's partitioner in a chain")
    if edge_options:
        raise Unsupported(f"cortex_m lowering takes no {', '.join(sorted(edge_options))}")
    config = cortex_m_edge_compile_config()
    target = target_config(options)
    edge = to_edge_transform_and_lower(programs, compile_config=config)
    rewritten = {
        method: CortexMPassManager(
            edge.exported_program(method), target_config=target, use_explicit_layout=EXPLICIT_LAYOUT
        ).transform()
        for method in sorted(edge.methods)
    }
    # A new manager of the rewritten programs (upstream's scripts assign its private _edge_programs).
    return EdgeProgramManager(rewritten, constant_methods=constant_methods, compile_config=config)

"""Quantizer and quantization-config factories named by quantization recipes.

Two flows, told apart by what a factory returns:

* **PT2E** (``quantizer: etforge.builders.quantization.quantizers:<fn>``, ``fn(options) -> Quantizer``):
  the captured graph ``.module(check_guards=False)`` ->
  ``prepare_pt2e(gm, quantizer)`` -> calibrate -> ``convert_pt2e`` ->
  ``torch.export.export`` again -> lower with the backend's partitioners
  (etforge.builders.quantization.quantize ``pt2e_quantize``). Quantize/dequantize ops left outside a delegate
  need ``import executorch.kernels.quantized`` before ``to_executorch()``.
  A factory with a ``fold_quantize = False`` attribute (OpenVINO) must be
  converted with ``convert_pt2e(gm, fold_quantize=False)``.
* **torchao** (``fn(options) -> AOBaseConfig``): ``quantize_(model, config, filter_fn)``
  on the eager model, ``unwrap_tensor_subclass``, then export and lower as a
  float model (etforge.builders.quantization.quantize ``torchao_quantize``). No calibration.
  ``unwrap_tensor_subclass`` matters: without it ``IntxWeightOnlyConfig``
  lowers on XNNPACK and silently computes garbage (SQNR -50..-180 dB); with it
  XNNPACK refuses (``Missing out variants: {'torchao::dequantize_affine'}``).
  ``filter_fn`` is etforge.builders.quantization.layer_filter's: the layers the config can take
  (group size, MultiheadAttention.out_proj, ``min_weight_elements``), decided
  before quantizing; the others stay in float and the quantize record says why.

Every factory imports its backend lazily; importing this module imports
nothing heavy. Options not given fall back to the defaults written here.
"""

from __future__ import annotations

from etforge.core.errors import BadValue

# --------------------------------------------------------------------------- PT2E: XNNPACK


def xnnpack_int8_static(options: dict):
    """PT2E, XNNPACK: static int8 activations and weights (symmetric).

    ``per_channel`` (default True) selects per-channel weight scales; False is
    per-tensor. Needs calibration batches."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import get_symmetric_quantization_config

    config = get_symmetric_quantization_config(is_per_channel=bool(options.get("per_channel", True)))
    return _xnnpack_quantizer().set_global(config)


def _xnnpack_quantizer():
    """An XNNPACKQuantizer whose ``transform_for_annotation`` turns only floating-point scalars of
    add/mul into tensor attributes (what it does so their other operand can be quantized).

    The stock one converts every scalar to a float32 attribute, integer ones included: in a
    transformers encoder the mask construction adds an int scalar to ``arange`` and feeds
    ``aten.index.Tensor``, which then gets a float index and calibration fails with
    ``IndexError: tensors used as indices must be long, int, byte or bool tensors``
    (research/issue13 NOTES.md section 5). Integer arithmetic is never quantized, so
    leaving it alone changes nothing else."""
    import torch
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import XNNPACKQuantizer
    from torchao.quantization.pt2e.utils import get_new_attr_name_with_prefix

    arithmetic = (torch.ops.aten.add.Tensor, torch.ops.aten.mul.Tensor)

    class FloatScalarsXNNPACKQuantizer(XNNPACKQuantizer):
        def transform_for_annotation(self, model):
            # executorch 1.5.1's _convert_scalars_to_attrs, skipping integer-valued nodes
            for node in model.graph.nodes:
                val = node.meta.get("val")
                if (
                    node.op != "call_function"
                    or node.target not in arithmetic
                    or (isinstance(val, torch.Tensor) and not val.is_floating_point())
                ):
                    continue
                args = []
                for arg in node.args:
                    if not isinstance(arg, torch.fx.Node):
                        name = get_new_attr_name_with_prefix("_tensor_constant_")(model)
                        model.register_buffer(name, torch.tensor(float(arg)))
                        with model.graph.inserting_before(node):
                            attr = model.graph.create_node("get_attr", name, (), {})
                        attr.meta["val"] = val.fake_mode.from_tensor(getattr(model, name), static_shapes=True)
                        arg = attr
                    args.append(arg)
                node.args = tuple(args)
            model.recompile()
            return model

    return FloatScalarsXNNPACKQuantizer()


def xnnpack_int8_dynamic(options: dict):
    """PT2E, XNNPACK: dynamic int8 activations (scales computed at run time),
    int8 per-channel weights. Only linear-like ops are quantized; best for
    transformer blocks. Calibration is not needed (it does no harm)."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import get_symmetric_quantization_config

    config = get_symmetric_quantization_config(is_per_channel=bool(options.get("per_channel", True)), is_dynamic=True)
    return _xnnpack_quantizer().set_global(config)


# --------------------------------------------------------------------------- PT2E: Core ML


def coreml_int8(options: dict):
    """PT2E, Core ML: int8 weights (per-channel, symmetric) and, with
    ``activations: int8`` (default), static uint8 activations; ``activations:
    float32`` gives weight-only int8 through PT2E. Lower with the coreml
    backend at ``minimum_deployment_target`` iOS17 or later, else lowering
    fails with ``Parameter dtype of the cast operation ... Provided int8``."""
    import coremltools as ct
    import torch
    from executorch.backends.apple.coreml.quantizer import CoreMLQuantizer

    activation_dtype = torch.float32 if options.get("activations", "int8") == "float32" else torch.quint8
    config = ct.optimize.torch.quantization.LinearQuantizerConfig(
        global_config=ct.optimize.torch.quantization.ModuleLinearQuantizerConfig(
            quantization_scheme="symmetric",
            activation_dtype=activation_dtype,
            weight_dtype=torch.qint8,
            weight_per_channel=True,
        )
    )
    return CoreMLQuantizer(config)


# --------------------------------------------------------------------------- PT2E: Arm


def arm_tosa_int8(options: dict):
    """PT2E, Arm TOSA: int8 (symmetric, per-channel weights) for a
    ``TOSA-1.0+INT`` program; lower with the arm_tosa backend at
    ``tosa_spec: TOSA-1.0+INT``."""
    from executorch.backends.arm.quantizer import TOSAQuantizer, get_symmetric_quantization_config
    from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec

    spec = TosaCompileSpec(options.get("tosa_spec", "TOSA-1.0+INT"))
    config = get_symmetric_quantization_config(is_per_channel=bool(options.get("per_channel", True)))
    return TOSAQuantizer(spec).set_global(config)


def ethos_u_int8(options: dict):
    """PT2E, Arm Ethos-U55/U85: int8 with ``EthosUQuantizer`` for the same
    Ethos-U compile spec the partitioner uses (``target``, ``system_config``,
    ``memory_mode`` options, default ethos-u55-128). Ethos-U only runs int8."""
    from executorch.backends.arm.quantizer import EthosUQuantizer, get_symmetric_quantization_config

    from etforge.builders.lowering.partitioners import ethos_u_compile_spec

    config = get_symmetric_quantization_config(is_per_channel=bool(options.get("per_channel", True)))
    return EthosUQuantizer(ethos_u_compile_spec(options)).set_global(config)


def vgf_int8(options: dict):
    """PT2E, Arm VGF: int8 with ``VgfQuantizer`` (``tosa_spec`` default
    TOSA-1.0+INT); lower with the arm_vgf backend."""
    from executorch.backends.arm.quantizer import VgfQuantizer, get_symmetric_quantization_config
    from executorch.backends.arm.vgf import VgfCompileSpec

    spec = VgfCompileSpec(options.get("tosa_spec", "TOSA-1.0+INT"))
    config = get_symmetric_quantization_config(is_per_channel=bool(options.get("per_channel", True)))
    return VgfQuantizer(spec).set_global(config)


def ethos_u85_int8(options: dict):
    """PT2E, Arm Ethos-U85: ``ethos_u_int8`` with the ethos-u85-256 default target."""
    return ethos_u_int8({"target": "ethos-u85-256", **options})


# --------------------------------------------------------------------------- PT2E: Cortex-M


def cortex_m_int8(options: dict):
    """PT2E, Cortex-M (CMSIS-NN): ExecuTorch's ``CortexMQuantizer`` in the layout mode the cortex_m
    lowering runs (etforge.builders.cortex_m.lowering): int8 activations, convolution weights per
    channel, the other ops per tensor, as CMSIS-NN takes them. It does not depend on the core, so
    every Cortex-M backend shares one quantized graph."""
    if not options.get("per_channel", True):
        raise BadValue(
            "int8 on cortex_m: CortexMQuantizer quantizes convolution weights per channel only (per_channel)"
        )
    from executorch.backends.cortex_m.quantizer.quantizer import CortexMQuantizer

    from etforge.builders.cortex_m.lowering import EXPLICIT_LAYOUT

    return CortexMQuantizer(use_explicit_layout=EXPLICIT_LAYOUT)


# --------------------------------------------------------------------------- PT2E: OpenVINO


def openvino_int8(options: dict):
    """PT2E, OpenVINO: NNCF's ``OpenVINOQuantizer`` (``mode`` int8_sym default,
    int8_mixed, int8_transformer).

    Convert with ``convert_pt2e(gm, fold_quantize=False)`` (this function's
    ``fold_quantize`` attribute): OpenVINO's frontend wants float weights
    followed by quantize/dequantize, and with folded int8 weights lowering
    fails with ``OpConversionFailure ... is_conversion_successful``."""
    from executorch.backends.openvino.quantizer import OpenVINOQuantizer, QuantizationMode

    return OpenVINOQuantizer(mode=QuantizationMode(options.get("mode", "int8_sym")))


setattr(openvino_int8, "fold_quantize", False)  # noqa: B010 (a flag on the factory)


# --------------------------------------------------------------------------- torchao


def torchao_8da4w(options: dict):
    """torchao, XNNPACK: int8 dynamic activations, int4 weights grouped along
    the input dimension (``group_size``, default 32; must divide in_features).
    Linear layers only."""
    import torch
    from torchao.quantization.granularity import PerGroup
    from torchao.quantization.quant_api import Int8DynamicActivationIntxWeightConfig

    return Int8DynamicActivationIntxWeightConfig(
        weight_dtype=torch.int4, weight_granularity=PerGroup(int(options.get("group_size", 32)))
    )


def torchao_8da8w(options: dict):
    """torchao, XNNPACK: int8 dynamic activations, int8 per-output-channel
    weights (``PerAxis(0)``). Linear layers only."""
    import torch
    from torchao.quantization.granularity import PerAxis
    from torchao.quantization.quant_api import Int8DynamicActivationIntxWeightConfig

    return Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8, weight_granularity=PerAxis(0))


def coreml_weight_only(options: dict):
    """torchao, Core ML: weight-only linear quantization with
    ``IntxWeightOnlyConfig`` (what ExecuTorch's Core ML recipes use);
    ``bits`` 8 (default) or 4, per-channel unless ``group_size`` is set.
    int8 lowers at minimum_deployment_target iOS17+; int4 (per-channel or
    per-group) needs iOS18 (at iOS17: ``constexpr_affine_dequantize expects
    ... uint8, int8 but got ... int4``). Core ML only: on XNNPACK this config
    computes wrong outputs or fails to lower."""
    import torch
    from torchao.quantization.granularity import PerAxis, PerGroup
    from torchao.quantization.quant_api import IntxWeightOnlyConfig

    dtype = {8: torch.int8, 4: torch.int4}[int(options.get("bits", 8))]
    group = options.get("group_size")
    granularity = PerGroup(int(group)) if group else PerAxis(0)
    return IntxWeightOnlyConfig(weight_dtype=dtype, granularity=granularity)


def coreml_palettize(options: dict):
    """torchao, Core ML: palettization (``CodebookWeightOnlyConfig``, a
    ``2**bits``-entry lookup table per block of ``block_size``, default
    ``[-1, 16]``: 16-column groups over all rows). ``bits`` 1..8, default 4.
    Linear layers only. Needs minimum_deployment_target iOS18."""
    import torch
    from torchao.prototype.quantization.codebook_coreml import CodebookWeightOnlyConfig

    bits = int(options.get("bits", 4))
    return CodebookWeightOnlyConfig(
        dtype=getattr(torch, f"uint{bits}"), block_size=list(options.get("block_size", [-1, 16]))
    )


def torchao_embedding(options: dict):
    """torchao, the ``embedding: 4|8`` option of the torchao schemes: weight-only ``bits`` quantization
    of ``nn.Embedding`` tables, grouped along the embedding dimension (``group_size``, default 32; 0:
    one scale per row), as ExecuTorch's LLM flow does (extension/llm/export/quantize.py). Lowering
    must run ``to_executorch(ExecutorchBackendConfig(do_quant_fusion_and_const_prop=True))``, which
    turns dequantize + embedding into ``quantized_decomposed::embedding_4bit``/``embedding_byte``
    (etforge.builders.lowering.lower); those run in ``executorch.kernels.quantized``, never in a delegate."""
    import torch
    from torchao.quantization.granularity import PerAxis, PerGroup
    from torchao.quantization.quant_api import IntxWeightOnlyConfig

    group = int(options.get("group_size", 32))
    return IntxWeightOnlyConfig(
        weight_dtype={8: torch.int8, 4: torch.int4}[int(options["bits"])],
        granularity=PerGroup(group) if group else PerAxis(0),
        intx_choose_qparams_algorithm="hqq_scale_only",
    )


def quantizes_embeddings(transform) -> bool:
    """Whether a cell's transform quantizes embedding tables (its lowering needs quant fusion)."""
    return transform is not None and transform.method == "torchao" and bool(transform.options.get("embedding"))


# Modules that register the custom ops a factory's quantized graph contains: loading that
# graph in another process (the export task, often another worker) must import them first.
setattr(coreml_palettize, "op_libraries", ("torchao.prototype.quantization.codebook_coreml",))  # noqa: B010

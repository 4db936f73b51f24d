"""Build a ``transformers:`` model (etforge.config.hf_source) as an eval-mode nn.Module.

Without a checkpoint the weights are random, drawn after ``torch.manual_seed`` (the
caller seeds): the same key gives the same weights. Nothing is downloaded:
``from_config`` never touches the hub, a checkpoint is a local directory.
"""

from __future__ import annotations

from pathlib import Path

from etforge.config.hf_seq2seq import ENCODER_INPUTS
from etforge.config.hf_source import TASKS
from etforge.core.errors import BadValue

# The task's Auto class when the source names no model_class.
AUTO_CLASSES = {task: auto for task, (auto, _) in TASKS.items()}
# Tasks whose program returns the ModelOutput's fields by name (['logits'], ['pred_boxes'], ...);
# the text encoders keep their flat tuple ([0], [1], ...), which their apps already read.
NAMED_OUTPUT_TASKS = ("image-classification", "fill-mask", "object-detection")
RANDOM_WEIGHTS_NOTE = "weights are random (built from the config with a fixed seed; no checkpoint)"


def import_transformers():
    """transformers, after etforge's torchvision shim (transformers imports torchvision, whose
    PyPI build here lacks the nms schema: etforge.builders.loading.torchvision_compat)."""
    from etforge.builders.loading.torchvision_compat import import_torchvision

    import_torchvision()
    import transformers

    return transformers


def build_config(source: dict):
    """The config object of a transformers source; a key its class does not know is an error
    (the plan-time check reads transformers' source; this one is the real class)."""
    tf = import_transformers()
    values = {k: v for k, v in source["config"].items() if k != "model_type"}
    config = tf.AutoConfig.for_model(source["config"]["model_type"], **values)
    known = set(type(config)().to_dict()) | {"num_labels", "torch_dtype"}
    unknown = sorted(set(values) - known)
    if unknown:
        raise BadValue(f"unknown {source['config']['model_type']} config key {unknown[0]!r}")
    return config


def model_class(source: dict):
    tf = import_transformers()
    name = source.get("model_class") or AUTO_CLASSES[source["task"]]
    cls = getattr(tf, name, None)
    if cls is None:
        raise BadValue(f"transformers has no model class {name!r}")
    return cls


def build_hf_model(spec, root: Path):
    """The eager module of a transformers source: a causal LM as is (llm_export wraps it), an
    encoder wrapped to return a flat tuple of tensors."""
    source = spec.source["transformers"]
    config = build_config(source)
    cls = model_class(source)
    attn = attention_for(cls, config, source.get("attn_implementation", "sdpa"))
    try:
        model = _instantiate(cls, config, attn, root, source.get("checkpoint"))
    except ValueError as exc:  # a sub-model without SDPA (DETR's ResNet backbone): as attention_for
        if attn != "sdpa" or "does not support an attention implementation" not in str(exc):
            raise
        model = _instantiate(cls, config, "eager", root, source.get("checkpoint"))
    model = model.eval()
    if source["task"] == "text-generation" or source["task"] in ENCODER_INPUTS:  # wrapped by llm/seq2seq_export
        return model
    if source["task"] in NAMED_OUTPUT_TASKS:
        return TupleOutputs(model, named=True)
    return TupleOutputs(model)


def _instantiate(cls, config, attn: str, root: Path, checkpoint: dict | None):
    if checkpoint:
        return cls.from_pretrained(
            root / checkpoint["path"], config=config, attn_implementation=attn, local_files_only=True
        )
    if hasattr(cls, "from_config"):
        return cls.from_config(config, attn_implementation=attn)
    return cls._from_config(config, attn_implementation=attn)


def attention_for(cls, config, attn: str) -> str:
    """The attention implementation a model is built with: ``sdpa`` falls back to ``eager`` for a class
    that has none (Gemma 2: its logit softcap; ``from_config`` would raise), as optimum-executorch does;
    a model whose sub-model has none is retried with ``eager`` (build_hf_model).
    An LLM's program attention is etforge's own either way (etforge.builders.llm.export)."""
    mapping = getattr(cls, "_model_mapping", None)
    concrete = mapping[type(config)] if mapping is not None and type(config) in mapping else cls
    if attn == "sdpa" and getattr(concrete, "_supports_sdpa", True) is False:
        return "eager"
    return attn


def random_weights(spec) -> bool:
    source = spec.source.get("transformers") or {}
    return not source.get("checkpoint")


def _tuple_outputs_class():
    import torch

    class _TupleOutputs(torch.nn.Module):
        """forward(*inputs) -> the model output's tensors as a tuple, or with ``named`` a dict of its
        non-None fields in field order (export-friendly either way)."""

        def __init__(self, model, named: bool = False):
            super().__init__()
            self.model = model
            self.named = named

        def forward(self, *inputs):
            out = self.model(*inputs, return_dict=True)
            return dict(out.items()) if self.named else tuple(out.to_tuple())

    return _TupleOutputs


def TupleOutputs(model, named: bool = False):  # noqa: N802 - made lazily: importing this module needs no torch
    return _tuple_outputs_class()(model, named)

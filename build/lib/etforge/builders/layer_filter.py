"""Which layers a weight-group scheme takes, and why it leaves the others in float.

torchao's ``quantize_`` asserts on a layer it cannot take (``Expecting input size
... to be divisible by block_size``), and a layer it does take can still break the
model (``nn.MultiheadAttention`` calls ``F.linear`` on ``out_proj.weight`` after a
transpose the quantized weight tensor does not implement). So the quantize stage
decides layer by layer before anything is quantized, the way ExecuTorch's LLM
flow does (``skip_incompatible_shapes``), and keeps the reason for each layer left
in float:

    rule = LayerRule(kind="linear", group=32)   # what one torchao config takes
    choice = choose_layers(model, rule)          # LayerChoice: quantized + kept_float
    quantize_(model, config, choice.as_filter())

A choice that takes nothing (:attr:`LayerChoice.empty`) is a rejected cell, not a
failed one: the scheme cannot apply to this model.

The rule of a config comes from the config itself (:func:`rule_of`), so the filter
always agrees with the group size torchao will use.
"""

from __future__ import annotations

from dataclasses import dataclass, field

KINDS = ("linear", "embedding")
SHOWN = 3  # kept-float layers named in a one-line note; the records keep them all


@dataclass(frozen=True)
class LayerRule:
    """What one quantization step takes: a kind of layer, the group its weight rows split into
    (the input size must be a multiple of it; None: per channel), and a size below which a
    weight is not worth quantizing (its scales would cost about what it saves)."""

    kind: str  # linear | embedding
    group: int | None = None
    min_elements: int = 0


@dataclass
class LayerChoice:
    """The layers a rule takes (fully qualified names) and those it leaves in float, with why."""

    rule: LayerRule
    quantized: list = field(default_factory=list)
    kept_float: list = field(default_factory=list)  # {"layer": fqn, "reason": one line}

    @property
    def empty(self) -> bool:
        return not self.quantized

    def as_filter(self):
        """torchao's ``filter_fn(module, fqn)``: exactly the layers chosen here."""
        chosen = frozenset(self.quantized)
        return lambda module, fqn: fqn in chosen


def rule_of(config, kind: str = "linear", min_elements: int = 0) -> LayerRule:
    """The rule a torchao config implies: its group along the input dimension, if any.

    ``Int8DynamicActivationIntxWeightConfig.weight_granularity``, ``IntxWeightOnlyConfig.granularity``
    (``PerGroup(g)``: g; ``PerAxis``: none), ``CodebookWeightOnlyConfig.block_size`` ([-1, g]: g)."""
    granularity = getattr(config, "weight_granularity", None) or getattr(config, "granularity", None)
    group = getattr(granularity, "group_size", None)
    block = getattr(config, "block_size", None)
    if group is None and block and int(block[-1]) > 0:
        group = int(block[-1])
    return LayerRule(kind=kind, group=int(group) if group else None, min_elements=min_elements)


def choose_layers(model, rule: LayerRule) -> LayerChoice:
    """Walk ``model`` once (no quantization, no forward) and decide every layer of ``rule.kind``."""
    import torch

    choice = LayerChoice(rule)
    for fqn, module in model.named_modules():
        reason = _why_not(module, rule, torch.nn)
        if reason is None:
            choice.quantized.append(fqn)
        elif reason:
            choice.kept_float.append({"layer": fqn, "reason": reason})
    return choice


def _why_not(module, rule: LayerRule, nn) -> str | None:
    """None: take it; "": not this rule's kind at all; else why it stays in float."""
    if rule.kind == "embedding":
        if type(module) is not nn.Embedding:  # EmbeddingBag and subclasses have other kernels
            return ""
        width, what = module.embedding_dim, "embedding_dim"
    else:
        if not isinstance(module, nn.Linear):
            return ""
        if isinstance(module, nn.modules.linear.NonDynamicallyQuantizableLinear):
            return (
                "MultiheadAttention.out_proj (attention transposes its weight, which a quantized "
                "weight does not support)"
            )
        width, what = module.in_features, "in_features"
    if rule.group and width % rule.group:
        return f"{what} {width} is not a multiple of the group size {rule.group}"
    if module.weight.numel() < rule.min_elements:
        return f"{module.weight.numel()} weights, fewer than min_weight_elements {rule.min_elements}"
    return None


def layers_info(choices) -> dict:
    """The quantize record's ``layers`` field: counts, the layers taken per kind, and every layer kept
    in float with its reason (what the summary note and the manifests' variants show)."""
    quantized = {c.rule.kind: list(c.quantized) for c in choices if c.quantized}
    kept = [entry for c in choices for entry in c.kept_float]
    return {
        "quantized": sum(len(v) for v in quantized.values()),
        "float": len(kept),
        "quantized_layers": quantized,
        "kept_float": kept,
    }


def rejection(scheme: str, choices) -> str:
    """Why ``scheme`` takes no layer of the model (its choices are all empty), in one line."""
    kinds = " or ".join(dict.fromkeys(c.rule.kind for c in choices))
    kept = [entry for c in choices for entry in c.kept_float]
    if not kept:
        return f"{scheme} quantizes {kinds} layers and the model has none"
    return f"{scheme} can take none of the model's {kinds} layers: " + describe_kept(kept, len(kept))


def describe_kept(kept: list, total_float: int) -> str:
    shown = "; ".join(f"{e['layer']} ({e['reason']})" for e in kept[:SHOWN])
    more = total_float - min(len(kept), SHOWN)
    return shown + (f"; and {more} more" if more > 0 else "")

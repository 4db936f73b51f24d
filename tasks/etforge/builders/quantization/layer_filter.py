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

A weight-group scheme does not drop a layer to float while the backend can take something
smaller (:func:`choose_with_fallback`): per layer the declared group, else the largest smaller
group the backend accepts (its recipe's ``group_size_multiple``) that divides the width, else
the scheme's declared fallback for that backend (8da4w on XNNPACK: 8-bit per-channel weights,
the recipe's ``fallback``), and only then float. The record says what each layer got and why.

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
    weights: str = ""  # how the config stores what it takes, e.g. "int4 group 32" (weights_label)
    fallbacks: list = field(default_factory=list)  # {"layer", "weights", "reason"}: not the declared form
    weight_bytes: int = 0  # fp32 bytes of the weights it takes

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
    """The quantize record's ``layers`` field: counts, the layers taken per kind, every layer kept
    in float with its reason (what the summary note and the manifests' variants show), the layers
    that got a fallback form instead of the declared one (and why), how many layers each form took,
    and the fp32 bytes of the weights taken per kind (what the size gate judges)."""
    quantized: dict = {}
    taken_bytes: dict = {}
    forms: dict = {}
    for c in choices:
        if c.quantized:
            quantized.setdefault(c.rule.kind, []).extend(c.quantized)
            taken_bytes[c.rule.kind] = taken_bytes.get(c.rule.kind, 0) + c.weight_bytes
            label = c.weights or c.rule.kind
            forms[label] = forms.get(label, 0) + len(c.quantized)
    kept = [entry for c in choices for entry in c.kept_float]
    info = {
        "quantized": sum(len(v) for v in quantized.values()),
        "float": len(kept),
        "quantized_layers": quantized,
        "kept_float": kept,
        "weight_forms": forms,
        "taken_weight_bytes": taken_bytes,
    }
    fallbacks = [entry for c in choices for entry in c.fallbacks]
    if fallbacks:
        info["fallbacks"] = fallbacks
    return info


def weights_label(config) -> str:
    """'int4 group 32', 'int8 per-channel': how a torchao config stores the weights it takes."""
    dtype = getattr(config, "weight_dtype", None) or getattr(config, "dtype", None)
    bits = str(dtype).removeprefix("torch.") if dtype is not None else type(config).__name__
    group = rule_of(config).group
    return f"{bits} group {group}" if group else f"{bits} per-channel"


def with_weight_bytes(model, choice: LayerChoice) -> LayerChoice:
    """``choice`` with the fp32 bytes of the weights it takes filled in."""
    modules = dict(model.named_modules())
    choice.weight_bytes = sum(
        modules[f].weight.numel() * modules[f].weight.element_size() for f in choice.quantized if f in modules
    )
    return choice


def choose_with_fallback(model, declared, config_for_group, multiple: int | None, fallback, minimum: int = 0) -> list:
    """[(config, LayerChoice)] that take every linear layer the backend can store smaller than float.

    ``declared``: the scheme's config (its group); ``config_for_group(g)``: the same config with group
    g; ``multiple``: the backend takes groups of a multiple of this only (None: not declared, no smaller
    group is tried); ``fallback``:
    the scheme's declared fallback config for this backend, or None. Per layer: the declared group,
    else the largest smaller group that is a multiple of ``multiple`` and divides the width, else
    the fallback, else float (with why). ``minimum``: min_weight_elements (smaller stays float)."""
    import torch

    rule = rule_of(declared, "linear", minimum)
    any_group = LayerRule("linear", None, minimum)
    steps: dict = {rule.group: (declared, LayerChoice(rule, weights=weights_label(declared)))}
    last = None
    if fallback is not None:
        last = LayerChoice(rule_of(fallback, "linear", rule.min_elements), weights=weights_label(fallback))
    float_choice = LayerChoice(rule)
    for fqn, module in model.named_modules():
        unfit = _why_not(module, any_group, torch.nn)  # attention's out_proj, too small: no form helps
        if unfit == "":
            continue
        if unfit:
            float_choice.kept_float.append({"layer": fqn, "reason": unfit})
            continue
        reason = _why_not(module, rule, torch.nn)
        if reason is None:
            steps[rule.group][1].quantized.append(fqn)
            continue
        width = module.in_features
        # only groups the backend declares it takes: a recipe without group_size_multiple tries none
        top = rule.group or 0
        smaller = [g for g in range(top - multiple, 0, -multiple) if width % g == 0] if multiple else []
        if smaller:
            group = smaller[0]
            if group not in steps:
                config = config_for_group(group)
                steps[group] = (config, LayerChoice(rule_of(config, "linear", rule.min_elements)))
                steps[group][1].weights = weights_label(config)
            steps[group][1].quantized.append(fqn)
            steps[group][1].fallbacks.append(
                {"layer": fqn, "weights": steps[group][1].weights, "reason": f"{reason}; group {group} divides it"}
            )
            continue
        why = (
            f"{reason}, and no smaller group the backend takes (a multiple of {multiple}) divides it"
            if multiple
            else reason
        )
        if last is not None:
            last.quantized.append(fqn)
            last.fallbacks.append({"layer": fqn, "weights": last.weights, "reason": f"{why}: the scheme's fallback"})
        else:
            float_choice.kept_float.append({"layer": fqn, "reason": why})
    out = [(config, with_weight_bytes(model, choice)) for config, choice in steps.values()]
    if last is not None:
        out.append((fallback, with_weight_bytes(model, last)))
    # the layers kept in float ride on the declared step's choice (its record lists them)
    out[0][1].kept_float.extend(float_choice.kept_float)
    return out


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

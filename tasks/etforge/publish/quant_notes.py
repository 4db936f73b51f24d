"""What a cell's note says of its quantization: layers kept in float or given a fallback form,
and what keep_float: auto bought. Also ``finite``, the one reader of a recorded number."""

from __future__ import annotations

import math


def finite(value):
    """``value`` when it is a finite number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return value


def rescue_note(rescue: dict) -> str:
    """'keep_float auto kept l1 (+9.3 dB) in float: 30.6 -> 39.9 dB (threshold 35 dB)', or ""."""
    kept = [e for e in rescue.get("kept") or () if isinstance(e, dict)]
    if not kept:
        return ""
    layers = ", ".join(
        f"{e.get('layer')} ({e['gain_db']:+.1f} dB)" if finite(e.get("gain_db")) is not None else str(e.get("layer"))
        for e in kept
    )
    after = finite(rescue.get("after_db"))
    shown = "identical outputs" if after is None else f"{after} dB"
    short = "" if rescue.get("reached") else f", not reached within keep_float_limit {rescue.get('limit')}"
    return (
        f"keep_float auto kept {layers} in float: {rescue.get('before_db')} -> {shown} "
        f"(threshold {rescue.get('threshold_db')} dB{short})"
    )


def layers_note(scheme: str, layers: dict) -> str:
    """'8da4w quantized 3 of 5 layers; kept in float: side (in_features 24 ...); ...', plus the layers that
    got a fallback form instead of the declared one ('int8 per-channel: d, e'), or "" when it took all
    as declared."""
    kept = [e for e in layers.get("kept_float") or () if isinstance(e, dict)]
    fallbacks = [e for e in layers.get("fallbacks") or () if isinstance(e, dict)]
    quantized = finite(layers.get("quantized")) or 0
    parts = []
    if kept:
        shown = "; ".join(f"{e.get('layer')} ({e.get('reason')})" for e in kept[:3])
        more = f"; and {len(kept) - 3} more" if len(kept) > 3 else ""
        parts.append(f"{scheme} quantized {quantized} of {quantized + len(kept)} layers; kept in float: {shown}{more}")
    if fallbacks:
        forms: dict = {}
        for e in fallbacks:
            forms.setdefault(str(e.get("weights")), []).append(str(e.get("layer")))
        parts.append(
            "not in the declared group: "
            + "; ".join(
                f"{form}: {', '.join(names[:3])}" + (f" and {len(names) - 3} more" if len(names) > 3 else "")
                for form, names in forms.items()
            )
        )
    return "; ".join(parts)

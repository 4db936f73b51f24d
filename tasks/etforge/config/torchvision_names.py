"""The model names torchvision's registry takes, read from torchvision's source without importing it.

``torchvision.models.get_model`` builds every model a ``@register_model()`` decorator names
(classification, segmentation, detection, video, optical flow, quantizable), and importing
torchvision at plan time is not allowed (it imports torch). So this module parses the installed
package's ``models/`` files: a function decorated with ``register_model(...)`` is
registered under its ``name=`` argument, else its own name. :func:`registered_models` returns
None when it cannot tell (torchvision not installed, no decorator found): the capture task then
checks the name against the real registry (etforge.builders.loading.model_loading).
"""

from __future__ import annotations

import difflib
import importlib.util
import re
from functools import cache
from pathlib import Path

# ``@register_model()`` or ``@register_model(name="quantized_x")``, then (maybe after other decorators)
# the top-level ``def x(``. A regex over the text: parsing every model file with ast costs ~1 s.
_REGISTERED = re.compile(
    r"^@register_model\((?:\s*name\s*=\s*[\"'](?P<name>\w+)[\"']\s*)?\)\s*$(?P<rest>.*?)^def (?P<func>\w+)\(",
    re.M | re.S,
)


@cache
def registered_models() -> frozenset | None:
    spec = importlib.util.find_spec("torchvision")  # finds the package, does not import it
    if spec is None or not spec.origin:
        return None
    names: set[str] = set()
    for path in sorted((Path(spec.origin).parent / "models").rglob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            continue
        if "@register_model" in text:
            names.update(m["name"] or m["func"] for m in _REGISTERED.finditer(text))
    return frozenset(names) or None


def check_torchvision_name(r, name: str, path: tuple) -> None:
    """A ``torchvision:`` name its registry does not hold is one error line (``r``: the resolver)."""
    known = registered_models()
    if known is None or name in known:
        return
    close = difflib.get_close_matches(name, sorted(known), n=1)
    hint = f"did you mean {close[0]!r}?" if close else "see torchvision.models.list_models()"
    raise r.doc.error(path, f"torchvision's model registry has no model {name!r} ({len(known)} registered); {hint}")


def torchvision_source(r, name: str, path: tuple) -> dict:
    """A ``torchvision:`` model's source, its name checked. ``bn_recalibration`` 2: only the BatchNorm
    modules train while their statistics are recomputed (etforge.builders.loading.model_loading)."""
    check_torchvision_name(r, name, path)
    return {"torchvision": name, "bn_recalibration": 2}

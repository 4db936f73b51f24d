"""What this host can do, checked without importing any backend.

Backend recipes declare ``needs`` (importable modules, environment variables,
platforms). Importing some backends has side effects (the Qualcomm one tries to
download its SDK), so modules are located on disk, never imported.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path


def module_available(name: str) -> bool:
    top, *rest = name.split(".")
    try:
        spec = importlib.util.find_spec(top)  # top-level only: never runs package code
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    if not rest:
        return True
    for location in spec.submodule_search_locations or ():
        base = Path(location).joinpath(*rest)
        if base.is_dir() or base.with_suffix(".py").is_file() or any(base.parent.glob(base.name + ".*.so")):
            return True
    return False


def missing_requirement(needs: dict | None) -> str | None:
    """One line naming what this host lacks for ``needs``, or None."""
    if not needs:
        return None
    missing = []
    platforms = needs.get("platforms")
    if platforms and sys.platform not in platforms:
        missing.append(f"platform {'/'.join(platforms)} (this host is {sys.platform})")
    missing += [f"${var}" for var in needs.get("env", ()) if not os.environ.get(var)]
    missing += [f"Python module {m}" for m in needs.get("modules", ()) if not module_available(m)]
    if not missing:
        return None
    hint = needs.get("hint")
    return "missing " + ", ".join(missing) + (f" ({hint})" if hint else "")

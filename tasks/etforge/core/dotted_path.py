"""Import what a recipe or the stage table names by dotted path (``module:function``), on first use."""

from __future__ import annotations

import importlib


def load_callable(ref: str):
    """The ``function`` of ``module:function``, importing ``module`` now (inside task actions only)."""
    module_name, func_name = ref.split(":")
    return getattr(importlib.import_module(module_name), func_name)


def module_of(ref: str) -> str:
    """``module`` of ``module:function``."""
    return ref.split(":")[0]

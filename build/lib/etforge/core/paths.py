"""Where etforge's own files live: its code, and the schemas, recipes and templates it ships.

In an installed wheel the data directories are package data beside the code
(``etforge/schemas``...); in a checkout (an editable install) they are the
repository's top-level directories beside ``tasks/``, the package's directory
(the product card's layout).
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_NAME = "etforge"  # the import name; its directory is tasks/ in a checkout
PACKAGE_DIR = Path(__file__).resolve().parents[1]


def _data_dir(name: str) -> Path:
    inside = PACKAGE_DIR / name
    return inside if inside.is_dir() else PACKAGE_DIR.parent / name


SCHEMA_DIR = _data_dir("schemas")
RECIPE_DIR = _data_dir("recipes")
TEMPLATE_DIR = _data_dir("templates")

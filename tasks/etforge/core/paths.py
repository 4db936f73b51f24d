"""Where etforge's own files live: its code, and the schemas, recipes and templates it ships.

The data directories are beside the code (``etforge/schemas``...): package data in an
installed wheel, and in a checkout links to the repository's top-level ``schemas/``,
``recipes/`` and ``templates/`` (the product card's layout; ``tasks/`` is the source root).
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_NAME = "etforge"  # the import name; its directory is tasks/etforge in a checkout
PACKAGE_DIR = Path(__file__).resolve().parents[1]
SCHEMA_DIR = PACKAGE_DIR / "schemas"
RECIPE_DIR = PACKAGE_DIR / "recipes"
TEMPLATE_DIR = PACKAGE_DIR / "templates"

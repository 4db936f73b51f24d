"""Where etforge's own files live: the checkout that holds ``tasks/`` and its data directories."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]  # tasks/core/paths.py -> the checkout
SCHEMA_DIR = REPO_ROOT / "schemas"
RECIPE_DIR = REPO_ROOT / "recipes"
TEMPLATE_DIR = REPO_ROOT / "templates"

"""Backend and quantization recipes: YAML files under ``recipes/``.

The registry is the directory listing: a recipe is found by name, loaded and
validated against ``schemas/recipe.schema.json`` only when a pipeline uses it.
Partitioners are named by dotted path and imported inside task actions.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

from etforge.config import schema
from etforge.config.tools import check_tools
from etforge.config.yamlfile import load_yaml
from etforge.core.paths import RECIPE_DIR

RECIPE_ROOT = RECIPE_DIR
KIND_DIRS = {"backend": "backends", "quantization": "quantization"}


@dataclass(frozen=True)
class Recipe:
    name: str
    kind: str
    description: str
    path: Path
    data: dict

    @property
    def options_schema(self) -> dict:
        props = self.data.get("options") or {}
        return {"type": "object", "additionalProperties": False, "properties": props}

    def defaults(self) -> dict:
        return {k: v["default"] for k, v in (self.data.get("options") or {}).items() if "default" in v}


def available(kind: str, root: Path = RECIPE_ROOT) -> list[str]:
    return sorted(p.stem for p in (root / KIND_DIRS[kind]).glob("*.yaml"))


def load_recipe(kind: str, name: str, root: Path = RECIPE_ROOT) -> Recipe | None:
    """The recipe called ``name``, or None when no such recipe file exists."""
    path = root / KIND_DIRS[kind] / f"{name}.yaml"
    if not path.is_file():
        return None
    doc = load_yaml(path, display_name=str(path.relative_to(root.parent)))
    schema.validate(doc, "recipe.schema.json")
    if doc.data["kind"] != kind or doc.data["name"] != name:
        raise doc.error(("name",), f"recipe file {path.name} must declare kind {kind!r} and name {name!r}")
    for key_path, message in check_tools(doc.data):
        raise doc.error(key_path, message)
    return Recipe(name=name, kind=kind, description=doc.data["description"], path=path, data=doc.data)


def unknown_recipe_message(kind: str, name: str) -> str:
    names = available(kind)
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown {kind} {name!r}; {hint}known: {', '.join(names)}"


def check_options(recipe: Recipe, options: dict) -> list[tuple[tuple, str]]:
    """Errors in user options for ``recipe``, as (key path, message) pairs."""
    validator = schema.Validator(recipe.options_schema)
    problems = []
    allowed = sorted(recipe.data.get("options") or {})
    for error in validator.iter_errors(options):
        if error.validator == "additionalProperties":
            for key in sorted(set(error.instance) - set(allowed)):
                close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
                hint = f"did you mean {close[0]!r}?" if close else f"supported: {', '.join(allowed) or 'none'}"
                problems.append(((key,), f"unknown option {key!r} for {recipe.kind} recipe {recipe.name!r}; {hint}"))
        else:
            problems.append((tuple(error.absolute_path), f"invalid option: {schema.expectation(error)}"))
    return problems

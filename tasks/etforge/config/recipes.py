"""Backend and quantization recipes: YAML files under ``recipes/``, the one home of a backend's facts.

The registry is a search path of directory listings (:class:`RecipePath`): a project's own
``recipes/`` first, then etforge's, so a project adds a backend or a scheme (or replaces
one) without editing etforge. A recipe is found by name, loaded and validated against
``schemas/recipe.schema.json`` only when a pipeline uses it. Partitioners, quantizers and
lowering contexts are named by dotted path and imported inside task actions.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from etforge.config import schema
from etforge.config.tools import check_tools
from etforge.config.yamlfile import load_yaml
from etforge.core.paths import RECIPE_DIR
from etforge.core.text import one_line

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


@dataclass(frozen=True)
class RecipePath:
    """Directories searched for recipes, in order (each holds backends/ and quantization/).

    ``memo``: a ValidationMemo (etforge.config.validation_memo) that skips validating a recipe
    whose data passed before; None validates every recipe once per process."""

    dirs: tuple = (RECIPE_DIR,)
    memo: Any = field(default=None, compare=False, repr=False)

    @classmethod
    def for_project(cls, root: Path, memo: Any = None) -> RecipePath:
        """A project's own ``recipes/`` (when it has one) before etforge's."""
        own = Path(root) / "recipes"
        if own.is_dir() and own.resolve() != RECIPE_DIR.resolve():
            return cls((own, RECIPE_DIR), memo)
        return cls(memo=memo)

    def available(self, kind: str) -> list[str]:
        return sorted({p.stem for d in self.dirs for p in (d / KIND_DIRS[kind]).glob("*.yaml")})

    def find(self, kind: str, name: str) -> Path | None:
        return next(
            (
                d / KIND_DIRS[kind] / f"{name}.yaml"
                for d in self.dirs
                if (d / KIND_DIRS[kind] / f"{name}.yaml").is_file()
            ),
            None,
        )

    def load(self, kind: str, name: str) -> Recipe | None:
        """The recipe called ``name`` (the first on the path), or None when none exists."""
        path = self.find(kind, name)
        return None if path is None else _load(kind, name, path, self.memo)

    def load_data(self, kind: str, name: str) -> dict:
        """What the recipe called ``name`` says ({} when none exists)."""
        found = self.load(kind, name)
        return found.data if found is not None else {}

    def unknown_message(self, kind: str, name: str) -> str:
        names = self.available(kind)
        close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return f"unknown {kind} {name!r}; {hint}known: {', '.join(names)}"

    def platform_order(self) -> dict:
        """platform -> backend recipes in fallback order, from every backend recipe's ``manifest``
        (``platforms`` it serves, ``rank`` among them: lower first; ``default`` serves any other)."""
        ranked: dict = {}
        for name in self.available("backend"):
            recipe = self.load("backend", name)
            manifest = (recipe.data.get("manifest") if recipe else None) or {}
            for platform in manifest.get("platforms", ()):
                ranked.setdefault(platform, []).append((manifest.get("rank", 1000), name))
        return {platform: [name for _, name in sorted(entries)] for platform, entries in sorted(ranked.items())}


DEFAULT_PATH = RecipePath()


def _load(kind: str, name: str, path: Path, memo: Any = None) -> Recipe:
    st = path.stat()
    return _load_file(kind, name, path, st.st_mtime_ns, st.st_size, memo)


@cache
def _load_file(kind: str, name: str, path: Path, mtime_ns: int, size: int, memo: Any = None) -> Recipe:
    """(Once per process per version of the file: the manifests read every backend's on each run.)"""
    doc = memo.load_yaml(path, _shown(path)) if memo is not None else load_yaml(path, display_name=_shown(path))
    schema.validate(doc, "recipe.schema.json", memo)
    if doc.data["kind"] != kind or doc.data["name"] != name:
        raise doc.error(("name",), f"recipe file {path.name} must declare kind {kind!r} and name {name!r}")
    for key_path, message in check_declared_options(doc.data.get("options") or {}, memo):
        raise doc.error(key_path, message)
    for key_path, message in check_tools(doc.data):
        raise doc.error(key_path, message)
    return Recipe(name=name, kind=kind, description=doc.data["description"], path=path, data=doc.data)


def check_declared_options(options: dict, memo: Any = None) -> list[tuple[tuple, str]]:
    """Errors in the options a recipe declares, as (key path in the recipe, message): each must be a
    valid JSON Schema with a ``default`` that passes it, as an option set in pipeline.yaml must (a
    default flows into the keys and the builders' options unchecked otherwise). ``memo``: as for
    check_options."""
    if memo is None:
        return _declared_option_problems(options)
    return memo.once(("option defaults", options), lambda: _declared_option_problems(options)) or []


def _declared_option_problems(options: dict) -> list[tuple[tuple, str]]:
    from jsonschema.exceptions import SchemaError  # (imported by schema.validator anyway)

    problems = []
    for name, declared in options.items():
        where = ("options", name)
        validator = schema.validator(declared)
        try:
            type(validator).check_schema(declared)  # an unknown type would raise while checking a value
        except SchemaError as exc:
            problems.append((where + tuple(exc.path), f"not a valid option schema: {one_line(exc.message)}"))
            continue
        if "default" not in declared:
            problems.append((where, "missing required key 'default' (what the option is when a pipeline omits it)"))
            continue
        for error in validator.iter_errors(declared["default"]):
            problems.append((where + ("default",) + tuple(error.absolute_path), schema.expectation(error)))
    return problems


def _shown(path: Path) -> str:
    """How errors name a recipe file: recipes/<kind>/<name>.yaml (relative to its recipes/ dir's parent)."""
    return str(path.relative_to(path.parent.parent.parent))


def available(kind: str, path: RecipePath = DEFAULT_PATH) -> list[str]:
    return path.available(kind)


def load_recipe(kind: str, name: str, path: RecipePath = DEFAULT_PATH) -> Recipe | None:
    """The recipe called ``name``, or None when no such recipe file exists."""
    return path.load(kind, name)


def unknown_recipe_message(kind: str, name: str, path: RecipePath = DEFAULT_PATH) -> str:
    return path.unknown_message(kind, name)


def check_options(recipe: Recipe, options: dict, memo: Any = None) -> list[tuple[tuple, str]]:
    """Errors in user options for ``recipe``, as (key path, message) pairs (``memo``: none, without
    validating, for options it has seen pass against this recipe's options before)."""
    if memo is None:
        return _option_problems(recipe, options)
    return memo.once(("options", recipe.options_schema, options), lambda: _option_problems(recipe, options)) or []


def _option_problems(recipe: Recipe, options: dict) -> list[tuple[tuple, str]]:
    validator = schema.validator(recipe.options_schema)
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

"""The keys a Hugging Face config class accepts, read from transformers' source without importing it.

transformers silently keeps a misspelt config key as an attribute
(``AutoConfig.for_model("llama", hiden_size=3)`` works), so etforge checks the keys
itself. Importing transformers at plan time is not allowed (it imports torch), so this
module parses the installed package's files with ``ast``: since transformers 5 a config
is a dataclass whose fields are annotated class attributes, inherited from its bases and
``PreTrainedConfig``; ``attribute_map`` adds aliases (``n_embd`` for ``hidden_size``).

:func:`accepted_keys` returns None when it cannot tell (a layout it does not know): the
capture task then checks the keys against the real config class (etforge.builders.loading.hf_models).
"""

from __future__ import annotations

import ast
import importlib.util
from functools import cache
from pathlib import Path

# Keyword arguments PreTrainedConfig.__post_init__ consumes that are not fields, and what
# save_pretrained writes besides the fields (a config.json from a checkpoint has it).
POST_INIT_KWARGS = frozenset({"num_labels", "torch_dtype", "_name_or_path"})


@cache
def _package_dir() -> Path | None:
    spec = importlib.util.find_spec("transformers")  # finds the package, does not import it
    return Path(spec.origin).parent if spec and spec.origin else None


@cache
def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return None


@cache
def _mapping(path: Path, name: str) -> list | None:
    """The (key, value) pairs of a module-level ``name = OrderedDict([...])`` in ``path``, or None.

    Only that statement is parsed (it ends at the first ``)`` in column 0 after it): the whole
    module took ~20 ms per file, a tenth of a no-op run's planning."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    start = text.find(f"\n{name} = ")
    end = text.find("\n)", start) if start >= 0 else -1
    try:
        tree = ast.parse(text[start + 1 : end + 2]) if end >= 0 else None
    except SyntaxError:
        tree = None
    if tree is None:
        tree = _parse(path)  # another layout: the whole module
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            try:
                pairs = ast.literal_eval(node.value.args[0]) if isinstance(node.value, ast.Call) else None
            except (ValueError, IndexError):
                return None
            return list(pairs) if pairs else None
    return None


def config_class_names() -> dict | None:
    """model_type -> config class name (transformers' CONFIG_MAPPING_NAMES), or None."""
    root = _package_dir()
    pairs = _mapping(root / "models" / "auto" / "auto_mappings.py", "CONFIG_MAPPING_NAMES") if root else None
    return dict(pairs) if pairs else None


def _find_class(tree: ast.Module, name: str) -> ast.ClassDef | None:
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)


def _imported_from(tree: ast.Module, name: str, path: Path) -> Path | None:
    """The file a relative ``from ..x import name`` in ``path`` points at, or None."""
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and any(a.name == name for a in node.names) and node.level:
            base = path.parent
            for _ in range(node.level - 1):
                base = base.parent
            target = base.joinpath(*(node.module or "").split("."))
            return target.with_suffix(".py") if target.with_suffix(".py").is_file() else None
    return None


def _class_keys(path: Path, name: str, depth: int = 0) -> set | None:
    tree = _parse(path)
    cls = _find_class(tree, name) if tree is not None else None
    if tree is None or cls is None or depth > 8:
        return None
    keys: set = set()
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            if "ClassVar" not in ast.unparse(stmt.annotation):
                keys.add(stmt.target.id)
        elif isinstance(stmt, ast.Assign) and any(getattr(t, "id", None) == "attribute_map" for t in stmt.targets):
            try:
                keys.update(ast.literal_eval(stmt.value))
            except ValueError:
                pass
        elif isinstance(stmt, ast.FunctionDef) and any(ast.unparse(d).endswith(".setter") for d in stmt.decorator_list):
            keys.add(stmt.name)  # a property with a setter (num_labels)
    for base in cls.bases:
        base_name = ast.unparse(base)
        if base_name in ("object", "PushToHubMixin") or base_name.endswith("Mixin"):
            continue
        where = path if _find_class(tree, base_name) else _imported_from(tree, base_name, path)
        inherited = _class_keys(where, base_name, depth + 1) if where else None
        if inherited is None:
            return None
        keys |= inherited
    return keys


def accepted_keys(model_type: str) -> set | None:
    """Every key the config class of ``model_type`` accepts, or None when this cannot be read."""
    found = _config_class(model_type)
    keys = _class_keys(*found) if found else None
    return None if keys is None else keys | POST_INIT_KWARGS | {"model_type"}


def _config_class(model_type: str) -> tuple[Path, str] | None:
    """(the file, the class name) of ``model_type``'s config class in transformers' source, or None."""
    root = _package_dir()
    names = config_class_names()
    if root is None or not names or model_type not in names:
        return None
    folder = model_type.replace("-", "_")
    path = root / "models" / folder / f"configuration_{folder}.py"
    return (path, names[model_type]) if path.is_file() else None


def known_model_types() -> list | None:
    names = config_class_names()
    return sorted(names) if names else None


@cache
def task_model_types(mapping: str) -> frozenset | None:
    """The model_types an Auto class takes: the keys of transformers' ``<mapping>``
    (``MODEL_FOR_MASKED_LM_MAPPING_NAMES``, ...) in models/auto/modeling_auto.py, or None."""
    root = _package_dir()
    pairs = _mapping(root / "models" / "auto" / "modeling_auto.py", mapping) if root else None
    return frozenset(k for k, _ in pairs) if pairs else None


def _class_default(path: Path, name: str, key: str, depth: int = 0):
    """(found, value) of ``key``'s literal default in class ``name`` of ``path`` or its bases."""
    tree = _parse(path)
    cls = _find_class(tree, name) if tree is not None else None
    if tree is None or cls is None or depth > 8:
        return False, None
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and getattr(stmt.target, "id", None) == key and stmt.value is not None:
            try:
                return True, ast.literal_eval(stmt.value)
            except ValueError:
                return False, None
    for base in cls.bases:
        base_name = ast.unparse(base)
        where = path if _find_class(tree, base_name) else _imported_from(tree, base_name, path)
        if where:
            found, value = _class_default(where, base_name, key, depth + 1)
            if found:
                return True, value
    return False, None


def default_value(model_type: str, key: str):
    """The literal default of config key ``key`` in ``model_type``'s config class (``num_mel_bins: int = 80``),
    or None when it has none this module can read."""
    found = _config_class(model_type)
    return _class_default(*found, key)[1] if found else None

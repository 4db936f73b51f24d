"""The layout of the etforge package (tasks/etforge; docs/design.md): imports flow one way, no circles,
small modules.

Every import counts, including those inside functions: a lazy import is still a
dependency, and the engine must reach builders and publishers only through the
stage table's dotted paths or what dodo.py hands it.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tasks" / "etforge"
MAY_IMPORT = {
    "core": set(),
    "config": {"core"},
    "checks": {"core", "config", "program"},
    "pipeline": {"core", "config", "program", "checks"},
    "program": {"core", "config"},
    "cache": {"core", "config", "pipeline", "program", "checks"},
    "engine": {"core", "config", "pipeline", "cache", "program", "checks"},
    "builders": {"core", "config", "pipeline", "program", "checks"},
    "publish": {"core", "config", "pipeline", "cache", "program", "checks"},
    # the composition root: wires publishing into the engine; never imports a builder
    "app": {"core", "config", "pipeline", "cache", "program", "checks", "engine", "publish"},
}
MAX_LINES = 450


def _module_name(path: Path) -> str:
    """etforge.cache.store -> etforge.cache.store (the package's import name is etforge)."""
    parts = ("etforge",) + path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set:
    """The etforge.* modules `path` names in any import statement, at any depth."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in names if name == "etforge" or name.startswith("etforge.")}


def _graph() -> dict:
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {_module_name(path) for path in files}
    return {
        _module_name(path): {name for name in _imports(path) if name in modules} - {_module_name(path)}
        for path in files
    }


def test_every_module_lives_in_a_layer():
    entry = "etforge.__main__"  # `python -m etforge`: one line calling etforge.app.cli
    loose = [
        name for name in _graph() if name.count(".") == 1 and name.split(".")[1] not in MAY_IMPORT and name != entry
    ]
    assert not loose, f"modules outside the sub-packages: {loose}"


def test_imports_flow_one_way():
    violations = []
    for module, targets in _graph().items():
        layer = module.split(".")[1] if module.count(".") >= 1 else None
        if layer not in MAY_IMPORT:
            continue
        for target in targets:
            target_layer = target.split(".")[1] if target.count(".") >= 1 else None
            if target_layer and target_layer != layer and target_layer not in MAY_IMPORT[layer]:
                violations.append(f"{module} imports {target}")
    assert not violations, "\n".join(sorted(violations))


def test_no_import_circles():
    graph = _graph()
    circles, done, path = [], set(), []

    def visit(module):
        if module in path:
            circles.append(path[path.index(module) :] + [module])
            return
        if module in done:
            return
        path.append(module)
        for target in sorted(graph[module]):
            visit(target)
        path.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)
    assert not circles, "\n".join(" -> ".join(circle) for circle in circles)


def test_modules_stay_small():
    big = [
        f"{path.relative_to(ROOT)}: {n} lines"
        for path in PACKAGE.rglob("*.py")
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    ]
    assert not big, "\n".join(big)


def test_the_check_sees_a_lazy_upward_import(tmp_path):
    """The walk counts an import inside a function (otherwise the layering test could not fail)."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from etforge.publish.outcome import cell_outcome\n")
    assert "etforge.publish.outcome" in _imports(module)


def test_the_type_checker_sees_a_type_error_across_modules(tmp_path):
    """`make lint`'s mypy, in a scratch copy of the package with a planted error: one module's str
    returned as another module's int fails the check (every etforge.x import resolves to its file)."""
    import shutil
    import subprocess
    import sys

    shutil.copytree(ROOT / "tasks", tmp_path / "tasks", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    core = tmp_path / "tasks" / "etforge" / "core"
    (core / "_planted_a.py").write_text('def f() -> str:\n    return "x"\n')
    (core / "_planted_b.py").write_text("from etforge.core._planted_a import f\n\n\ndef g() -> int:\n    return f()\n")
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / ".mypy_cache")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert '_planted_b.py:5: error: Incompatible return value type (got "str", expected "int")' in run.stdout


BUILTIN_RAISES = {
    "RuntimeError",
    "ValueError",
    "TypeError",
    "KeyError",
    "ImportError",
    "NotImplementedError",
    "Exception",
}


def test_every_error_etforge_raises_on_purpose_derives_from_one_base():
    """Every exception class the package defines is an EtforgeError (one line, one handler), and no
    module raises a bare builtin error of its own (only re-raises of what the OS or a protocol gave)."""
    import importlib
    import inspect

    from etforge.core.errors import EtforgeError

    defined = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "__main__.py":  # runs the command when imported
            continue
        module = importlib.import_module(_module_name(path))
        defined += [
            f"{module.__name__}.{name}"
            for name, obj in vars(module).items()
            if inspect.isclass(obj)
            and issubclass(obj, BaseException)
            and obj.__module__ == module.__name__
            and not issubclass(obj, EtforgeError)
        ]
    assert not defined, f"exception classes outside EtforgeError: {defined}"
    raised = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and isinstance(node.exc.func, ast.Name):
                if node.exc.func.id in BUILTIN_RAISES:
                    raised.append(f"{path.relative_to(ROOT)}:{node.lineno}: raise {node.exc.func.id}")
    assert not raised, "\n".join(raised)


MAX_FIELDS = 20


def _dataclass_fields(path: Path) -> dict:
    """class name -> number of annotated fields, for every @dataclass class of ``path``."""
    out = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.ClassDef):
            continue
        decorators = [d.func if isinstance(d, ast.Call) else d for d in node.decorator_list]
        if any(getattr(d, "id", getattr(d, "attr", "")) == "dataclass" for d in decorators):
            fields = [
                s for s in node.body if isinstance(s, ast.AnnAssign) and "ClassVar" not in ast.unparse(s.annotation)
            ]
            out[node.name] = len(fields)
    return out


def test_records_at_the_seams_stay_small():
    """No dataclass of the package has more than MAX_FIELDS fields: a new feature adds a record of
    its own (a check, a section), not fields on a shared one."""
    large = {
        f"{path.relative_to(PACKAGE)}:{name}": count
        for path in sorted(PACKAGE.rglob("*.py"))
        for name, count in _dataclass_fields(path).items()
        if count > MAX_FIELDS
    }
    assert not large, f"dataclasses with more than {MAX_FIELDS} fields: {large}"


def test_the_field_count_sees_a_large_record(tmp_path):
    """The count above can fail: a 21-field dataclass is counted as 21."""
    body = "\n".join(f"    f{i}: int = 0" for i in range(MAX_FIELDS + 1))
    (tmp_path / "m.py").write_text(
        f"from dataclasses import dataclass\n\n@dataclass(frozen=True)\nclass Big:\n{body}\n"
    )
    assert _dataclass_fields(tmp_path / "m.py") == {"Big": MAX_FIELDS + 1}

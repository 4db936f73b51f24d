"""The package layout of tasks/ (the etforge package; docs/design.md): imports flow one way, no circles,
small modules, one name per module.

Every import counts, including those inside functions: a lazy import is still a
dependency, and the engine must reach builders and publishers only through the
stage table's dotted paths or what dodo.py hands it.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tasks"
MAY_IMPORT = {
    "core": set(),
    "config": {"core"},
    "pipeline": {"core", "config"},
    "program": {"core", "config"},
    "cache": {"core", "config", "pipeline"},
    "engine": {"core", "config", "pipeline", "cache", "program"},
    "builders": {"core", "config", "pipeline", "program"},
    "publish": {"core", "config", "pipeline", "cache", "program"},
    # the composition root: wires publishing into the engine; never imports a builder
    "app": {"core", "config", "pipeline", "cache", "program", "engine", "publish"},
}
MAX_LINES = 450


def _module_name(path: Path) -> str:
    """tasks/cache/store.py -> etforge.cache.store (the package's import name is etforge)."""
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


def test_every_module_name_is_unique():
    names: dict = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name != "__init__.py":
            names.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert not {n: p for n, p in names.items() if len(p) > 1}

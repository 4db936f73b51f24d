"""The project files a module reaches through its imports, found without importing anything.

A static walk of ``import`` statements (``ast``), anywhere in a file (inside
functions and ``try`` blocks too): ``import a.b``, ``import a.b as c``,
``from a.b import c`` (``c`` as a submodule when such a file exists), and
relative imports. Importing ``a.b.c`` runs ``a/__init__.py`` and
``a/b/__init__.py`` first, so those count too. A name is looked up under the
root the way Python's path finder does (package ``a/__init__.py``, then module
``a.py``, then a namespace directory ``a/``); a name not found there (torch,
numpy, ...) lies outside the project and is ignored: its version is the
business of ``packages:`` and the toolchain.

Not seen: imports built from strings at run time (``importlib.import_module(name)``)
and files read as data. Over-approximation is harmless (a key changes when an
unused import's file does); missing a file is what this module exists to prevent.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

from etforge.core.digest import digest, sha256_file
from etforge.core.errors import BadValue
from etforge.core.paths import PACKAGE_DIR, PACKAGE_NAME


def module_name(file: Path, root: Path, package: str | None = None) -> str | None:
    """``a/b/c.py`` -> ``a.b.c``, ``a/b/__init__.py`` -> ``a.b``; None outside ``root``.
    ``package``: the import name of ``root`` itself (its files are ``package.a.b``)."""
    try:
        parts = list(file.relative_to(root).with_suffix("").parts)
    except ValueError:
        return None
    if parts and parts[-1] == "__init__":
        parts.pop()
    if package:
        parts.insert(0, package)
    return ".".join(parts) or None


def import_records(source: bytes) -> list:
    """The import statements of a file, unresolved: ``[level, module, names]`` each.

    ``import a.b`` gives ``[0, "a.b", None]``; ``from ..x import y, z`` gives
    ``[2, "x", ["y", "z"]]``. Unparseable source has none: importing it fails
    at run time with its own message.
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    records: list = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            records += [[0, alias.name, None] for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            records.append([node.level, node.module or "", [a.name for a in node.names]])
    return records


class ImportGraph:
    """Import edges between the files under one root, each file parsed once.

    With a DigestCache, a file's import records are memoised by its content
    digest across runs, so a no-op run parses nothing.
    """

    def __init__(self, root: Path, digests=None, package: str | None = None):
        self.root = Path(root).resolve()
        self.digests = digests  # etforge.config.digest_cache.DigestCache or None
        # The import name of ``root`` itself (etforge's code: its directory is tasks/etforge in a
        # checkout), or None when ``root`` is a directory on sys.path (a project).
        self.package = package
        self._edges: dict = {}  # file -> frozenset of project files it imports
        self._found: dict = {}  # (directory, name) -> what _find found there

    def reach(self, entries: Iterable[Path]) -> frozenset:
        """``entries`` and every project file they import, directly or indirectly.

        Importing ``a/b/c.py`` as ``a.b.c`` runs ``a/__init__.py`` and ``a/b/__init__.py``
        first: they count as imports of an entry too.
        """
        seen: set = set()
        todo = [Path(e) if Path(e).is_relative_to(self.root) else Path(e).resolve() for e in entries]
        todo += [init for e in todo for init in self._package_inits(e)]
        while todo:
            file = todo.pop()
            if file in seen:
                continue
            seen.add(file)
            todo.extend(self.imports_of(file) - seen)
        return frozenset(seen)

    def _package_inits(self, file: Path) -> list:
        inits = []
        directory = file.parent
        while directory != self.root and directory.is_relative_to(self.root):
            if (directory / "__init__.py").is_file():
                inits.append(directory / "__init__.py")
            directory = directory.parent
        if self.package and (self.root / "__init__.py").is_file():
            inits.append(self.root / "__init__.py")
        return inits

    def imports_of(self, file: Path) -> frozenset:
        if file not in self._edges:
            self._edges[file] = frozenset(self._resolve_all(file))
        return self._edges[file]

    def _records(self, file: Path) -> list:
        try:
            if self.digests is None:
                return import_records(file.read_bytes())
            return self.digests.derived(
                "imports", self.digests.file_digest(file), lambda: import_records(file.read_bytes())
            )
        except OSError:
            return []

    def _resolve_all(self, file: Path) -> set:
        name = module_name(file, self.root, self.package)
        package = (name or "") if file.name == "__init__.py" else (name or "").rpartition(".")[0]
        found: set = set()
        for level, module, names in self._records(file):
            if names is None:  # import a.b.c
                found |= self.files_of(module)
                continue
            base = self._absolute(level, module, package)
            if base is None:
                continue
            if base:
                found |= self.files_of(base)
            for imported in names:  # `from pkg import mod` imports pkg/mod.py
                if imported != "*":
                    found |= self.files_of(f"{base}.{imported}" if base else imported, submodule=True)
        found.discard(file)
        return found

    @staticmethod
    def _absolute(level: int, module: str, package: str) -> str | None:
        """The absolute module a ``from ... import`` names; None when it points above the top."""
        if not level:
            return module
        parts = package.split(".") if package else []
        if level - 1 > len(parts) or (level - 1 == len(parts) and not module):
            return None
        base = parts[: len(parts) - (level - 1)]
        if module:
            base += module.split(".")
        return ".".join(base)

    def files_of(self, dotted: str, submodule: bool = False) -> set:
        """The project files importing ``dotted`` runs: each package's __init__.py on the way.

        ``submodule``: only the last part's own file, since a.b was already resolved
        and ``c`` in ``from a.b import c`` may just be a name defined in a.b.
        """
        files: set = set()
        directory = self.root
        if self.package:  # only the package's own modules, named without its import name
            if dotted == self.package:
                return {self.root / "__init__.py"} if (self.root / "__init__.py").is_file() else files
            if not dotted.startswith(self.package + "."):
                return files
            dotted = dotted[len(self.package) + 1 :]
        parts = dotted.split(".")
        for i, part in enumerate(parts):
            if (directory, part) not in self._found:
                self._found[directory, part] = self._find(directory, part)
            found = self._found[directory, part]
            if found is None:
                return files  # outside the project (or a name, not a module)
            file, is_package = found
            if file is not None and (not submodule or i == len(parts) - 1):
                files.add(file)
            if not is_package:
                return files  # a module has no submodules
            directory = directory / part
        return files

    @staticmethod
    def _find(directory: Path, part: str) -> tuple | None:
        """(file or None, is_package) for ``part`` in ``directory``, as the path finder orders it."""
        package = directory / part
        init = package / "__init__.py"
        if init.is_file():
            return init, True
        module = directory / f"{part}.py"
        if module.is_file():
            return module, False
        if package.is_dir():
            return None, True  # a namespace package: no code of its own
        return None


def project_files(entries: Iterable[Path], root: Path, digests=None) -> frozenset:
    """The files under ``root`` that importing ``entries`` runs, ``entries`` included."""
    return ImportGraph(root, digests).reach(entries)


class CodeDigests:
    """The digest of the etforge code that entry modules run: their static import closure.

    How a stage's key covers the code that decides its result (etforge.pipeline.keys):
    one way for every stage, instead of file lists or a module hashing itself. File
    digests go through the DigestCache (a stat per file on a no-op run); each closure
    is computed once per process.
    """

    def __init__(self, digests=None, root: Path = PACKAGE_DIR, package: str | None = PACKAGE_NAME):
        self.root = Path(root).resolve()
        self.digests = digests  # etforge.config.digest_cache.DigestCache or None
        self._graph = ImportGraph(self.root, digests, package)
        self._memo: dict = {}
        self._files: dict = {}  # file -> (relative name, sha256): once per process, like the closures

    def has(self, module: str) -> bool:
        """Whether ``module`` is one of the files under the root."""
        return bool(self._graph.files_of(module))

    def files(self, modules: Iterable[str]) -> list:
        """The files (relative, sorted) that importing ``modules`` runs; a module not found is an error."""
        return sorted(f.relative_to(self.root).as_posix() for f in self._graph.reach(self._entries(modules)))

    def _entries(self, modules: Iterable[str]) -> list:
        entries: list = []
        for module in modules:
            found = self._graph.files_of(module)
            if not found:
                raise BadValue(f"module {module!r} is not under {self.root}")
            entries += found
        return entries

    def of(self, modules: Iterable[str]) -> str:
        """sha256 over the relative names and contents of the closure of ``modules``."""
        key = tuple(sorted(modules))
        if key not in self._memo:
            self._memo[key] = digest(self.file_digests(key))
        return self._memo[key]

    def file_digests(self, modules: Iterable[str]) -> dict:
        """{relative file: sha256} of the closure of ``modules``: what :meth:`of` digests, kept by
        name so that a task's record can say which file changed (``etforge explain``)."""
        key = ("files",) + tuple(sorted(modules))
        if key not in self._memo:
            self._memo[key] = dict(sorted(self._file(f) for f in self._graph.reach(self._entries(key[1:]))))
        return self._memo[key]

    def read_names(self, modules: Iterable[str]) -> frozenset:
        """The files of the closure of ``modules`` by the names the DigestCache keeps them under
        (what etforge.config.digest_cache ``changed_since_seen`` checks after a task ran)."""
        key = ("names",) + tuple(sorted(modules))
        if key not in self._memo:
            files = self._graph.reach(self._entries(key[1:]))
            name_of = self.digests.name_of if self.digests is not None else (lambda f: str(f.resolve()))
            self._memo[key] = frozenset(name_of(f) for f in files)
        return self._memo[key]

    def _file(self, path: Path) -> tuple[str, str]:
        """(name relative to the root, sha256) of a file of a closure; the stages' closures share
        most of their files, so each is named and hashed once per process."""
        if path not in self._files:
            digest_of = self.digests.file_digest if self.digests is not None else sha256_file
            self._files[path] = (path.relative_to(self.root).as_posix(), digest_of(path))
        return self._files[path]

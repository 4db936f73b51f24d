"""``etforge init [DIR]``: scaffold a project (pipeline.yaml, models/ with one example factory,
.gitignore) in any directory; existing files are never overwritten, and nothing is written
through a symlink that dangles or leads out of DIR."""

from __future__ import annotations

import os
from pathlib import Path

from doit.cmd_base import Command

from etforge.core.console import say
from etforge.core.errors import BadValue

SCAFFOLD = Path(__file__).resolve().parent / "scaffold"
# scaffold file -> where it goes in the project (a packaged ".gitignore" would be dropped by tools)
FILES = {
    "pipeline.yaml": "pipeline.yaml",
    "models/__init__.py": "models/__init__.py",
    "models/tiny_classifier.py": "models/tiny_classifier.py",
    "gitignore": ".gitignore",
}
DANGLING = "which does not exist: init does not write through it"  # a link's target


class Init(Command):
    doc_purpose = "create an etforge project: pipeline.yaml, models/ with an example factory, .gitignore"
    doc_usage = "[DIR]"
    doc_description = (
        "Writes the files into DIR (default: the current directory), keeping any that exist. "
        "Then run `etforge` there: it exports, validates and benchmarks every cell."
    )

    def execute(self, params, args):
        if len(args) > 1:
            say(f"etforge: error: init takes one directory, got {len(args)}: {' '.join(args)}")
            return 3
        target = Path(args[0] if args else ".")
        try:
            written, kept = scaffold(target)
        except BadValue as exc:  # here, not in etforge's main: `doit init` runs this command too
            say(f"etforge: error: {exc}")
            return exc.exit_code
        for rel in written:
            print(f"created {target / rel}")
        for rel in kept:
            print(f"kept    {target / rel} (already there)")
        print(f"next: cd {target} && etforge")
        return 0


def scaffold(target: Path) -> tuple[list, list]:
    """Copy the scaffold into ``target``: (files written, files kept because they exist).

    A file that exists (through a link too) is kept and never written. What would be written is
    checked before anything is (a bad path writes nothing); BadValue names the first that cannot
    be used, or the write that failed."""
    root = _project_directory(target)
    written, kept = [], []
    for rel in FILES.values():
        path = target / rel
        if path.exists():
            kept.append(rel)
            continue
        for parent in reversed(Path(rel).parents[:-1]):  # models/ before models/x.py
            _check_directory(target / parent, root)
        if path.is_symlink():  # and not there: writing would create the file it points to
            raise BadValue(f"{path} is a symlink to {os.readlink(path)}, {DANGLING}")
        written.append(rel)
    for source, rel in FILES.items():
        if rel in written:
            _write_new(SCAFFOLD / source, target / rel)
    return written, kept


def _project_directory(target: Path) -> Path:
    """The real directory the project goes into: DIR may be a link (the user named it), not a dangling one."""
    if target.is_symlink() and not target.exists():
        raise BadValue(f"{target} is a symlink to {os.readlink(target)}, {DANGLING}")
    if target.exists() and not target.is_dir():
        raise BadValue(f"{target} is not a directory")
    return target.resolve()


def _check_directory(path: Path, root: Path) -> None:
    """``path`` (models/) may be created or written into: not a file, not a link that dangles or leaves
    the project (its files would land elsewhere); a link within the project is followed."""
    if path.is_symlink():
        if not path.exists():
            raise BadValue(f"{path} is a symlink to {os.readlink(path)}, {DANGLING}")
        if not path.resolve().is_relative_to(root):
            raise BadValue(
                f"{path} is a symlink to {os.readlink(path)}, outside the project directory {root}: "
                "init does not write through it"
            )
    if path.exists() and not path.is_dir():
        raise BadValue(f"{path} is not a directory: move it aside to scaffold the project")


def _write_new(source: Path, path: Path) -> None:
    """Create ``path`` with ``source``'s bytes; O_EXCL|O_NOFOLLOW: never through a link, nor over a
    file that appeared since the checks."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
        with os.fdopen(fd, "wb") as out:
            out.write(source.read_bytes())
    except OSError as exc:
        raise BadValue(f"cannot write {exc.filename or path}: {exc.strerror or exc}") from None

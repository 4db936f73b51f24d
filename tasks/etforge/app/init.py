"""``etforge init [DIR]``: scaffold a project (pipeline.yaml, models/ with one example factory,
.gitignore) in any directory; existing files are never overwritten."""

from __future__ import annotations

import shutil
from pathlib import Path

from doit.cmd_base import Command

from etforge.core.console import say

SCAFFOLD = Path(__file__).resolve().parent / "scaffold"
# scaffold file -> where it goes in the project (a packaged ".gitignore" would be dropped by tools)
FILES = {
    "pipeline.yaml": "pipeline.yaml",
    "models/__init__.py": "models/__init__.py",
    "models/tiny_classifier.py": "models/tiny_classifier.py",
    "gitignore": ".gitignore",
}


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
        written, kept = scaffold(target)
        for rel in written:
            print(f"created {target / rel}")
        for rel in kept:
            print(f"kept    {target / rel} (already there)")
        print(f"next: cd {target} && etforge")
        return 0


def scaffold(target: Path) -> tuple[list, list]:
    """Copy the scaffold into ``target``: (files written, files kept because they exist)."""
    written, kept = [], []
    for source, rel in FILES.items():
        path = target / rel
        if path.exists():
            kept.append(rel)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SCAFFOLD / source, path)
        written.append(rel)
    return written, kept

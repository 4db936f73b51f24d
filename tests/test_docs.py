"""The documentation: the site builds strictly, its generated pages cover the schema and the recipes,
the README stays short, and the repository holds no build outputs, no machine-specific paths and
no names of files that do not exist. Fast: nothing here imports torch (the docs build is a
subprocess whose hook reads the schema and the recipes, never a builder).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README_LIMIT = 6 * 1024


# ---------------------------------------------------------------- the site


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built once with ``mkdocs build --strict`` (every warning is an error)."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(REPO / "mkdocs.yml")]
        + ["--site-dir", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    return out


def page(site: Path, uri: str) -> str:
    return (site / uri / "index.html").read_text(encoding="utf-8")


def test_the_reference_has_a_section_per_key_path(site):
    html = page(site, "reference/pipeline")
    for key_path in ("models.<model>.inputs", "models.<model>.inputs[].shape", "matrix.expected_failures", "cache"):
        anchor = re.sub(r"[^A-Za-z0-9_.-]", "", key_path)
        shown = key_path.replace("<", "&lt;").replace(">", "&gt;")
        assert f'id="{anchor}"' in html and f"<code>{shown}</code>" in html, key_path
    bare = re.findall(r'<h[23] id="([^"]+)">(?:(?!</h[23]>).)*</h[23]>\s*<ul>', html, flags=re.S)
    assert not bare, f"sections without a description (add one to the schema): {bare}"


def test_every_key_of_the_pipeline_schema_is_described():
    """The reference is generated from these descriptions: a key without one would be a bare heading."""
    schema = json.loads((REPO / "schemas" / "pipeline.schema.json").read_text(encoding="utf-8"))
    missing = []

    def walk(node, path):
        if not isinstance(node, dict):
            return
        for key, sub in (node.get("properties") or {}).items():
            if "description" not in sub:
                missing.append(f"{path}{key}")
            walk(sub, f"{path}{key}.")
        for key in ("additionalProperties", "items"):
            walk(node.get(key), path)
        for alt in node.get("oneOf") or ():
            walk(alt, path)

    walk(schema, "")
    for name, node in schema["$defs"].items():
        walk(node, f"$defs.{name}.")
    assert not missing, f"schema keys without a description: {missing}"


def test_the_backends_page_lists_every_recipe(site):
    html = page(site, "backends")
    for kind, prefix in (("backends", ""), ("quantization", "scheme-")):
        names = sorted(p.stem for p in (REPO / "recipes" / kind).glob("*.yaml"))
        assert names, kind
        missing = [n for n in names if f'id="{prefix}{n}"' not in html]
        assert not missing, f"recipes/{kind} not on the backends page: {missing}"


def test_the_backends_table_says_where_each_backends_programs_are_checked(site):
    """From each recipe's runtime: the ExecuTorch runtime here, what ``runtime.validated_by`` names
    (the TOSA reference model, through a proxy for Ethos-U), or the device."""
    html = page(site, "backends")
    table = html[html.index('id="backends"') : html.index('id="which-scheme-on-which-backend"')]
    rows = {
        m.group(1): m.group(2) for m in re.finditer(r'<tr>\s*<td><a href="#([\w-]+)">.*?</td>(.*?)</tr>', table, re.S)
    }
    assert "<td>yes</td>" in rows["xnnpack"]
    assert "on the TOSA reference model, not the ExecuTorch runtime" in rows["arm_tosa"]
    assert "on the TOSA reference model" in rows["ethos_u55"] and "proxy" in rows["ethos_u55"]
    assert "on-device" in rows["vulkan"]


def test_the_design_page_has_the_stage_table(site):
    html = page(site, "design")
    for stage in ("capture", "quantize", "export", "sizegate", "validate", "benchmark", "manifest", "release"):
        assert f"<td><code>{stage}</code></td>" in html, stage


# ---------------------------------------------------------------- the README


def test_readme_is_short_and_starts_with_the_two_commands():
    raw = (REPO / "README.md").read_bytes()
    assert len(raw) <= README_LIMIT, (
        f"README.md is {len(raw)} bytes; keep it under {README_LIMIT} and move the rest to docs/"
    )
    lines = raw.decode("utf-8").splitlines()
    body = [line for line in lines if line.strip()][1:4]  # after the title
    assert body[0] == "```bash", body
    assert body[1].startswith("make run ") and body[2].startswith("make test "), body


# ---------------------------------------------------------------- what the repository tracks


def tracked_files() -> list[str]:
    """``git ls-files`` of the repository, or a skip when this is not a git checkout."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
        )
    except FileNotFoundError:
        pytest.skip("git is not installed")
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    return [name for name in listed.stdout.split("\0") if name]


def test_no_tracked_file_is_a_build_output():
    outputs = [name for name in tracked_files() if "artifacts" in Path(name).parts[:-1]]
    assert not outputs, f"build outputs under artifacts/ are tracked (git rm --cached them): {outputs[:5]}"


# An absolute path into a home or work directory of one machine: /work/<dir>, /root/<dir>,
# /home/<someone>, /Users/<someone>, where it starts a path (not inside a URL or a longer path
# such as s3://bucket/work/x, which the look-behind rules out). The component after it is what
# makes it machine-specific; a placeholder there is fine: /home/user/, /Users/you/, /home/$USER/,
# /home/<name>/, /root/... . /tmp/, /opt/, /path/to/ and the like are not matched.
MACHINE_PATH = re.compile(r"(?<![\w.~$/-])/(work|root|home|Users)/([^\s/'\"`)]*)")
PLACEHOLDERS = {"", "user", "you", "me", "name", "USER"}


def machine_paths(text: str) -> list[str]:
    found = []
    for match in MACHINE_PATH.finditer(text):
        component = match.group(2)
        if component in PLACEHOLDERS or component.startswith(("<", "$", "{", "...")):
            continue
        found.append(match.group(0))
    return found


def test_the_machine_path_check_can_fail():
    home, work = "/" + "home/alice/src", "/" + "work/wt/x.py"
    assert machine_paths(f"see {home} and '{work}'") == ["/" + "home/alice", "/" + "work/wt"]
    assert machine_paths("/home/user/project, s3://bucket/work/x, https://x.org/root/y, /tmp/a") == []


def test_no_tracked_text_file_names_a_machine_specific_path():
    offenders = []
    for name in tracked_files():
        path = REPO / name
        try:
            data = path.read_bytes()
        except OSError:
            continue  # listed but not in the working tree (a sparse checkout, a deletion not yet committed)
        if b"\0" in data[:8192]:
            continue  # binary
        for found in machine_paths(data.decode("utf-8", errors="replace")):
            offenders.append(f"{name}: {found}")
    assert not offenders, "machine-specific paths in tracked files:\n" + "\n".join(offenders[:20])


# ---------------------------------------------------------------- names of repository files


# A repository path in a comment, docstring, message or page: a top-level directory of this
# repository, then a file name with one of these extensions. Names with placeholders
# (recipes/backends/<name>.yaml) do not match; models/ is left out on purpose, since the docs
# also name files of a user's own project (models/keyword_mlp.py).
REPO_PATH = re.compile(
    r"(?<![\w./-])((?:tasks|templates|recipes|schemas|docs|tests|benchmarks|cpp)/[\w./-]*?"
    r"\.(?:py|j2|yaml|yml|json|md|toml|txt|cpp|sh))(?![\w/-])"
)
SCANNED = ("tasks", "templates", "recipes", "docs", "README.md")
TEXT_SUFFIXES = {".py", ".j2", ".yaml", ".yml", ".json", ".md", ".txt", ".toml"}
# Stale names in files the docs do not own, found when this test was written; each entry is
# (file, the name it gives). Fix the file, then remove its entry: the list should end empty
# (an entry no longer needed is a warning, not a failure).
KNOWN_STALE: set = set()  # (file, name) pairs being fixed elsewhere; empty: every name exists


def missing_paths(text: str, root: Path = REPO) -> list[tuple[int, str]]:
    """(line number, name) of every repository path ``text`` names that does not exist under ``root``."""
    missing = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in REPO_PATH.finditer(line):
            if not (root / match.group(1)).exists():
                missing.append((number, match.group(1)))
    return missing


def test_the_path_scanner_can_fail():
    text = (
        "see tasks/etforge/app/cli.py and tasks/etforge/app/no_such_module.py (also `docs/missing.md`)\n"
        "recipes/backends/<name>.yaml"
    )
    assert missing_paths(text) == [(1, "tasks/etforge/app/no_such_module.py"), (1, "docs/missing.md")]
    assert missing_paths("s3://bucket/tasks/x.py, etforge/templates/y.j2, tasks/etforge/app/init.py") == []


def scanned_files() -> list[Path]:
    files = []
    for entry in SCANNED:
        path = REPO / entry
        if path.is_file():
            files.append(path)
        else:
            files += sorted(p for p in path.rglob("*") if p.suffix in TEXT_SUFFIXES and "__pycache__" not in p.parts)
    return files


def test_every_repository_path_named_in_code_and_docs_exists():
    stale, seen = [], set()
    for path in scanned_files():
        rel = path.relative_to(REPO).as_posix()
        for number, name in missing_paths(path.read_text(encoding="utf-8", errors="replace")):
            if (rel, name) in KNOWN_STALE:
                seen.add((rel, name))
                continue
            stale.append(f"{rel}:{number}: {name}")
    assert not stale, "names of files that do not exist:\n" + "\n".join(stale)
    if KNOWN_STALE - seen:  # fixed since: a warning, so that a merge of the fix fails nothing
        warnings.warn(f"remove from KNOWN_STALE, fixed: {sorted(KNOWN_STALE - seen)}", stacklevel=1)


# ---------------------------------------------------------------- names of etforge's modules

# A module of the package named in a comment, docstring, page, recipe or template: etforge.a.b, maybe
# followed by :function or .Name. Code names modules this one way (by import name), never by path.
MODULE_NAME = re.compile(r"(?<![\w./-])etforge((?:\.[a-z_][a-z0-9_]*)+)")
MODULE_PATH_IN_CODE = re.compile(r"(?<![\w./-])tasks/etforge/[\w/]+\.py\b")


def missing_modules(text: str, package: Path = REPO / "tasks" / "etforge") -> list[tuple[int, str]]:
    """(line number, name) of every etforge.x.y that names no module or package of ``package`` (a
    module may be followed by one attribute: etforge.publish.outcome.cell_outcome; a sub-package by
    none, since etforge.app.no_such_module is more likely a stale module than an attribute)."""
    missing = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in MODULE_NAME.finditer(line):
            parts = match.group(1).strip(".").split(".")
            found = False
            for n in range(len(parts), 0, -1):
                base = package.joinpath(*parts[:n])
                if base.with_suffix(".py").is_file():
                    found = n >= len(parts) - 1  # at most one attribute after the module
                    break
                if (base / "__init__.py").is_file():
                    found = n == len(parts)
                    break
            if not found and match.group(1) != ".__version__":
                missing.append((number, "etforge" + match.group(1)))
    return missing


def test_the_module_scanner_can_fail():
    text = "see etforge.app.cli and etforge.app.cli.main, etforge.app.no_such_module and etforge.nothing.here"
    assert missing_modules(text) == [(1, "etforge.app.no_such_module"), (1, "etforge.nothing.here")]


def test_every_module_named_in_code_and_docs_exists():
    stale = []
    for path in scanned_files():
        rel = path.relative_to(REPO).as_posix()
        for number, name in missing_modules(path.read_text(encoding="utf-8", errors="replace")):
            stale.append(f"{rel}:{number}: {name}")
    assert not stale, "names of modules that do not exist:\n" + "\n".join(stale)


def test_code_names_modules_by_their_import_name():
    """A comment in the package names a module as etforge.x.y, never as a path."""
    offenders = [
        f"{path.relative_to(REPO)}:{number}"
        for path in sorted((REPO / "tasks").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if MODULE_PATH_IN_CODE.search(line)
    ]
    assert not offenders, "\n".join(offenders)

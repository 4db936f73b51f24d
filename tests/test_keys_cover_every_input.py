"""What cache keys cover: the tools a recipe declares, and the project code a model imports.

Real runs on tiny models: a faked upgrade of one backend's compiler package
outdates exactly that backend's cells; an edited helper module rebuilds
exactly the models that import it. Each change is first seen alone by
``doit list --status``; one run then rebuilds them all (a run imports torch
and ExecuTorch first, and each OpenVINO cell lowers in a fresh interpreter).
Plus plan-level checks that need no build (SDK fingerprints, the static
import walk, recipe errors).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from conftest import REPO, Project, make_project, state

sys.path.insert(0, str(REPO))
from etforge.config.code_deps import project_files  # noqa: E402
from etforge.config.digest_cache import DigestCache  # noqa: E402
from etforge.config.recipes import RecipePath, load_recipe  # noqa: E402
from etforge.config.resolve import resolve  # noqa: E402
from etforge.core.errors import PipelineError  # noqa: E402
from etforge.pipeline.specs import spec_of  # noqa: E402

BENCH = "benchmark: {warmup: 1, iterations: 3, max_seconds: 2, threads: 1}\n"  # one thread: see weights_pipeline in test_build_once_rebuild_what_changed.py
# Tasks over the whole matrix: they re-run when what they show changes.
PIPELINE_TASKS = {"manifest", "report"}


def cell_tasks(cell: str) -> set:
    return {f"{kind}:{cell}" for kind in ("export", "validate", "benchmark")}


def listed_status(run) -> dict:
    """``doit list --all --status`` as {task: "R" or "U"}."""
    out = {}
    for line in run.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in ("R", "U"):
            out[parts[1]] = parts[0]
    assert out, run.stdout + run.stderr
    return out


def copy_project(project: Project, target: Path) -> Project:
    shutil.copytree(project.root, target, symlinks=True)
    return Project(target)


def manifest_hashes(project: Project) -> dict:
    """Cell -> the program sha256 the manifests (index.json) give."""
    index = json.loads((project.out / "manifests" / "index.json").read_text())
    return {f"{e['modelName']}/{e['backend']}/{e['quantization']}": e["hash"] for e in index["models"]}


# --------------------------------------------------------------------------- the built project

LAYERS = '''"""A layer two of the models share."""

import torch
from torch import nn

SCALE = 2.0


class Scale(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * SCALE
'''

DIRECT = """from torch import nn

from models.layers import Scale


def build():
    return nn.Sequential(Scale(), nn.ReLU())
"""

MIDDLE = """def make():
    from . import layers  # imported inside a function: still a dependency

    return layers.Scale()
"""

INDIRECT = """import torch.nn as nn

import models.middle as middle


def build():
    return nn.Sequential(middle.make(), nn.Tanh())
"""

PLAIN = """from torch import nn


def build():
    return nn.Sequential(nn.ReLU())
"""

# One project for both concerns, so that each change is also seen to leave the
# other concern's cells alone: linreg on xnnpack and openvino (tools), three
# models on xnnpack of which two import models/layers.py (model code).
PIPELINE = (
    """\
name: t
version: 0.0.1
models:
  linreg:
    python: models.linreg:build
    inputs: [{name: features, shape: [1, 4]}]
  direct:
    python: models.direct:build
    inputs: [{name: x, shape: [1, 8]}]
  indirect:
    python: models.indirect:build
    inputs: [{name: x, shape: [1, 8]}]
  plain:
    python: models.plain:build
    inputs: [{name: x, shape: [1, 8]}]
backends:
  xnnpack: {}
  openvino: {}
quantization: [fp32]
targets: false
matrix:
  product: false
  include:
    - {model: linreg}
    - {model: direct, backend: xnnpack}
    - {model: indirect, backend: xnnpack}
    - {model: plain, backend: xnnpack}
"""
    + BENCH
)


def model_cells(*models: str) -> set:
    return {t for m in models for t in {f"capture:{m}"} | cell_tasks(f"{m}/xnnpack/fp32")}


def write_models(project: Project) -> None:
    for name, text in (
        ("layers", LAYERS),
        ("direct", DIRECT),
        ("middle", MIDDLE),
        ("indirect", INDIRECT),
        ("plain", PLAIN),
    ):
        (project.root / "models" / f"{name}.py").write_text(text)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Project:
    project = make_project(tmp_path_factory.mktemp("keys") / "proj", PIPELINE)
    write_models(project)
    run = project.doit()
    assert run.returncode == 0, run.stdout + run.stderr
    return project


# --------------------------------------------------------------------------- tools in keys


def fake_distribution(directory: Path, name: str, version: str) -> Path:
    """A dist-info that importlib.metadata finds before site-packages' one (on PYTHONPATH)."""
    info = directory / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return directory


def outdated_tasks(project: Project, before: dict, env: dict | None = None) -> set:
    """Tasks `doit list --all --status` shows out of date that were up to date in ``before``."""
    after = listed_status(project.doit("list", "--all", "--status", extra_env=env))
    return {t for t in after if after[t] == "R" and before[t] == "U"}


def upgrade_openvino(tmp_path: Path) -> dict:
    """The environment of a doit run that sees a newer openvino than the installed one."""
    return {"PYTHONPATH": str(fake_distribution(tmp_path / "site", "openvino", "2025.4.1.post999"))}


def comment_helper(project: Project) -> None:
    layers = project.root / "models" / "layers.py"
    layers.write_text(layers.read_text() + "\n# a comment changes the bytes, not the program\n")


def edit_helper(project: Project) -> None:
    layers = project.root / "models" / "layers.py"
    layers.write_text(layers.read_text().replace("SCALE = 2.0", "SCALE = -3.0"))


@pytest.fixture(scope="module")
def rebuilt(built, tmp_path_factory):
    """A copy with every change of the two tests below (openvino upgraded; models/layers.py
    commented and edited), rebuilt by one run under the upgrade; with its environment."""
    root = tmp_path_factory.mktemp("rebuilt")
    project = copy_project(built, root / "proj")
    upgraded = upgrade_openvino(root)
    comment_helper(project)
    edit_helper(project)
    run = project.doit(extra_env=upgraded)
    assert run.returncode == 0, run.stdout + run.stderr
    return project, run, upgraded


def test_upgraded_compiler_and_commented_helper_rebuild_exactly_their_cells(built, rebuilt, tmp_path):
    """Two changes, each seen alone by `doit list --status`, then rebuilt in one run (`rebuilt`,
    with the edit of test_edited_helper_module_rebuilds_exactly_the_models_that_import_it)."""
    project = copy_project(built, tmp_path / "proj")
    before = listed_status(project.doit("list", "--all", "--status"))
    assert all(before[t] == "U" for t in before if ":" in t), before  # everything built

    upgraded = upgrade_openvino(tmp_path)
    # The openvino cell's lowering, and the validation and benchmark of its program
    # (openvino runs it here); the matrix-wide views of it re-check. Nothing else.
    assert outdated_tasks(project, before, upgraded) == cell_tasks("linreg/openvino/fp32") | PIPELINE_TASKS

    # A comment in the helper: keys are over bytes, so its models rebuild (and nothing breaks).
    comment_helper(project)
    assert outdated_tasks(project, before) == model_cells("direct", "indirect") | PIPELINE_TASKS

    rebuilt_project, run, upgraded = rebuilt
    assert run.started - PIPELINE_TASKS == cell_tasks("linreg/openvino/fp32") | model_cells("direct", "indirect")
    # The upgrade lowered the same program, byte for byte: the manifests name the same bytes (and
    # with no program changed the manifest task stands: test_build_once_rebuild_what_changed.py).
    export = "export:linreg/openvino/fp32"
    assert state(rebuilt_project, export)["info"]["sha256"] == state(built, export)["info"]["sha256"]
    assert manifest_hashes(rebuilt_project)["linreg/openvino/fp32"] == manifest_hashes(built)["linreg/openvino/fp32"]
    rows = {r["cell"]: r["status"] for r in json.loads((rebuilt_project.out / "summary.json").read_text())}
    assert set(rows.values()) == {"provisional"} and len(rows) == 5, rows
    assert listed_status(rebuilt_project.doit("list", "--all", "--status", extra_env=upgraded)) == before


QNN_PIPELINE = """\
name: t
models:
  linreg:
    python: models.linreg:build
    inputs: [{shape: [1, 4]}]
backends:
  xnnpack: {}
  qnn: {}
  coreml: {}
quantization: [fp32, int8]
"""


def all_keys(pipeline: Path) -> dict:
    """Every task's key for the plan, by task name (what `doit` compares with its records)."""
    plan = resolve(pipeline, DigestCache(pipeline.parent / "digests.json"))
    keys = {}
    for cell in plan.cells:
        for stage in ("capture", "quantize", "export", "validate", "benchmark"):
            if stage != "quantize" or cell.transform:
                spec = spec_of(plan, stage, cell, host={})
                keys[spec.name] = spec.key
    return keys


def changed(a: dict, b: dict) -> set:
    return {t for t in a if a[t] != b[t]}


def test_sdk_version_file_changes_only_that_backends_keys(tmp_path, monkeypatch):
    project = make_project(tmp_path / "proj", QNN_PIPELINE)
    sdk = tmp_path / "qairt" / "2.37.0"
    (sdk / "lib").mkdir(parents=True)
    (sdk / "sdk.yaml").write_text("name: qairt\nversion: 2.37.0.250724\n")
    (sdk / "lib" / "libQnnHtp.so").write_bytes(b"\0" * 64)
    monkeypatch.setenv("QNN_SDK_ROOT", str(sdk))
    first = all_keys(project.pipeline)
    qnn_tasks = {t for t in first if "/qnn/" in t}
    assert {"export:linreg/qnn/fp32", "validate:linreg/qnn/fp32"} <= qnn_tasks  # int8 is refused for QNN

    (sdk / "sdk.yaml").write_text("name: qairt\nversion: 2.38.0.250901\n")
    upgraded = all_keys(project.pipeline)
    assert changed(first, upgraded) == qnn_tasks

    # The same SDK elsewhere gives the same keys: the path is not part of them.
    moved = tmp_path / "elsewhere" / "qnn"
    shutil.copytree(sdk, moved)
    monkeypatch.setenv("QNN_SDK_ROOT", str(moved))
    assert all_keys(project.pipeline) == upgraded

    # Without a version file, the listing (names, sizes) stands for the SDK.
    (moved / "sdk.yaml").unlink()
    listed = all_keys(project.pipeline)
    assert changed(upgraded, listed) == qnn_tasks
    (moved / "lib" / "libQnnHtp.so").write_bytes(b"\0" * 65)
    assert changed(listed, all_keys(project.pipeline)) == qnn_tasks


def test_scheme_tools_join_only_the_quantize_keys_of_their_entry(tmp_path, monkeypatch):
    """int8 declares coremltools for its coreml entry only: a coremltools upgrade redoes the
    Core ML quantization and lowering, never the XNNPACK ones."""
    project = make_project(tmp_path / "proj", QNN_PIPELINE)
    first = all_keys(project.pipeline)
    monkeypatch.syspath_prepend(str(fake_distribution(tmp_path / "site", "coremltools", "9.0.post999")))
    upgraded = all_keys(project.pipeline)
    assert changed(first, upgraded) == {
        "quantize:linreg/int8/coreml_int8",
        "export:linreg/coreml/int8",
        "validate:linreg/coreml/int8",
        "benchmark:linreg/coreml/int8",
        "export:linreg/coreml/fp32",
        "validate:linreg/coreml/fp32",
        "benchmark:linreg/coreml/fp32",
    }


def write_recipe(root: Path, kind_dir: str, name: str, text: str) -> None:
    (root / kind_dir).mkdir(parents=True, exist_ok=True)
    (root / kind_dir / f"{name}.yaml").write_text(text)


@pytest.mark.parametrize(
    "kind_dir,kind,text,line,key,message",
    [
        (
            "quantization",
            "quantization",
            "backends:\n  xnnpack: {dtype: float16}\ntools:\n  quantize:\n    xnnpak: {python: [numpy]}\n",
            8,
            "tools.quantize.xnnpak",
            "not an entry of 'backends'",
        ),
        ("backends", "backend", "partitioner: null\ntools:\n  quantize: {}\n", 6, "tools.quantize", "not 'quantize'"),
        (
            "backends",
            "backend",
            "partitioner: null\ntools:\n  lowering: {python: numpy}\n",
            6,
            "tools.lowering.python",
            "expected a list of Python distribution names",
        ),
        (
            "backends",
            "backend",
            "partitioner: null\ntools:\n  lowering: {sdks: [{version_files: [x]}]}\n",
            6,
            "tools.lowering.sdks[0]",
            "missing required key 'env'",
        ),
    ],
)
def test_bad_tools_block_is_a_file_line_error(tmp_path, kind_dir, kind, text, line, key, message):
    write_recipe(tmp_path / "recipes", kind_dir, "r", f"name: r\nkind: {kind}\ndescription: x\n" + text)
    with pytest.raises(PipelineError) as err:
        load_recipe(kind, "r", RecipePath((tmp_path / "recipes",)))
    assert err.value.line == line and err.value.key == key and message in err.value.message, str(err.value)


def test_every_shipped_recipe_loads_with_its_tools():
    for kind, directory in (("backend", "backends"), ("quantization", "quantization")):
        for path in (REPO / "recipes" / directory).glob("*.yaml"):
            assert load_recipe(kind, path.stem) is not None


# --------------------------------------------------------------------------- model code in keys


def run_program(pte: Path, x):
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(pte.read_bytes())
    (out,) = program.load_method("forward").execute([x])
    return out


def test_edited_helper_module_rebuilds_exactly_the_models_that_import_it(built, rebuilt, tmp_path):
    """Alone (listed), then in one run with the changes of
    test_upgraded_compiler_and_commented_helper_rebuild_exactly_their_cells (`rebuilt`)."""
    import torch

    alone = copy_project(built, tmp_path / "proj")
    edit_helper(alone)
    listed = listed_status(alone.doit("list", "--all", "--status"))
    assert {t for t in listed if listed[t] == "R" and ":" in t} == model_cells("direct", "indirect")
    project, run, upgraded = rebuilt
    assert run.started - PIPELINE_TASKS - cell_tasks("linreg/openvino/fp32") == model_cells("direct", "indirect")

    x = torch.linspace(-1, 1, 8).reshape(1, 8)
    torch.testing.assert_close(run_program(project.out / "direct" / "direct_xnnpack_fp32.pte", x), torch.relu(x * -3.0))
    torch.testing.assert_close(
        run_program(project.out / "indirect" / "indirect_xnnpack_fp32.pte", x), torch.tanh(x * -3.0)
    )
    for model in ("direct", "indirect"):
        numerics = json.loads((project.out / model / f"{model}_xnnpack_fp32.numerics.json").read_text())
        assert numerics["passed"] is True

    # The next run executes nothing and hashes or parses nothing: the memo stays as it is.
    memo = project.root / "artifacts" / ".etforge" / "digests.json"
    memo_before = memo.read_bytes()
    again = project.doit(extra_env=upgraded)
    assert again.returncode == 0 and again.started == set(), again.stdout
    assert memo.read_bytes() == memo_before


def test_import_walk_finds_project_modules_only(tmp_path):
    root = tmp_path / "proj"
    files = {
        "models/__init__.py": "",
        "models/net.py": "import os\nimport torch\nfrom .parts import head as h\nfrom models.util import *\n"
        "def build():\n    import models.lazy.deep as d\n    from ..outside import x\n",
        "models/parts/__init__.py": "from . import shared\n",
        "models/parts/head.py": "import models.parts\n",
        "models/parts/shared.py": "CONST = 1\n",
        "models/util.py": "from models import sibling  # a name or a module: here a module\n",
        "models/sibling.py": "def f(:\n",  # a syntax error: kept, but walked no further
        "models/lazy/deep.py": "from .. import parts\n",  # lazy/ is a namespace package
        "models/unused.py": "",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    reached = {p.relative_to(root.resolve()).as_posix() for p in project_files([root / "models" / "net.py"], root)}
    assert reached == {
        "models/net.py",
        "models/__init__.py",
        "models/parts/__init__.py",
        "models/parts/head.py",
        "models/parts/shared.py",
        "models/util.py",
        "models/sibling.py",
        "models/lazy/deep.py",
    }


def test_model_key_names_each_imported_module(tmp_path):
    project = make_project(tmp_path / "proj", PIPELINE)
    write_models(project)
    plan = resolve(project.pipeline, DigestCache(tmp_path / "digests.json"))
    modules = {name: set(m.source["modules"]) for name, m in plan.models.items()}
    assert modules == {
        "linreg": {"models/__init__.py"},
        "direct": {"models/__init__.py", "models/layers.py"},
        "indirect": {"models/__init__.py", "models/layers.py", "models/middle.py"},
        "plain": {"models/__init__.py"},
    }

"""etforge as an installed tool: a wheel built from this repository, installed into a fresh venv,
scaffolds a project anywhere and builds it there, beside a project's own ``tasks`` module.

The venv gets etforge from its wheel alone (no network); torch, executorch and the rest are
the ones this suite runs with, made visible through a ``.pth`` file, since downloading 2 GB
again would test PyPI, not etforge.
"""

from __future__ import annotations

import json
import shutil
import site
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
from conftest import REPO


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The bin/ directory of a fresh venv with etforge installed from its wheel."""
    base = tmp_path_factory.mktemp("install")
    # A copy of what the wheel is built from: setuptools writes build/ and *.egg-info into its source.
    source = base / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "tasks", "schemas", "recipes", "templates"):
        copy = shutil.copytree if (REPO / name).is_dir() else shutil.copy2
        copy(
            REPO / name,
            source / name,
            **({"ignore": shutil.ignore_patterns("__pycache__")} if copy is shutil.copytree else {}),
        )
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(base / "dist"),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (base / "dist").glob("etforge-*.whl")
    venv.EnvBuilder(with_pip=True).create(base / "venv")
    bin_dir = base / "venv" / "bin"
    target = subprocess.run(
        [str(bin_dir / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(target, "toolchain.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    install = subprocess.run(
        [str(bin_dir / "pip"), "install", "-q", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr
    return bin_dir


def wheel_names(bin_dir: Path) -> list:
    (wheel,) = (bin_dir.parent.parent / "dist").glob("etforge-*.whl")
    return zipfile.ZipFile(wheel).namelist()


def test_wheel_contents(installed):
    names = wheel_names(installed)
    for expected in (
        "etforge/schemas/pipeline.schema.json",
        "etforge/recipes/backends/xnnpack.yaml",
        "etforge/recipes/quantization/int8.yaml",
        "etforge/templates/models.g.dart.j2",
        "etforge/app/scaffold/pipeline.yaml",
        "etforge/builders/lowering/lower.py",
    ):
        assert expected in names, expected
    assert not any(n.startswith(("tests/", "tasks/", "models/", "artifacts/")) for n in names)


@pytest.mark.parametrize("own_tasks", [False, True], ids=["plain", "with-own-tasks-module"])
def test_init_then_validate_in_a_project_outside_the_repository(installed, tmp_path, own_tasks):
    project = tmp_path / "app"
    init = subprocess.run(
        [str(installed / "etforge"), "init", str(project)], capture_output=True, text=True, timeout=120
    )
    assert init.returncode == 0, init.stderr
    if own_tasks:  # a Celery/invoke project's own `tasks` module, which its model code imports
        (project / "tasks.py").write_text("SCALE = 2.0\n")
        factory = project / "models" / "tiny_classifier.py"
        factory.write_text(
            factory.read_text()
            .replace("from torch import nn\n", "import tasks\nfrom torch import nn\n")
            .replace("nn.Linear(8, num_classes),", "nn.Linear(8, num_classes * int(tasks.SCALE)),")
        )
    run = subprocess.run(
        [str(installed / "etforge"), "validate", "target", "--backends", "xnnpack"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    rows = {r["cell"]: r for r in json.loads((project / "artifacts" / "my-app-models" / "summary.json").read_text())}
    # lowered, run and matched eager here; and judged on the aarch64 cores, or said why not
    assert rows["tiny_classifier/xnnpack/fp32"]["status"] == "provisional", rows
    assert (project / "artifacts" / "my-app-models" / "tiny_classifier" / "tiny_classifier_xnnpack_fp32.pte").is_file()
    again = subprocess.run(
        [str(installed / "etforge"), "validate", "target", "--backends", "xnnpack"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert again.returncode == 0 and "start " not in again.stdout, again.stdout

"""Fixtures of the unit tier: a guard that torch stays out, a clean environment, a project."""

from __future__ import annotations

import pytest

from unit.fake_builders import heavy_modules
from unit.support import UnitProject, make_unit_project

# What the environment could say that would change a plan under a test.
ENVIRONMENT = (
    "ETFORGE_PIPELINE",
    "ETFORGE_CACHE_REMOTE",
    "ETFORGE_CACHE_READ_ONLY",
    "ETFORGE_CACHE_KEY",
    "QNN_SDK_ROOT",
    "DOIT_FILE",
    "ETFORGE_WORKER_LABELS",
)


@pytest.fixture(autouse=True, scope="module")
def _imports_no_torch():
    """Each module of the unit tier imports no heavy package while its tests run.

    Per module: pytest-xdist (``--dist loadfile``) may run another tier's file in the same
    worker first, so what counts is what this module's tests added. (Importing the
    modules themselves is checked by test_unit_imports.py, in a fresh interpreter.)
    """
    before = heavy_modules()
    yield
    added = heavy_modules() - before
    assert not added, f"the unit tier imported {sorted(added)}"


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch):
    for name in ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def unit_project(tmp_path) -> UnitProject:
    return make_unit_project(tmp_path / "proj")

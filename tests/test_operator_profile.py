"""A cell's per-operator profile: the export keeps an ETRecord, the benchmark an ETDump of a few traced
runs, and bench.json holds where the time went (etforge.builders.bench.profile).

The token tagger's embedding runs in a portable kernel and its MLP in XNNPACK (export.json says
so), so its profile has both kinds of call.
"""

from __future__ import annotations

import json
import math
import warnings

import pytest

from tests.conftest import make_project, state

PIPELINE = """\
name: t
version: 0.0.1
models:
  tagger:
    python: models.token_tagger:build
    kwargs: {vocab: 100}
    inputs: [{name: ids, shape: [1, 12], dtype: int64}]
backends:
  xnnpack: {}
quantization: [fp32]
benchmark: {warmup: 1, iterations: 3}
targets: false
"""
CELL = "tagger/xnnpack/fp32"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("profile") / "proj", PIPELINE)
    run = project.doit()  # every stage: the report shows the profile
    assert run.returncode == 0, run.stdout + run.stderr
    return project


def _cell_file(project, suffix: str):
    found = sorted((project.out / "tagger").glob(f"*{suffix}"))
    assert len(found) == 1, found
    return found[0]


def test_the_program_leaves_an_operator_outside_xnnpack(built):
    export = json.loads(_cell_file(built, ".export.json").read_text())
    delegation = next(c for c in export["checks"] if c["check"] == "delegation")
    assert delegation["not_delegated"] == {"aten.embedding": 1}


def test_the_benchmark_record_holds_the_profile(built):
    profile = state(built, f"benchmark:{CELL}")["info"]["profile"]
    assert "note" not in profile, profile
    assert profile["runs"] == 5
    assert profile["delegate_calls"] == 1 and profile["portable_calls"] >= 1
    assert profile["delegate_ms"] > 0 and profile["portable_ms"] > 0
    assert profile["delegate_ms"] + profile["portable_ms"] <= profile["total_ms"] * 1.05
    kinds = {op["kind"] for op in profile["top"]}
    assert kinds == {"delegate", "portable"}
    names = [op["name"] for op in profile["top"]]
    assert any(n.startswith("XnnpackBackend: ") and "aten.linear.default" in n for n in names), names
    assert "aten.embedding.default" in names
    embed = next(op for op in profile["top"] if op["name"] == "aten.embedding.default")
    assert embed["module"] == "embed (Embedding)"  # mapped to the model's module through the ETRecord
    ms = [op["ms"] for op in profile["top"]]
    assert ms == sorted(ms, reverse=True) and all(math.isfinite(m) and m > 0 for m in ms)
    bench = json.loads(_cell_file(built, ".bench.json").read_text())
    assert bench["profile"] == profile


def test_the_kept_etdump_and_etrecord_open_in_the_inspector(built):
    from executorch.devtools import Inspector

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        inspector = Inspector(
            etdump_path=str(_cell_file(built, ".etdump")), etrecord=str(_cell_file(built, ".etrecord"))
        )
    names = [e.name for block in inspector.event_blocks for e in block.events]
    assert "DELEGATE_CALL" in names and "OPERATOR_CALL" in names


def test_the_report_shows_the_profile(built):
    page = (built.out / "report.html").read_text()
    table = page[page.index('id="profiles"') :]
    table = table[: table.index("</table>")]
    assert f'data-cell="{CELL}"' in table
    assert "delegate: XnnpackBackend: aten.linear.default" in table and "portable: aten.embedding.default" in table
    assert "1 / 1" in table  # delegate / portable calls

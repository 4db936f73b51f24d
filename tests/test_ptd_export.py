"""External weights (.ptd) and self-describing programs, through the real doit pipeline.

One project built once: the same two-layer perceptron under two model names (identical
weights), lowered with `external_weights: true` for XNNPACK and portable, and inline.
"""

from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest

from tests.conftest import make_project, state

PIPELINE = """\
name: t
version: 0.0.1
models:
  mlp_a:
    python: models.mlp:build
    inputs: [{name: x, shape: [1, 16]}]
  mlp_b:
    python: models.mlp:build
    inputs: [{name: x, shape: [1, 16]}]
backends:
  xnnpack: {external_weights: true}
  portable: {external_weights: true}
  inline: {recipe: xnnpack}
quantization: [fp32]
matrix:
  product: false
  include:
    - {model: mlp_a}
    - {model: mlp_b, backend: xnnpack}
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("ptd") / "proj", PIPELINE)
    run = project.doit()
    assert run.returncode == 0, run.stdout + run.stderr
    return project


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _eager(project, x):
    import torch

    from models.mlp import build  # the repository's copy: the project's is the same file
    from tasks.build.model_loading import SEED

    torch.manual_seed(SEED)
    return build().eval()(torch.from_numpy(x)).detach().numpy()


@pytest.mark.parametrize("backend", ["xnnpack", "portable"])
def test_pte_and_ptd_load_and_match_eager(built, backend):
    from tasks.build.program_io import load_method
    from tasks.store.program_meta import read_meta

    pte = built.out / "mlp_a" / f"mlp_a_{backend}_fp32.pte"
    ptd = pte.with_suffix(".ptd")
    inline = built.out / "mlp_a" / "mlp_a_inline_fp32.pte"
    assert ptd.stat().st_size > 8 * 1024, "the weights went to the .ptd"
    assert pte.stat().st_size < inline.stat().st_size / 3, "the program shrank"
    assert read_meta(pte.read_bytes())["data_file"] == {"sha256": _sha(ptd)}
    x = np.random.default_rng(0).standard_normal((1, 16)).astype(np.float32)
    import torch

    program, method = load_method(pte, data_path=ptd)
    out = method.execute([torch.from_numpy(x)])[0].detach().numpy()
    np.testing.assert_allclose(out, _eager(built, x), rtol=1e-4, atol=1e-5)
    validated = state(built, f"validate:mlp_a/{backend}/fp32")  # the pipeline's own run, with the .ptd
    assert validated["status"] == "ok" and validated["info"]["sqnr_db"] > 100


@pytest.mark.parametrize("backend", ["xnnpack", "portable"])
def test_program_without_its_ptd_is_a_clear_error(built, backend, tmp_path):
    from tasks.build.program_io import load_method
    from tasks.store.program_meta import ProgramMetaError

    pte = shutil.copy(built.out / "mlp_a" / f"mlp_a_{backend}_fp32.pte", tmp_path / "lonely.pte")
    with pytest.raises(ProgramMetaError, match=r"keeps its weights in a separate \.ptd .* not given"):
        load_method(pte)  # XNNPACK would segfault in load_method without the check
    other = built.out / "mlp_a" / f"mlp_a_{'portable' if backend == 'xnnpack' else 'xnnpack'}_fp32.ptd"
    with pytest.raises(ProgramMetaError, match="needs the .ptd with sha256"):
        load_method(pte, data_path=other)  # portable would run silently with the wrong weights


def test_identical_weights_share_one_ptd(built):
    a = built.out / "mlp_a" / "mlp_a_xnnpack_fp32.ptd"
    b = built.out / "mlp_b" / "mlp_b_xnnpack_fp32.ptd"
    assert _sha(a) == _sha(b)
    assert not (built.out / "mlp_a" / "mlp_a_inline_fp32.ptd").exists()


def test_metadata_read_back_from_the_program_matches_the_manifest(built):
    from tasks.build.program_io import load_method
    from tasks.store.program_meta import META_METHOD, VERSION_METHOD, META_VERSION

    index = json.loads((built.out / "manifests" / "index.json").read_text())
    entries = {e["name"]: e for e in index["models"]}
    for name, entry in entries.items():
        pte = built.out / entry["modelName"] / name
        program, _ = load_method(pte)  # executes the constant methods in the runtime, as an app would
        meta = json.loads(program.load_method(META_METHOD).execute([])[0])
        assert program.load_method(VERSION_METHOD).execute([])[0] == META_VERSION
        assert (meta["model"], meta["backend"], meta["scheme"]) == (
            entry["modelName"], entry["backend"], entry["quantization"])
        assert meta["methods"] == entry["methods"]
        assert meta["methods"] == [{"name": "forward",
                                    "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 16]}],
                                    "outputs": [{"name": "output_0", "path": "", "shape": [1, 4],
                                                 "dtype": "float32"}]}]

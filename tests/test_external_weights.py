"""External weights (.ptd) and self-describing programs, through the real doit pipeline.

One project built once (module fixture): the same two-layer perceptron under two model names
(identical weights), lowered with `external_weights: true` for XNNPACK and portable, and
inline; a two-method model (no forward) with external weights on portable. Tests that change
the project work on a copy (copy_project).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time

import numpy as np
import pytest
from conftest import REPO, check, copy_project, make_project, state

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
  seq2seq:
    python: models.encoder_decoder:build
    methods:
      encode: {inputs: [{name: x, shape: [1, 8, 16]}]}
      decode: {inputs: [{name: ids, shape: [1, 4], dtype: int64, range: [0, 20]}, {name: memory, shape: [1, 16]}]}
backends:
  xnnpack: {external_weights: true}
  portable: {external_weights: true}
  inline: {recipe: xnnpack}
quantization: [fp32]
targets: false  # aarch64 verdicts: tests/test_aarch64_targets.py
matrix:
  product: false
  include:
    - {model: mlp_a}
    - {model: mlp_b, backend: xnnpack}
    - {model: seq2seq, backend: portable}
"""
SHARED = ("mlp_a/xnnpack/fp32", "mlp_b/xnnpack/fp32")  # identical weights: one .ptd


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

    from etforge.builders.loading.model_loading import SEED
    from models.mlp import build  # the repository's copy: the project's is the same file

    torch.manual_seed(SEED)
    return build().eval()(torch.from_numpy(x)).detach().numpy()


@pytest.mark.parametrize("backend", ["xnnpack", "portable"])
def test_pte_and_ptd_load_and_match_eager(built, backend):
    from etforge.builders.runtime.program_io import load_method
    from etforge.program.metadata import read_meta

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
    assert validated["status"] == "ok" and check(validated["info"], "numerics")["sqnr_db"] > 100


@pytest.mark.parametrize("backend", ["xnnpack", "portable"])
def test_program_without_its_ptd_is_a_clear_error(built, backend, tmp_path):
    from etforge.builders.runtime.program_io import load_method
    from etforge.program.metadata import ProgramMetaError

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
    from etforge.builders.runtime.program_io import load_program
    from etforge.program.metadata import META_METHOD, META_VERSION, VERSION_METHOD

    index = json.loads((built.out / "manifests" / "index.json").read_text())
    entries = {e["name"]: e for e in index["models"]}
    assert len(entries) == 5
    for name, entry in entries.items():
        pte = built.out / entry["modelName"] / name
        program = load_program(pte)  # executes the constant methods in the runtime, as an app would
        meta = json.loads(program.load_method(META_METHOD).execute([])[0])
        assert program.load_method(VERSION_METHOD).execute([])[0] == META_VERSION
        assert (meta["model"], meta["backend"], meta["scheme"]) == (
            entry["modelName"],
            entry["backend"],
            entry["quantization"],
        )
        assert meta["methods"] == entry["methods"]
        assert (meta["data_file"] or {}).get("sha256", "")[:16] == (entry["dataFile"] or "")[:16]
    assert entries["mlp_a_xnnpack_fp32.pte"]["methods"] == [
        {
            "name": "forward",
            "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 16]}],
            "outputs": [{"name": "output_0", "path": "", "shape": [1, 4], "dtype": "float32"}],
        }
    ]
    encode, decode = entries["seq2seq_portable_fp32.pte"]["methods"]
    assert (encode["name"], decode["name"]) == ("encode", "decode")
    assert decode["inputs"][0] == {"name": "ids", "shape": [1, 4], "dtype": "int64", "range": [0, 20]}


# ---------------------------------------------------------------- shared .ptd in the manifests and the release


def _ptd_sha(project, cell: str) -> str:
    model, backend, quant = cell.split("/")
    return _sha(project.out / model / f"{model}_{backend}_{quant}.ptd")


def test_identical_weights_ship_one_ptd_named_by_its_sha256(built):
    manifests = built.out / "manifests"
    index = json.loads((manifests / "index.json").read_text())
    sha = _ptd_sha(built, SHARED[0])
    name = f"{sha[:16]}.ptd"
    shared = [d for d in index["dataFiles"] if d["hash"] == sha]
    assert len(shared) == 1 and shared[0]["name"] == name
    assert shared[0]["programs"] == ["mlp_a_xnnpack_fp32.pte", "mlp_b_xnnpack_fp32.pte"]
    assert shared[0]["size"] == (built.out / "mlp_a" / "mlp_a_xnnpack_fp32.ptd").stat().st_size
    # Every distinct .ptd once: the shared one, mlp_a's portable one, seq2seq's.
    assert len(index["dataFiles"]) == len({d["hash"] for d in index["dataFiles"]}) == 3
    entries = {e["name"]: e for e in index["models"]}
    assert entries["mlp_a_xnnpack_fp32.pte"]["dataFile"] == entries["mlp_b_xnnpack_fp32.pte"]["dataFile"] == name
    assert entries["mlp_a_inline_fp32.pte"]["dataFile"] is None
    for entry in entries.values():  # each variant names the file its program says it needs
        meta = read_meta_of(built.out / entry["modelName"] / entry["name"])
        needed = (meta["data_file"] or {}).get("sha256")
        assert entry["dataFile"] == (f"{needed[:16]}.ptd" if needed else None)
    # The Flutter side lists it once too: pubspec assets and the Dart asset list.
    pubspec = (manifests / "pubspec_assets.yaml").read_text()
    assert pubspec.count(f"assets/models/{name}") == 1
    dart = (manifests / "models.g.dart").read_text()
    assert dart.count(f"\n    'assets/models/{name}',\n") == 1  # EtforgeModels.assets
    assert dart.count(f"dataAsset: 'assets/models/{name}'") == 2  # the two variants that need it
    cmake = (manifests / "models.cmake").read_text()
    assert f'set(ETFORGE_MLP_A_XNNPACK_FP32_DATA_FILE "{name}")' in cmake
    assert cmake.count(f'RENAME "{name}" ') == 1


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
def test_cmake_verifies_the_ptd_each_variant_needs(built, tmp_path):
    script = tmp_path / "probe.cmake"
    script.write_text(
        "cmake_policy(VERSION 3.13)\nset(ETFORGE_INSTALL_MODELS OFF)\ninclude(${MANIFEST})\netforge_verify_models()\n"
        'message("data files: ${ETFORGE_DATA_FILES}")\n'
    )
    models = tmp_path / "models"
    shutil.copytree(built.out, models, ignore=shutil.ignore_patterns("cache", ".state", "release"))

    def probe():
        return subprocess.run(
            ["cmake", f"-DMANIFEST={models / 'manifests' / 'models.cmake'}", "-P", str(script)],
            capture_output=True,
            text=True,
            timeout=120,
        )

    ok = probe()
    assert ok.returncode == 0, ok.stderr
    assert ok.stderr.count(".ptd") == 3  # the one line listing the three distinct files
    (models / "mlp_b" / "mlp_b_xnnpack_fp32.ptd").unlink()
    missing = probe()
    assert missing.returncode != 0
    assert (
        f"etforge: MLP_B_XNNPACK_FP32: its external weights {models}/mlp_b/mlp_b_xnnpack_fp32.ptd are "
        "missing; run `etforge export`"
    ) in " ".join(missing.stderr.split()), missing.stderr


def read_meta_of(pte):
    from etforge.program.metadata import read_meta

    return read_meta(pte.read_bytes())


def test_the_release_packs_each_ptd_once(built, tmp_path):
    project = copy_project(built, tmp_path / "proj")
    run = project.doit("release")
    assert run.returncode == 0, run.stdout + run.stderr
    with tarfile.open(project.root / "artifacts" / "release" / "t-0.0.1.tar.gz") as tar:
        names = [n.split("/", 1)[1] for n in tar.getnames() if n.endswith(".ptd")]
        sums = tar.extractfile("t-0.0.1/SHA256SUMS").read().decode()
        sha = _ptd_sha(built, SHARED[0])
        shared = tar.extractfile(f"t-0.0.1/models/{sha[:16]}.ptd").read()
    assert sorted(names) == sorted(
        f"models/{d['name']}" for d in json.loads((built.out / "manifests" / "index.json").read_text())["dataFiles"]
    )
    assert len(names) == 3 and hashlib.sha256(shared).hexdigest() == sha
    assert f"{sha}  models/{sha[:16]}.ptd\n" in sums


def test_a_doctored_program_fails_doit_manifest_naming_the_cell_and_field(built, tmp_path):
    project = copy_project(built, tmp_path / "proj")
    pte = project.out / "mlp_a" / "mlp_a_portable_fp32.pte"
    st = pte.stat()
    data = pte.read_bytes()
    doctored = data.replace(
        b'"name": "x", "shape": [1, 16], "dtype": "float32"', b'"name": "x", "shape": [1, 16], "dtype": "float64"'
    )
    assert doctored != data and len(doctored) == len(data)  # same length: the flatbuffer stays valid
    pte.write_bytes(doctored)
    os.utime(pte, ns=(st.st_atime_ns, st.st_mtime_ns))  # its export stays up to date
    run = project.doit("manifest")
    assert run.returncode != 0
    assert (
        "etforge: error: manifest: mlp_a/portable/fp32: forward.inputs[x].dtype: the program says "
        "'float64', the manifest 'float32'"
    ) in run.stderr.splitlines(), run.stderr


# ---------------------------------------------------------------- the export key: names the program embeds


def test_a_renamed_model_reuses_its_capture_and_quantized_graph_and_is_lowered_again(tmp_path):
    from etforge.config.resolve import resolve
    from etforge.pipeline.specs import spec_of

    text = (
        "name: t\nmodels:\n  {name}:\n    python: models.linreg:build\n    inputs: [{{shape: [1, 4]}}]\n"
        "backends:\n  xnnpack: {{}}\nquantization: [fp32, int8]\n"
    )
    keys = {}
    for name in ("before", "after"):
        project = make_project(tmp_path / name, text.format(name=name))
        plan = resolve(project.pipeline)
        keys[name] = {
            (stage, cell.quant.name): spec_of(plan, stage, cell, host={}).key
            for cell in plan.cells
            for stage in ("capture", "quantize", "export")
            if stage != "quantize" or cell.transform
        }
    before, after = keys["before"], keys["after"]
    assert before.keys() == after.keys() and ("quantize", "int8") in before
    for (stage, quant), key in before.items():
        # capture and quantize are name-free (reused); the program embeds its names (lowered again)
        assert (after[(stage, quant)] == key) == (stage != "export"), (stage, quant)


# ---------------------------------------------------------------- cpp/runner with a data map


def _records(stdout: str, kind: str) -> list:
    out = []
    for line in stdout.splitlines():
        k, *fields = line.split("\t")
        if k == kind:
            out.append(dict(f.split("=", 1) for f in fields))
    return out


@pytest.fixture(scope="module")
def runner(built, tmp_path_factory):
    """cpp/runner built against the project's etforge_models.h (tree layout: the .ptd beside each .pte)."""
    if shutil.which("cmake") is None or shutil.which("c++") is None:
        pytest.skip("cmake and a C++ compiler are needed to build cpp/runner")
    build = tmp_path_factory.mktemp("ptd_runner") / "build"
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    start = time.monotonic()
    for args in (
        [
            "-S",
            str(REPO / "cpp" / "runner"),
            "-B",
            str(build),
            *generator,
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DETFORGE_MODELS_HEADER={built.out / 'manifests' / 'etforge_models.h'}",
            f"-DETFORGE_PYTHON={sys.executable}",
        ],
        ["--build", str(build), "--parallel", "2"],
    ):
        done = subprocess.run(["cmake", *args], capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout + done.stderr
    print(f"\nrunner configured and built in {time.monotonic() - start:.1f}s")
    return build / "etforge_runner"


def _run(runner, models_dir, *args):
    return subprocess.run(
        [str(runner), "--models-dir", str(models_dir), "--warmup", "1", "--iterations", "3", "--values", "-1", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_cpp_runner_loads_the_program_with_its_ptd_and_matches_python(built, runner):
    from etforge.builders.runtime.program_io import load_method

    done = _run(runner, built.out, "mlp_a")
    assert done.returncode == 0, done.stdout + done.stderr
    variants = {v["id"]: v for v in _records(done.stdout, "variant")}
    assert {v["status"] for v in variants.values()} == {"ok"} and len(variants) == 3
    assert variants["mlp_a/xnnpack/fp32"]["data_file"].endswith("mlp_a/mlp_a_xnnpack_fp32.ptd")
    assert variants["mlp_a/inline/fp32"]["data_file"] == ""
    outputs = {o["id"]: np.array([float(v) for v in o["values"].split(",")]) for o in _records(done.stdout, "output")}
    inline = outputs["mlp_a/inline/fp32"]
    assert np.isfinite(inline).all() and np.abs(inline).max() > 0
    x = np.random.default_rng(3).standard_normal((1, 16)).astype("<f4")
    given = built.out.parent / "x.bin"
    given.write_bytes(x.tobytes())
    with_input = _run(runner, built.out, "--input", str(given), "mlp_a")
    got = {o["id"]: np.array([float(v) for v in o["values"].split(",")]) for o in _records(with_input.stdout, "output")}
    for backend in ("xnnpack", "portable"):  # the pair through the C++ data map == Python's == eager
        np.testing.assert_allclose(outputs[f"mlp_a/{backend}/fp32"], inline, rtol=1e-5, atol=1e-6)
        program, method = load_method(built.out / "mlp_a" / f"mlp_a_{backend}_fp32.pte")
        import torch

        expected = method.execute([torch.from_numpy(x)])[0].numpy().reshape(-1)
        np.testing.assert_allclose(got[f"mlp_a/{backend}/fp32"], expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[f"mlp_a/{backend}/fp32"], _eager(built, x).reshape(-1), rtol=1e-4, atol=1e-5)
        del method, program


def test_cpp_runner_without_the_ptd_is_one_clear_line(built, runner, tmp_path):
    models = tmp_path / "models"
    shutil.copytree(built.out / "mlp_a", models / "mlp_a")
    (models / "mlp_a" / "mlp_a_xnnpack_fp32.ptd").unlink()
    done = _run(runner, models, "mlp_a")
    assert done.returncode == 1, done.stdout + done.stderr  # a variant failed; nothing crashed
    variants = {v["id"]: v for v in _records(done.stdout, "variant")}
    reason = variants["mlp_a/xnnpack/fp32"]["reason"]
    sha = _ptd_sha(built, SHARED[0])
    assert variants["mlp_a/xnnpack/fp32"]["status"] == "failed"
    assert reason.startswith(
        f"the program keeps its weights in {models}/mlp_a/mlp_a_xnnpack_fp32.ptd (sha256 {sha}), which cannot be read"
    ), reason
    assert reason.endswith("; pass --data FILE.ptd"), reason
    assert variants["mlp_a/portable/fp32"]["status"] == "ok"
    other = built.out / "mlp_a" / "mlp_a_portable_fp32.ptd"  # --data with another program's weights
    wrong = _run(runner, models, "--data", str(other), "mlp_a")
    reason = {v["id"]: v for v in _records(wrong.stdout, "variant")}["mlp_a/xnnpack/fp32"]["reason"]
    assert reason == f"the program needs the .ptd with sha256 {sha}, {other} has {_sha(other)}"
    given = _run(runner, models, "--data", str(built.out / "mlp_b" / "mlp_b_xnnpack_fp32.ptd"), "mlp_a")
    assert {v["id"]: v for v in _records(given.stdout, "variant")}["mlp_a/xnnpack/fp32"]["status"] == "ok"


def test_cpp_runner_runs_the_first_method_of_a_program_without_forward(built, runner):
    done = _run(runner, built.out, "seq2seq")
    assert done.returncode == 0, done.stdout + done.stderr
    (variant,) = _records(done.stdout, "variant")
    assert variant["status"] == "ok" and variant["method"] == "encode", variant
    assert variant["data_file"].endswith("seq2seq/seq2seq_portable_fp32.ptd")


def test_the_size_gate_sees_through_the_names_a_program_carries(built):
    from types import SimpleNamespace

    from etforge.builders.gates.gates import size_gate
    from etforge.pipeline.stage_results import ExportResult
    from etforge.program.metadata import without_meta

    a, b = (built.out / m / f"{m}_xnnpack_fp32.pte" for m in ("mlp_a", "mlp_b"))
    assert a.read_bytes() != b.read_bytes() and without_meta(a.read_bytes()) == without_meta(b.read_bytes())
    infos = [state(built, f"export:{m}/xnnpack/fp32")["info"] for m in ("mlp_a", "mlp_b")]
    assert (
        infos[0]["sha256_without_metadata"] == infos[1]["sha256_without_metadata"]
        and infos[0]["data_size_bytes"] > 8 * 1024
    )
    cell = SimpleNamespace(
        size_gate={"weights": ["linear"], "max_ratio": 0.4},
        quant=SimpleNamespace(name="int8"),
        model=SimpleNamespace(name="mlp_b"),
    )
    gate = size_gate(
        cell, ExportResult.from_json(infos[1]), ExportResult.from_json(infos[0]), {"all": 10000, "linear": 10000}
    )
    assert gate.reason() == "identical to its fp32 sibling but for the names it carries: int8 was not applied"
    assert gate.size_vs_fp32 == 1.0  # .pte and .ptd together

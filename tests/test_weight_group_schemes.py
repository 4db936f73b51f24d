"""Weight-group schemes on real architectures, through the real pipeline.

One project, built once: a transformer-ish model whose layers 8da4w/8da8w cannot all
take (a 24-wide linear, MultiheadAttention.out_proj), models they cannot take at all
(rejected, never failed), a token model with a 4-bit quantized embedding, and static
int8 calibration of that token model (models/token_tagger.py) on int64 inputs.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import check, copy_project, make_project, state

PIPELINE = """\
name: t
models:
  mixed:
    python: models.mixed:build
    inputs: [{name: x, shape: [1, 8, 32]}, {name: z, shape: [1, 24]}]
  wide:
    python: models.mixed:wide
    inputs: [{name: x, shape: [1, 64]}]
  narrow:                    # 80 and 48 wide: no group of a multiple of 32 divides either
    python: models.mixed:narrow
    inputs: [{name: z, shape: [1, 80]}]
  convnet:
    python: models.mixed:convnet
    inputs: [{name: image, shape: [1, 3, 8, 8]}]
  lm:                        # ids come from the capture's generator: int64 in [0, 10), valid for 100 rows
    python: models.token_tagger:build
    kwargs: {vocab: 100}
    inputs: [{name: ids, shape: [1, 12], dtype: int64}]
  lm_data:
    python: models.token_tagger:build
    kwargs: {vocab: 100}
    inputs: [{name: ids, shape: [1, 12], dtype: int64}]
    calibration: {npz: data/ids.npz}
backends:
  xnnpack: {}
  coreml: {}
quantization: [fp32, int8, 8da4w, 8da8w, coreml_int4w]
targets: false  # aarch64 verdicts: tests/test_aarch64_targets.py
quantization_options: {8da4w: {embedding: 4}, coreml_int4w: {group_size: 32}}
matrix:
  product: false
  include:
    - {model: mixed, backend: xnnpack, quantization: 8da4w}
    - {model: mixed, backend: xnnpack, quantization: 8da8w}
    - {model: wide, backend: coreml, quantization: coreml_int4w}
    - {model: narrow, backend: xnnpack, quantization: 8da4w}
    - {model: convnet, backend: xnnpack, quantization: 8da8w}
    - {model: lm, backend: xnnpack, quantization: fp32}
    - {model: lm, backend: xnnpack, quantization: 8da4w}
    - {model: lm, backend: xnnpack, quantization: int8}
    - {model: lm_data, backend: xnnpack, quantization: int8}
"""

MODELS = '''\
import torch
from torch import nn


class Mixed(nn.Module):
    """d_model 32 (a multiple of 32) with MultiheadAttention, plus a 24-wide side input (not one)."""

    def __init__(self):
        super().__init__()
        self.enc = nn.TransformerEncoderLayer(d_model=32, nhead=2, dim_feedforward=64, batch_first=True)
        self.side = nn.Linear(24, 32)
        self.head = nn.Linear(32, 10)

    def forward(self, x, z):
        return self.head(self.enc(x) + self.side(z).unsqueeze(1)).mean(1)


def build():
    torch.manual_seed(0)
    return Mixed()


def wide():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 64), nn.ReLU(), nn.Linear(64, 10))


def narrow():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(80, 48), nn.ReLU(), nn.Linear(48, 4))


def convnet():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1))
'''


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("schemes") / "proj", PIPELINE)
    (project.root / "models" / "mixed.py").write_text(MODELS)
    (project.root / "data").mkdir()
    ids = np.random.default_rng(5).integers(0, 100, (8, 1, 12), dtype=np.int64)
    np.savez(project.root / "data" / "ids.npz", ids=ids)
    run = project.doit()
    return project, run


def rows(project) -> dict:
    return {r["cell"]: r for r in json.loads((project.out / "summary.json").read_text())}


def layers(project, model: str, scheme: str, label: str) -> dict:
    return state(project, f"quantize:{model}/{scheme}/{label}")["info"]["layers"]


def index_entry(project, cell: str) -> dict:
    index = json.loads((project.out / "manifests" / "index.json").read_text())
    model, backend, quant = cell.split("/")
    return next(
        e for e in index["models"] if (e["modelName"], e["backend"], e["quantization"]) == (model, backend, quant)
    )


def test_8da4w_gives_the_layers_its_group_cannot_take_8_bit_weights_and_says_which(built):
    project, run = built
    table = rows(project)
    assert table["mixed/xnnpack/8da4w"]["status"] == "provisional", table["mixed/xnnpack/8da4w"]
    info = layers(project, "mixed", "8da4w", "torchao_8da4w")
    assert info["quantized_layers"] == {"linear": ["enc.linear1", "enc.linear2", "head", "side"]}
    assert info["weight_forms"] == {"int4 group 32": 3, "int8 per-channel": 1}
    assert info["fallbacks"] == [
        {
            "layer": "side",
            "weights": "int8 per-channel",
            "reason": "in_features 24 is not a multiple of the group size 32, and no smaller group the backend "
            "takes (a multiple of 32) divides it: the scheme's fallback",
        }
    ]
    # only attention's out_proj stays in float: no form of quantized weight works there
    assert info["kept_float"] == [
        {
            "layer": "enc.self_attn.out_proj",
            "reason": "MultiheadAttention.out_proj (attention transposes its "
            "weight, which a quantized weight does not support)",
        },
    ]
    note = table["mixed/xnnpack/8da4w"]["note"]
    assert "8da4w quantized 4 of 5 layers; kept in float: enc.self_attn.out_proj (MultiheadAttention" in note
    # The program matches the quantized model within the scheme's threshold.
    assert state(project, "validate:mixed/xnnpack/8da4w")["status"] == "ok"
    # The manifests' variant carries the same counts and reasons.
    entry = index_entry(project, "mixed/xnnpack/8da4w")
    assert entry["layers"]["quantized"] == 4 and entry["layers"]["float"] == 1
    assert [e["layer"] for e in entry["layers"]["kept_float"]] == ["enc.self_attn.out_proj"]


def test_an_80_wide_layer_under_8da4w_on_xnnpack_gets_8_bit_per_channel_weights_not_float(built):
    project, _ = built
    info = layers(project, "narrow", "8da4w", "torchao_8da4w")
    assert info["quantized_layers"] == {"linear": ["0", "2"]} and info["kept_float"] == []
    assert info["weight_forms"] == {"int8 per-channel": 2}
    assert info["fallbacks"][0]["layer"] == "0" and info["fallbacks"][0]["weights"] == "int8 per-channel"
    assert "in_features 80 is not a multiple of the group size 32" in info["fallbacks"][0]["reason"]
    assert info["taken_weight_bytes"] == {"linear": (80 * 48 + 48 * 4) * 4}
    # lowered by XNNPACK (every matmul inside) and validated against eager
    delegation = check(state(project, "export:narrow/xnnpack/8da4w")["info"], "delegation")
    assert delegation["compute_coverage"] > 0.9 and "aten.linear" not in delegation["not_delegated"]
    assert state(project, "validate:narrow/xnnpack/8da4w")["status"] == "ok"
    assert rows(project)["narrow/xnnpack/8da4w"]["status"] == "provisional"


def test_a_smaller_group_the_backend_takes_comes_before_8_bit():
    import torch
    from torch import nn

    from etforge.builders.quantization.layer_filter import choose_with_fallback, layers_info
    from etforge.builders.quantization.quantizers import torchao_8da4w, torchao_8da8w

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 192), nn.Linear(192, 96), nn.Linear(96, 80), nn.Linear(80, 48))
    steps = choose_with_fallback(
        model, torchao_8da4w({"group_size": 128}), lambda g: torchao_8da4w({"group_size": g}), 32, torchao_8da8w({})
    )
    info = layers_info([choice for _, choice in steps])
    assert info["weight_forms"] == {"int4 group 128": 1, "int4 group 96": 2, "int8 per-channel": 1}
    got = {e["layer"]: e["weights"] for e in info["fallbacks"]}
    assert got == {"1": "int4 group 96", "2": "int4 group 96", "3": "int8 per-channel"}
    assert info["kept_float"] == []
    # without a fallback declared, what no group divides stays in float, with why
    steps = choose_with_fallback(model, torchao_8da4w({"group_size": 32}), torchao_8da4w, 32, None)
    kept = layers_info([choice for _, choice in steps])["kept_float"]
    assert kept == [
        {
            "layer": "3",
            "reason": "in_features 80 is not a multiple of the group size 32, and no smaller group the backend "
            "takes (a multiple of 32) divides it",
        }
    ]


def test_8da8w_per_channel_takes_every_width_but_not_attention_out_proj(built):
    project, _ = built
    info = layers(project, "mixed", "8da8w", "torchao_8da8w")
    assert info["quantized"] == 4
    assert [e["layer"] for e in info["kept_float"]] == ["enc.self_attn.out_proj"]
    assert rows(project)["mixed/xnnpack/8da8w"]["status"] == "provisional"


def test_core_ml_per_group_int4_keeps_the_layer_the_group_does_not_divide(built):
    project, _ = built
    info = layers(project, "wide", "coreml_int4w", "coreml_weight_only")
    assert info["quantized_layers"] == {"linear": ["0", "4"]}
    assert info["kept_float"] == [{"layer": "2", "reason": "in_features 48 is not a multiple of the group size 32"}]
    # Lowered for Core ML (not runnable here: its bundled program checks itself on the device).
    assert state(project, "export:wide/coreml/coreml_int4w")["status"] == "ok"
    assert rows(project)["wide/coreml/coreml_int4w"]["status"] == "on-device"


def test_a_scheme_that_takes_no_layer_is_rejected_with_the_reason_not_failed(built):
    project, run = built
    table = rows(project)
    assert table["convnet/xnnpack/8da8w"]["status"] == "rejected"
    assert table["convnet/xnnpack/8da8w"]["note"] == "8da8w quantizes linear layers and the model has none"
    # Decided before any quantized graph: nothing lowered, nothing failed, and the run does not fail for them.
    assert state(project, "export:convnet/xnnpack/8da8w")["status"] == "rejected"
    assert "FAILED           quantize:convnet" not in run.stdout and "FAILED           export:convnet" not in run.stdout
    index = json.loads((project.out / "manifests" / "index.json").read_text())
    excluded = {e["cell"]: e for e in index["excluded"]}
    assert excluded["convnet/xnnpack/8da8w"]["status"] == "rejected"


def test_a_second_run_keeps_the_rejections_and_executes_nothing(built, tmp_path):
    project = copy_project(built[0], tmp_path / "copy")  # its own summary.json: the others read the first run's
    again = project.doit("--models", "convnet")
    assert {t for t in again.started if ":" in t} == set(), again.stdout  # only the report of this selection
    assert rows(project)["convnet/xnnpack/8da8w"]["status"] == "rejected"
    assert again.returncode == 0, again.stdout + again.stderr


def test_embedding_quantized_to_4_bits_lowers_runs_and_shrinks_the_program(built):
    project, _ = built
    info = layers(project, "lm", "8da4w", "torchao_8da4w")
    assert info["quantized_layers"] == {"embedding": ["embed"], "linear": ["mlp.0", "mlp.2"]}
    assert state(project, "validate:lm/xnnpack/8da4w")["status"] == "ok"
    assert rows(project)["lm/xnnpack/8da4w"]["status"] == "provisional"
    fp32 = state(project, "export:lm/xnnpack/fp32")["info"]["size_bytes"]
    quantized = state(project, "export:lm/xnnpack/8da4w")["info"]["size_bytes"]
    assert quantized < 0.35 * fp32, (quantized, fp32)  # the 100x64 table dominates: 4 bits + scales


def test_static_int8_of_an_embedding_model_calibrated_on_valid_ids(built):
    project, _ = built
    quantize = state(project, "quantize:lm_data/int8/xnnpack_int8_static")
    assert quantize["status"] == "ok" and quantize["info"]["calibration"] == "npz data/ids.npz"
    assert rows(project)["lm_data/xnnpack/int8"]["status"] == "provisional"


def test_static_int8_of_an_embedding_model_calibrated_on_random_int64_inputs(built):
    project, _ = built
    assert rows(project)["lm/xnnpack/int8"]["status"] == "provisional", rows(project)["lm/xnnpack/int8"]

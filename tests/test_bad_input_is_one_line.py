"""A corpus of malformed and hostile pipeline.yaml files, and the one-line
error each must produce: ``<file>:<line>: <key path>: <what was expected>``.

Most cases call ``etforge.config.resolve.resolve`` in-process (no torch, milliseconds);
a few run ``doit list`` end to end to check what the user actually sees.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from etforge.config.recipes import available  # noqa: E402
from etforge.config.resolve import resolve  # noqa: E402
from etforge.config.selection import select  # noqa: E402
from etforge.core.errors import PipelineError  # noqa: E402

KNOWN_BACKENDS = ", ".join(available("backend"))
KNOWN_SCHEMES = ", ".join(available("quantization"))

# Any case, hostile ones included, must fail at least this fast.
MAX_SECONDS = 5.0

# The valid pipeline most cases start from, by line:
#   1 name: t
#   2 models:
#   3   linreg:
#   4     python: models.linreg:build
#   5     inputs:
#   6       - {name: features, shape: [1, 4], dtype: float32}
#   7 backends:
#   8   xnnpack: {}
#   9 quantization: [fp32]
BASE = """\
name: t
models:
  linreg:
    python: models.linreg:build
    inputs:
      - {name: features, shape: [1, 4], dtype: float32}
backends:
  xnnpack: {}
quantization: [fp32]
"""


def base(*edits: tuple[str, str], append: str = "") -> str:
    """BASE with each (old, new) replaced once; old must occur exactly once."""
    text = BASE
    for old, new in edits:
        assert text.count(old) == 1, f"{old!r} must occur once in BASE"
        text = text.replace(old, new)
    return text + append


WEIGHTS = b"etforge test weights\n"
WEIGHTS_SHA = hashlib.sha256(WEIGHTS).hexdigest()
OTHER_SHA = hashlib.sha256(b"other weights").hexdigest()


def write_weights(root: Path) -> None:
    (root / "weights").mkdir()
    (root / "weights" / "w.bin").write_bytes(WEIGHTS)


def symlink_outside(root: Path) -> None:
    outside = root.parent / "outside"
    outside.mkdir()
    (outside / "w.bin").write_bytes(WEIGHTS)
    (root / "link").symlink_to(outside, target_is_directory=True)


def module_dir_outside(root: Path) -> None:
    outside = root.parent / "outside"
    outside.mkdir()
    (outside / "found.py").write_text("def build():\n    return None\n")
    (root / "ext").symlink_to(outside, target_is_directory=True)


def alias_bomb() -> str:
    # "Billion laughs": 9 levels of 9 aliases each would expand to 9**9 strings.
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for prev, cur in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{cur}: &{cur} [" + ", ".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\n"


VALIDATION_NPZ = base(
    (
        "      - {name: features, shape: [1, 4], dtype: float32}\n",
        "      - {name: features, shape: [1, 4], dtype: float32}\n    validation: {npz: data/val.npz}\n",
    )
)


def write_npz(root: Path, **shapes) -> None:
    import numpy as np

    (root / "data").mkdir()
    np.savez(root / "data" / "val.npz", **{name: np.zeros(shape, np.float32) for name, shape in shapes.items()})


@dataclass
class Case:
    id: str
    text: str | bytes  # the pipeline.yaml content
    expected: str  # exact str(PipelineError), with the file shown as "pipeline.yaml"
    setup: Callable[[Path], None] | None = None  # extra files in the project
    xfail: str | None = None  # a known bug outside this test's reach, see reason


CASES = [
    # --- YAML syntax ---------------------------------------------------------
    Case(
        "yaml-bad-indentation",
        "name: t\nmodels:\n  linreg:\n    python: models.linreg:build\n   inputs: [{shape: [1, 4]}]\n",
        "pipeline.yaml:5: models.linreg: YAML syntax error: bad indentation: "
        "this line does not line up with the lines above it",
    ),
    Case(
        "yaml-indented-key-under-scalar",
        "name: t\nmodels:\n  linreg:\n    python: models.linreg:build\n      inputs: [{shape: [1, 4]}]\n",
        "pipeline.yaml:5: models.linreg: YAML syntax error: unexpected ':' "
        "(bad indentation, or a value containing ': ' that needs quotes)",
    ),
    Case(
        "yaml-unclosed-bracket",
        base(("quantization: [fp32]\n", "quantization: [fp32\nthresholds: {fp32: {sqnr_db: 30}}\n")),
        "pipeline.yaml:9: quantization: YAML syntax error: '[' is never closed "
        "(expected ',' or ']', but got ':' on line 10)",
    ),
    Case(
        "yaml-wrong-closing-bracket",
        base(("shape: [1, 4]", "shape: [1, 4}")),
        "pipeline.yaml:6: models.linreg.inputs[0].shape: YAML syntax error: '[' is never closed "
        "(expected ',' or ']', but got '}')",
    ),
    Case(
        "yaml-unclosed-quote",
        base(("name: t\n", 'name: "t\n')),
        "pipeline.yaml:1: name: YAML syntax error: quote is never closed (the file ends inside it)",
    ),
    Case(
        "yaml-unclosed-brace-at-end",
        base(append="thresholds: {fp32: {sqnr_db: 30}\n"),
        "pipeline.yaml:10: thresholds: YAML syntax error: '{' is never closed "
        "(expected ',' or '}', but got '<stream end>')",
    ),
    Case(
        "yaml-tab-indentation",
        base(("    python:", "\tpython:")),
        "pipeline.yaml:4: models.linreg: YAML syntax error: tab character; YAML must be indented with spaces",
    ),
    Case(
        "yaml-second-document",
        base(append="---\nname: u\n"),
        "pipeline.yaml:10: (top level): YAML syntax error: a second YAML document ('---'); "
        "the file must hold a single document",
    ),
    Case("yaml-not-utf8", b"name: t\nmodels:\n  caf\xe9:\n", "pipeline.yaml:3: not UTF-8 text (byte 0xe9)"),
    Case(
        "yaml-file-too-large",
        "# " + "x" * (300 << 10) + "\n",
        "pipeline.yaml: file is 307203 bytes; at most 262144 are accepted",
    ),
    Case(
        "yaml-undefined-alias",
        base(("  xnnpack: {}", "  xnnpack: *defaults")),
        "pipeline.yaml:8: backends.xnnpack: YAML syntax error: found undefined alias 'defaults'",
    ),
    Case(
        "yaml-deep-nesting",
        "name: t\nmodels: " + "[" * 5000 + "]" * 5000 + "\n",
        "pipeline.yaml:2: models: nested more than 32 levels deep",
    ),
    # --- the document as a whole --------------------------------------------
    Case("empty-file", "", "pipeline.yaml:1: (top level): expected a mapping, got an empty file"),
    Case(
        "comments-only",
        "# name: t\n\n# models: {}\n",
        "pipeline.yaml:1: (top level): expected a mapping, got an empty file",
    ),
    Case(
        "top-level-list",
        "- name: t\n- models: {}\n",
        'pipeline.yaml:1: (top level): expected a mapping, got [{"name": "t"}, {"models": {}}]',
    ),
    Case(
        "top-level-scalar", "just some text\n", 'pipeline.yaml:1: (top level): expected a mapping, got "just some text"'
    ),
    # --- wrong types -----------------------------------------------------------
    Case(
        "name-is-number",
        base(("name: t", "name: 42")),
        "pipeline.yaml:1: name: expected a name of letters, digits, '_' or '-' (at most 64, no '/' or '.'), got 42",
    ),
    Case(
        "version-not-semver",
        base(append="version: 1.0\n"),
        "pipeline.yaml:10: version: expected a semantic version such as 1.2.0, got 1.0",
    ),
    Case(
        "quantization-is-string",
        base(("quantization: [fp32]", "quantization: fp32")),
        'pipeline.yaml:9: quantization: expected a list of quantization scheme names, e.g. [fp32], got "fp32"',
    ),
    Case(
        "shape-is-string",  # the example from the design notes, line for line
        "# etforge pipeline with a typo in a shape\nname: demo\nversion: 1.0.0\n\nmodels:\n"
        "  linreg:\n    python: models.linreg:build\n    inputs:\n      - {name: features, shape: [1, 4]}\n"
        "  mobilenet:\n    torchvision: mobilenet_v3_small\n    inputs:\n      - name: image\n"
        '        shape: "224x224"\nbackends:\n  xnnpack: {}\nquantization: [fp32]\n',
        'pipeline.yaml:14: models.mobilenet.inputs[0].shape: expected a list of positive integers or dynamic dims {min, max, name}, got "224x224"',
    ),
    Case(
        "shape-zero",
        base(("shape: [1, 4]", "shape: [1, 0]")),
        "pipeline.yaml:6: models.linreg.inputs[0].shape[1]: expected a positive integer, or a dynamic dim {min: 1, max: 512[, name: seq]}, got 0",
    ),
    Case(
        "shape-negative",
        base(("shape: [1, 4]", "shape: [-1, 4]")),
        "pipeline.yaml:6: models.linreg.inputs[0].shape[0]: expected a positive integer, or a dynamic dim {min: 1, max: 512[, name: seq]}, got -1",
    ),
    Case(
        "shape-float",
        base(("shape: [1, 4]", "shape: [1, 4.5]")),
        "pipeline.yaml:6: models.linreg.inputs[0].shape[1]: expected a positive integer, or a dynamic dim {min: 1, max: 512[, name: seq]}, got 4.5",
    ),
    Case(
        "shape-integral-float",
        base(("shape: [1, 4]", "shape: [1, 4.0]")),
        "pipeline.yaml:6: models.linreg.inputs[0].shape[1]: expected a positive integer, or a dynamic dim {min: 1, max: 512[, name: seq]}, got 4.0",
    ),
    Case(
        "shape-too-many-dims",
        base(("shape: [1, 4]", "shape: [1, 1, 1, 1, 1, 1, 1, 1, 4]")),
        "pipeline.yaml:6: models.linreg.inputs[0].shape: expected at most 8 items, got [1, 1, 1, 1, 1, 1, 1, 1, 4]",
    ),
    Case(
        "shape-huge",
        base(("shape: [1, 4]", "shape: [100000, 100000, 100]")),
        "pipeline.yaml:6: models.linreg.inputs[0].shape: expected at most 67108864 elements "
        "in total, got 1000000000000",
    ),
    Case(
        "input-not-a-mapping",
        base(("- {name: features, shape: [1, 4], dtype: float32}", "- [1, 4]")),
        "pipeline.yaml:6: models.linreg.inputs[0]: expected a mapping such as "
        "{name: image, shape: [1, 3, 224, 224]}, got [1, 4]",
    ),
    Case(
        "dtype-unknown",
        base(("dtype: float32", "dtype: float64")),
        "pipeline.yaml:6: models.linreg.inputs[0].dtype: expected one of float32, float16, bfloat16, "
        'int64, int32, int8, uint8, bool, got "float64"',
    ),
    Case(
        "backend-options-null",
        base(("  xnnpack: {}", "  xnnpack:")),
        "pipeline.yaml:8: backends.xnnpack: expected a mapping of backend options ({} for none), got null",
    ),
    # --- unknown and missing keys -----------------------------------------------
    Case(
        "unknown-top-level-key",
        base(("models:", "modles:")),
        "pipeline.yaml:2: modles: unknown key 'modles'; did you mean 'models'?",
    ),
    Case(
        "unknown-nested-key",
        base(("dtype: float32", "dtyp: float32")),
        "pipeline.yaml:6: models.linreg.inputs[0].dtyp: unknown key 'dtyp'; did you mean 'dtype'?",
    ),
    Case(
        "unknown-model-key",
        base(("    python:", "    pyhton:")),
        "pipeline.yaml:4: models.linreg.pyhton: unknown key 'pyhton'; did you mean 'python'?",
    ),
    Case(
        "unknown-matrix-pattern-key",
        base(append="matrix:\n  exclude:\n    - {modle: linreg}\n"),
        "pipeline.yaml:12: matrix.exclude[0].modle: unknown key 'modle'; did you mean 'model'?",
    ),
    Case("missing-name", base(("name: t\n", "")), "pipeline.yaml:1: (top level): missing required key 'name'"),
    Case(
        "missing-models",
        base(
            (
                "models:\n  linreg:\n    python: models.linreg:build\n    inputs:\n"
                "      - {name: features, shape: [1, 4], dtype: float32}\n",
                "",
            )
        ),
        "pipeline.yaml:1: (top level): missing required key 'models'",
    ),
    Case(
        "missing-backends",
        base(("backends:\n  xnnpack: {}\n", "")),
        "pipeline.yaml:1: (top level): missing required key 'backends'",
    ),
    Case(
        "missing-quantization",
        base(("quantization: [fp32]\n", "")),
        "pipeline.yaml:1: (top level): missing required key 'quantization'",
    ),
    Case(
        "missing-inputs",
        base(("    inputs:\n      - {name: features, shape: [1, 4], dtype: float32}\n", "")),
        "pipeline.yaml:3: models.linreg: missing required key 'inputs'",
    ),
    Case(
        "missing-shape",
        base(("{name: features, shape: [1, 4], dtype: float32}", "{name: features}")),
        "pipeline.yaml:6: models.linreg.inputs[0]: missing required key 'shape'",
    ),
    Case(
        "no-models",
        base(
            (
                "models:\n  linreg:\n    python: models.linreg:build\n    inputs:\n"
                "      - {name: features, shape: [1, 4], dtype: float32}\n",
                "models: {}\n",
            )
        ),
        "pipeline.yaml:2: models: expected at least 1 entry, got {}",
    ),
    # --- model sources -------------------------------------------------------------
    Case(
        "model-both-sources",
        base(("    inputs:", "    torchvision: resnet18\n    inputs:")),
        "pipeline.yaml:3: models.linreg: expected exactly one model source: 'python: module:factory', "
        "'torchvision: <name>' or 'transformers: {...}', got a mapping with keys python, torchvision, inputs",
    ),
    Case(
        "model-no-source",
        base(("    python: models.linreg:build\n", "")),
        "pipeline.yaml:3: models.linreg: expected exactly one model source: 'python: module:factory', "
        "'torchvision: <name>' or 'transformers: {...}', got a mapping with keys inputs",
    ),
    Case(
        "python-ref-is-a-path",
        base(("python: models.linreg:build", "python: models/linreg.py")),
        "pipeline.yaml:4: models.linreg.python: expected 'module:factory', e.g. models.linreg:build, "
        'got "models/linreg.py"',
    ),
    Case(
        "python-ref-without-factory",
        base(("python: models.linreg:build", "python: models.linreg")),
        "pipeline.yaml:4: models.linreg.python: expected 'module:factory', e.g. models.linreg:build, "
        'got "models.linreg"',
    ),
    Case(
        "python-ref-too-long",
        base(("python: models.linreg:build", "python: models." + "a" * 300 + ":build")),
        'pipeline.yaml:4: models.linreg.python: expected at most 200 characters, got "models.' + "a" * 49 + "...",
    ),
    Case(
        "python-module-not-in-project",
        base(("python: models.linreg:build", "python: models.lnreg:build")),
        "pipeline.yaml:4: models.linreg.python: module 'models.lnreg' not found in the project "
        "(looked for models/lnreg.py)",
    ),
    Case(
        "python-module-from-stdlib",
        base(("python: models.linreg:build", "python: os:system")),
        "pipeline.yaml:4: models.linreg.python: module 'os' not found in the project (looked for os.py)",
    ),
    Case(
        "python-module-symlinked-outside",
        base(("python: models.linreg:build", "python: ext.found:build")),
        "pipeline.yaml:4: models.linreg.python: 'ext/found.py' resolves outside the project directory",
        setup=module_dir_outside,
    ),
    Case(
        "python-module-missing-behind-symlink",
        base(("python: models.linreg:build", "python: ext.missing:build")),
        "pipeline.yaml:4: models.linreg.python: module 'ext.missing' not found in the project "
        "(looked for ext/missing.py)",
        setup=module_dir_outside,
    ),
    # --- backends and quantization -------------------------------------------------
    Case(
        "unknown-backend",
        base(("  xnnpack: {}", "  xnnpak: {}")),
        f"pipeline.yaml:8: backends.xnnpak: unknown backend 'xnnpak'; did you mean 'xnnpack'? known: {KNOWN_BACKENDS}",
    ),
    Case(
        "unknown-backend-recipe",
        base(("  xnnpack: {}", "  fast: {recipe: xnnpak}")),
        "pipeline.yaml:8: backends.fast.recipe: unknown backend 'xnnpak'; did you mean 'xnnpack'? "
        f"known: {KNOWN_BACKENDS}",
    ),
    Case(
        "backend-key-yaml11-bool",
        base(("  xnnpack: {}", "  on: {}")),  # stays 'on', not True
        f"pipeline.yaml:8: backends.on: unknown backend 'on'; known: {KNOWN_BACKENDS}",
    ),
    Case(
        "unknown-backend-option",
        base(("  xnnpack: {}", "  xnnpack: {per_op: true}")),
        "pipeline.yaml:8: backends.xnnpack.per_op: unknown option 'per_op' for backend recipe 'xnnpack'; "
        "did you mean 'per_op_mode'?",
    ),
    Case(
        "backend-option-wrong-type",
        base(("  xnnpack: {}", '  xnnpack: {per_op_mode: "yes"}')),
        'pipeline.yaml:8: backends.xnnpack.per_op_mode: invalid option: expected true or false, got "yes"',
    ),
    Case(
        "unknown-quantization",
        base(("quantization: [fp32]", "quantization: [fp32, bogus]")),
        f"pipeline.yaml:9: quantization[1]: unknown quantization 'bogus'; known: {KNOWN_SCHEMES}",
    ),
    Case(
        "duplicate-quantization",
        base(("quantization: [fp32]", "quantization:\n  - fp32\n  - fp32")),
        'pipeline.yaml:11: quantization[1]: duplicate entry "fp32" (already at quantization[0])',
    ),
    # --- duplicates --------------------------------------------------------------------
    Case(
        "duplicate-model-name",
        base(("backends:", "  linreg:\n    torchvision: resnet18\n    inputs: [{shape: [1, 3, 8, 8]}]\nbackends:")),
        "pipeline.yaml:7: models.linreg: duplicate key 'linreg' (first defined on line 3)",
    ),
    Case(
        "duplicate-top-level-key",
        base(append="name: u\n"),
        "pipeline.yaml:10: name: duplicate key 'name' (first defined on line 1)",
    ),
    # --- matrix and thresholds -------------------------------------------------------
    Case(
        "matrix-exclude-undeclared-model",
        base(append="matrix:\n  exclude:\n    - {model: resnet}\n"),
        "pipeline.yaml:12: matrix.exclude[0].model: model 'resnet' is not declared in 'models'; declared: linreg",
    ),
    Case(
        "matrix-include-undeclared-backend",
        base(append="matrix:\n  include:\n    - {backend: coreml}\n"),
        "pipeline.yaml:12: matrix.include[0].backend: backend 'coreml' is not declared in 'backends'; "
        "declared: xnnpack",
    ),
    Case(
        "matrix-exclude-undeclared-quantization",
        base(append="matrix:\n  exclude:\n    - {model: linreg, quantization: int8}\n"),
        "pipeline.yaml:12: matrix.exclude[0].quantization: quantization 'int8' is not declared in "
        "'quantization'; declared: fp32",
    ),
    Case(
        "matrix-empty-after-exclude",
        base(append="matrix:\n  exclude:\n    - {backend: xnnpack}\n"),
        "pipeline.yaml:10: matrix: the matrix is empty after include/exclude",
    ),
    Case(
        "matrix-no-product-no-include",
        base(append="matrix: {product: false}\n"),
        "pipeline.yaml:10: matrix: the matrix is empty after include/exclude",
    ),
    Case(
        "thresholds-for-undeclared-scheme",
        base(append="thresholds:\n  int8: {sqnr_db: 20}\n"),
        "pipeline.yaml:11: thresholds.int8: thresholds for 'int8', which is not in 'quantization' (fp32)",
    ),
    Case(
        "model-thresholds-for-undeclared-scheme",
        base(("    inputs:", "    thresholds: {int4: {cosine: 0.9}}\n    inputs:")),
        "pipeline.yaml:5: models.linreg.thresholds.int4: thresholds for 'int4', which is not in 'quantization' (fp32)",
    ),
    Case(
        "threshold-out-of-range",
        base(append="thresholds:\n  fp32: {cosine: 2}\n"),
        "pipeline.yaml:11: thresholds.fp32.cosine: expected a number <= 1, got 2",
    ),
    # --- non-finite numbers: NaN compares false against any bound and would switch a gate off
    Case(
        "threshold-nan",
        base(append="thresholds:\n  fp32: {sqnr_db: .nan}\n"),
        "pipeline.yaml:11: thresholds.fp32.sqnr_db: expected a finite number, got .nan",
    ),
    Case(
        "threshold-inf",
        base(append="thresholds:\n  fp32: {sqnr_db: .inf}\n"),
        "pipeline.yaml:11: thresholds.fp32.sqnr_db: expected a finite number, got .inf",
    ),
    Case(
        "threshold-inf-beyond-maximum",
        base(append="thresholds:\n  fp32: {cosine: .inf}\n"),
        "pipeline.yaml:11: thresholds.fp32.cosine: expected a finite number, got .inf",
    ),
    Case(
        "model-threshold-negative-inf",
        base(("    inputs:", "    thresholds: {fp32: {max_abs_error: -.Inf}}\n    inputs:")),
        "pipeline.yaml:5: models.linreg.thresholds.fp32.max_abs_error: expected a finite number, got -.inf",
    ),
    Case(
        "benchmark-option-inf",
        base(append="benchmark: {max_seconds: .inf}\n"),
        "pipeline.yaml:10: benchmark.max_seconds: expected a finite number, got .inf",
    ),
    Case(
        "gate-nan",
        base(append="gates: {min_delegation_coverage: {xnnpack: .NaN}}\n"),
        "pipeline.yaml:10: gates.min_delegation_coverage.xnnpack: expected a finite number, got .nan",
    ),
    Case(
        "factory-kwarg-nan",
        base(("    inputs:", "    kwargs: {in_features: .nan}\n    inputs:")),
        "pipeline.yaml:5: models.linreg.kwargs.in_features: expected a finite number, got .nan",
    ),
    # --- gates -----------------------------------------------------------------------------
    Case(
        "gate-old-key",
        base(append="gates: {min_delegated_ops: 1}\n"),
        "pipeline.yaml:10: gates.min_delegated_ops: unknown key 'min_delegated_ops'; "
        "did you mean 'min_delegation_coverage'?",
    ),
    Case(
        "gate-coverage-above-one",
        base(append="gates: {min_delegation_coverage: {xnnpack: 1.5}}\n"),
        "pipeline.yaml:10: gates.min_delegation_coverage.xnnpack: expected a fraction between 0 and 1, got 1.5",
    ),
    Case(
        "budget-negative",
        base(append="gates: {max_planned_bytes: {xnnpack: -4096}}\n"),
        "pipeline.yaml:10: gates.max_planned_bytes.xnnpack: expected a number of bytes (an integer >= 0), got -4096",
    ),
    Case(
        "budget-not-a-number",
        base(append="gates: {max_program_bytes: {xnnpack: 2MB}}\n"),
        'pipeline.yaml:10: gates.max_program_bytes.xnnpack: expected a number of bytes (an integer >= 0), got "2MB"',
    ),
    Case(
        "budget-unused-backend",
        base(append="gates: {max_program_bytes: {coreml: 1000000}}\n"),
        "pipeline.yaml:10: gates.max_program_bytes.coreml: a budget for backend 'coreml', which no cell uses "
        "(the cells use: xnnpack)",
    ),
    Case(
        "app-runtime-not-a-version",
        base(append="manifests: {app_runtime: latest}\n"),
        "pipeline.yaml:10: manifests.app_runtime: expected an ExecuTorch version such as 1.4.0, or a list of them, "
        'got "latest"',
    ),
    Case(
        "gate-coverage-undeclared-backend",
        base(append="gates: {min_delegation_coverage: {coreml: 0.5}}\n"),
        "pipeline.yaml:10: gates.min_delegation_coverage.coreml: backend 'coreml' is not declared in "
        "'backends'; declared: xnnpack",
    ),
    Case(
        "gate-coverage-without-delegate",
        base(
            ("  xnnpack: {}", "  xnnpack: {}\n  portable: {}"),
            append="gates: {min_delegation_coverage: {portable: 0.5}}\n",
        ),
        "pipeline.yaml:11: gates.min_delegation_coverage.portable: backend 'portable' has no delegate "
        "(its programs run on portable kernels), so it has no coverage to gate",
    ),
    # --- options nothing uses: a typo must not go unnoticed ----------------------------------
    Case(
        "quantization-options-unlisted-scheme",
        base(append="quantization_options: {int8: {per_channel: false}}\n"),
        "pipeline.yaml:10: quantization_options.int8: options for 'int8', which is not in 'quantization' (fp32)",
    ),
    Case(
        "quantization-options-typo",
        base(
            ("quantization: [fp32]", "quantization: [fp32, 8da4w]"),
            append="quantization_options:\n  8da4W: {group_size: 64}\n",
        ),
        "pipeline.yaml:11: quantization_options.8da4W: options for '8da4W', which is not in 'quantization' "
        "(fp32, 8da4w)",
    ),
    Case(
        "backend-options-unused",
        base(
            ("  xnnpack: {}", "  xnnpack: {}\n  coreml: {compute_units: cpu}"),
            append="matrix:\n  exclude: [{backend: coreml}]\n",
        ),
        "pipeline.yaml:9: backends.coreml.compute_units: options for backend 'coreml', which no cell of the "
        "matrix uses (neither directly nor in a chain that a cell uses)",
    ),
    # --- names and paths that could escape artifacts/ ---------------------------------
    Case(
        "model-name-dotdot",
        base(("  linreg:", "  ../evil:")),
        "pipeline.yaml:3: models[\"../evil\"]: expected a name of letters, digits, '_' or '-' "
        "(at most 64, no '/' or '.'), got \"../evil\"",
    ),
    Case(
        "model-name-slash",
        base(("  linreg:", "  a/b:")),
        "pipeline.yaml:3: models[\"a/b\"]: expected a name of letters, digits, '_' or '-' "
        "(at most 64, no '/' or '.'), got \"a/b\"",
    ),
    Case(
        "model-name-absolute",
        base(("  linreg:", "  /etc/passwd:")),
        "pipeline.yaml:3: models[\"/etc/passwd\"]: expected a name of letters, digits, '_' or '-' "
        "(at most 64, no '/' or '.'), got \"/etc/passwd\"",
    ),
    Case(
        "backend-name-dotdot",
        base(("  xnnpack: {}", "  ..: {recipe: xnnpack}")),
        "pipeline.yaml:8: backends[\"..\"]: expected a name of letters, digits, '_' or '-' "
        "(at most 64, no '/' or '.'), got \"..\"",
    ),
    Case(
        "pipeline-name-dotdot",
        base(("name: t", "name: ../../etc")),
        "pipeline.yaml:1: name: expected a name of letters, digits, '_' or '-' "
        "(at most 64, no '/' or '.'), got \"../../etc\"",
    ),
    Case(
        "pipeline-name-absolute",
        base(("name: t", "name: /tmp/x")),
        "pipeline.yaml:1: name: expected a name of letters, digits, '_' or '-' "
        "(at most 64, no '/' or '.'), got \"/tmp/x\"",
    ),
    Case(
        "weights-path-dotdot",
        base(("    inputs:", f"    weights: {{path: ../w.bin, sha256: {WEIGHTS_SHA}}}\n    inputs:")),
        "pipeline.yaml:5: models.linreg.weights.path: expected a relative path inside the project "
        "(no leading '/', no '..', parts of at most 255 characters), got \"../w.bin\"",
    ),
    Case(
        "weights-path-absolute",
        base(("    inputs:", f"    weights: {{path: /etc/passwd, sha256: {WEIGHTS_SHA}}}\n    inputs:")),
        "pipeline.yaml:5: models.linreg.weights.path: expected a relative path inside the project "
        "(no leading '/', no '..', parts of at most 255 characters), got \"/etc/passwd\"",
    ),
    Case(
        "weights-path-symlink-outside",
        base(("    inputs:", f"    weights: {{path: link/w.bin, sha256: {WEIGHTS_SHA}}}\n    inputs:")),
        "pipeline.yaml:5: models.linreg.weights.path: 'link/w.bin' resolves outside the project directory",
        setup=symlink_outside,
    ),
    Case(
        "weights-missing",
        base(("    inputs:", f"    weights: {{path: weights/missing.bin, sha256: {WEIGHTS_SHA}}}\n    inputs:")),
        "pipeline.yaml:5: models.linreg.weights.path: weights file 'weights/missing.bin' not found",
        setup=write_weights,
    ),
    Case(
        "weights-sha256-mismatch",
        base(("    inputs:", f"    weights:\n      path: weights/w.bin\n      sha256: {OTHER_SHA}\n    inputs:")),
        f"pipeline.yaml:7: models.linreg.weights.sha256: weights file sha256 is {WEIGHTS_SHA}, "
        f"pipeline pins {OTHER_SHA}",
        setup=write_weights,
    ),
    Case(
        "weights-sha256-malformed",
        base(("    inputs:", "    weights: {path: weights/w.bin, sha256: ABC}\n    inputs:")),
        'pipeline.yaml:5: models.linreg.weights.sha256: expected 64 lowercase hex digits, got "ABC"',
        setup=write_weights,
    ),
    # --- YAML features that are not plain data -----------------------------------------
    Case(
        "yaml-python-object-apply",
        base(("name: t", 'name: !!python/object/apply:os.system ["echo hi"]')),
        "pipeline.yaml:1: name: unsupported YAML tag '!!python/object/apply:os.system': only plain data is allowed",
    ),
    Case(
        "yaml-python-name",
        base(("python: models.linreg:build", "python: !!python/name:os.system ''")),
        "pipeline.yaml:4: models.linreg.python: unsupported YAML tag '!!python/name:os.system': "
        "only plain data is allowed",
    ),
    Case(
        "yaml-python-object-new",
        base(("  xnnpack: {}", "  xnnpack: !!python/object/new:os.system {args: [id]}")),
        "pipeline.yaml:8: backends.xnnpack: unsupported YAML tag '!!python/object/new:os.system': "
        "only plain data is allowed",
    ),
    Case(
        "yaml-local-tag",
        base(("name: t", "name: !env HOME")),
        "pipeline.yaml:1: name: unsupported YAML tag '!env': only plain data is allowed",
    ),
    Case(
        "yaml-binary-tag",
        base(("name: t", "name: !!binary dA==")),
        "pipeline.yaml:1: name: unsupported YAML tag '!!binary': only plain data is allowed",
    ),
    Case(
        "yaml-bad-explicit-int",
        base(("shape: [1, 4]", "shape: [1, !!int four]")),
        "pipeline.yaml:6: models.linreg.inputs[0].shape[1]: 'four' is not a valid !!int",
    ),
    Case(
        "yaml-merge-key",
        base(("  linreg:", "  linreg: &lin"), ("backends:", "  again:\n    <<: *lin\nbackends:")),
        "pipeline.yaml:8: models.again: YAML merge keys (<<) are not supported; write the keys out",
    ),
    Case(
        "yaml-alias-bomb",
        alias_bomb(),
        "pipeline.yaml:6: f: document expands to more than 200000 values (YAML aliases nested into an alias bomb?)",
    ),
    # --- data files that cannot feed the model (they used to fail inside a task, e.g. an
    # UnboundLocalError for an .npz without samples) -----------------------------------
    Case(
        "npz-without-arrays",
        VALIDATION_NPZ,
        "pipeline.yaml:7: models.linreg.validation.npz: data/val.npz holds no arrays",
        setup=lambda root: write_npz(root),
    ),
    Case(
        "npz-without-samples",
        VALIDATION_NPZ,
        "pipeline.yaml:7: models.linreg.validation.npz: "
        "data/val.npz array 'features' has shape [0, 4]: no samples along its first axis",
        setup=lambda root: write_npz(root, features=(0, 4)),
    ),
    Case(
        "npz-without-the-input",
        VALIDATION_NPZ,
        "pipeline.yaml:7: models.linreg.validation.npz: data/val.npz has no array 'features' or 'input_0' (has: image)",
        setup=lambda root: write_npz(root, image=(2, 4)),
    ),
    Case(
        "npz-not-a-zip",
        VALIDATION_NPZ,
        "pipeline.yaml:7: models.linreg.validation.npz: "
        "data/val.npz is not an .npz archive (BadZipFile: File is not a zip file)",
        setup=lambda root: (root / "data").mkdir() or (root / "data" / "val.npz").write_bytes(b"not a zip"),
    ),
]


def make_project(root: Path, text: str | bytes) -> Path:
    """A throwaway project: models/ copied from the repo, plus pipeline.yaml."""
    root.mkdir()
    shutil.copytree(REPO / "models", root / "models", ignore=shutil.ignore_patterns("__pycache__"))
    pipeline = root / "pipeline.yaml"
    if isinstance(text, bytes):
        pipeline.write_bytes(text)
    else:
        pipeline.write_text(text, encoding="utf-8")
    return pipeline


def params(cases):
    return [
        pytest.param(c, id=c.id, marks=[pytest.mark.xfail(reason=c.xfail, strict=True)] if c.xfail else [])
        for c in cases
    ]


def test_corpus_is_large_and_ids_are_unique():
    assert len(CASES) >= 30
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", params(CASES))
def test_resolve_reports_one_precise_line(case: Case, tmp_path, monkeypatch):
    project = tmp_path / "proj"
    pipeline = make_project(project, case.text)
    if case.setup:
        case.setup(project)
    monkeypatch.chdir(project)  # errors name the file relative to the working directory
    start = time.monotonic()
    with pytest.raises(PipelineError) as info:
        resolve(pipeline)
    elapsed = time.monotonic() - start
    message = str(info.value)
    assert "\n" not in message
    assert message == case.expected
    assert elapsed < MAX_SECONDS, f"took {elapsed:.1f}s"
    assert not (project / "artifacts").exists(), "a failed resolve must not write anything"


def test_python_tags_do_not_run_code(tmp_path, monkeypatch):
    marker = tmp_path / "pwned"
    text = base(("name: t", f'name: !!python/object/apply:os.system ["touch {marker}"]'))
    pipeline = make_project(tmp_path / "proj", text)
    monkeypatch.chdir(pipeline.parent)
    with pytest.raises(PipelineError, match=r"^pipeline\.yaml:1: name: unsupported YAML tag"):
        resolve(pipeline)
    assert not marker.exists()


def test_unknown_model_in_selection(tmp_path, monkeypatch):
    pipeline = make_project(tmp_path / "proj", BASE)
    monkeypatch.chdir(pipeline.parent)
    plan = resolve(pipeline)
    with pytest.raises(PipelineError) as info:
        select(plan, model="nope")
    assert str(info.value) == "pipeline.yaml:2: models: unknown model 'nope' on the command line; known: linreg"


# --- end to end: what `doit` prints ------------------------------------------------------


def snapshot(directory: Path) -> dict | None:
    if not directory.exists():
        return None
    return {
        p.relative_to(directory).as_posix(): (p.read_bytes() if p.is_file() else None)
        for p in sorted(directory.rglob("*"))
    }


def run_doit(project: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "ETFORGE_PIPELINE"}
    return subprocess.run(
        [sys.executable, "-m", "etforge", "list", "--pipeline", str(project / "pipeline.yaml"), *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


CLI_IDS = (
    "yaml-unclosed-bracket",
    "yaml-tab-indentation",
    "unknown-top-level-key",
    "shape-is-string",
    "yaml-python-object-apply",
    "yaml-alias-bomb",
    "weights-sha256-mismatch",
    "model-name-dotdot",
)
CLI_PARAMS = (
    [pytest.param(c, False, id=c.id) for c in CASES if c.id in CLI_IDS]
    # A project that already has artifacts/ must find it byte-identical afterwards.
    + [
        pytest.param(c, True, id=c.id + "-existing-artifacts")
        for c in CASES
        if c.id in ("yaml-unclosed-bracket", "weights-sha256-mismatch")
    ]
)


@pytest.mark.parametrize(("case", "existing_artifacts"), CLI_PARAMS)
def test_doit_list_prints_one_error_line(case: Case, existing_artifacts: bool, tmp_path):
    project = tmp_path / "proj"
    make_project(project, case.text)
    if case.setup:
        case.setup(project)
    if existing_artifacts:
        (project / "artifacts" / "t").mkdir(parents=True)
        (project / "artifacts" / "t" / "old.pte").write_bytes(b"previous build")
    before = snapshot(project / "artifacts")

    proc = run_doit(project)

    assert "Traceback" not in proc.stdout + proc.stderr
    assert proc.returncode == 3, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    line_no = re.search(r"pipeline\.yaml:(\d+): ", case.expected).group(1)
    assert lines[0].startswith("etforge: error: ")
    assert f"pipeline.yaml:{line_no}:" in lines[0]
    # etforge runs in the project: the file is shown relative to it, as the user named it.
    assert lines[0] == "etforge: error: " + case.expected
    assert snapshot(project / "artifacts") == before


def test_doit_list_unknown_model_on_command_line(tmp_path):
    project = tmp_path / "proj"
    make_project(project, BASE)
    proc = run_doit(project, "--models", "nope")
    assert "Traceback" not in proc.stdout + proc.stderr
    assert proc.returncode == 3
    assert proc.stderr == (
        "etforge: error: pipeline.yaml:2: models: unknown model 'nope' on the command line; known: linreg\n"
    )


def test_doit_list_unknown_model_names_a_line(tmp_path):
    project = tmp_path / "proj"
    make_project(project, BASE)
    proc = run_doit(project, "--models", "nope")
    assert re.fullmatch(r"etforge: error: \S*pipeline\.yaml:2: models: unknown model 'nope'.*\n", proc.stderr)


def test_doit_list_unknown_model_writes_nothing(tmp_path):
    project = tmp_path / "proj"
    make_project(project, BASE)
    proc = run_doit(project, "--models", "nope")
    assert proc.returncode == 3
    assert not (project / "artifacts").exists()


def test_doit_list_relative_pipeline_path(tmp_path):
    project = tmp_path / "proj"
    make_project(project, base(("models:", "modles:")))
    env = {k: v for k, v in os.environ.items() if k != "ETFORGE_PIPELINE"}
    proc = subprocess.run(
        [sys.executable, "-m", "etforge", "list", "--pipeline", "proj/pipeline.yaml"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 3
    assert "pipeline.yaml:2: modles: unknown key 'modles'" in proc.stderr


# --- resolve must stay cheap ---------------------------------------------------------------


def test_resolve_does_not_import_torch(tmp_path):
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "import etforge.engine.entry\n"
        "from etforge.config.digest_cache import DigestCache\n"
        "from etforge.config.resolve import resolve\n"
        # A private digest memo: the repo's artifacts/ is left alone.
        "plan = resolve(Path(sys.argv[1]), digests=DigestCache(Path(sys.argv[2])))\n"
        "assert plan.cells, 'the default pipeline has cells'\n"
        "print(sorted(m for m in ('torch', 'executorch', 'torchvision') if m in sys.modules))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(REPO / "pipeline.yaml"), str(tmp_path / "digests.json")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"

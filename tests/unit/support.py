"""What the unit tier's tests share: small projects resolved in-process, their task keys.

Nothing here imports torch, executorch or a model's code: a project's model modules are
files that resolve digests and never imports (``FAKE_MODEL``).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from etforge.config.digest_cache import PROJECT_MEMO, MemoData, digest_cache_for, memo_text, read_memo
from etforge.config.model import ModelKind
from etforge.config.resolve import resolve
from etforge.pipeline.specs import run_specs
from etforge.pipeline.stages import STAGES, code_of
from etforge.publish import summary

# A host fingerprint for benchmark keys (the real one reads /proc/cpuinfo): any fixed dict will do.
HOST = {"cpu_model": "unit-test cpu", "logical_cores": 2, "usable_cores": 2, "machine": "x86_64", "system": "Linux"}

# A model factory resolve can digest: the unit tier never runs a model.
FAKE_MODEL = 'def build():\n    """Never called by the unit tier."""\n    return None\n'

# Two models with modules of their own, on two backends, fp32 and fp16 (fp16: xnnpack only,
# quantized by its own task, with a size gate): 6 cells, 2 refused combinations.
PIPELINE = """\
name: t
version: 0.0.1
models:
  a:
    python: models.a:build
    inputs: [{name: x, shape: [1, 4]}]
  b:
    python: models.b:build
    inputs: [{name: x, shape: [1, 4]}]
backends:
  xnnpack: {}
  portable: {}
quantization: [fp32, fp16]
targets: false  # the target stage's fake-free tests are in test_unit_targets.py
"""


@dataclass
class UnitProject:
    """A throwaway project: pipeline.yaml and model modules that are never imported."""

    root: Path

    @property
    def pipeline(self) -> Path:
        return self.root / "pipeline.yaml"

    @property
    def out(self) -> Path:
        return self.root / "artifacts" / "t"

    def write(self, relative: str, text: str) -> Path:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        # A new inode and a later mtime: an edit is never hidden by the digest memo's stat signature.
        tmp = path.with_name(path.name + ".new")
        tmp.write_text(text)
        os.replace(tmp, path)
        return path

    def write_pipeline(self, text: str) -> None:
        self.write("pipeline.yaml", text)

    def edit_pipeline(self, old: str, new: str) -> None:
        text = self.pipeline.read_text()
        assert old in text, f"{old!r} is not in pipeline.yaml"
        self.write_pipeline(text.replace(old, new))

    def plan(self):
        return resolve(self.pipeline)

    def cell(self, plan, name: str):
        return next(c for c in plan.cells if c.name == name)


def make_unit_project(root: Path, pipeline: str = PIPELINE, models=("a", "b"), warm: bool = True) -> UnitProject:
    """A project with a fake module per model; ``warm``: with the digest memo of a project that
    already ran (etforge's own files hashed and parsed once per process, not once per test)."""
    project = UnitProject(root)
    project.write("models/__init__.py", "")
    for model in models:
        project.write(f"models/{model}.py", FAKE_MODEL)
    project.write_pipeline(pipeline)
    if warm:
        project.write(PROJECT_MEMO.as_posix(), _warm_memo())
    return project


@functools.cache
def _warm_memo() -> str:
    """The digest memo (artifacts/.etforge/digests.json) after a run that computed every key:
    etforge's files by absolute path and stat signature, their imports by content digest."""
    with tempfile.TemporaryDirectory() as tmp:
        project = make_unit_project(Path(tmp), warm=False)
        digests = digest_cache_for(project.pipeline)
        plan = resolve(project.pipeline, digests)
        task_keys(plan)
        for stage in STAGES:
            for kind in ModelKind:
                plan.code.etforge.of(code_of(stage, kind))
        digests.save()
        memo = read_memo(project.root / PROJECT_MEMO)
    outside = str(Path(tmp).resolve())
    return memo_text(
        MemoData({path: v for path, v in memo.files.items() if not path.startswith(outside)}, memo.derived)
    )


def task_keys(plan, cells=None) -> dict:
    """task name -> key of every task of ``cells`` (default all) that has one before anything runs."""
    specs, _ = run_specs(plan, plan.cells if cells is None else cells, HOST)
    return {name: spec.key for name, spec in specs.items() if spec.key is not None}


def changed_keys(before: dict, after: dict) -> set:
    """The task names whose key differs (or that exist on one side only)."""
    return {name for name in before.keys() | after.keys() if before.get(name) != after.get(name)}


def report_row(cell: str, size=None, sqnr=None, p50=None, status="ok", **extra) -> dict:
    """A row of the report's cell table, as publish.summary makes them, for chart and page tests."""
    model, backend, quant = cell.split("/")
    return {
        "cell": cell,
        "model": model,
        "backend": backend,
        "quant": quant,
        "quantized": quant != "fp32",
        "status": status,
        "size_bytes": size,
        "size_text": summary.human_size(size),
        "accuracy": sqnr,
        "accuracy_text": "-" if sqnr is None else f"{sqnr:.1f}",
        "accuracy_label": "SQNR vs eager (dB)",
        "p50_ms": p50,
        "fastest_ms": p50,
        "latency_text": "-" if p50 is None else f"{p50} ms",
        "regression": None,
        **extra,
    }


def upstream_union(listed: list, workdir: Path) -> dict:
    """ExecuTorch's own ``gen_all_oplist`` over the per-program selected_operators files ``listed``
    (run in a subprocess; it needs no runtime): the union etforge's must equal."""
    import yaml

    (workdir / "list.txt").write_text("\n".join(str(p) for p in listed))
    (workdir / "union").mkdir()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "executorch.codegen.tools.gen_all_oplist",
            "--model_file_list_path",
            f"@{workdir / 'list.txt'}",
            "--output_dir",
            str(workdir / "union"),
        ],
        check=True,
        capture_output=True,
    )
    return yaml.safe_load((workdir / "union" / "selected_operators.yaml").read_text())


def word_tokenizer_json(path: Path, vocab: list) -> None:
    """A word-level Hugging Face tokenizer.json over ``vocab`` (id = index) that prepends ``<s>`` (id 1),
    as a Llama tokenizer's template does: a model's tokenizer without a download."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token=vocab[0]))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tokenizer.save(str(path))

#!/usr/bin/env python3
"""The same LLM, the same recipes, through etforge and through the upstream one-shot path, in one run.

    .venv/bin/python benchmarks/llm_side_by_side.py [--site DIR] [--work DIR] [--keep]

The model: a Llama of hidden 256, 4 layers, vocab 8192 (7.2 M parameters, untied), built once
from its config with seeded random weights and saved as a checkpoint directory, which both paths
load (so both export the very same weights). The recipes: XNNPACK 8da4w (group 32) with 8-bit
embeddings (one scale per row, optimum's ``8w``), and XNNPACK fp32; a static KV cache of 128
positions and ExecuTorch's custom SDPA and KV-cache ops.

etforge: a temporary project whose pipeline.yaml names the checkpoint (``transformers:``
source, ``checkpoint:`` pinned by digest); ``doit export:<cell>`` runs capture, quantize and
export, as the upstream path does (no validation or benchmark, which the one-shot path has
no equivalent of). Then fp32 is added to the pipeline and exported: the second scheme reuses
the captured graph. Then the same command again: the no-op time.

Upstream: optimum-executorch 1.1.0's ``main_export`` (what ``optimum-cli export executorch``
calls), which pins transformers 5.0.0rc1 (a conflict with the venv's huggingface_hub and
tokenizers): it runs in a child process with its own ``pip --target`` directory first on
PYTHONPATH (--site; created from PyPI with the exact set in OE_PINS when missing, --no-deps so
that torch, executorch and torchao stay the venv's). If it cannot run there, the script says
so and falls back to a one-shot script in the venv: transformers'
TorchExportableModuleForDecoderOnlyLM + ExecuTorch's quantize_model_ + to_edge_transform_and_lower.

Every build is its own child process; wall time is measured around it and peak RSS is the
child's ``ru_maxrss`` from ``os.wait4`` (it covers the grandchildren it waited for, e.g.
doit's workers). This process never imports torch (the checkpoint is made by a child too):
a child's ru_maxrss would otherwise start from this process's pages at fork time. Timings on a shared machine are noisy: compare the ratios, side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIG = {
    "model_type": "llama",
    "vocab_size": 8192,
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
MAX_LEN = 128
SEED = 0
TINY = "ETFORGE_SBS_TINY"  # --tiny: the same paths on a 1-layer Llama of hidden 32 (the test suite's run)
if os.environ.get(TINY):
    CONFIG.update(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    MAX_LEN = 32
# optimum-executorch 1.1.0 and what it needs beyond the venv (research/issue13 NOTES.md section 1).
OE_PINS = (
    "optimum-executorch==1.1.0",
    "optimum==2.0.0",
    "transformers==5.0.0rc1",
    "huggingface_hub==1.33.0",
    "tokenizers==0.22.2",
    "accelerate==1.15.0",
    "httpx==0.28.1",
    "httpcore==1.0.9",
)
DEFAULT_SITE = Path.home() / ".cache" / "etforge" / "site_optimum_executorch_1.1.0"
# scheme -> (optimum main_export kwargs, etforge quantization_options)
RECIPES = {
    "8da4w": ({"qlinear": "8da4w", "qembedding": "8w"}, {"group_size": 32, "embedding": 8, "embedding_group_size": 0}),
    "fp32": ({}, None),
}
PIPELINE = """\
name: sbs
version: 0.0.1
models:
  llama:
    transformers:
      task: text-generation
      checkpoint: {{path: ckpt, sha256: "{sha}"}}
      llm: {{max_context_len: {max_len}, prompt_len: 16, decode_steps: 8}}
backends:
  xnnpack: {{}}
quantization: [{schemes}]
quantization_options:
  8da4w: {{group_size: 32, embedding: 8, embedding_group_size: 0}}   # 8w: one scale per row, as optimum's
"""


# ---------------------------------------------------------------- measuring a child


def run_measured(cmd: list, env: dict | None = None, cwd: Path | None = None, log: Path | None = None) -> dict:
    """Run ``cmd``; {"rc", "wall_s", "peak_rss_mb", "tail"} (peak: the child's ru_maxrss via wait4)."""
    out = open(log, "w") if log else subprocess.DEVNULL
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env={**os.environ, **(env or {})}, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if log:
        out.close()
    tail = Path(log).read_text(errors="replace")[-3000:] if log else ""
    return {"rc": proc.returncode, "wall_s": round(wall, 1), "peak_rss_mb": round(usage.ru_maxrss / 1024), "tail": tail}


# ---------------------------------------------------------------- the model


def save_checkpoint(directory: Path) -> str:
    """Build the model from CONFIG (seeded) and save it; the checkpoint digest etforge pins."""
    import hashlib

    import torch

    sys.path.insert(0, str(REPO))
    from etforge.builders.loading.hf_models import import_transformers
    from etforge.config.hf_source import checkpoint_digest

    tf = import_transformers()
    torch.manual_seed(SEED)
    config = tf.AutoConfig.for_model(**CONFIG)
    model = tf.AutoModelForCausalLM.from_config(config)
    print(
        f"model: llama hidden {CONFIG['hidden_size']}, {CONFIG['num_hidden_layers']} layers, vocab "
        f"{CONFIG['vocab_size']}: {sum(p.numel() for p in model.parameters()):,} parameters",
        flush=True,
    )
    model.save_pretrained(directory)
    return checkpoint_digest(
        {
            p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*"))
            if p.is_file()
        }
    )


# ---------------------------------------------------------------- etforge


def etforge_run(project: Path, sha: str, schemes: list, targets: list, log: Path) -> dict:
    (project / "pipeline.yaml").write_text(PIPELINE.format(sha=sha, max_len=MAX_LEN, schemes=", ".join(schemes)))
    result = run_measured(
        [sys.executable, "-m", "etforge", *targets],
        env={"ETFORGE_PIPELINE": str(project / "pipeline.yaml")},
        cwd=project,
        log=log,
    )
    result["started"] = Path(log).read_text(errors="replace").count(" start ")
    return result


def etforge_size(project: Path, scheme: str) -> int | None:
    pte = project / "artifacts" / "sbs" / "llama" / f"llama_xnnpack_{scheme}.pte"
    return pte.stat().st_size if pte.exists() else None


# ---------------------------------------------------------------- upstream


def ensure_site(site: Path) -> tuple[Path | None, str]:
    """The optimum-executorch --target directory (created from PyPI when missing), or (None, why not).
    Pass an existing one with --site to reuse it."""
    if (site / "optimum_executorch-1.1.0.dist-info").is_dir():
        return site, f"reused {site}"
    site.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(site), *OE_PINS]
    print("installing: " + " ".join(cmd), flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        return None, "pip install failed: " + (done.stderr.strip().splitlines() or ["?"])[-1]
    return site, f"installed {', '.join(OE_PINS)} into {site}"


def upstream_child(model_dir: str, out: str, scheme: str, mode: str) -> None:
    """Child process: one export of ``model_dir`` with ``scheme``; prints RESULT {"pte": path}."""
    import torch

    # PyPI's torchvision is a CUDA build: define its op schemas before transformers imports it.
    if not hasattr(torch.ops.torchvision, "nms"):
        lib = torch.library.Library("torchvision", "DEF")
        for op in ("nms", "qnms"):
            lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        torch._etforge_tv_lib = lib
    os.makedirs(out, exist_ok=True)
    kwargs = RECIPES[scheme][0]
    if mode == "optimum":
        from optimum.exporters.executorch import main_export

        main_export(
            model_dir,
            task="text-generation",
            recipe="xnnpack",
            output_dir=out,
            use_custom_sdpa=True,
            use_custom_kv_cache=True,
            max_seq_len=MAX_LEN,
            **kwargs,
        )
        pte = next(Path(out).glob("*.pte"))
    else:
        pte = _fallback_export(model_dir, Path(out), kwargs)
    print("RESULT " + json.dumps({"pte": str(pte)}), flush=True)


def _fallback_export(model_dir: str, out: Path, kwargs: dict) -> Path:
    """transformers' own ExecuTorch wrapper (HF StaticCache, torch sdpa) + quantize_model_ + lowering."""
    import torch
    import transformers
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge_transform_and_lower
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    if kwargs:
        from executorch.extension.llm.export.quantize import quantize_model_

        quantize_model_(
            model,
            qlinear_config=kwargs["qlinear"],
            qlinear_group_size=32,
            qembedding_config=kwargs["qembedding"],
            qembedding_group_size=0,
            skip_incompatible_shapes=True,
        )
    model.generation_config.use_cache = True
    model.generation_config.cache_implementation = "static"
    wrapper = TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=MAX_LEN)
    seq = torch.export.Dim("seq", max=MAX_LEN - 1)
    with torch.no_grad():
        program = wrapper.export(
            input_ids=torch.zeros((1, 3), dtype=torch.long),
            cache_position=torch.arange(3),
            dynamic_shapes={"input_ids": {1: seq}, "cache_position": {0: seq}},
            strict=True,
        )
    import executorch.kernels.quantized  # noqa: F401

    edge = to_edge_transform_and_lower(
        program,
        partitioner=[XnnpackPartitioner()],
        compile_config=EdgeCompileConfig(_check_ir_validity=False, _skip_dim_order=True),
        constant_methods={
            "get_max_seq_len": MAX_LEN,
            "get_max_context_len": MAX_LEN,
            "get_vocab_size": CONFIG["vocab_size"],
            "use_kv_cache": True,
        },
    )
    et = edge.to_executorch(
        ExecutorchBackendConfig(extract_delegate_segments=True, do_quant_fusion_and_const_prop=True)
    )
    pte = out / "model.pte"
    pte.write_bytes(et.buffer)
    return pte


def upstream_run(model_dir: Path, out: Path, scheme: str, mode: str, site: Path | None, log: Path) -> dict:
    env = {"HF_HUB_OFFLINE": "1"}
    if mode == "optimum":
        env["PYTHONPATH"] = str(site)
    result = run_measured(
        [sys.executable, __file__, "--child", str(model_dir), str(out), scheme, mode], env=env, cwd=out.parent, log=log
    )
    lines = [line for line in result["tail"].splitlines() if line.startswith("RESULT ")]
    result["pte"] = json.loads(lines[-1][7:])["pte"] if lines and result["rc"] == 0 else None
    result["size"] = Path(result["pte"]).stat().st_size if result["pte"] else None
    return result


def check_loads_child(paths: list) -> int:
    """Child process: load every program (the llama:: custom ops registered); one line per failure."""
    from etforge.builders.llm.export import register_custom_ops
    from etforge.builders.runtime.program_io import check_loads

    register_custom_ops()
    failed = 0
    for path in paths:
        try:
            check_loads(Path(path))
        except Exception as exc:  # noqa: BLE001  (named, and the script exits 1)
            failed += 1
            print(f"LOADFAIL {path}: {type(exc).__name__}: {str(exc).strip()[:200]}", flush=True)
    return 1 if failed else 0


def program_problems(results: dict, programs: dict) -> list:
    """Why no ratio may be printed: a build that failed, a side without its program, a program that
    does not load in the ExecuTorch runtime (checked in a child: this process stays free of torch)."""
    problems = [
        f"{name}: exited {r['rc']}: {r['tail'].strip().splitlines()[-1:]}" for name, r in results.items() if r["rc"]
    ]
    problems += [
        f"{name}: no program was written" for name, path in programs.items() if not path or not Path(path).is_file()
    ]
    if problems:
        return problems
    check = subprocess.run(
        [sys.executable, __file__, "--check-loads", *map(str, programs.values())], capture_output=True, text=True
    )
    problems += [line[len("LOADFAIL ") :] for line in check.stdout.splitlines() if line.startswith("LOADFAIL ")]
    if check.returncode and not problems:
        problems.append(f"the load check itself failed: {check.stderr.strip()[-300:]}")
    return problems


# ---------------------------------------------------------------- main


def _row(name: str, r: dict) -> str:
    size = f"{r['size']:,} B" if r.get("size") else "-"
    status = "" if r["rc"] == 0 else f"  FAILED rc={r['rc']}"
    return f"{name:<44} {r['wall_s']:>8.1f} s {r['peak_rss_mb']:>7,} MB {size:>14}{status}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", type=Path, default=DEFAULT_SITE, help="optimum-executorch --target dir")
    parser.add_argument("--work", type=Path, help="working directory (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the working directory")
    parser.add_argument("--fallback", action="store_true", help="use the one-shot transformers script upstream")
    parser.add_argument(
        "--tiny", action="store_true", help="a 1-layer Llama of hidden 32 (checks the paths, not speed)"
    )
    args = parser.parse_args(argv)
    if args.tiny and not os.environ.get(TINY):  # the module's sizes are read at import: run again with them
        return subprocess.run(
            [sys.executable, __file__, *(argv or sys.argv[1:])], env={**os.environ, TINY: "1"}
        ).returncode
    work = args.work or Path(tempfile.mkdtemp(prefix="etforge_sbs_"))
    work.mkdir(parents=True, exist_ok=True)
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    try:
        project = work / "etforge"
        project.mkdir(exist_ok=True)
        model_dir = project / "ckpt"
        # in a child: this process stays free of torch, so that no child's ru_maxrss starts from
        # this process's pages at fork time
        made = subprocess.run(
            [sys.executable, __file__, "--checkpoint", str(model_dir)], capture_output=True, text=True
        )
        if made.returncode != 0:
            print(made.stdout + made.stderr, file=sys.stderr)
            return 1
        print(next(line for line in made.stdout.splitlines() if line.startswith("model:")), flush=True)
        sha = made.stdout.split()[-1]

        mode, site = "fallback", None
        if not args.fallback:
            site, how = ensure_site(args.site)
            print(
                f"upstream: optimum-executorch main_export ({how})"
                if site
                else f"upstream: optimum-executorch "
                f"cannot be installed ({how}); falling back to the one-shot transformers script",
                flush=True,
            )
            mode = "optimum" if site else "fallback"

        results = {}
        cell = "export:llama/xnnpack/{}"
        results["etforge 8da4w+e8w (capture, quantize, export)"] = r = etforge_run(
            project, sha, ["8da4w"], [cell.format("8da4w")], logs / "etforge_8da4w.txt"
        )
        r["size"] = etforge_size(project, "8da4w")
        for scheme in ("8da4w", "fp32"):
            label = f"upstream {mode} {scheme}{'+e8w' if scheme == '8da4w' else ''}"
            r = upstream_run(
                model_dir, work / f"upstream_{scheme}", scheme, mode, site, logs / f"upstream_{scheme}.txt"
            )
            if r["rc"] != 0 and mode == "optimum":
                print(
                    f"optimum-executorch failed ({r['tail'].strip().splitlines()[-1:]}); falling back to the "
                    "one-shot transformers script",
                    flush=True,
                )
                mode = "fallback"
                label = f"upstream fallback {scheme}"
                r = upstream_run(
                    model_dir, work / f"upstream_{scheme}", scheme, mode, site, logs / f"upstream_{scheme}.txt"
                )
            results[label] = r
        results["etforge + fp32, second scheme (reuses capture)"] = r = etforge_run(
            project, sha, ["8da4w", "fp32"], [cell.format("fp32")], logs / "etforge_fp32.txt"
        )
        r["size"] = etforge_size(project, "fp32")
        results["etforge no-op (both cells up to date)"] = r = etforge_run(
            project, sha, ["8da4w", "fp32"], [cell.format("8da4w"), cell.format("fp32")], logs / "etforge_noop.txt"
        )

        print(f"\n{'':<44} {'wall':>10} {'peak RSS':>10} {'.pte':>14}")
        for name, r in results.items():
            print(_row(name, r))
        names = list(results)
        e8, u8, uf, e2, noop = (results[n] for n in names)
        programs = {
            "etforge 8da4w": project / "artifacts" / "sbs" / "llama" / "llama_xnnpack_8da4w.pte",
            "etforge fp32": project / "artifacts" / "sbs" / "llama" / "llama_xnnpack_fp32.pte",
            "upstream 8da4w": u8.get("pte"),
            "upstream fp32": uf.get("pte"),
        }
        problems = program_problems(results, programs)
        if problems:
            print("\nno ratio printed: the two sides are not comparable", file=sys.stderr)
            for problem in problems:
                print(f"  {problem}", file=sys.stderr)
        else:
            print(f"\nboth sides built 8da4w and fp32; the {len(programs)} programs load in the ExecuTorch runtime")
            print(
                f"\nratios etforge / upstream: 8da4w+e8w wall {e8['wall_s'] / u8['wall_s']:.2f}, "
                f"peak RSS {e8['peak_rss_mb'] / u8['peak_rss_mb']:.2f}, size {e8['size'] / u8['size']:.3f}; "
                f"fp32 (second scheme) wall {e2['wall_s'] / uf['wall_s']:.2f}, size {e2['size'] / uf['size']:.3f}; "
                f"no-op {noop['wall_s']:.1f} s ({noop['started']} tasks started)"
            )
        (work / "results.json").write_text(
            json.dumps({k: {x: y for x, y in v.items() if x != "tail"} for k, v in results.items()}, indent=2)
        )
        print(f"logs: {logs}" if args.keep or args.work else "")
        return 1 if problems else 0
    finally:
        if not args.keep and not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--checkpoint":  # prints the model line, then the digest
        print(save_checkpoint(Path(sys.argv[2])), flush=True)
        sys.exit(0)
    if len(sys.argv) > 1 and sys.argv[1] == "--check-loads":
        sys.exit(check_loads_child(sys.argv[2:]))
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        upstream_child(*sys.argv[2:6])
        sys.exit(0)
    sys.exit(main())

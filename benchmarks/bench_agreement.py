#!/usr/bin/env python3
"""Does etforge's benchmark agree with a plain timing loop over the same .pte?

    .venv/bin/python benchmarks/bench_agreement.py                 # builds a small CNN for XNNPACK
    .venv/bin/python benchmarks/bench_agreement.py model.pte       # random inputs from the program
    .venv/bin/python benchmarks/bench_agreement.py model.pte --reference reference.npz

In one process, with one thread count, it alternates ``etforge.builders.bench.benchmark.build_benchmark``
(the builder the ``benchmark:<cell>`` tasks run) with a plain loop
(``time.perf_counter()`` around ``method.execute``, nothing else), over the same
inputs, for ``--rounds`` rounds, swapping which goes first each round. It prints
both p50s (over all samples of all rounds) and their ratio, and exits 1 when they
differ by more than ``--tolerance`` (10%). Timing on a shared 2-core machine is
noisy: rerun before you trust one disagreement.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

CNN_INPUT_SHAPE = (1, 3, 64, 64)


def build_small_cnn_pte(out_dir: Path, shape=CNN_INPUT_SHAPE) -> Path:
    """Lower models/small_cnn.py to an XNNPACK fp32 .pte in ``out_dir``."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from models.small_cnn import build

    torch.manual_seed(0)
    model = build(num_classes=10, width=16).eval()
    example = (torch.randn(*shape),)
    exported = torch.export.export(model, example, strict=False)
    program = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()]).to_executorch()
    pte = Path(out_dir) / "small_cnn_xnnpack_fp32.pte"
    pte.write_bytes(program.buffer)
    return pte


def inputs_from_program(pte: Path, method_name: str, seed: int = 0) -> list:
    """Seeded random inputs shaped and typed as the program's method declares them."""
    import numpy as np
    from executorch.runtime import Runtime

    from etforge.builders.runtime.pte_interpreter import SCALAR_TYPES  # ExecuTorch ScalarType code -> dtype name

    program = Runtime.get().load_program(str(pte))
    meta = program.load_method(method_name).metadata
    rng = np.random.default_rng(seed)
    inputs = []
    for i in range(meta.num_inputs()):
        tmeta = meta.input_tensor_meta(i)
        dtype = SCALAR_TYPES.get(int(tmeta.dtype()))
        if dtype is None or dtype == "bfloat16":  # numpy has no bfloat16
            raise SystemExit(f"input {i}: unsupported ExecuTorch dtype code {tmeta.dtype()}; pass --reference")
        shape = tuple(tmeta.sizes())
        if dtype.startswith("float"):
            inputs.append(rng.standard_normal(shape).astype(dtype))
        elif dtype == "bool":
            inputs.append(rng.integers(0, 2, shape).astype(bool))
        else:
            inputs.append(rng.integers(0, 8, shape).astype(dtype))
    return inputs


def plain_loop(pte: Path, inputs: list, method_name: str, warmup: int, iterations: int) -> list:
    """The obvious way to time a program: seconds per call."""
    import torch
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(str(pte))
    method = program.load_method(method_name)
    tensors = [torch.from_numpy(x).contiguous() for x in inputs]
    for _ in range(warmup):
        method.execute(tensors)
    times = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        method.execute(tensors)
        times.append(time.perf_counter() - t0)
    return times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pte", nargs="?", type=Path, help="program to time (default: build a small CNN)")
    parser.add_argument("--reference", type=Path, help="a capture's reference.npz (input_0, ...) for inputs")
    parser.add_argument("--method", default="forward")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iterations", type=int, default=50, help="timed iterations per round and side (default 50)")
    parser.add_argument("--rounds", type=int, default=10, help="alternating rounds (default 10)")
    parser.add_argument("--threads", type=int, help="runtime threads (default: the runtime's default)")
    parser.add_argument("--tolerance", type=float, default=0.10, help="allowed |ratio - 1| (default 0.10)")
    parser.add_argument("--save-pte", type=Path, help="keep the built small-CNN .pte here")
    args = parser.parse_args(argv)

    import executorch.kernels.quantized  # noqa: F401  (as build_benchmark does)
    import numpy as np
    from executorch.extension.pybindings import portable_lib

    from etforge.builders.bench.benchmark import build_benchmark, current_thread_count
    from etforge.builders.capture.reference import load_reference

    with tempfile.TemporaryDirectory(prefix="bench-agreement-") as tmp:
        tmp = Path(tmp)
        pte = args.pte
        if pte is None:
            pte = build_small_cnn_pte(tmp)
            if args.save_pte:
                args.save_pte.write_bytes(pte.read_bytes())
        if not pte.is_file():
            print(f"no such program: {pte}", file=sys.stderr)
            return 2
        if args.reference:
            inputs, _ = load_reference(args.reference)
        else:
            inputs = inputs_from_program(pte, args.method)
        reference = tmp / "reference.npz"
        np.savez(reference, **{f"input_{i}": x for i, x in enumerate(inputs)})

        # One thread count for the whole process, set before any program is loaded;
        # build_benchmark gets the same number (and so leaves the pool alone).
        if args.threads is not None and args.threads != current_thread_count():
            portable_lib._unsafe_reset_threadpool(args.threads)
        threads = current_thread_count()
        options = {
            "warmup": args.warmup,
            "iterations": args.iterations,
            "threads": threads,
            "max_seconds": None,
            "method": args.method,
        }
        print(
            f"program: {pte} ({pte.stat().st_size / 1024:.1f} KB); inputs: "
            + ", ".join(f"{list(x.shape)} {x.dtype}" for x in inputs)
            + f"; threads: {threads}; {args.rounds} rounds x {args.iterations} iterations, "
            f"{args.warmup} warm-up",
            flush=True,
        )

        bench_ms, plain_ms, round_ratios = [], [], []
        for r in range(args.rounds):
            order = ("benchmark", "plain") if r % 2 == 0 else ("plain", "benchmark")
            round_p50 = {}
            for side in order:
                if side == "benchmark":
                    workdir = tmp / f"round{r}"
                    workdir.mkdir()
                    result = build_benchmark(None, pte, reference, [], options, workdir)
                    record = json.loads(result.files["bench.json"].read_text())
                    if record["threads"]["used"] != threads:
                        print(
                            f"warning: benchmark used {record['threads']['used']} threads, plain loop {threads}",
                            file=sys.stderr,
                        )
                    samples = record["samples_ms"]
                    bench_ms += samples
                else:
                    samples = [t * 1e3 for t in plain_loop(pte, inputs, args.method, args.warmup, args.iterations)]
                    plain_ms += samples
                round_p50[side] = statistics.median(samples)
            round_ratios.append(round_p50["benchmark"] / round_p50["plain"])
            print(
                f"round {r + 1} ({order[0]} first): benchmark p50 {round_p50['benchmark']:.4f} ms, "
                f"plain p50 {round_p50['plain']:.4f} ms, ratio {round_ratios[-1]:.3f}",
                flush=True,
            )

    bench_p50, plain_p50 = statistics.median(bench_ms), statistics.median(plain_ms)
    ratio = bench_p50 / plain_p50
    agree = abs(ratio - 1.0) <= args.tolerance
    print(
        f"benchmark p50: {bench_p50:.4f} ms (etforge.builders.bench.benchmark.build_benchmark, {len(bench_ms)} samples)"
    )
    print(f"plain p50: {plain_p50:.4f} ms (perf_counter loop, {len(plain_ms)} samples)")
    print(
        f"median of the {len(round_ratios)} per-round ratios: {statistics.median(round_ratios):.3f} "
        f"(pairs adjacent in time; less sensitive to drifting load)"
    )
    load = os.getloadavg()
    if load[0] > (os.cpu_count() or 1):
        print(f"note: load average {load[0]:.2f} on {os.cpu_count()} cores: other work competed for the CPU")
    print(
        f"ratio (benchmark / plain): {ratio:.3f}: "
        + (f"agree within {args.tolerance:.0%}" if agree else f"DISAGREE by more than {args.tolerance:.0%}")
    )
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())

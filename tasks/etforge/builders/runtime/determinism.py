"""Deterministic numerics while a number that ships is measured (eager references, validation runs).

A verdict's SQNR and errors go into the manifests, the report and the release, which must be
byte-identical between two clean builds. Multi-threaded float reductions are not: their order
depends on how many threads a kernel got, and BLAS libraries pick that by the load of the
machine. Measured here: tiny_llm/portable/fp32 validated at 130.67 dB in one build and 130.10 dB
in the other. So eager PyTorch runs on one thread with deterministic algorithms, and the
ExecuTorch runtime's threadpool on one thread, inside :func:`deterministic`; what was set
before is restored after (the benchmark stage picks its own thread count).

The runtime also computes differently depending on which of ExecuTorch's native libraries a
process loaded first: the runtime (pybindings) or an AOT op library (``executorch.kernels.quantized``
and the LLM custom ops, which carry copies of some kernel code). Measured, executorch 1.5.1: the
same tiny_bert/portable/fp32 program on the same inputs gives 129.46 dB when the runtime was
loaded first and 133.57 dB when the quantized op library was, every time; which came first in a
worker depended on the tasks it ran before, so on the scheduler (`-n 2` or not). So every build
action loads them in one order first (:func:`load_runtime_libraries`, each stage's ``setup``
in the stage table), and every entry to the runtime goes through :func:`runtime`.
"""

from __future__ import annotations

import contextlib
import importlib

THREADS = 1


@contextlib.contextmanager
def deterministic(runtime: bool = False):
    """Run the block with one intra-op thread and deterministic algorithms in torch, and with
    ``runtime`` the ExecuTorch runtime's threadpool on one thread too (an eager-only block does
    not import the runtime)."""
    import torch

    threads = torch.get_num_threads()
    algorithms = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    pool = _runtime_threadpool() if runtime else None
    pool_threads = pool[0]() if pool else None
    torch.set_num_threads(THREADS)
    torch.use_deterministic_algorithms(True, warn_only=True)  # an op without a deterministic kernel still runs
    if pool:
        pool[1](THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(algorithms, warn_only=warn_only)
        if pool and pool_threads:
            pool[1](pool_threads)


# ExecuTorch's runtime, then the AOT op libraries a program or an export may need, in this order.
RUNTIME_LIBRARIES = (
    "executorch.extension.pybindings.portable_lib",
    "executorch.kernels.quantized",
    "executorch.extension.llm.custom_ops.custom_ops",
)


def load_runtime_libraries() -> None:
    """Load ExecuTorch's runtime and op libraries in RUNTIME_LIBRARIES' order (once per process;
    a no-op after): the kernels a program runs then do not depend on what the process did before."""
    for name in RUNTIME_LIBRARIES:
        importlib.import_module(name)


def runtime():
    """``executorch.runtime.Runtime.get()``, its libraries loaded in the one order: the one way
    etforge reaches the runtime."""
    load_runtime_libraries()
    from executorch.runtime import Runtime

    return Runtime.get()


def _runtime_threadpool():
    """(get, reset) of the ExecuTorch runtime's threadpool size, or None when this build has no such API."""
    try:
        from executorch.extension.pybindings import portable_lib
    except ImportError:
        return None
    get = getattr(portable_lib, "_threadpool_get_thread_count", None)
    reset = getattr(portable_lib, "_unsafe_reset_threadpool", None)
    return (get, reset) if get and reset else None

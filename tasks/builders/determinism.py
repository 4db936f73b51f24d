"""Deterministic numerics while a number that ships is measured (eager references, validation runs).

A verdict's SQNR and errors go into the manifests, the report and the release, which must be
byte-identical between two clean builds. Multi-threaded float reductions are not: their order
depends on how many threads a kernel got, and BLAS libraries pick that by the load of the
machine. Measured here: tiny_llm/portable/fp32 validated at 130.67 dB in one build and 130.10 dB
in the other. So eager PyTorch runs on one thread with deterministic algorithms, and the
ExecuTorch runtime's threadpool on one thread, inside :func:`deterministic`; what was set
before is restored after (the benchmark stage picks its own thread count).
"""

from __future__ import annotations

import contextlib

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


def _runtime_threadpool():
    """(get, reset) of the ExecuTorch runtime's threadpool size, or None when this build has no such API."""
    try:
        from executorch.extension.pybindings import portable_lib
    except ImportError:
        return None
    get = getattr(portable_lib, "_threadpool_get_thread_count", None)
    reset = getattr(portable_lib, "_unsafe_reset_threadpool", None)
    return (get, reset) if get and reset else None

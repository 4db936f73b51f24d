"""The app's runtime: which shipped variants ExecuTorch's compatibility policy does not promise to load.

    app_runtimes(plan) -> the versions of ``manifests.app_runtime`` (one or a list), or ()
    refusals(plan, shipped) -> one line per shipped variant outside a version's load window

The window is etforge.program.compat's (a table, schemas/executorch_compat.json); the
version that built a program is its export record's.
"""

from __future__ import annotations

from etforge.program.compat import outside_window


def app_runtimes(plan) -> tuple:
    value = (plan.manifests or {}).get("app_runtime")
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


def refusals(plan, shipped) -> list:
    """``<cell>: <why>`` for each shipped outcome some app runtime is outside the window of."""
    lines = []
    for o in shipped:
        built_by = o.evidence.executorch_version or plan.toolchain.get("executorch")
        for runtime in app_runtimes(plan):
            why = outside_window(built_by, runtime)
            if why:
                lines.append(f"{o.cell}: {why} (manifests.app_runtime)")
                break
    return lines

"""Which part of the plan a command line asks for, and what the environment overrides.

--pipeline FILE               or $ETFORGE_PIPELINE, else pipeline.yaml (pipeline_path)
--model/--backend/--quant     comma-separated names (select)
--shard k/n                   a stable split of the cells, the same on every machine (shard)
$ETFORGE_CACHE_REMOTE, $ETFORGE_CACHE_READ_ONLY   over pipeline.yaml's `cache:` (cache_settings)
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from etforge.config.model import SECTIONS, Plan, cell_dim
from etforge.core.digest import digest
from etforge.core.errors import PipelineError


def pipeline_path(value: str | None, workdir: str | None = None) -> Path:
    """``--pipeline FILE`` (or $ETFORGE_PIPELINE), else ``pipeline.yaml``, taken from ``workdir``
    (the directory the command was started in), default the current one."""
    return Path(workdir or os.getcwd(), value or "pipeline.yaml").absolute()


def select(plan: Plan, model=None, backend=None, quantization=None) -> tuple:
    """Cells matching comma-separated name lists (None matches all)."""
    wanted = {"model": model, "backend": backend, "quantization": quantization}
    known = {"model": plan.models, "backend": plan.backends, "quantization": plan.quantizations}
    filters = {}
    for dim, value in wanted.items():
        if not value:
            continue
        names = [v.strip() for v in value.split(",") if v.strip()]
        for n in names:
            if n not in known[dim]:
                raise PipelineError(
                    f"unknown {dim} {n!r} on the command line; known: {', '.join(known[dim])}",
                    file=plan.source.display,
                    line=plan.source.section_lines[dim],
                    key=SECTIONS[dim],
                )
        filters[dim] = set(names)
    return tuple(c for c in plan.cells if all(cell_dim(c, d) in names for d, names in filters.items()))


def shard(plan: Plan, cells: tuple, spec: str) -> tuple:
    """Cells of shard ``k/n`` (1-based): a stable split by cell name, the same on every machine."""
    try:
        k, n = (int(x) for x in spec.split("/"))
        if not 1 <= k <= n:
            raise ValueError
    except ValueError:
        raise PipelineError(
            f"--shard {spec!r}: expected k/n with 1 <= k <= n, e.g. 2/4", file=plan.source.display
        ) from None
    return tuple(c for c in cells if int(digest(c.name)[:8], 16) % n == k - 1)


def named(plan: Plan, cells: tuple, names: str) -> tuple:
    """The cells of ``cells`` named in a comma-separated list (``etforge ci-matrix`` hands each CI job
    its exact list); a name that is no cell of the matrix is one line."""
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = {c.name for c in plan.cells}
    for name in wanted:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise PipelineError(f"--cells: {name!r} is no cell of the matrix{hint}", file=plan.source.display)
    return tuple(c for c in cells if c.name in set(wanted))


def cache_settings(section: dict | None, root: Path) -> tuple:
    """(remote URL or None, read_only) from pipeline.yaml's ``cache:``, the environment winning."""
    section = section or {}
    remote = _remote_url(os.environ.get("ETFORGE_CACHE_REMOTE") or section.get("remote"), root)
    return remote, _env_flag("ETFORGE_CACHE_READ_ONLY", section.get("read_only", False))


def _remote_url(url: str | None, root: Path) -> str | None:
    """A relative directory is taken from the project directory, like every other path."""
    if not url or "://" in url or os.path.isabs(url):
        return url
    return str(root / url)


def _env_flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    return default if value is None else value.strip().lower() in ("1", "true", "yes", "on")

"""Every path under ``artifacts/``: the one place that names where etforge writes.

    artifacts/
      cache/<k[:2]>/<k>/          the content-addressed store (etforge.cache.store)
      .etforge/                   run lock, digest memo, remote bookkeeping
      .doit.sqlite3               doit's own database (etforge.engine.doit_db)
      release/<name>-<version>/   and .tar.gz, .bench.json (etforge.publish.release)
      <pipeline>/
        <model>/<stem>.pte        and .ptd (external weights), .export.json, .numerics.json, .bpte,
                                  .bundled.json, .bench.json
        manifests/                models.g.dart, pubspec_assets.yaml, models.cmake, index.json, etforge_models.h
        report.html, summary.json
        .state/<task>.json        task records (etforge.cache.records)
        logs/<task>.log

``<stem>`` is ``<model>_<backend>_<quant>``; a task name becomes a file name
with ``:`` and ``/`` as ``__``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from etforge.config.digest_cache import PROJECT_MEMO


@dataclass(frozen=True)
class ArtifactLayout:
    root: Path  # the project directory (where pipeline.yaml is)
    name: str  # the pipeline's name

    # (the directories every other path is under: made once per layout, a no-op run asks ~4,000 times)
    @cached_property
    def artifacts_dir(self) -> Path:
        return self.root / "artifacts"

    @property
    def cache_dir(self) -> Path:
        return self.artifacts_dir / "cache"

    @property
    def etforge_dir(self) -> Path:
        return self.artifacts_dir / ".etforge"

    @property
    def digests_file(self) -> Path:
        return self.root / PROJECT_MEMO

    @property
    def lock_file(self) -> Path:
        return self.etforge_dir / "run.lock"

    @cached_property
    def out_dir(self) -> Path:
        return self.artifacts_dir / self.name

    @cached_property
    def state_dir(self) -> Path:
        return self.out_dir / ".state"

    @property
    def manifest_dir(self) -> Path:
        return self.out_dir / "manifests"

    @property
    def report_path(self) -> Path:
        return self.out_dir / "report.html"

    @property
    def summary_path(self) -> Path:
        return self.out_dir / "summary.json"

    @property
    def release_root(self) -> Path:
        return self.artifacts_dir / "release"

    # ---------------------------------------------------------------- per cell

    def cell_dir(self, cell) -> Path:
        return self.out_dir / cell.model.name

    def pte_path(self, cell) -> Path:
        return self.cell_dir(cell) / f"{cell.stem}.pte"

    def ptd_path(self, cell) -> Path:
        """The program's external weights, beside it (etforge.builders.runtime.program_io data_file_of);
        what ships is named by its sha256 instead (manifests, release): cells with the same
        weights share that file."""
        return self.cell_dir(cell) / f"{cell.stem}.ptd"

    def export_info_path(self, cell) -> Path:
        return self.cell_dir(cell) / f"{cell.stem}.export.json"

    def oplist_path(self, cell) -> Path:
        """The program's operators outside its delegates, in ExecuTorch's selected_operators.yaml format."""
        return self.cell_dir(cell) / f"{cell.stem}.selected_operators.yaml"

    def numerics_path(self, cell) -> Path:
        return self.cell_dir(cell) / f"{cell.stem}.numerics.json"

    def bundled_path(self, cell) -> Path:
        return self.cell_dir(cell) / f"{cell.stem}.bpte"

    def bundled_info_path(self, cell) -> Path:
        return self.cell_dir(cell) / f"{cell.stem}.bundled.json"

    def bench_path(self, cell) -> Path:
        return self.cell_dir(cell) / f"{cell.stem}.bench.json"

    def etrecord_path(self, cell) -> Path:
        """The export's ETRecord and the benchmark's ETDump: a profile the devtools Inspector opens."""
        return self.cell_dir(cell) / f"{cell.stem}.etrecord"

    def etdump_path(self, cell) -> Path:
        return self.cell_dir(cell) / f"{cell.stem}.etdump"

    # ---------------------------------------------------------------- per task

    def state_file(self, task_name: str) -> Path:
        return self.state_dir / f"{_file_stem(task_name)}.json"

    def log_path(self, task_name: str) -> Path:
        return self.out_dir / "logs" / f"{_file_stem(task_name)}.log"

    def output(self, where: str, subject, blob: str) -> Path:
        """Where a stage's blob goes (etforge.pipeline.stages ``outputs``): ``where`` names a method of
        this class taking the subject (``pte_path``), or a directory the blob goes into (``manifest_dir``)."""
        place = getattr(self, where)
        return place(subject) if callable(place) else place / blob

    # ---------------------------------------------------------------- release

    def release_dir(self, release_name: str) -> Path:
        return self.release_root / release_name

    def archive_path(self, release_name: str) -> Path:
        return self.release_root / f"{release_name}.tar.gz"

    def release_bench_path(self, release_name: str) -> Path:
        return self.release_root / f"{release_name}.bench.json"

    def shown(self, path) -> str:
        """A path as messages and manifests name it: relative to artifacts/<pipeline>/, else its file name."""
        try:
            return Path(path).relative_to(self.out_dir).as_posix()
        except ValueError:
            return Path(path).name


def layout_of(plan) -> ArtifactLayout:
    """The plan's layout (one per plan: it is derived from the plan alone)."""
    memo = getattr(plan, "memo", None)
    if memo is None:
        return ArtifactLayout(plan.root, plan.name)
    found = memo.get("layout")
    if found is None or found.root != plan.root or found.name != plan.name:
        found = memo["layout"] = ArtifactLayout(plan.root, plan.name)
    return found


def _file_stem(task_name: str) -> str:
    return task_name.replace(":", "__").replace("/", "__")

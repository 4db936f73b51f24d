"""The doit actions and ``uptodate`` checks of every stage, one of each per kind of subject.

    run_stage           a model, graph or cell task: skip, read upstream entries, build, record
    run_matrix_stage    a matrix-wide task (manifest, report): content, key, render, record
    matrix_up_to_date   its ``uptodate``: evaluated after the cells' tasks ran, so it sees their records
    run_uncached        a stage with no store entry (release): the builder decides and records

Builders, content and render functions are named by dotted path in the stage
table and imported here, inside the action: planning imports none of them
(neither torch nor the publishing modules). A content function is handed the run's
``outcomes`` too: an object the loader made (publish's RunOutcomes, opaque here), so
that the cells' outcomes are decided once per run whichever stage reads them.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from etforge.cache.content_keys import MEMO_FILE as CONTENT_KEYS_FILE
from etforge.cache.content_keys import ContentKeys
from etforge.cache.records import write_state
from etforge.cache.store import Store
from etforge.core.digest import canonical_json, digest
from etforge.core.dotted_path import load_callable
from etforge.core.text import first_line
from etforge.engine.cached_run import is_up_to_date, run_cached
from etforge.engine.inputs import judges_current_program, upstream_entries
from etforge.pipeline.keys import content_key, reads_of, template_digests
from etforge.pipeline.layout import layout_of
from etforge.pipeline.results import BuildRequest, Skip, TaskStatus
from etforge.pipeline.specs import cell_specs, spec_of
from etforge.pipeline.stages import STAGE, StageTable, holds, kind_of, missing_here


def run_stage(plan, table: StageTable, stage_name: str, subject, store: Store, host: dict | None = None) -> bool:
    """doit action of a model, graph or cell task (and how a consumer rebuilds a missing entry), with
    the builders of ``table``."""
    stage = STAGE[stage_name]
    spec = spec_of(plan, stage, subject, host)

    def rebuild(up, up_subject) -> bool:
        return run_stage(plan, table, up.name, up_subject, store, host)

    def inputs() -> dict:
        for predicate, reason in stage.skip_if:
            if holds(predicate, plan, subject):
                raise Skip(reason.format(missing=missing_here(subject)))
        return upstream_entries(plan, stage, subject, store, host, rebuild)

    def build(workdir: Path, upstream: dict):
        if table.setup:
            load_callable(table.setup)()
        builder = load_callable(table.builder_for(stage, kind_of(subject)))  # the model's kind picks it, once
        return builder(BuildRequest(plan=plan, subject=subject, upstream=upstream, workdir=workdir))

    def changed() -> str | None:
        digests = plan.code.etforge.digests
        edited = digests.changed_since_seen(reads_of(plan, stage, subject, host)) if digests is not None else None
        return None if edited is None else _shown(plan, Path(edited))

    accept = judges_current_program(plan, stage, subject, store, host, rebuild) if stage.judges else None
    return run_cached(spec, store, build, inputs=inputs, accept=accept, changed=changed)


def _shown(plan, path: Path) -> str:
    """A file as a message names it: relative to the project, else as it is."""
    try:
        return path.relative_to(plan.root.resolve()).as_posix()
    except ValueError:
        return str(path)


def _matrix_spec(plan, stage, cells, host, outcomes=None):
    """(content, spec with its content key) of a matrix-wide stage."""
    content = load_callable(stage.matrix.content)(plan, cells, host, outcomes=outcomes)
    return content, spec_of(plan, stage, key=content_key(plan, stage, content))


def _content_inputs(plan, stage, cells, host) -> str:
    """What a matrix-wide stage's content is computed from besides the files it reads: the stage,
    its code and templates, the plan, the keys of every task whose record decides a cell (a changed
    model source changes them, not the plan), the selected cells and the host."""
    per_host = plan.memo.setdefault("content_inputs", {})
    host_json = canonical_json(host)
    shared = per_host.get(host_json)
    if shared is None:  # the same for both stages: once per run
        shared = per_host[host_json] = digest(
            {
                "plan": hashlib.sha256(repr(plan).encode()).hexdigest(),  # every resolved field
                "keys": {s.name: s.key for cell in plan.cells for s in cell_specs(plan, cell, host)},
            }
        )
    return digest(
        {
            "shared": shared,
            "stage": stage.name,
            "content": stage.matrix.content,
            "code": plan.code.etforge.of(stage.code),
            "templates": template_digests(stage),
            "cells": [c.name for c in cells],
            "host": host,
        }
    )


def matrix_up_to_date(plan, stage_name: str, cells, store: Store, host: dict | None = None, outcomes=None) -> bool:
    """Whether the stage's outputs are current: its key is its content's digest, kept in a memo
    (etforge.cache.content_keys) while nothing the content reads changed, so that a no-op run does
    not build the content again."""
    stage = STAGE[stage_name]
    try:
        if not stage.matrix.content_reads:  # no file set to watch: no memo
            return is_up_to_date(_matrix_spec(plan, stage, cells, host, outcomes)[1], store)
        layout = layout_of(plan)
        memo = ContentKeys(layout.etforge_dir / CONTENT_KEYS_FILE)
        name = f"{layout.out_dir.name}:{stage.name}"
        inputs = _content_inputs(plan, stage, cells, host)
        files, trusted = load_callable(stage.matrix.content_reads)(plan).signature()
        key = memo.get(name, inputs, files)
        if key is not None:
            return is_up_to_date(spec_of(plan, stage, key=key), store)
        _, spec = _matrix_spec(plan, stage, cells, host, outcomes)
        if trusted:  # signatures taken before the content read its files, all old enough to vouch
            memo.keep(name, inputs, files, spec.key)
        return is_up_to_date(spec, store)
    except Exception:  # the action reports it
        return False


def run_matrix_stage(
    plan, table: StageTable, stage_name: str, cells, store: Store, host: dict | None = None, outcomes=None
) -> bool:
    stage = STAGE[stage_name]
    try:
        content, spec = _matrix_spec(plan, stage, cells, host, outcomes)
    except Exception as exc:  # e.g. two variants that would ship under one file name
        reason = first_line(exc)
        # A truthful record for the reporter, under a key that is never current.
        write_state(spec_of(plan, stage), TaskStatus.FAILED, key="", reason=reason)
        sys.stderr.write(f"etforge: error: {stage.name}: {reason}\n")
        return False

    def build(workdir: Path):
        return load_callable(table.builder_for(stage))(content, workdir)

    ok = run_cached(spec, store, build)
    if not ok:
        sys.stderr.write(f"etforge: {stage.name}: failed (log: {spec.log_file})\n")
    return ok


def run_uncached(
    plan, table: StageTable, stage_name: str, cells, host: dict | None = None, outcomes=None, **options
) -> bool:
    """A stage with no store entry (the release): its builder decides and records, from the run's
    ``outcomes`` (publish's RunOutcomes, opaque here) and its flags."""
    return load_callable(table.builder_for(STAGE[stage_name]))(plan, cells, host, outcomes=outcomes, **options)

"""Each fact is computed once per run: a store entry is hashed once per process while its files keep
their stat signatures, an fp32 cell's export reads its capture once (graph and capture are one task),
and a builder takes a program's sha256 from the entry the store verified."""

from __future__ import annotations

import hashlib
import time

from etforge.cache import entries
from etforge.cache.store import Store
from etforge.config.digest_cache import RACY_NS
from etforge.engine.inputs import upstream_entries
from etforge.pipeline.specs import spec_of
from etforge.pipeline.stages import STAGE
from unit.support import HOST, make_unit_project


def _settled() -> None:
    """Wait until files written now are old enough to vouch for their bytes (RACY_NS: git's rule)."""
    time.sleep(2 * RACY_NS / 1e9)


def _hashes(monkeypatch) -> list:
    hashed: list = []
    real = entries.sha256_file

    def counting(path):
        hashed.append(path.name)
        return real(path)

    monkeypatch.setattr(entries, "sha256_file", counting)
    return hashed


def test_a_verified_entry_is_not_hashed_again_while_its_files_keep_their_signatures(tmp_path, monkeypatch):
    blob = tmp_path / "program.pte"
    blob.write_bytes(b"a program")
    store = Store(tmp_path / "cache")
    store.put("k" * 64, {"program.pte": blob}, {"status": "ok"})
    _settled()
    hashed = _hashes(monkeypatch)
    fresh = Store(tmp_path / "cache")  # another process of the run: it verifies once
    assert fresh.get("k" * 64) is not None and fresh.get("k" * 64) is not None
    assert hashed == ["program.pte"]
    assert fresh.sha256_of("k" * 64) == {"program.pte": hashlib.sha256(b"a program").hexdigest()}
    # a blob changed under the same name: its signature differs, so it is verified (and refused) again
    stored = fresh.entry_dir("k" * 64) / "program.pte"
    stored.write_bytes(b"another!!")
    assert fresh.get("k" * 64) is None
    assert hashed == ["program.pte", "program.pte"]


class CountingStore(Store):
    def __init__(self, root):
        super().__init__(root)
        self.reads: list = []

    def get(self, key):
        self.reads.append(key)
        return super().get(key)


def test_an_fp32_cells_export_reads_its_capture_once(tmp_path):
    project = make_unit_project(tmp_path / "p")
    plan = project.plan()
    cell = next(c for c in plan.cells if c.transform is None)
    capture = spec_of(plan, "capture", cell, HOST)
    store = CountingStore(tmp_path / "cache")
    blob = tmp_path / "model.pt2"
    blob.write_bytes(b"a graph")
    store.put(capture.store_key, {"model.pt2": blob}, {"status": "ok"})
    found = upstream_entries(plan, STAGE["export"], cell, store, HOST, rebuild=lambda *_: False)
    assert set(found) == {"graph", "capture"} and found["graph"] is found["capture"]
    assert store.reads == [capture.store_key]  # one fetch (and verification) for both relations
    assert found["capture"].sha256 == {"model.pt2": hashlib.sha256(b"a graph").hexdigest()}

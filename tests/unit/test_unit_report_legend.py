"""The report's notes legend: a sentence three or more cells carry is said once, under a short tag.

Generic grouping (etforge.publish.report.legend, etforge.publish.report.glance): no sentence is
special-cased, tags follow first appearance, and each row keeps only what it alone says.
"""

from __future__ import annotations

from etforge.publish.outcome import STATUSES
from etforge.publish.report.glance import glance
from etforge.publish.report.legend import LegendEntry, RowNote, note_legend

RANDOM = "validated on seeded random inputs only (name data under models.m.validation in pipeline.yaml)"
VGF = "not run here, missing: an ExecuTorch runtime with VgfBackend"


def test_a_sentence_three_cells_share_goes_to_the_legend_once():
    notes = [
        f"{RANDOM}; SQNR 12 dB < 20 dB",
        RANDOM,
        f"{VGF}; {RANDOM}",
        f"{VGF}; {VGF}",  # said twice by one cell: counts once
        VGF,
        "its own reason",
        "",
    ]
    legend, rows = note_legend(notes)
    assert legend == [LegendEntry("N1", RANDOM, 3), LegendEntry("N2", VGF, 3)]
    assert rows == [
        RowNote("SQNR 12 dB < 20 dB", ("N1",)),
        RowNote("", ("N1",)),
        RowNote("", ("N2", "N1")),
        RowNote("", ("N2",)),
        RowNote("", ("N2",)),
        RowNote("its own reason"),
        RowNote(""),
    ]


def test_a_sentence_two_cells_share_stays_in_their_rows():
    legend, rows = note_legend(["a; b", "a", "c"])
    assert legend == []
    assert [r.text for r in rows] == ["a; b", "a", "c"] and all(not r.tags for r in rows)
    legend, _ = note_legend(["a", "a"], min_cells=2)
    assert legend == [LegendEntry("N1", "a", 2)]


def row(cell: str, status: str, note: str) -> dict:
    model, backend, quant = cell.split("/")
    return {"cell": cell, "model": model, "backend": backend, "quant": quant, "status": status, "note": note}


def test_glance_tags_rows_and_puts_failing_and_on_device_cells_first():
    rows = [
        row("m/xnnpack/fp32", "ok", f"{RANDOM}; fine"),
        row("m/qnn/fp32", "on-device", RANDOM),
        row("m/portable/int8", "failed", f"SQNR 3 dB; {RANDOM}"),
        row("m/vgf/int8", "skipped", "no runtime"),
    ]
    view = glance(rows, STATUSES)
    assert view["note_legend"] == [{"tag": "N1", "text": RANDOM, "cells": 3}]
    assert [r["note_text"] for r in rows] == ["fine", "", "SQNR 3 dB", "no runtime"]
    assert rows[0]["note_tags"] == [{"tag": "N1", "text": RANDOM}] and rows[3]["note_tags"] == []
    assert [a["cell"] for a in view["attention"]] == ["m/portable/int8", "m/qnn/fp32"]  # failing first
    assert view["filters"]["backend"] == ["xnnpack", "qnn", "portable", "vgf"]
    assert view["filters"]["quant"] == ["fp32", "int8"]
    assert set(view["filters"]["status"]) == {"ok", "on-device", "failed", "skipped"}

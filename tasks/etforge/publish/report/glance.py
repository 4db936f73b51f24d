"""What makes the report's cell table read at a glance: shared notes as a legend, the filters'
choices, and the cells that need a look first.

    glance(rows, status_order) -> the page context's "note_legend", "filters" and "attention";
                                  each row gains "note_text" (its own sentences) and "note_tags" (tag, text)
"""

from __future__ import annotations

from dataclasses import asdict

from etforge.publish.report.legend import note_legend

# The states a person looks at first: the run fails on them, or nothing here could judge them.
ATTENTION = ("failed", "unexpectedly-passing", "on-device")


def glance(rows: list, status_order: tuple) -> dict:
    legend, notes = note_legend([r["note"] for r in rows])
    said = {e.tag: e.text for e in legend}
    for row, note in zip(rows, notes, strict=True):
        row["note_text"] = note.text
        row["note_tags"] = [{"tag": t, "text": said[t]} for t in note.tags]  # the text: the tag's title
    present = {r["status"] for r in rows}
    statuses = [s for s in status_order if s in present] + sorted(present - set(status_order))
    return {
        "note_legend": [asdict(e) for e in legend],
        "filters": {
            "status": statuses,
            "backend": list(dict.fromkeys(r["backend"] for r in rows)),
            "quant": list(dict.fromkeys(r["quant"] for r in rows)),
        },
        "attention": [{"cell": r["cell"], "status": r["status"]} for s in ATTENTION for r in rows if r["status"] == s],
        "attention_states": list(ATTENTION),
    }

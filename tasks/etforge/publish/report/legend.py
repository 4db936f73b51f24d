"""Notes many cells share, said once: the report's legend, and each row's own text plus short tags.

A row's note is sentences joined by "; " (etforge.publish.summary). A sentence that ``min_cells`` or
more rows carry goes to the legend under a short tag ("N1", "N2", ... in order of first appearance);
the row keeps the sentences only it (or one other) says, and the tags of the shared ones. Nothing is
special-cased: whatever repeats, the legend says once.

    note_legend(notes, min_cells=3) -> (legend entries, one RowNote per note, in order)
"""

from __future__ import annotations

from dataclasses import dataclass

SEPARATOR = "; "


@dataclass(frozen=True)
class LegendEntry:
    tag: str  # "N1"
    text: str  # the whole sentence
    cells: int  # how many rows carry it


@dataclass(frozen=True)
class RowNote:
    text: str  # the row's own sentences, joined by "; "
    tags: tuple[str, ...] = ()  # the legend entries it carries, in its sentences' order


def sentences(note: str) -> list[str]:
    """A note's sentences, stripped, empty ones and repeats within the note dropped."""
    return list(dict.fromkeys(s.strip() for s in (note or "").split(SEPARATOR) if s.strip()))


def note_legend(notes: list[str], min_cells: int = 3) -> tuple[list[LegendEntry], list[RowNote]]:
    split = [sentences(n) for n in notes]
    counts: dict[str, int] = {}
    for said in split:
        for sentence in said:
            counts[sentence] = counts.get(sentence, 0) + 1
    tags: dict[str, str] = {}
    for said in split:  # tags in order of first appearance: the same rows give the same page
        for sentence in said:
            if counts[sentence] >= min_cells and sentence not in tags:
                tags[sentence] = f"N{len(tags) + 1}"
    legend = [LegendEntry(tag, text, counts[text]) for text, tag in tags.items()]
    rows = [
        RowNote(SEPARATOR.join(s for s in said if s not in tags), tuple(tags[s] for s in said if s in tags))
        for said in split
    ]
    return legend, rows

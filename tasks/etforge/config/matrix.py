"""The matrix: which (model, backend, scheme) combinations become cells, which are refused and why,
and which are expected to fail (``matrix:`` of pipeline.yaml, and each scheme's ``backends`` table).
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from etforge.config.budgets import check_budgets
from etforge.config.model import SECTIONS, BackendSpec, Cell, ExpectedFailure, QuantSpec, RejectedCell, Transform
from etforge.config.tools import ToolVersions, stage_tools
from etforge.config.yamlfile import LoadedYaml, format_path


def reject_refused(doc: LoadedYaml, cells: tuple, rejected: tuple, refusal) -> tuple[tuple, tuple]:
    """The cells ``refusal(cell)`` has no reason against, and ``rejected`` plus those it refuses;
    a matrix left empty is one error naming pipeline.yaml's ``quantization`` line."""
    kept, refused = [], list(rejected)
    for cell in cells:
        reason = refusal(cell)
        if reason:
            refused.append(RejectedCell(cell.model.name, cell.backend.name, cell.quant.name, reason))
        else:
            kept.append(cell)
    if not kept:
        raise doc.error(
            ("quantization",),
            "every cell of the matrix is refused: " + "; ".join(f"{r.name}: {r.reason}" for r in refused[:3]),
        )
    return tuple(kept), tuple(refused)


def scheme_size_gate(quant: QuantSpec, backend: BackendSpec) -> dict | None:
    """The scheme's size gate for this backend: its entry for the backend's primary recipe, else the recipe's."""
    table = quant.recipe.data.get("backends") or {}
    entry = table.get(backend.primary.recipe, table.get("*")) or {}
    return entry.get("size_gate", quant.recipe.data.get("size_gate"))


def merge_thresholds(*layers) -> dict:
    out: dict = {}
    for layer in layers:
        out.update(layer or {})
    return out


class MatrixResolver:
    """Cells of the matrix, with errors naming pipeline.yaml's line and key."""

    def __init__(self, doc: LoadedYaml, versions: ToolVersions):
        self.doc = doc
        self.data = doc.data
        self.versions = versions

    def apply_scheme(self, backend: BackendSpec, quant: QuantSpec) -> tuple:
        """(backend with the scheme's options, transform) or (None, reason) when refused."""
        table = quant.recipe.data.get("backends") or {}
        entries = [table.get(m.recipe, table.get("*")) for m in backend.members]
        primary = entries[0]
        primary_name = backend.primary.recipe if backend.primary.recipe in table else "*"
        if primary is None:
            usable = ", ".join(sorted(k for k, v in table.items() if "rejected" not in v)) or "none"
            return None, f"{quant.name} is not available for {backend.primary.recipe} (available for: {usable})"
        if "rejected" in primary:
            return None, primary["rejected"]
        members = []
        for member, entry in zip(backend.members, entries):
            overrides = (entry or {}).get("backend_options") or {}
            members.append(replace(member, options={**member.options, **overrides}) if overrides else member)
        transform = None
        options = quant.options
        if primary.get("with_backend_options"):  # e.g. an Ethos-U quantizer needs the target
            options = {**members[0].options, **quant.options}
        multiple, group = primary.get("group_size_multiple"), options.get("group_size")
        if multiple and group and int(group) % multiple:
            return None, (
                f"{backend.primary.recipe} lowers only weight groups of a multiple of {multiple}: "
                f"{quant.name} group_size {group} is not one"
            )
        for method in ("pt2e", "torchao", "dtype"):
            if method in primary:
                label = primary[method].split(":")[-1]
                if primary.get("with_backend_options"):  # one graph per backend configuration
                    label += f"-{backend.name}"
                tools = self.versions.versions(stage_tools(quant.recipe.data, "quantize", primary_name))
                transform = Transform(
                    method=method,
                    ref=primary[method],
                    options=options,
                    calibrated=quant.calibrated and method == "pt2e",
                    label=label,
                    tools=tools,
                    group_multiple=multiple if method == "torchao" else None,
                    fallback=(primary.get("fallback") or {}).get(method),
                )
        return replace(backend, members=tuple(members)), transform

    def check_pattern(self, pattern: dict, path: tuple, known: dict) -> None:
        for dim, names in known.items():
            if dim in pattern and pattern[dim] not in names:
                raise self.doc.error(
                    path + (dim,),
                    f"{dim} {pattern[dim]!r} is not declared in '{SECTIONS[dim]}'; declared: {', '.join(names)}",
                )

    def cells(self, models, backends, quants, quant_thresholds) -> tuple:
        matrix = self.data.get("matrix") or {}
        known = {"model": list(models), "backend": list(backends), "quantization": list(quants)}
        for kind in ("exclude", "include"):
            for i, pattern in enumerate(matrix.get(kind, [])):
                self.check_pattern(pattern, ("matrix", kind, i), known)
        combos = list(itertools.product(models, backends, quants)) if matrix.get("product", True) else []

        def matches(pattern, combo):
            return all(pattern.get(dim) in (None, value) for dim, value in zip(known, combo))

        combos = [c for c in combos if not any(matches(p, c) for p in matrix.get("exclude", []))]
        for pattern in matrix.get("include", []):  # after exclude, as in CI matrices
            for combo in itertools.product(*(([pattern[d]] if d in pattern else known[d]) for d in known)):
                if combo not in combos:
                    combos.append(combo)
        if not combos:
            raise self.doc.error(
                ("matrix",) if "matrix" in self.data else (), "the matrix is empty after include/exclude"
            )
        order = {d: {n: i for i, n in enumerate(known[d])} for d in known}
        combos.sort(key=lambda c: tuple(order[d][v] for d, v in zip(known, c)))
        global_thresholds = self.data.get("thresholds") or {}
        model_thresholds = {m: (self.data["models"][m].get("thresholds") or {}) for m in models}
        explicit = [p for p in matrix.get("include", []) if len(p) == 3]
        cells, rejected = [], []
        for m, b, q in combos:
            backend, transform = self.apply_scheme(backends[b], quants[q])
            if backend is None:
                # Refused before any export runs: an explicit include is a mistake in the
                # file; a combination that only came from the product is reported.
                for i, p in enumerate(matrix.get("include", [])):
                    if p in explicit and (p["model"], p["backend"], p["quantization"]) == (m, b, q):
                        raise self.doc.error(("matrix", "include", i), f"{m}/{b}/{q} is refused: {transform}")
                rejected.append(RejectedCell(m, b, q, transform))
                continue
            cells.append(
                Cell(
                    model=models[m],
                    backend=backend,
                    quant=quants[q],
                    transform=transform,
                    size_gate=scheme_size_gate(quants[q], backends[b]),
                    thresholds=merge_thresholds(
                        quant_thresholds[q], global_thresholds.get(q), model_thresholds[m].get(q)
                    ),
                )
            )
        if not cells:
            raise self.doc.error(
                ("quantization",),
                "every cell of the matrix is refused: " + "; ".join(f"{r.name}: {r.reason}" for r in rejected[:3]),
            )
        return tuple(cells), tuple(rejected)

    def check_scheme_options(self, quant_names) -> None:
        """quantization_options only for schemes the pipeline lists: a typo must not go unnoticed."""
        for name in self.data.get("quantization_options") or {}:
            if name not in quant_names:
                raise self.doc.error(
                    ("quantization_options", name),
                    f"options for {name!r}, which is not in 'quantization' ({', '.join(quant_names)})",
                )

    def check_backend_options(self, cells, rejected) -> None:
        """Options (and coverage overrides) only for backends a cell uses, directly or as a link of
        a chain that a cell uses; rejected cells count, since they are reported."""
        declared = self.data["backends"]
        used = {c.backend.name for c in cells} | {r.backend for r in rejected}
        used |= {link for name in list(used) for link in declared.get(name, {}).get("chain", [])}
        why = "which no cell of the matrix uses (neither directly nor in a chain that a cell uses)"
        for name, spec in declared.items():
            options = [k for k in spec if k not in ("recipe", "chain")]
            if options and name not in used:
                raise self.doc.error(("backends", name, options[0]), f"options for backend {name!r}, {why}")
        for name in (self.data.get("gates") or {}).get("min_delegation_coverage") or {}:
            path = ("gates", "min_delegation_coverage", name)
            if name not in declared:
                raise self.doc.error(
                    path, f"backend {name!r} is not declared in 'backends'; declared: {', '.join(declared)}"
                )
            if name not in used:
                raise self.doc.error(path, f"a coverage minimum for backend {name!r}, {why}")
        check_budgets(self.doc, cells)  # gates.max_program_bytes / max_planned_bytes

    def expected_failures(self, cells: tuple, rejected: tuple, known: dict) -> tuple:
        """``matrix.expected_failures``; an entry that names no buildable cell is a mistake."""
        entries = []
        for i, spec in enumerate((self.data.get("matrix") or {}).get("expected_failures", [])):
            path = ("matrix", "expected_failures", i)
            self.check_pattern(spec, path, known)
            line = self.doc.line_of(path)
            entry = ExpectedFailure(
                model=spec.get("model"),
                backend=spec.get("backend"),
                quantization=spec.get("quantization"),
                reason=" ".join(spec["reason"].split()),
                link=spec["link"],
                where=f"{self.doc.file}:{line}: {format_path(path)}",
            )
            if not any(entry.matches(c) for c in cells):
                refused = [
                    r.name
                    for r in rejected
                    if all(
                        getattr(entry, d) in (None, v)
                        for d, v in (("model", r.model), ("backend", r.backend), ("quantization", r.quantization))
                    )
                ]
                raise self.doc.error(
                    path,
                    "names no cell of the matrix"
                    + (f" (only refused combinations, which never build: {', '.join(refused[:3])})" if refused else "")
                    + "; remove the entry",
                )
            entries.append(entry)
        return tuple(entries)

    def check_threshold_keys(self, quant_names) -> None:
        sections = [("thresholds",)] + [("models", m, "thresholds") for m in self.data["models"]]
        for section in sections:
            node = self.data
            for part in section:
                node = node.get(part) or {}
            for q in node:
                if q not in quant_names:
                    raise self.doc.error(
                        section + (q,),
                        f"thresholds for {q!r}, which is not in 'quantization' ({', '.join(quant_names)})",
                    )

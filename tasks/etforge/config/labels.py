"""Worker labels: what a task needs of a machine beyond "any Linux CPU", and what a machine offers.

A backend recipe's labels follow from what it already says (``needs``): a recipe
that lowers only on ``platforms: [darwin]`` needs ``macos``; one that needs an
``<X>_SDK_ROOT`` variable needs ``<x>_sdk`` (``QNN_SDK_ROOT`` -> ``qnn_sdk``).
``capabilities: {lowering: [...], runtime: [...]}`` adds labels the recipe cannot
derive: ``runtime: [macos]`` for Core ML (its programs run on macOS only),
``[gpu]`` for CUDA. A model adds its own (``labels: [mem64]`` in pipeline.yaml:
an LLM export that needs 64 GB of RAM).

A machine offers ``ETFORGE_WORKER_LABELS`` (comma-separated) when set, else what
:func:`detected` finds: its platform, the SDK variables that point at a directory,
an NVIDIA device, and its memory class. ``memN`` is satisfied by any ``memM`` with
M >= N. ``etforge ci-matrix`` and the cluster runner (``-P dask``) route by
the same labels.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Mapping

from etforge.config.requirements import missing_requirement
from etforge.core.errors import PipelineError

ENV = "ETFORGE_WORKER_LABELS"
LABEL = re.compile(r"^[a-z][a-z0-9_]*$")
MEMORY = re.compile(r"^mem([0-9]+)$")  # at least N GB of RAM
SDK_VARIABLE = re.compile(r"^([A-Z][A-Z0-9]*)_SDK_ROOT$")
# sys.platform -> the label of a machine running it ("linux" is the baseline: nothing to ask for).
PLATFORM_LABELS = {"linux": "linux", "darwin": "macos", "win32": "windows"}
# Labels a machine can offer whatever the recipes say (memN aside).
BUILTIN = frozenset(PLATFORM_LABELS.values()) | {"gpu"}


class LabelError(PipelineError):
    """A label nobody knows (one line, as any bad input)."""


def recipe_labels(recipe: Mapping) -> dict:
    """``{"lowering": frozenset, "runtime": frozenset}``: what lowering and running its programs need."""
    needs = recipe.get("needs") or {}
    lowering = set()
    platforms = needs.get("platforms") or ()
    if platforms and "linux" not in platforms:
        lowering |= {PLATFORM_LABELS.get(p, p) for p in platforms[:1]}  # the first platform it names
    for variable in needs.get("env") or ():
        match = SDK_VARIABLE.match(variable)
        if match:
            lowering.add(f"{match.group(1).lower()}_sdk")
    declared = recipe.get("capabilities") or {}
    return {
        "lowering": frozenset(lowering | set(declared.get("lowering") or ())),
        "runtime": frozenset(declared.get("runtime") or ()),
    }


def known_labels(recipes: Iterable[Mapping]) -> frozenset:
    """Every label a recipe needs, plus the ones any machine may offer."""
    known = set(BUILTIN)
    for recipe in recipes:
        for labels in recipe_labels(recipe).values():
            known |= labels
    return frozenset(known)


def is_known(label: str, known: frozenset) -> bool:
    return label in known or bool(MEMORY.match(label))


def parse(text: str, known: frozenset, where: str = ENV) -> frozenset:
    """``a,b,mem64`` -> labels; LabelError (one line) for a malformed or unknown one."""
    labels = frozenset(part.strip() for part in text.split(",") if part.strip())
    for label in sorted(labels):
        if not LABEL.match(label):
            raise LabelError(f"{where}: {label!r} is not a label (lowercase letters, digits and _)")
        if not is_known(label, known):
            raise LabelError(f"{where}: unknown label {label!r}; known: {', '.join(sorted(known))}, memN (N GB of RAM)")
    return labels


def memory_gb() -> int:
    """This machine's RAM in GB (0 when it cannot tell)."""
    try:
        return (os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) >> 30
    except (ValueError, OSError, AttributeError):
        return 0


def detected(environ: Mapping | None = None) -> frozenset:
    """What this machine offers, found without asking anyone."""
    environ = os.environ if environ is None else environ
    labels = {PLATFORM_LABELS.get(sys.platform, sys.platform)}
    for variable, value in environ.items():
        match = SDK_VARIABLE.match(variable)
        if match and value and os.path.isdir(value):
            labels.add(f"{match.group(1).lower()}_sdk")
    if os.path.exists("/dev/nvidiactl"):
        labels.add("gpu")
    gb = memory_gb()
    if gb:
        labels.add(f"mem{gb}")
    return frozenset(labels)


def offered(known: frozenset, environ: Mapping | None = None) -> frozenset:
    """``ETFORGE_WORKER_LABELS`` when set and not blank (what the machine says it offers), else :func:`detected`."""
    environ = os.environ if environ is None else environ
    text = environ.get(ENV) or ""
    return parse(text, known) if text.strip() else detected(environ)  # set but blank: not said


def declared_or_detected() -> frozenset:
    """What this machine offers, unchecked (resolving the pipeline checked ETFORGE_WORKER_LABELS)."""
    text = os.environ.get(ENV) or ""
    return frozenset(p.strip() for p in text.split(",") if p.strip()) if text.strip() else detected()


def lacking(needed: Iterable[str], offers: Iterable[str]) -> tuple:
    """The labels of ``needed`` that ``offers`` does not satisfy, sorted."""
    offers = frozenset(offers)
    memory = max((int(m.group(1)) for m in map(MEMORY.match, offers) if m), default=-1)
    out = []
    for label in set(needed):
        match = MEMORY.match(label)
        if match:
            if int(match.group(1)) > memory:
                out.append(label)
        elif label not in offers:
            out.append(label)
    return tuple(sorted(out))


def lacking_message(missing: Iterable[str], offers: Iterable[str]) -> str:
    """One line: which labels this host lacks (the skip reason of a cell it never attempts)."""
    missing = sorted(missing)
    offers = sorted(offers)
    return (
        f"needs worker label{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
        f"(this host offers {', '.join(offers) or 'none'}; set {ENV} on a machine that has "
        f"{'them' if len(missing) > 1 else 'it'})"
    )


class HostLabels:
    """What resolving a pipeline asks of labels: the known ones (from every recipe on the path),
    what this host offers (read once), and the label fields of a backend member or a model."""

    def __init__(self, recipe_path) -> None:
        self.recipe_path = recipe_path  # etforge.config.recipes RecipePath
        self._known: frozenset | None = None
        self._offers: frozenset | None = None

    @property
    def known(self) -> frozenset:
        if self._known is None:
            loaded = (self.recipe_path.load("backend", name) for name in self.recipe_path.available("backend"))
            self._known = known_labels(recipe.data for recipe in loaded if recipe is not None)
        return self._known

    @property
    def offers(self) -> frozenset:
        if self._offers is None:
            self._offers = offered(self.known)
        return self._offers

    def member_fields(self, recipe: Mapping, host_runnable: bool) -> dict:
        """BackendMember's labels, runtime_labels, missing and host_runnable on this host."""
        labels = recipe_labels(recipe)
        missing = missing_requirement(recipe.get("needs"))
        short = lacking(labels["lowering"], self.offers)
        if short:  # the label names what to look for; the recipe's hint how to get it
            hint = (recipe.get("needs") or {}).get("hint")
            missing = lacking_message(short, self.offers) + (f" ({hint})" if hint else "")
        # A recipe whose programs run only on some machines (Core ML: runtime: [macos]) runs them on those.
        runs_here = bool(labels["runtime"]) and not lacking(labels["runtime"], self.offers)
        return {
            "labels": labels["lowering"],
            "runtime_labels": labels["runtime"],
            "missing": missing,
            "host_runnable": host_runnable or runs_here,
        }

    def model_fields(self, declared, error) -> dict:
        """ModelSpec's labels and missing on this host; ``error(index, message)`` for a label nobody knows."""
        for i, label in enumerate(declared):
            if not is_known(label, self.known):
                raise error(i, f"unknown label {label!r}; known: {', '.join(sorted(self.known))}, memN")
        short = lacking(declared, self.offers)
        return {"labels": frozenset(declared), "missing": lacking_message(short, self.offers) if short else None}

"""Target runtimes: the CPU cores besides this host's that judge a cell's program.

A cell's program runs in the ExecuTorch runtime of this host (x86_64) when it is validated; a
phone runs the arm64 build of the same runtime, with other kernels (NEON, dot product, native fp16
arithmetic). A target is a CPU profile, an architecture and a core, whose runtime etforge runs the
program in under qemu-user (etforge.builders.targets) with the same inputs, metrics and thresholds;
a cell passes only when every target passes. Backend recipes give defaults (``runtime.targets``);
``targets`` in pipeline.yaml replaces them:

    targets: false                              # no targets anywhere
    targets: [aarch64-cortex-a76]               # every CPU backend, instead of its recipe's defaults
    targets:
      default: [aarch64-cortex-a76]             # the same, for the backends not named below
      backends: {xnnpack: [aarch64-cortex-a72], portable: []}

"Every CPU backend" is every backend whose programs this host's runtime runs (``host_runnable``);
a backend named under ``backends`` gets exactly its list, whatever it is. A chain's defaults are
the profiles every member's recipe gives. PROFILES is the registry of the cores etforge runs.

This module must not import torch or executorch.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from etforge.core.errors import PipelineError


@dataclass(frozen=True)
class Profile:
    """A CPU etforge can judge programs on: an architecture and a core qemu-user emulates."""

    arch: str
    cpu: str  # qemu's -cpu model
    stands_for: str  # what devices it stands for, and why it is checked (docs/targets.md)

    @property
    def name(self) -> str:
        return f"{self.arch}-{self.cpu}"


# Named cores only: measured with qemu 7.2, `-cpu max` advertises SME and XNNPACK's SME int8 kernels
# come out wrong there (REFUSED); every named core below gave int8 programs bit-exact with x86.
PROFILES = {
    p.name: p
    for p in (
        Profile(
            "aarch64",
            "cortex-a76",
            "Armv8.2-A with fp16 arithmetic and dot product: a phone's big core since 2019; "
            "XNNPACK computes fp16 programs in fp16 here",
        ),
        Profile(
            "aarch64",
            "cortex-a72",
            "Armv8.0-A without fp16 arithmetic or dot product: older phones, Raspberry Pi 4; "
            "XNNPACK computes fp16 programs in fp32 here",
        ),
        Profile("aarch64", "cortex-a53", "Armv8.0-A in-order little core: budget phones, Raspberry Pi 3"),
        Profile("aarch64", "neoverse-n1", "Armv8.2-A server core with fp16 and dot product (AWS Graviton2)"),
    )
}
REFUSED = {
    "aarch64-max": "qemu's max core advertises SME, and XNNPACK's SME int8 kernels compute wrong results "
    "under qemu 7.2 (3.6 dB where every named core is bit-exact); name a core instead",
}


@dataclass(frozen=True)
class Target:
    """One profile a cell's program is judged on (its verdict is a ``numerics@<label>`` check)."""

    profile: str  # its name in pipeline.yaml and recipes, e.g. aarch64-cortex-a76
    arch: str
    cpu: str

    @property
    def label(self) -> str:
        """The runtime that judges it, as checks, tables and reasons name it."""
        return f"{self.arch} {self.cpu} (qemu-user)"

    def canonical(self) -> dict:
        return {"profile": self.profile, "arch": self.arch, "cpu": self.cpu}


def target_of(name: str) -> Target | None:
    """The Target of profile ``name``, or None when etforge knows no such profile."""
    found = PROFILES.get(name)
    return None if found is None else Target(found.name, found.arch, found.cpu)


def unknown_profile(name: str) -> str:
    """One line on why ``name`` is no profile: refused (why), or unknown (the known ones)."""
    if name in REFUSED:
        return f"target {name!r} is not offered: {REFUSED[name]}"
    close = difflib.get_close_matches(name, list(PROFILES), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown target {name!r}; {hint}known: {', '.join(PROFILES)}"


class TargetResolver:
    """The targets of each backend of a pipeline: its ``targets`` section over its recipes' defaults.

    ``doc`` is the pipeline (LoadedYaml: errors name file, line and key); ``recipes`` a RecipePath."""

    def __init__(self, doc, recipes):
        self.doc = doc
        self.recipes = recipes
        self.section = doc.data.get("targets")

    def of_backends(self, backends: dict) -> dict:
        """backend name -> its Targets (a tuple, in the order named; () for none)."""
        section = self.section
        if section is None:
            return {name: self.defaults(spec) for name, spec in backends.items()}
        if section is False:
            return {name: () for name in backends}
        if isinstance(section, list):
            section = {"default": section}
        own = section.get("backends") or {}
        for name in own:
            if name not in backends:
                raise self.doc.error(
                    ("targets", "backends", name),
                    f"no backend {name!r} in backends (declared: {', '.join(backends)})",
                )
        out = {}
        for name, spec in backends.items():
            if name in own:
                out[name] = self.named(own[name], ("targets", "backends", name))
            elif "default" in section:
                where = ("targets",) if isinstance(self.section, list) else ("targets", "default")
                out[name] = self.named(section["default"], where) if spec.host_runnable else ()
            else:
                out[name] = self.defaults(spec)
        return out

    def named(self, names, where: tuple) -> tuple:
        found = []
        for i, name in enumerate(names or ()):
            target = target_of(name)
            if target is None:
                raise self.doc.error(where + (i,), unknown_profile(name))
            if target not in found:
                found.append(target)
        return tuple(found)

    def defaults(self, backend) -> tuple:
        """The profiles every member recipe of ``backend`` gives (``runtime.targets``), in the first's order."""
        per_member = [self.recipe_defaults(m.recipe) for m in backend.members]
        common = set.intersection(*(set(t) for t in per_member)) if per_member else set()
        return tuple(t for t in per_member[0] if t in common) if per_member else ()

    def recipe_defaults(self, recipe_name: str) -> tuple:
        recipe = self.recipes.load("backend", recipe_name)
        names = ((recipe.data.get("runtime") or {}).get("targets") or ()) if recipe is not None else ()
        out = []
        for i, name in enumerate(names):
            target = target_of(name)
            if target is None:
                raise _recipe_error(recipe, ("runtime", "targets", i), unknown_profile(name))
            out.append(target)
        return tuple(out)


def _recipe_error(recipe, path: tuple, message: str) -> PipelineError:
    """A mistake in a recipe file, naming its line (read again: errors are rare)."""
    from etforge.config.yamlfile import load_yaml

    shown = str(recipe.path.relative_to(recipe.path.parent.parent.parent))  # recipes/backends/<name>.yaml
    return load_yaml(recipe.path, display_name=shown).error(path, message)

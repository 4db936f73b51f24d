"""Why a task runs: what changed in the named inputs of its key since its last recorded run.

    why(spec, current_inputs) -> Explanation

A task's record keeps the named inputs of the key it was made from (etforge.cache.records:
facts of the plan, tool versions, etforge's code files, upstream keys), and every key's
inputs are kept once more by key, so an upstream key that changed is explained through the
upstream task's own inputs, even after that task ran again:

    export:small_cnn/xnnpack/fp32: models/blocks.py changed (sha 1a2b3c4d…→5e6f7a8b…, via
    capture:small_cnn); torch 2.13.0+cpu, executorch 1.5.1 unchanged

Pure reading: nothing here runs a task or imports torch.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from etforge.cache.records import inputs_by_key, read_state
from etforge.pipeline.specs import TaskSpec

SHA = re.compile(r"^[0-9a-f]{64}$")
MAX_DEPTH = 6  # upstream chains are short (capture -> quantize -> export -> validate)


@dataclass(frozen=True)
class Explanation:
    task: str
    up_to_date: bool  # the last record was made from the current key
    changes: tuple  # one phrase per changed input
    unchanged: tuple = ()  # the tool versions that did not change, for context

    def line(self) -> str:
        if self.up_to_date:
            return f"{self.task}: up to date"
        text = "; ".join(self.changes) if self.changes else "its key changed"
        if self.unchanged:
            text += f"; {', '.join(self.unchanged)} unchanged"
        return f"{self.task}: {text}"


def why(spec: TaskSpec, current_inputs: Callable[[str], dict | None]) -> Explanation:
    """What changed in ``spec``'s key inputs since its last record. ``current_inputs(task name)``:
    the current named inputs of an upstream task (to explain an upstream key that changed)."""
    record = read_state(spec.state_file)  # checked: each field it holds has its type, inputs their shape
    if record is None or not record.get("key"):
        return Explanation(spec.name, False, ("never run here (no record of a run under any key)",))
    if record.get("key") == spec.key:
        if record.get("status") == "failed":  # the same inputs: whether it runs again is the engine's call
            reason = str(record.get("reason") or "failed").splitlines()[0]
            return Explanation(spec.name, False, (f"inputs unchanged since its last run, which failed: {reason}",))
        return Explanation(spec.name, True, ())
    old = record["inputs"] if "inputs" in record else inputs_by_key(spec, record["key"])
    new = spec.inputs or {}
    if old is None:
        return Explanation(
            spec.name,
            False,
            (
                f"its key changed ({record['key'][:12]}…→{str(spec.key)[:12]}…); its last record "
                "predates recorded key inputs, so it cannot say which",
            ),
        )
    changes = _shortest(compare(old, new, spec, current_inputs, via=(), depth=0))
    return Explanation(spec.name, False, tuple(changes) or ("its key changed",), _unchanged_tools(old, new))


def _shortest(found: list) -> list:
    """One phrase per cause: a file changed upstream reaches a task through several paths (its
    export and its capture); name it once, through the shortest."""
    best: dict = {}
    for core, via in found:
        if core not in best or len(via) < len(best[core]):
            best[core] = via
    out = []
    for core, via in best.items():
        where = f"via {' <- '.join(via)}" if via else ""
        if core.endswith(")") and "(sha " in core and where:
            out.append(f"{core[:-1]}, {where})")
        else:
            out.append(f"{core} ({where})" if where else core)
    return out


def compare(old: dict, new: dict, spec: TaskSpec, current_inputs, via: tuple, depth: int) -> list:
    """(phrase, upstream path) per named input that differs between two key inputs, upstream
    ones followed through the inputs kept by key."""
    out: list = []
    old_facts, new_facts = flatten(old.get("facts") or {}), flatten(new.get("facts") or {})
    for path in sorted(old_facts.keys() | new_facts.keys(), key=lambda p: [str(x) for x in p]):
        a, b = old_facts.get(path, _MISSING), new_facts.get(path, _MISSING)
        if a != b:
            out.append((_phrase(path, a, b, old_facts, new_facts), via))
    old_code, new_code = old.get("code") or {}, new.get("code") or {}
    if isinstance(old_code, dict) and isinstance(new_code, dict):
        for rel in sorted(old_code.keys() | new_code.keys()):
            a, b = old_code.get(rel, _MISSING), new_code.get(rel, _MISSING)
            if a != b:
                out.append((_file_phrase(f"etforge {rel}", a, b), via))
    for relation, up in (new.get("upstream") or {}).items():
        before = (old.get("upstream") or {}).get(relation) or {}
        if not isinstance(up, dict) or before.get("key") == up.get("key"):
            continue
        task = up.get("task") or relation
        then = inputs_by_key(spec, before.get("key"))
        now = inputs_by_key(spec, up.get("key")) or current_inputs(task)
        found = []
        if then is not None and now is not None and depth < MAX_DEPTH:
            found = compare(then, now, spec, current_inputs, via + (task,), depth + 1)
        keys = f"key {str(before.get('key'))[:12]}…→{str(up.get('key'))[:12]}…"
        out += found or [(f"{task} changed ({keys}; its inputs then were not recorded)", via)]
    return out


class _Missing:
    def __repr__(self) -> str:
        return "absent"


_MISSING = _Missing()


def flatten(value, path: tuple = ()) -> dict:
    """{path tuple: leaf} of nested dicts (lists are leaves)."""
    if isinstance(value, dict) and value:
        out: dict = {}
        for k, v in value.items():
            out.update(flatten(v, path + (k,)))
        return out
    return {path: value}


def _phrase(path: tuple, a, b, old: dict, new: dict) -> str:
    if len(path) == 2 and path[0] == "toolchain":
        return f"{path[1]} {_shown(a)} → {_shown(b)}"
    if path and path[-1] == "sha256":  # a file's digest beside its name (a model's factory file)
        name = new.get(path[:-1] + ("file",), old.get(path[:-1] + ("file",)))
        return _file_phrase(str(name or ".".join(map(str, path))), a, b)
    if len(path) >= 2 and path[-2] == "modules":  # a project module the factory imports
        return _file_phrase(str(path[-1]), a, b)
    if all(isinstance(v, str) and SHA.match(v) for v in (a, b)):
        return _file_phrase(".".join(map(str, path)), a, b)
    return f"{'.'.join(map(str, path))} {_shown(a)} → {_shown(b)}"


def _file_phrase(name: str, a, b) -> str:
    if a is _MISSING:
        return f"{name} added"
    if b is _MISSING:
        return f"{name} removed"
    return f"{name} changed (sha {str(a)[:8]}…→{str(b)[:8]}…)"


def _shown(value) -> str:
    if value is _MISSING:
        return "(absent)"
    return str(value) if not isinstance(value, str) or value else '""'


def _unchanged_tools(old: dict, new: dict) -> tuple:
    a = (old.get("facts") or {}).get("toolchain") or {}
    b = (new.get("facts") or {}).get("toolchain") or {}
    return tuple(f"{k} {b[k]}" for k in ("torch", "executorch") if k in b and a.get(k) == b[k])

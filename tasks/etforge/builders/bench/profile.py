"""A per-operator profile of a cell's program: an ETDump of a few runs, read with the devtools Inspector.

``record_profile`` loads a second copy of the program through the pybindings with the event tracer on
(``enable_etdump=True``: the pip runtime has it, measured with executorch 1.5.1), runs it
``PROFILE_RUNS`` times after the benchmark's timed loop (so the tracer never slows the latency
figures), writes ``program.etdump`` and reads it back through ``Inspector`` with the export's ETRecord,
which maps each event to its operators and the model's modules. ``summarize_events`` (pure) turns the
Inspector's events into an OperatorProfile. Timing is never a gate: a profile that cannot be made says
why in its ``note``.

torch and executorch are imported only inside the functions that run programs.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from etforge.core.atomic import atomic_write_bytes
from etforge.pipeline.stage_results import OperatorProfile, OperatorTime

ETDUMP = "program.etdump"
ETRECORD = "program.etrecord"  # the export stage's (etforge.builders.lowering.lower)
PROFILE_RUNS = 5  # the summary takes each event's median: the first run's one-off setup drops out
TOP = 8  # call sites the record keeps
DELEGATE_CALL = "DELEGATE_CALL"  # the runtime's event around one delegate's execute
OPERATOR_CALL = "OPERATOR_CALL"  # around one portable kernel (its native_call_* event sits inside it)
EXECUTE = "Method::execute"


@dataclass(frozen=True)
class Event:
    """One Inspector event, as the summary reads it (executorch.devtools.inspector Event)."""

    name: str
    raw_ms: tuple = ()  # one time per run
    backend: str | None = None  # the delegate a DELEGATE_CALL (or an event inside it) belongs to
    inside_delegate: bool = False  # an event the delegate itself logged (nested in a DELEGATE_CALL)
    op_types: tuple = ()  # the edge operators it ran (from the ETRecord)
    modules: tuple = field(default_factory=tuple)  # the model's module paths it came from


def _median(values: Iterable) -> float | None:
    finite = [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v)]
    return statistics.median(finite) if finite else None


def _label(event: Event) -> str:
    ops = ", ".join(event.op_types)
    if event.name == DELEGATE_CALL:
        return f"{event.backend or 'delegate'}: {ops}" if ops else (event.backend or "delegate")
    return ops or event.name


def summarize_events(events: Iterable[Event], top: int = TOP) -> OperatorProfile:
    """The profile of a run from its events: the delegate calls' and portable operators' median times,
    their counts per run, and the ``top`` call sites by time. Events a delegate logged inside its call,
    and a portable kernel's inner native_call event, are parts of an outer event and never count twice."""
    events = list(events)
    runs = max((len(e.raw_ms) for e in events if e.name == EXECUTE), default=0)
    total = _median(next((e.raw_ms for e in events if e.name == EXECUTE), ()))
    sites = []
    kernel = None  # the native_call_<op> event the runtime logs just before its OPERATOR_CALL
    for event in events:
        if event.name.startswith("native_call_"):
            kernel = event.name.removeprefix("native_call_")
        if event.inside_delegate or event.name not in (DELEGATE_CALL, OPERATOR_CALL):
            continue
        if event.name == OPERATOR_CALL and not event.op_types and kernel:  # no ETRecord: the kernel names it
            event = replace(event, op_types=(kernel,))
        ms = _median(event.raw_ms)
        if ms is not None:
            sites.append((event, ms))
    if not sites or total is None or total <= 0:
        return OperatorProfile(runs=runs, note="the ETDump holds no timed operator or delegate call")
    delegate = [ms for e, ms in sites if e.name == DELEGATE_CALL]
    portable = [ms for e, ms in sites if e.name == OPERATOR_CALL]
    ranked = sorted(sites, key=lambda site: -site[1])[:top]
    return OperatorProfile(
        runs=runs,
        total_ms=round(total, 4),
        delegate_ms=round(sum(delegate), 4),
        portable_ms=round(sum(portable), 4),
        delegate_calls=len(delegate),
        portable_calls=len(portable),
        top=tuple(
            OperatorTime(
                name=_label(e),
                kind="delegate" if e.name == DELEGATE_CALL else "portable",
                ms=round(ms, 4),
                share=round(ms / total, 4),
                module=", ".join(e.modules[:3]) or None,
            )
            for e, ms in ranked
        ),
    )


def _modules(hierarchy) -> tuple:
    """The deepest module path of each node an event ran ({node: {key: (path, type)}}), e.g. "c (Conv2d)"."""
    out: dict = {}
    for chain in (hierarchy or {}).values():
        if not isinstance(chain, dict) or not chain:
            continue
        path, kind = list(chain.values())[-1]
        name = f"{path} ({str(kind).rsplit('.', 1)[-1]})" if path else str(kind).rsplit(".", 1)[-1]
        out[name] = None
    return tuple(out)


def events_of(inspector) -> list:
    """The Inspector's events of every block, as Event records."""
    out = []
    for block in inspector.event_blocks:
        for event in block.events:
            perf = getattr(event, "perf_data", None)
            out.append(
                Event(
                    name=str(event.name),
                    raw_ms=tuple(getattr(perf, "raw", None) or ()),
                    backend=getattr(event, "delegate_backend_name", None),
                    inside_delegate=bool(getattr(event, "is_delegated_op", False)),
                    op_types=tuple(getattr(event, "op_types", None) or ()),
                    modules=_modules(getattr(event, "module_hierarchy", None)),
                )
            )
    return out


def record_profile(
    pte: Path, data: Path | None, method: str, inputs: list, workdir: Path, etrecord: Path | None
) -> tuple[Path, OperatorProfile]:
    """Run the program ``PROFILE_RUNS`` times with the event tracer on; (the ETDump written, its profile).

    The ETDump is always written (with the load events at least), so that the benchmark's outputs are
    the same for every cell; when the runs or the Inspector fail, the profile's note says why."""
    from executorch.extension.pybindings import portable_lib

    out = Path(workdir) / ETDUMP
    kept = out.name, etrecord.name if etrecord else None
    try:
        module = portable_lib._load_for_executorch(
            str(pte), str(data) if data else None, enable_etdump=True, debug_buffer_size=0
        )
    except Exception as exc:  # a backend this runtime lacks: no profile, never a crash
        atomic_write_bytes(out, b"")
        return out, OperatorProfile(note=f"no ETDump: the program did not load with the event tracer: {_line(exc)}")
    why = None
    try:
        for _ in range(PROFILE_RUNS):
            module.run_method(method, inputs)
    except Exception as exc:
        why = f"no profile: a traced run failed: {_line(exc)}"
    module.write_etdump_result_to_file(str(out))
    del module
    if why:
        return out, OperatorProfile(note=why, etdump=kept[0], etrecord=kept[1])
    unmapped = None
    try:
        try:
            inspector = open_inspector(out, etrecord)
        except Exception as exc:  # e.g. KeyError 'forward' for a program whose methods have other names
            if etrecord is None:
                raise
            unmapped = f"operators not mapped to the model's modules: the ETRecord did not apply ({_line(exc)})"
            inspector = open_inspector(out, None)
        profile = summarize_events(events_of(inspector))
    except Exception as exc:
        why = f"no profile: the devtools Inspector could not read it: {_line(exc)}"
        return out, OperatorProfile(note=why, etdump=kept[0], etrecord=kept[1])
    return out, replace(profile, etdump=kept[0], etrecord=kept[1], note=profile.note or unmapped)


def open_inspector(etdump: Path, etrecord, debug_buffer: Path | None = None):
    """The devtools Inspector of an ETDump, with an ETRecord (a path or a parsed one) and the debug
    buffer of a run that logged intermediate outputs (etforge.builders.numerics.etdump_divergence)."""
    import warnings

    from executorch.devtools import Inspector

    if isinstance(etrecord, Path):
        etrecord = str(etrecord)
    with warnings.catch_warnings():  # "Output Buffer not found" without a buffer; its tensors are read-only
        warnings.simplefilter("ignore")
        return Inspector(
            etdump_path=str(etdump),
            etrecord=etrecord,
            debug_buffer_path=str(debug_buffer) if debug_buffer else None,
        )


def _line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")

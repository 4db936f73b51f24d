"""What each stage found, as one frozen dataclass per stage: builders write them, publishing reads them.

A task's record and its store entry keep a result's JSON form (``to_json``) as the task's
``info``, beside its status and reason; :meth:`StageResult.from_json` reads it back, taking
only the fields it knows and, for each, only a value of the field's type (etforge.core.typed),
so that a hand-edited or older record can never smuggle a malformed value into a verdict.
A field a record lacks keeps its default.

    CaptureResult    the torch.export of a model and its eager reference
    QuantizeResult   a quantized graph: how, with what calibration, which layers
    ExportResult     a lowered program: its bytes, costs, interface; its checks (delegation, Vela)
    GateResult       the size gate's check of a quantized program against its fp32 sibling
    Verdict          the program's numerics checks: run here against eager, or bundled for the device
    TargetVerdict    the same program's numerics on each of the cell's targets (aarch64 under qemu-user)
    BenchmarkResult  host timings and memory; its OperatorProfile (per-operator times, ETDump)
    ManifestResult, ReportResult, ReleaseResult   the matrix-wide stages

What a stage judged is a list of checks (etforge.checks), read back through the check table
(etforge.checks.table CHECKS, or the one a reader is handed). A verdict counts only for the bytes
it judged: :meth:`Judgement.judges` is that rule, the one place it is written (the engine's
up-to-date check, the check of a stored verdict, and the cell's outcome all call it).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from etforge.checks.base import Check
from etforge.checks.table import CHECKS, CheckTable
from etforge.core.typed import TypedRecord
from etforge.program.costs import ProgramCosts


class StageResult(TypedRecord):
    """A stage's result; its ``checks`` (where it has them) are read through a check table."""

    @classmethod
    def _read_field(cls, name: str, kind, value):
        if name == "checks":
            return None  # read by from_json, with the table it is handed
        return super()._read_field(name, kind, value)

    @classmethod
    def from_json(cls, data, table: CheckTable = CHECKS):
        result = super().from_json(data)
        if isinstance(data, dict) and any(f.name == "checks" for f in fields(cls)):  # type: ignore[arg-type]
            result = replace(result, checks=table.parse_all(data.get("checks")))
        return result

    def failed_check(self) -> Check | None:
        """The first of its checks that failed its gate, or None."""
        return next((c for c in getattr(self, "checks", ()) if c.failed), None)


@dataclass(frozen=True)
class CaptureResult(StageResult):
    export_s: float | None = None
    inputs: str | None = None  # where the reference inputs came from: "random (seeded)", "npz data/val.npz"
    samples: int | None = None
    outputs: tuple = ()  # {"path", "shape", "dtype"} of each output of the first method (etforge.config.io_spec)
    methods: dict = field(default_factory=dict)  # several methods: method -> {"outputs": [...]}
    weight_bytes: dict = field(default_factory=dict)  # fp32 bytes of all weights and of linear/conv/embedding ones
    llm: dict = field(default_factory=dict)  # an LLM: prompt_len, decode_steps, eager_tokens, custom_ops
    note: str | None = None


@dataclass(frozen=True)
class QuantizeResult(StageResult):
    method: str | None = None  # pt2e | torchao | dtype
    quantizer: str | None = None  # the recipe's factory, or the dtype
    quantize_s: float | None = None
    calibration: str | None = None  # where static quantization's calibration data came from
    calibration_samples: int | None = None
    layers: dict = field(default_factory=dict)  # the layers a weight-group scheme took and kept in float
    rescue: dict = field(default_factory=dict)  # keep_float: auto: search, divergence, layers kept, dB, measurements


@dataclass(frozen=True)
class ExportResult(StageResult):
    size_bytes: int | None = None
    sha256: str | None = None  # of the .pte: what a verdict must have judged
    sha256_without_metadata: str | None = None  # the program with its names blanked (the size gate)
    lowering_s: float | None = None
    delegates: tuple = ()
    executorch_version: str | None = None
    input_dtypes: tuple = ()  # as the program takes them (an fp16 program takes float16)
    data_sha256: str | None = None  # external weights: the .ptd the program needs
    data_size_bytes: int | None = None
    constant_bytes: int | None = None  # of the graph, when its weights go to a .ptd
    schema_version: int | None = None  # the program's Program.version
    costs: ProgramCosts = field(default_factory=ProgramCosts)  # etforge.builders.lowering.program_costs
    llm_metadata: dict = field(default_factory=dict)  # an LLM's runner metadata methods -> values
    # op -> kernel keys, of every operator the program runs outside its delegates (etforge.builders.lowering.oplist)
    operators: dict = field(default_factory=dict)
    note: str | None = None
    checks: tuple[Check, ...] = ()  # delegation coverage; Vela's estimate of an Ethos-U program


@dataclass(frozen=True)
class GateResult(StageResult):
    checks: tuple[Check, ...] = ()  # the size gate


@dataclass(frozen=True)
class Judgement(StageResult):
    """A result about one program's bytes (a verdict, a benchmark)."""

    program_sha256: str | None = None  # the bytes judged

    def judges(self, program_sha256: str | None) -> bool:
        """Whether this counts for the program with ``program_sha256``: only for the bytes it
        judged; one that names none counts for nothing."""
        return self.program_sha256 is not None and self.program_sha256 == program_sha256


@dataclass(frozen=True)
class Verdict(Judgement):
    """The program's numerics: run here against eager (a Numerics check), or bundled for the device to
    check itself (an OnDevice check)."""

    checks: tuple[Check, ...] = ()


@dataclass(frozen=True)
class TargetVerdict(Verdict):
    """The program in other CPUs' runtimes (a cell's targets: aarch64 cores under qemu-user): a Numerics
    check per target that ran it (``target`` names it), a NotRun check per target that could not."""


@dataclass(frozen=True)
class BenchmarkResult(Judgement):
    latency_p50_ms: float | None = None
    latency_p90_ms: float | None = None
    latency_trimmed_mean_ms: float | None = None
    latency_min_ms: float | None = None
    latency_max_ms: float | None = None
    latency_stdev_ms: float | None = None
    latency_p50_ms_per_size: tuple = ()  # dynamic shapes: {"input_shapes", "p50"} per size
    iterations: int | None = None
    iterations_requested: int | None = None
    stopped_early: bool | None = None
    load_ms: float | None = None
    peak_rss_mb: float | None = None
    load_rss_delta_mb: float | None = None
    threads: int | None = None
    host: str | None = None  # one line: CPU, cores, OS
    host_id: str | None = None
    load_average_1m: float | None = None
    # an LLM: load_ms, prompt_len, prefill_tok_s, ttft_ms, decode_steps, decode_tok_s,
    # decode_step_p50_ms, peak_rss_mb, peak_rss_delta_mb (etforge.builders.llm.bench)
    llm: dict = field(default_factory=dict)
    note: str | None = None
    profile: OperatorProfile | None = None  # per-operator times from an ETDump (never a gate)


@dataclass(frozen=True)
class OperatorTime(TypedRecord):
    """One call site of a profiled run: a delegate call or a portable (non-delegated) operator."""

    name: str = ""  # "aten.cumsum.default", or "XnnpackBackend: aten.convolution.default, ..."
    kind: str = ""  # delegate | portable
    ms: float | None = None  # median over the profiled runs
    share: float | None = None  # of the run's time (Method::execute)
    module: str | None = None  # the model's module(s) it came from (the ETRecord's hierarchy)


@dataclass(frozen=True)
class OperatorProfile(TypedRecord):
    """Where a run's time goes (etforge.builders.bench.profile): the ETDump of a few runs, read through
    the devtools Inspector with the export's ETRecord. ``note`` says why there is none, in one line."""

    runs: int | None = None
    total_ms: float | None = None  # Method::execute, median
    delegate_ms: float | None = None  # the delegate calls' sum, median
    portable_ms: float | None = None  # operators left outside delegates, median
    delegate_calls: int | None = None  # per run
    portable_calls: int | None = None  # per run
    top: tuple[OperatorTime, ...] = ()  # by time, longest first
    etdump: str | None = None  # the kept files (devtools Inspector opens them)
    etrecord: str | None = None
    note: str | None = None

    @classmethod
    def _read_field(cls, name: str, kind, value):
        if name == "top":
            if not isinstance(value, list):
                return None
            return tuple(OperatorTime.from_json(v) for v in value if isinstance(v, dict))
        return super()._read_field(name, kind, value)


@dataclass(frozen=True)
class ManifestResult(StageResult):
    variants: int | None = None  # shipped variants the manifests list
    excluded: tuple = ()  # cells they leave out (each with its reason in the manifests)


@dataclass(frozen=True)
class ReportResult(StageResult):
    cells: int | None = None


@dataclass(frozen=True)
class ReleaseResult(StageResult):
    archive: str | None = None
    sha256: str | None = None
    allow_failures: bool | None = None
    failures: tuple = ()  # cells packed around with --allow-failures

"""What each stage found, as one frozen dataclass per stage: builders write them, publishing reads them.

A task's record and its store entry keep a result's JSON form (``to_json``) as the task's
``info``, beside its status and reason; :meth:`StageResult.from_json` reads it back, taking
only the fields it knows and, for each, only a value of the field's type (a float field
only a finite number), so that a hand-edited or older record can never smuggle a
malformed value into a verdict. A field a record lacks keeps its default.

    CaptureResult    the torch.export of a model and its eager reference
    QuantizeResult   a quantized graph: how, with what calibration, which layers
    ExportResult     a lowered program: its bytes, delegation, interface
    SizeGateResult   a quantized program against its fp32 sibling
    Verdict          the program run here against eager, or bundled for the device
    BenchmarkResult  host timings and memory
    ManifestResult, ReportResult, ReleaseResult   the matrix-wide stages

A verdict counts only for the bytes it judged: :meth:`Judgement.judges` is that rule, the
one place it is written (the engine's up-to-date check, the check of a stored verdict,
and the cell's outcome all call it).
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass, field, fields
from functools import cache


@cache
def _type_hints(cls: typing.Any) -> dict:
    return typing.get_type_hints(cls)


def _hints(cls: type) -> dict:
    """The field types of a result class (memoised: every record read asks)."""
    return _type_hints(typing.cast(typing.Any, cls))


def _coerce(kind, value):
    """``value`` as a field of type ``kind`` holds it, else None (the field's default is used)."""
    args = set(typing.get_args(kind)) - {type(None)}
    base = next(iter(args)) if args else kind
    if base is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        return float(value) if ok else None
    if base is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if base is bool or base is str:
        return value if isinstance(value, base) else None
    if base is dict:
        return dict(value) if isinstance(value, dict) else None
    if base is tuple:
        return tuple(value) if isinstance(value, list | tuple) else None
    return None


class StageResult:
    """JSON form of the stage results below (frozen dataclasses)."""

    @classmethod
    def from_json(cls, data):
        data = data if isinstance(data, dict) else {}
        hints = _hints(cls)
        values = {}
        for f in fields(cls):  # type: ignore[arg-type]
            if f.name in data:
                value = _coerce(hints[f.name], data[f.name])
                if value is not None:
                    values[f.name] = value
        return cls(**values)

    @classmethod
    def of(cls, values: dict):
        """A result from the fields a builder measured (lists become tuples); an unknown field is a
        TypeError, so a builder cannot write what no reader knows."""
        hints = _hints(cls)
        return cls(**{k: tuple(v) if hints.get(k) is tuple and isinstance(v, list) else v for k, v in values.items()})

    def to_json(self) -> dict:
        """Every field that has a value (None left out), tuples as lists."""
        out = {}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


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
    rescue: dict = field(default_factory=dict)  # keep_float: auto: sensitivity, layers kept, dB each bought


@dataclass(frozen=True)
class ExportResult(StageResult):
    size_bytes: int | None = None
    sha256: str | None = None  # of the .pte: what a verdict must have judged
    sha256_without_metadata: str | None = None  # the program with its names blanked (the size gate)
    lowering_s: float | None = None
    delegated_ops: int | None = None
    non_delegated_ops: int | None = None
    delegated_subgraphs: int | None = None
    compute_ops: int | None = None
    delegated_compute_ops: int | None = None
    delegation_coverage: float | None = None  # of compute ops (etforge.builders.gates.gates)
    delegated_by_backend: dict = field(default_factory=dict)  # backend id -> compute ops it took
    not_delegated: dict = field(default_factory=dict)  # op -> how many stayed on portable kernels
    # compute (FLOPs, etforge.builders.gates.compute_share): what the delegation gate judges
    compute_coverage: float | None = None  # delegated FLOPs / all FLOPs
    flops: int | None = None
    delegated_flops: int | None = None
    flops_not_delegated: dict = field(default_factory=dict)  # op -> its FLOPs on portable kernels
    delegates: tuple = ()
    executorch_version: str | None = None
    input_dtypes: tuple = ()  # as the program takes them (an fp16 program takes float16)
    data_sha256: str | None = None  # external weights: the .ptd the program needs
    data_size_bytes: int | None = None
    # What the program costs (etforge.builders.lowering.program_costs): {"constants", "delegates": {backend
    # id: bytes}, "program", "total"}; method -> planned buffer bytes; what that figure is;
    # backend id -> delegated subgraphs over every method; the program's Program.version.
    size_breakdown: dict = field(default_factory=dict)
    planned_bytes: dict = field(default_factory=dict)
    planned_note: str | None = None
    delegate_subgraphs: dict = field(default_factory=dict)
    schema_version: int | None = None
    constant_bytes: int | None = None
    llm_metadata: dict = field(default_factory=dict)  # an LLM's runner metadata methods -> values
    note: str | None = None
    # An Ethos-U program: Vela's summary for the configured accelerator, system config and memory
    # mode, added over its delegates (etforge.builders.arm.ethos_u_vela); bytes are Vela's KiB x 1024.
    vela_accelerator: str | None = None  # e.g. "ethos-u55-128"
    vela_system_config: str | None = None
    vela_memory_mode: str | None = None
    vela_core_clock_hz: float | None = None
    vela_npu_ops: int | None = None  # operators Vela put on the NPU
    vela_cpu_ops: int | None = None  # and left to the CPU
    # peak use per memory area (added over delegates: an upper bound if the runtime shares one
    # scratch area); with U85's Sram_Only, Vela files the weights under on-chip flash, an alias of SRAM
    vela_sram_bytes: int | None = None
    vela_dram_bytes: int | None = None
    vela_onchip_flash_bytes: int | None = None
    vela_offchip_flash_bytes: int | None = None
    vela_cycles_npu: int | None = None  # per inference
    vela_cycles_total: int | None = None
    vela_inference_time_s: float | None = None  # cycles_total / core clock
    vela_delegates: tuple = ()  # per delegate: Vela's whole summary row, its op split, its TOSA size
    # op -> kernel keys, of every operator the program runs outside its delegates (etforge.builders.lowering.oplist)
    operators: dict = field(default_factory=dict)
    # what its quantized graph left in float ({"layer", "reason"}) and keep_float: auto's record
    kept_float: tuple = ()
    rescue: dict = field(default_factory=dict)


@dataclass(frozen=True)
class SizeGateResult(StageResult):
    size_vs_fp32: float | None = None
    saved_bytes: int | None = None
    weight_bytes: int | None = None  # fp32 bytes of the weights the scheme takes
    weight_ratio: float | None = None  # those weights as stored / fp32
    max_weight_ratio: float | None = None
    overhead_bytes: int | None = None
    kept_float: tuple = ()  # {"layer", "reason"}: layers the scheme left in float (not judged)


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
    """The program run here against eager (``passed``, metrics), or bundled for the device to check
    itself (``test_cases``, tolerances)."""

    passed: bool | None = None
    inputs: str | None = None  # what the verdict was measured on
    samples: int | None = None
    methods: tuple = ()  # a multi-method program: the methods judged
    sqnr_db: float | None = None  # the worst output's
    max_abs_error: float | None = None
    cosine: float | None = None
    top1_agreement: float | None = None
    top5_agreement: float | None = None
    nonfinite_values: int | None = None
    first_divergence: str | None = None  # an fp32 cell that missed: where the program leaves eager
    # run here on something else than the ExecuTorch runtime (a recipe's runtime.validated_by):
    runner: str | None = None  # what ran it, e.g. "TOSA reference model (tosa-tools 2026.5.0)"
    proxy: str | None = None  # what stood in for the program, when not its own bytes
    # an LLM: per decode step, greedy continuation, against the eager model after the same scheme
    prefill_sqnr_db: float | None = None
    greedy_agreement: float | None = None
    same_scheme_sqnr_db: float | None = None
    same_scheme_top1_agreement: float | None = None
    decode_steps: int | None = None
    encoder_sqnr_db: float | None = None  # an encoder-decoder program (Whisper, T5): its encoder method's
    # checked on the device: the .bpte's test cases and tolerances
    method: str | None = None
    test_cases: int | None = None
    ordered: bool | None = None
    output_paths: tuple = ()
    rtol: float | None = None
    atol: float | None = None
    tolerance_rule: str | None = None
    thresholds: dict = field(default_factory=dict)
    not_checked_on_device: tuple = ()
    method_suites: dict = field(default_factory=dict)  # several methods: method -> its suite's facts
    delegates: tuple = ()
    size_bytes: int | None = None  # of the .bpte

    def runner_note(self) -> str:
        """Where the numbers come from when not from the ExecuTorch runtime ("" when they do)."""
        if not self.runner:
            return ""
        if self.proxy:
            return f"validated by proxy: {self.proxy}, run on the {self.runner}"
        return f"run on the {self.runner}, not the ExecuTorch runtime"


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

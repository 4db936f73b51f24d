"""Numerics on a runtime: a program's outputs against eager PyTorch, judged by the cell's thresholds.

One check per runtime that ran the program on the validation samples: this host's ExecuTorch
runtime (``target`` None), or what a recipe's ``runtime.validated_by`` names instead (the TOSA
reference model: ``runner``, and ``proxy`` when it ran a stand-in for the program), or another
runtime of the same program (``target``, e.g. an aarch64 core under emulation: its own key, so a
cell can carry several). The builder (etforge.builders.numerics.validate, the LLM and encoder-decoder
kinds' numerics) measures the figures and the misses; a miss is a threshold the figures did not
meet, and a NaN meets none.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from etforge.checks.base import Check, Figure, Judge, finite
from etforge.core.typed import TypedRecord


@dataclass(frozen=True)
class Generation(TypedRecord):
    """A generative program's figures per decode step (an LLM, an encoder-decoder), against eager fp32
    and against the eager model after the same scheme (``same_scheme_*``: the lowering alone)."""

    decode_steps: int | None = None
    greedy_agreement: float | None = None  # the program's greedy continuation against eager's
    prefill_sqnr_db: float | None = None  # an LLM's prompt in one call
    encoder_sqnr_db: float | None = None  # an encoder-decoder's encoder method
    same_scheme_sqnr_db: float | None = None
    same_scheme_top1_agreement: float | None = None


@dataclass(frozen=True, kw_only=True)
class Numerics(Check):
    kind: ClassVar[str] = "numerics"

    target: str | None = None  # another runtime of the same program (e.g. "aarch64 cortex-a76"); None: the cell's own
    runner: str | None = None  # what ran it when not the ExecuTorch runtime, e.g. "TOSA reference model (...)"
    proxy: str | None = None  # what stood in for the program, when not its own bytes
    inputs: str | None = None  # what it was measured on: "random (seeded)", "npz data/val.npz"
    samples: int | None = None
    methods: tuple = ()  # a multi-method program: the methods judged
    sqnr_db: float | None = None  # the worst output's (None: identical to eager, or not a number)
    max_abs_error: float | None = None
    cosine: float | None = None
    top1_agreement: float | None = None
    top5_agreement: float | None = None
    nonfinite_values: int | None = None
    outputs: tuple = ()  # per output of several: {"output", "sqnr_db", "top1_agreement", "top5_agreement"}
    misses: tuple = ()  # one line per threshold missed
    first_divergence: str | None = None  # a missed cell: where it leaves eager (fp32: node; quantized: layer)
    generation: Generation | None = None

    @property
    def key(self) -> str:
        return self.kind + (f"@{self.target}" if self.target else "")

    @property
    def exact(self) -> bool:
        """Identical to eager: no SQNR (infinite) and no error (a NaN SQNR comes with a NaN error)."""
        return self.sqnr_db is None and self.max_abs_error == 0

    @property
    def provisional(self) -> bool:
        return str(self.inputs or "").startswith("random")

    def runner_note(self) -> str:
        """Where the numbers come from when not from the ExecuTorch runtime ("" when they do)."""
        if not self.runner:
            return ""
        if self.proxy:
            return f"validated by proxy: {self.proxy}, run on the {self.runner}"
        return f"run on the {self.runner}, not the ExecuTorch runtime"

    def reason(self) -> str:
        said = [*self.misses, *([self.first_divergence] if self.first_divergence else []), self.runner_note()]
        return "; ".join(s for s in said if s)

    def note(self) -> str:
        return self.runner_note()

    def heading(self) -> str:
        return "SQNR dB" + (f" ({self.target})" if self.target else "")

    def text(self) -> str:
        if self.exact:
            return "exact"
        return "-" if self.sqnr_db is None else f"{self.sqnr_db:.1f}"

    def detail(self) -> str:
        parts = []
        if self.inputs:
            parts.append(f"validated on {self.inputs}" + (f" ({self.samples} samples)" if self.samples else ""))
        for label, value in (("cosine", self.cosine), ("max abs error", self.max_abs_error)):
            if finite(value) is not None:
                parts.append(f"{label}: {value:.6g}")
        for label, value in (("top-1", self.top1_agreement), ("top-5", self.top5_agreement)):
            if finite(value) is not None:
                parts.append(f"{label} agreement {value:.1%}")
        if self.runner:
            parts.append(self.runner_note())
        return "; ".join(parts)

    def figures(self) -> tuple[Figure, ...]:
        prefix = f"{self.target} " if self.target else ""
        out = [
            Figure(f"{prefix}exact", 1.0 if self.exact else 0.0, "yes/no", better="higher", digits=0),
            Figure(
                f"{prefix}sqnr_db",
                self.sqnr_db,
                " dB",
                "higher",
                "sqnr_db",
                chart=None if self.target else "SQNR vs eager (dB)",
            ),
        ]
        out += [_agreement(f"{prefix}{k}", getattr(self, k)) for k in ("top1_agreement", "top5_agreement")]
        if len(self.outputs) > 1:  # one output: the worst output's figures above already say it
            for o in self.outputs:
                if isinstance(o, dict):
                    name = f"{prefix}{o.get('output')}"
                    out.append(Figure(f"{name} sqnr_db", o.get("sqnr_db"), " dB", "higher", "sqnr_db"))
                    out += [_agreement(f"{name} {k}", o.get(k)) for k in ("top1_agreement", "top5_agreement")]
        return tuple(f for f in out if finite(f.value) is not None)

    def manifest(self) -> dict:
        out: dict = {
            "checked": "here",
            "inputs": self.inputs,
            "samples": self.samples,
            "exact": self.exact,
            # every metric, null when not measured (or not finite): the manifests read each by name;
            # a null SQNR with exact: identical outputs (infinite SQNR)
            **{k: finite(getattr(self, k)) for k in ("sqnr_db", "cosine", "max_abs_error")},
            **{k: finite(getattr(self, k)) for k in ("top1_agreement", "top5_agreement")},
        }
        if self.runner:  # e.g. on the TOSA reference model, or through a proxy
            out["validated_by"] = self.runner_note()
        if self.target:  # another runtime's verdict: beside the cell's own, never over it
            return {self.key: {**out, "checked": self.target}}
        return out

    def judge(self) -> Judge:
        runtime = self.target or self.runner or HOST_RUNTIME
        if self.proxy and not self.target:
            runtime = f"{runtime}, by proxy"
        verdict = "not run" if self.passed is None else "passed" if self.passed else "failed"
        why = self.reason() if self.passed is False else self.detail()
        if self.proxy and not self.target:
            why = "; ".join(s for s in (why, f"proxy: {self.proxy}") if s)
        return Judge(runtime, verdict, why)


HOST_RUNTIME = "this host's ExecuTorch runtime"  # a Numerics with neither target nor runner


def _agreement(name: str, value) -> Figure:
    return Figure(name, value, " points", "higher", "top_k", scale=100, digits=4)


@dataclass(frozen=True, kw_only=True)
class OnDevice(Check):
    """A program this host cannot run, bundled (.bpte) with its validation inputs, eager's outputs and
    tolerances for the device to check itself: judged nowhere here (``passed`` None)."""

    kind: ClassVar[str] = "on_device"
    gates: ClassVar[str] = "never"

    method: str | None = None  # the first method's suite (all of a one-method program)
    test_cases: int | None = None
    ordered: bool | None = None  # an LLM's prompt token by token: the cases run in order
    output_paths: tuple = ()
    inputs: str | None = None
    rtol: float | None = None
    atol: float | None = None
    tolerance_rule: str | None = None
    thresholds: dict = field(default_factory=dict)
    not_checked_on_device: tuple = ()  # thresholds a bundled comparison cannot check
    method_suites: dict = field(default_factory=dict)  # several methods: method -> its suite's facts
    bundle_bytes: int | None = None

    def heading(self) -> str:
        return "SQNR dB"

    def detail(self) -> str:
        return f"checked on the device: {self.test_cases} test case(s), rtol={self.rtol}, atol={self.atol}"

    def judge(self) -> Judge:
        return Judge("the device (bundled .bpte)", "on device", self.detail())

    def manifest(self) -> dict:
        return {
            "checked": "on device",
            "inputs": self.inputs,
            "samples": self.test_cases,
            "rtol": finite(self.rtol),
            "atol": finite(self.atol),
            "not_checked_on_device": list(self.not_checked_on_device),
        }

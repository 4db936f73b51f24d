"""Task quality of an LLM program on a validation token file: perplexity and KL divergence.

The builder (etforge.builders.llm.quality, from the LLM validation run) measures perplexity of eager
fp32, of the eager model after the cell's scheme and of the program on the file's first window,
and the mean and p99 KL divergence of the program's next-token distribution from eager fp32's.
``max_ppl_ratio`` gates the program / eager fp32 perplexity ratio, ``max_kl`` the mean KL; a
figure that is not finite fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from etforge.checks.base import Check, Figure, finite


@dataclass(frozen=True, kw_only=True)
class LlmQuality(Check):
    kind: ClassVar[str] = "llm_quality"

    inputs: str | None = None  # "tokens data/val.npz"
    positions: int | None = None  # next-token predictions judged
    ppl_eager: float | None = None  # eager fp32
    ppl_same_scheme: float | None = None  # the eager model after the cell's scheme (None: fp32)
    ppl_program: float | None = None
    ppl_ratio: float | None = None  # program / eager fp32
    kl_mean: float | None = None  # nats, KL(P_fp32 || P_program) per position
    kl_p99: float | None = None
    max_ppl_ratio: float | None = None
    max_kl: float | None = None
    misses: tuple = ()

    def reason(self) -> str:
        return "; ".join(self.misses)

    def heading(self) -> str:
        return "PPL ratio"

    def text(self) -> str:
        return "-" if finite(self.ppl_ratio) is None else f"{self.ppl_ratio:.3f}"

    def detail(self) -> str:
        def show(value, digits=".4g"):
            return "-" if finite(value) is None else format(value, digits)

        parts = [
            f"perplexity on {self.inputs} ({self.positions} positions): program {show(self.ppl_program)}, "
            f"eager fp32 {show(self.ppl_eager)}"
        ]
        if self.ppl_same_scheme is not None:
            parts.append(f"same-scheme eager {show(self.ppl_same_scheme)}")
        parts.append(f"KL from eager fp32: mean {show(self.kl_mean)}, p99 {show(self.kl_p99)} nats")
        return "; ".join(parts)

    def figures(self) -> tuple[Figure, ...]:
        out = (
            Figure("ppl_program", self.ppl_program, "", "lower", digits=4),
            Figure("ppl_ratio", self.ppl_ratio, "x", "lower", digits=4),
            Figure("kl_mean", self.kl_mean, " nats", "lower", digits=5),
            Figure("kl_p99", self.kl_p99, " nats", "lower", digits=5),
        )
        return tuple(f for f in out if finite(f.value) is not None)

    def manifest(self) -> dict:
        names = ("ppl_eager", "ppl_same_scheme", "ppl_program", "ppl_ratio", "kl_mean", "kl_p99")
        return {"llm_quality": {"inputs": self.inputs, **{k: finite(getattr(self, k)) for k in names}}}

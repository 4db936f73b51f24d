"""etforge.builders.bench.profile summarize_events: an Inspector's events to the benchmark's profile record."""

from __future__ import annotations

import math

from etforge.builders.bench.profile import Event, _modules, summarize_events
from etforge.pipeline.stage_results import BenchmarkResult, OperatorProfile

RUN = [
    Event("Method::init", (0.4,)),  # loading: not part of a run
    Event("Method::execute", (0.9, 0.10, 0.12, 0.11, 0.10)),
    Event("Convolution (NHWC, F32) IGEMM #1", (0.5, 0.05, 0.05, 0.05, 0.05), "XnnpackBackend", inside_delegate=True),
    Event(
        "DELEGATE_CALL",
        (0.6, 0.06, 0.07, 0.06, 0.06),
        "XnnpackBackend",
        op_types=("aten.convolution.default", "aten.relu.default"),
        modules=("c (Conv2d)",),
    ),
    Event("native_call_cumsum.out", (0.2, 0.02, 0.02, 0.02, 0.02), op_types=("aten.cumsum.default",)),
    Event("OPERATOR_CALL", (0.2, 0.03, 0.03, 0.03, 0.03), op_types=("aten.cumsum.default",)),
    Event("OPERATOR_CALL", (0.05, 0.005, 0.005, 0.005, 0.005), op_types=("aten.mean.dim",)),
    Event("DELEGATE_CALL", (0.05, 0.01, 0.01, 0.01, 0.01), "XnnpackBackend", op_types=("aten.linear.default",)),
]


def test_delegate_and_portable_time_and_calls_count_each_call_once():
    profile = summarize_events(RUN)
    assert profile.runs == 5 and profile.total_ms == 0.11  # medians: the first run's setup drops out
    assert profile.delegate_calls == 2 and profile.portable_calls == 2
    assert math.isclose(profile.delegate_ms, 0.07) and math.isclose(profile.portable_ms, 0.035)
    assert profile.note is None


def test_the_top_call_sites_are_named_by_their_operators_longest_first():
    top = summarize_events(RUN, top=3).top
    assert [(t.name, t.kind) for t in top] == [
        ("XnnpackBackend: aten.convolution.default, aten.relu.default", "delegate"),
        ("aten.cumsum.default", "portable"),
        ("XnnpackBackend: aten.linear.default", "delegate"),
    ]
    assert top[0].module == "c (Conv2d)" and top[1].module is None
    assert math.isclose(top[0].share, round(0.06 / 0.11, 4))


def test_non_finite_times_never_enter_the_sums():
    events = [
        Event("Method::execute", (1.0, 1.0)),
        Event("OPERATOR_CALL", (math.nan, math.inf), op_types=("aten.add.Tensor",)),
        Event("OPERATOR_CALL", (0.5, 0.5), op_types=("aten.mul.Tensor",)),
    ]
    profile = summarize_events(events)
    assert profile.portable_calls == 1 and profile.portable_ms == 0.5
    assert [t.name for t in profile.top] == ["aten.mul.Tensor"]


def test_an_etdump_without_calls_says_so_in_one_line():
    profile = summarize_events([Event("Method::init", (0.4,)), Event("Program::load_method", (0.4,))])
    assert profile.top == () and profile.delegate_ms is None
    assert profile.note == "the ETDump holds no timed operator or delegate call"


def test_the_module_of_an_event_is_its_deepest_module():
    hierarchy = {
        "aten_linear_default": {
            "L__self__": ("", "m.M"),
            "L__self__mlp_0": ("mlp.0", "torch.nn.modules.linear.Linear"),
        },
        "aten_relu_default": {"L__self__": ("", "m.M")},
    }
    assert _modules(hierarchy) == ("mlp.0 (Linear)", "M")


def test_the_profile_survives_the_benchmark_records_json_form():
    profile = summarize_events(RUN)
    result = BenchmarkResult(program_sha256="ab", profile=profile)
    back = BenchmarkResult.from_json(result.to_json())
    assert back.profile == profile and isinstance(back.profile, OperatorProfile)
    damaged = result.to_json()
    damaged["profile"]["top"] = "not a list"
    damaged["profile"]["delegate_ms"] = "NaN"
    assert BenchmarkResult.from_json(damaged).profile.top == ()
    assert BenchmarkResult.from_json(damaged).profile.delegate_ms is None


def test_without_an_etrecord_a_portable_operator_is_named_by_its_kernel():
    events = [
        Event("Method::execute", (1.0,)),
        Event("native_call_embedding.out", (0.2,)),
        Event("OPERATOR_CALL", (0.3,)),
        Event("DELEGATE_CALL", (0.5,), "XnnpackBackend"),
    ]
    top = summarize_events(events).top
    assert [(t.name, t.kind) for t in top] == [("XnnpackBackend", "delegate"), ("embedding.out", "portable")]

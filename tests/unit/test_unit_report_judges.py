"""Every runtime that judged a cell, from its checks' judge(): the report's "judged by" chips."""

from __future__ import annotations

from etforge.checks.base import Judge
from etforge.checks.not_run import NotRun
from etforge.checks.numerics import HOST_RUNTIME, Numerics, OnDevice
from etforge.checks.size import SizeGate
from etforge.publish.report.judges import judged_by

TOSA = "TOSA reference model (tosa-tools 2026.5.0)"


def test_numerics_names_the_runtime_that_ran_it():
    host = Numerics(passed=True, sqnr_db=41.0, inputs="npz data/val.npz", samples=4)
    assert host.judge() == Judge(HOST_RUNTIME, "passed", host.detail())
    assert "npz data/val.npz" in host.judge().why
    aarch64 = Numerics(passed=False, target="aarch64 cortex-a76 (qemu-user)", misses=("SQNR 54.0 dB < 60 dB",))
    assert aarch64.judge() == Judge("aarch64 cortex-a76 (qemu-user)", "failed", "SQNR 54.0 dB < 60 dB")
    tosa = Numerics(passed=True, runner=TOSA)
    assert tosa.judge().runtime == TOSA and tosa.judge().verdict == "passed"
    proxy = Numerics(passed=True, runner="Cortex-M dialect interpreter", proxy="cortex_m:: operators")
    assert proxy.judge().runtime == "Cortex-M dialect interpreter, by proxy"
    assert "proxy: cortex_m:: operators" in proxy.judge().why


def test_not_run_names_its_why_and_on_device_says_on_device():
    missing = NotRun(
        target="aarch64 cortex-a72 (qemu-user)", why="qemu-aarch64 is not installed (apt-get install qemu-user)"
    )
    assert missing.judge() == Judge(
        "aarch64 cortex-a72 (qemu-user)", "not run", "qemu-aarch64 is not installed (apt-get install qemu-user)"
    )
    bundled = OnDevice(test_cases=1, rtol=0.0, atol=0.005)
    assert bundled.judge().verdict == "on device" and "1 test case(s)" in bundled.judge().why


def test_chips_follow_the_checks_and_skip_checks_no_runtime_ran():
    checks = [
        Numerics(passed=True, sqnr_db=80.0),
        SizeGate(passed=True),
        Numerics(passed=True, target="aarch64 cortex-a76 (qemu-user)", sqnr_db=61.0),
        NotRun(target="aarch64 cortex-a72 (qemu-user)", why="no qemu-aarch64"),
    ]
    chips = judged_by(checks)
    assert [(c.label, c.verdict) for c in chips] == [
        ("host ExecuTorch", "passed"),
        ("aarch64 cortex-a76", "passed"),
        ("aarch64 cortex-a72", "not run"),
    ]
    assert chips[2].title == "aarch64 cortex-a72 (qemu-user): not run (no qemu-aarch64)"

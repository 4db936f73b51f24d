"""The unit tier never imports torch: its modules, and the etforge modules it drives, in a fresh interpreter.

(conftest.py checks, per module, that running the tests imports nothing heavy either; the
fake builders record it for the worker process of an in-process run.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from unit.fake_builders import HEAVY

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent


def test_importing_the_unit_tier_and_the_planning_path_imports_no_torch():
    modules = ["unit." + p.stem for p in sorted(HERE.glob("*.py")) if p.stem != "__init__"]
    assert "unit.test_unit_imports" in modules and len(modules) > 4
    modules += [
        "etforge.app.cli",
        "etforge.engine.actions",
        "etforge.engine.cached_run",
        "etforge.publish.outcome",
        "etforge.publish.exit_status",
        "etforge.config.resolve",
    ]
    script = (
        "import importlib, json, sys\n"
        f"sys.path[:0] = [{str(TESTS)!r}, {str(TESTS.parent)!r}]\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {list(HEAVY)!r})))\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.splitlines()[-1]) == []

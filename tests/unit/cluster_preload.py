"""Dask worker preload of the unit tier: the stage table with fake builders in each worker process.

The cluster's workers are fresh interpreters (the Nanny spawns them), not forks of the test
process, so they import this module to get what the forked workers inherit from the test's
monkeypatch (fake_builders.fake_stages).
"""

from __future__ import annotations

from etforge.pipeline.stages import STAGE
from unit.fake_builders import fake_stages

STAGE.update(fake_stages())

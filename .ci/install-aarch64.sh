#!/usr/bin/env bash
# Set up the aarch64 targets (docs/targets.md) for tests/test_aarch64_targets.py: Debian's qemu-user,
# g++-aarch64-linux-gnu and cmake (apt-get), the aarch64 executorch wheel (pinned sha256) and the
# runner cross-built against it, in the virtualenv. Idempotent: `etforge setup-targets` keeps what
# is already there (the runner is rebuilt only when its sources, the wheel or the compiler change).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/etforge setup-targets

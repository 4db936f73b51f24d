#!/bin/sh
# Ultralytics is AGPL-3.0: etforge does not depend on it. This installs it, pinned, into the
# Python environment that runs etforge, for this example only.
set -eu
PYTHON="${PYTHON:-python}"
"$PYTHON" -m pip install "ultralytics==8.4.190"

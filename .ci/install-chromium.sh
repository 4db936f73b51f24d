#!/usr/bin/env bash
# Install Debian's headless-capable Chromium for the report test (tests/test_report.py).
# Idempotent: does nothing when /usr/bin/chromium is already there.
# Needs root (or sudo); fonts-dejavu-core gives the page a readable default font.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
    echo "chromium already installed: $(/usr/bin/chromium --version 2>/dev/null || echo /usr/bin/chromium)"
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core
/usr/bin/chromium --version

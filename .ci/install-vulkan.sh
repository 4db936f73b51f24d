#!/usr/bin/env bash
# Install what runs VGF programs here (etforge.builders.arm.vgf_run, docs/vgf.md):
#   - Debian packages: the Vulkan loader and Mesa's lavapipe (a CPU Vulkan driver). The Mesa
#     comes from bookworm-backports (25.0.7, with VK_KHR_maintenance5); it needs libdrm >= 2.4.121,
#     also from backports. Only these packages move; Debian's GL stack stays as it is.
#   - PyPI packages (requirements-vgf.txt, --no-deps): Arm's ML SDK scenario runner, the ML
#     emulation layer for Vulkan, and the VGF library's vgf_dump.
# Usage: .ci/install-vulkan.sh [python]   (default: .venv/bin/python)
# Idempotent: installs only what is missing or at another version. Needs root (or sudo) for apt.
# Debian 12 (bookworm) x86_64 only: elsewhere it says so in one line and exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${1:-.venv/bin/python}"

# The versions etforge.builders.arm.vgf_probe.MESA expects (a verdict names its driver).
MESA="25.0.7-2~bpo12+1"
DRM="2.4.123-1~bpo12+1"
LOADER="1.3.239.0-1"
PACKAGES=(
    "libvulkan1=$LOADER"
    "mesa-vulkan-drivers=$MESA"
    "libdrm2=$DRM"
    "libdrm-amdgpu1=$DRM"
    "libdrm-common=$DRM"
)

codename="$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")"
if [ "$codename" != "bookworm" ] || [ "$(uname -m)" != "x86_64" ]; then
    echo "install-vulkan: Debian 12 (bookworm) x86_64 only; this is ${codename:-not Debian} $(uname -m): install Mesa ${MESA%%-*} lavapipe and requirements-vgf.txt by hand" >&2
    exit 1
fi

installed() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || true; }
wanted=()
for spec in "${PACKAGES[@]}"; do
    name="${spec%%=*}"
    [ "$(installed "$name")" = "${spec#*=}" ] || wanted+=("$spec")
done

if [ ${#wanted[@]} -gt 0 ]; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
        SUDO="sudo"
    fi
    SOURCE=/etc/apt/sources.list.d/bookworm-backports.sources
    if ! grep -rqs "bookworm-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
        printf '%s\n' "Types: deb" "URIs: http://deb.debian.org/debian" "Suites: bookworm-backports" \
            "Components: main" "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" | $SUDO tee "$SOURCE" >/dev/null
    fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends "${wanted[@]}"
fi
echo "install-vulkan: mesa-vulkan-drivers $(installed mesa-vulkan-drivers), libvulkan1 $(installed libvulkan1)"

"$PYTHON" -m pip install --quiet --no-deps -r requirements-vgf.txt
"$PYTHON" -m pip list 2>/dev/null | grep -E '^ai[-_]ml[-_]' || true
# What etforge finds now: the driver that will judge VGF cells, or what is still missing (exit 1).
"$PYTHON" - <<'PY'
import sys

from etforge.builders.arm.vgf_probe import find_stack

stack, missing = find_stack()
if stack is None:
    sys.exit("install-vulkan: still missing: " + "; ".join(missing))
print(f"install-vulkan: VGF programs run here on lavapipe ({stack.driver})")
PY

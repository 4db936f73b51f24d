"""What runs VGF programs on this host, measured: found, or what is missing, by name.

A VGF delegate's payload (the .vgf the ML SDK model-converter wrote) runs here on Arm's packaged
stack (docs/vgf.md has how each part was measured):

1. PyPI ``ai-ml-sdk-scenario-runner``: runs a .vgf from a scenario file (its Python binding
   ``scenario_runner_py``), and
   ``ai-ml-sdk-vgf-library``: its ``vgf_dump`` writes the scenario template of a .vgf;
2. PyPI ``ai-ml-emulation-layer-for-vulkan``: the VK_ARM_data_graph / VK_ARM_tensors extensions
   as two Vulkan layers, on a driver without them;
3. a Vulkan loader and Mesa's lavapipe (a CPU Vulkan driver) of exactly :data:`MESA` (LLVM
   :data:`LLVM`): the driver decides the arithmetic, so a verdict names it and holds only for
   it (this module's code is in the validate key: changing the pin re-judges every VGF cell).
   ``.ci/install-vulkan.sh`` installs it (Debian bookworm-backports).

ExecuTorch's own VGF runtime delegate (VgfBackend) is not in the pip runtime, and not needed:
etforge.builders.arm.vgf_run runs the payload itself and the ops outside it. Listing the Vulkan
devices loads a GPU driver, so it runs in a child interpreter (``python -m
etforge.builders.arm.vgf_probe ICD``): a driver crash cannot take the build worker down.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

SCENARIO_RUNNER = "ai-ml-sdk-scenario-runner"
EMULATION_LAYER = "ai-ml-emulation-layer-for-vulkan"
VGF_LIBRARY = "ai-ml-sdk-vgf-library"
MESA, LLVM = "25.0.7", "15.0.6"  # the lavapipe that judges VGF cells (.ci/install-vulkan.sh installs it)
VULKAN_LOADER = "libvulkan.so.1"
# Where the Vulkan loader looks for driver manifests on Linux (lavapipe's is lvp_icd*.json).
ICD_DIRS = ("/usr/share/vulkan/icd.d", "/usr/local/share/vulkan/icd.d", "/etc/vulkan/icd.d")
INSTALL = ".ci/install-vulkan.sh"


@dataclass(frozen=True)
class VgfStack:
    """The parts that run a .vgf here, found."""

    vgf_dump: Path  # the vgf_dump binary (scenario templates)
    layers: Path  # the emulation layer's deploy dir (lib/, share/vulkan/explicit_layer.d/)
    icd: Path  # lavapipe's driver manifest
    driver: str  # what the driver says it is: "Mesa 25.0.7-2~bpo12+1 (LLVM 15.0.6)"
    versions: tuple  # ((distribution, version), ...) of the PyPI parts


def find_stack() -> tuple:
    """(VgfStack, []) when every part is here, else (None, [what is missing, one item each])."""
    missing, versions = [], []
    binaries = {}
    for dist, package, binary in (
        (SCENARIO_RUNNER, "scenario_runner_py", None),  # its Python binding runs the scenario
        (VGF_LIBRARY, "vgf_lib", "binaries/bin/vgf_dump"),
        (EMULATION_LAYER, "emulation_layer", "deploy"),
    ):
        found = _package_file(package, binary)
        version = _version(dist)
        if found is None or version is None:
            missing.append(f"PyPI {dist} (pip install --no-deps -r requirements-vgf.txt)")
        else:
            binaries[dist] = found
            versions.append((dist, version))
    icd = lavapipe_icd()
    driver = None
    if icd is None:
        missing.append(f"Mesa's lavapipe Vulkan driver (no lvp_icd*.json in {', '.join(ICD_DIRS)}; {INSTALL})")
    else:
        driver, why = lavapipe_driver(icd)
        if why:
            missing.append(why)
    if missing or icd is None or driver is None:
        return None, missing
    stack = VgfStack(
        vgf_dump=binaries[VGF_LIBRARY],
        layers=binaries[EMULATION_LAYER],
        icd=icd,
        driver=driver,
        versions=tuple(versions),
    )
    return stack, []


def lavapipe_icd() -> Path | None:
    """lavapipe's driver manifest, from where the Vulkan loader looks for it, or None."""
    for folder in ICD_DIRS:
        found = sorted(Path(folder).glob("lvp_icd*.json"))
        if found:
            return found[0]
    return None


def lavapipe_driver(icd: Path) -> tuple:
    """(driver info, None) when ``icd`` is the pinned lavapipe, else (info or None, why not: one line)."""
    listed = vulkan_devices(icd)
    if "error" in listed:
        return None, f"a working lavapipe ({listed['error']}; {INSTALL})"
    infos = [d["driver_info"] for d in listed["devices"] if d["driver_name"] == "llvmpipe"]
    if not infos:
        names = ", ".join(d["name"] for d in listed["devices"])
        return None, f"a lavapipe device ({icd} gave {names or 'none'}; {INSTALL})"
    info = infos[0]
    found = re.match(r"Mesa (\d+\.\d+\.\d+)\S* \(LLVM (\d+\.\d+\.\d+)\)", info)
    if found is None or found.groups() != (MESA, LLVM):
        return info, f"lavapipe of Mesa {MESA} (LLVM {LLVM}), which judges VGF cells (this host has {info}; {INSTALL})"
    return info, None


def vulkan_devices(icd: Path | None = None, timeout: float = 60) -> dict:
    """{"devices": [{"name", "api_version", "driver_name", "driver_info", "extensions"}]} or {"error":
    why none can be listed}, from a child interpreter; ``icd``: the only driver it may load."""
    command = [sys.executable, "-m", "etforge.builders.arm.vgf_probe"] + ([str(icd)] if icd else [])
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=driver_env(icd))
    except subprocess.TimeoutExpired:
        return {"error": f"listing the Vulkan devices took over {timeout:g} s"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"listing the Vulkan devices failed (exit {proc.returncode}): {last}"}
    return json.loads(lines[-1])


def driver_env(icd: Path | None, base: dict | None = None) -> dict:
    """The environment with ``icd`` as the only Vulkan driver (both loader spellings), and no layers
    or drivers a user's environment would add."""
    import os

    env = {k: v for k, v in (os.environ if base is None else base).items() if not k.startswith("VK_")}
    if icd is not None:
        env["VK_DRIVER_FILES"] = env["VK_ICD_FILENAMES"] = str(icd)
    return env


def _package_file(module: str, relative: str | None) -> Path | None:
    """``relative`` inside an installed top-level package (None: the module's own file), found
    without importing it."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if relative is None:
        return Path(spec.origin) if spec.origin else None
    if not spec.submodule_search_locations:
        return None
    found = Path(list(spec.submodule_search_locations)[0]) / relative
    return found if found.exists() else None


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


# ---------------------------------------------------------------- the child: Vulkan through ctypes


class _AppInfo(ctypes.Structure):
    _fields_ = [
        ("sType", ctypes.c_int),
        ("pNext", ctypes.c_void_p),
        ("pApplicationName", ctypes.c_char_p),
        ("applicationVersion", ctypes.c_uint32),
        ("pEngineName", ctypes.c_char_p),
        ("engineVersion", ctypes.c_uint32),
        ("apiVersion", ctypes.c_uint32),
    ]


class _InstanceInfo(ctypes.Structure):
    _fields_ = [
        ("sType", ctypes.c_int),
        ("pNext", ctypes.c_void_p),
        ("flags", ctypes.c_uint32),
        ("pApplicationInfo", ctypes.POINTER(_AppInfo)),
        ("enabledLayerCount", ctypes.c_uint32),
        ("ppEnabledLayerNames", ctypes.c_void_p),
        ("enabledExtensionCount", ctypes.c_uint32),
        ("ppEnabledExtensionNames", ctypes.c_void_p),
    ]


class _ExtensionProperties(ctypes.Structure):
    _fields_ = [("extensionName", ctypes.c_char * 256), ("specVersion", ctypes.c_uint32)]


class _DriverProperties(ctypes.Structure):  # VkPhysicalDeviceDriverProperties (Vulkan 1.2)
    _fields_ = [
        ("sType", ctypes.c_int),
        ("pNext", ctypes.c_void_p),
        ("driverID", ctypes.c_uint32),
        ("driverName", ctypes.c_char * 256),
        ("driverInfo", ctypes.c_char * 256),
        ("conformanceVersion", ctypes.c_uint8 * 4),
    ]


class _Properties2(ctypes.Structure):  # VkPhysicalDeviceProperties2: the 1.0 properties (about 824 bytes)
    _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p), ("properties", ctypes.c_uint8 * 4096)]


_PROPERTIES_2, _DRIVER_PROPERTIES = 1000059001, 1000196000  # their VkStructureType values


def _list_devices() -> dict:
    """The Vulkan devices the loader finds, with their driver and extensions (Vulkan 1.1 calls)."""
    try:
        vk = ctypes.CDLL(VULKAN_LOADER)
    except OSError:
        return {"error": f"no Vulkan loader: {VULKAN_LOADER} not found (Debian libvulkan1)"}
    app = _AppInfo(0, None, b"etforge", 1, b"etforge", 1, (1 << 22) | (1 << 12))  # VK_API_VERSION_1_1
    info = _InstanceInfo(1, None, 0, ctypes.pointer(app), 0, None, 0, None)
    instance = ctypes.c_void_p()
    result = vk.vkCreateInstance(ctypes.byref(info), None, ctypes.byref(instance))
    if result != 0:
        # -9: VK_ERROR_INCOMPATIBLE_DRIVER, what the loader says when it finds no driver (ICD)
        hint = " (no Vulkan driver installed: e.g. Debian mesa-vulkan-drivers)" if result == -9 else ""
        return {"error": f"vkCreateInstance returned {result}{hint}"}
    try:
        count = ctypes.c_uint32()
        vk.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), None)
        handles = (ctypes.c_void_p * count.value)()
        vk.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), handles)
        devices = [_device(vk, ctypes.c_void_p(h)) for h in handles[: count.value]]
    finally:
        vk.vkDestroyInstance(instance, None)
    if not devices:
        return {"error": "no Vulkan device (no driver: e.g. Debian mesa-vulkan-drivers)"}
    return {"devices": devices}


def _device(vk, handle) -> dict:
    driver = _DriverProperties(_DRIVER_PROPERTIES, None)
    properties = _Properties2(_PROPERTIES_2, ctypes.cast(ctypes.pointer(driver), ctypes.c_void_p))
    vk.vkGetPhysicalDeviceProperties2(handle, ctypes.byref(properties))
    raw = bytes(properties.properties)
    api = int.from_bytes(raw[0:4], "little")
    name = raw[20:276].split(b"\0", 1)[0].decode(errors="replace")  # after 5 uint32 fields
    count = ctypes.c_uint32()
    vk.vkEnumerateDeviceExtensionProperties(handle, None, ctypes.byref(count), None)
    extensions = (_ExtensionProperties * count.value)()
    vk.vkEnumerateDeviceExtensionProperties(handle, None, ctypes.byref(count), extensions)
    return {
        "name": name,
        "api_version": f"{api >> 22 & 0x7F}.{api >> 12 & 0x3FF}.{api & 0xFFF}",
        "driver_name": driver.driverName.decode(errors="replace"),
        "driver_info": driver.driverInfo.decode(errors="replace"),
        "extensions": sorted(e.extensionName.decode() for e in extensions[: count.value]),
    }


if __name__ == "__main__":
    print(json.dumps(_list_devices()))

"""Whether this host has a packaged path to run VGF programs, measured: what is missing, by name.

Running a .pte with a VgfBackend delegate needs three things:

1. an ExecuTorch runtime with the VGF backend registered (the pip wheel's runtime has
   XnnpackBackend, QnnBackend, OpenvinoBackend; VgfBackend needs a source build with
   EXECUTORCH_BUILD_VGF=ON, which etforge does not do);
2. a Vulkan loader and a device whose driver offers VK_KHR_maintenance5 (Debian 12's Mesa
   22.3 lavapipe does not; bookworm-backports' Mesa 25 does);
3. Arm's ML emulation layer for Vulkan (PyPI ``ai-ml-emulation-layer-for-vulkan``), which
   provides the VK_ARM_tensors / VK_ARM_data_graph extensions on a driver without them.

Named by the arm_vgf recipe (``runtime.probe``); the validate stage adds its line to the
cell's on-device note. The Vulkan part runs in a child interpreter (``python -m
etforge.builders.arm.vgf_probe``): loading a GPU driver must not be able to take the build
worker down with it.
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
from importlib import metadata

EMULATION_LAYER = "ai-ml-emulation-layer-for-vulkan"
MAINTENANCE5 = "VK_KHR_maintenance5"
VULKAN_LOADER = "libvulkan.so.1"


def missing() -> list:
    """What this host lacks to run VGF programs, one item each ([] when nothing is missing)."""
    out = []
    runtime = runtime_backends()
    if "VgfBackend" not in runtime:
        out.append(
            f"an ExecuTorch runtime with VgfBackend (the executorch {_version('executorch')} pip runtime "
            f"registers {', '.join(runtime) or 'none'}; VgfBackend needs a source build with EXECUTORCH_BUILD_VGF=ON)"
        )
    vulkan = vulkan_devices()
    if "error" in vulkan:
        out.append(f"a Vulkan driver with {MAINTENANCE5} ({vulkan['error']})")
    elif not any(MAINTENANCE5 in d["extensions"] for d in vulkan["devices"]):
        found = "; ".join(f"{d['name']} (Vulkan {d['api_version']})" for d in vulkan["devices"])
        out.append(f"a Vulkan driver with {MAINTENANCE5} (no device offers it: {found})")
    if _version(EMULATION_LAYER) is None:
        out.append(f"Arm's ML emulation layer for Vulkan (PyPI {EMULATION_LAYER} is not installed)")
    return out


def missing_note() -> str:
    """One line for an on-device VGF cell: what is missing to run it here."""
    found = missing()
    if not found:
        return "every part of a packaged VGF path is present here, but etforge does not run VGF programs yet"
    return "not run here, missing: " + "; ".join(found)


def runtime_backends() -> list:
    """The delegates the installed ExecuTorch runtime registers."""
    from etforge.builders.runtime.determinism import runtime

    return sorted(runtime().backend_registry.registered_backend_names)


def vulkan_devices(timeout: float = 60) -> dict:
    """{"devices": [{"name", "api_version", "extensions"}]} or {"error": why none can be listed},
    from a child interpreter (see the module docstring)."""
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "etforge.builders.arm.vgf_probe"],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"listing the Vulkan devices took over {timeout:g} s"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"listing the Vulkan devices failed (exit {proc.returncode}): {last}"}
    return json.loads(lines[-1])


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


def _list_devices() -> dict:
    """The Vulkan devices the loader finds, with their extensions (Vulkan 1.0 calls only)."""
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
    properties = ctypes.create_string_buffer(4096)  # VkPhysicalDeviceProperties (about 824 bytes)
    vk.vkGetPhysicalDeviceProperties(handle, properties)
    api = int.from_bytes(properties.raw[0:4], "little")
    name = properties.raw[20:276].split(b"\0", 1)[0].decode(errors="replace")  # after 5 uint32 fields
    count = ctypes.c_uint32()
    vk.vkEnumerateDeviceExtensionProperties(handle, None, ctypes.byref(count), None)
    extensions = (_ExtensionProperties * count.value)()
    vk.vkEnumerateDeviceExtensionProperties(handle, None, ctypes.byref(count), extensions)
    return {
        "name": name,
        "api_version": f"{api >> 22 & 0x7F}.{api >> 12 & 0x3FF}.{api & 0xFFF}",
        "extensions": sorted(e.extensionName.decode() for e in extensions[: count.value]),
    }


if __name__ == "__main__":
    print(json.dumps(_list_devices()))

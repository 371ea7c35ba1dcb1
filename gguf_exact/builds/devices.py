"""The GPU devices a llama.cpp build sees on this machine, and the Vulkan devices it hides.

llama.cpp's Vulkan backend (``ggml_vk_instance_init`` in ``ggml-vulkan.cpp`` at 0c1e57098)
takes every discrete and integrated GPU; failing those, the first device that is not of CPU
type; a CPU-type device (Mesa's lavapipe, ``llvmpipe``) only when ``GGML_VK_VISIBLE_DEVICES``
names it, by its index in the loader's list (as ``vulkaninfo`` numbers them: ``GPU0`` is 0).
So on a machine without a GPU a Vulkan build sees no device and runs everything on the CPU,
saying nothing. :func:`list_devices` asks the build itself (``llama-server --list-devices``,
in the environment a server would get); :func:`vulkan_devices` asks the Vulkan loader
(``vulkaninfo``) what there is, with each device's type and the limit on one tensor that
decides what stays in RAM (:func:`tensor_limit`).
:func:`ggml_gpu_devices` asks a loaded llama.cpp library (the bindings') the same.
:func:`parse_list_devices` and :func:`parse_vulkaninfo` are pure.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gguf_exact.constants import VULKAN_VISIBLE_ENV
from gguf_exact.errors import BuildError

LIST_TIMEOUT_S = 60  # a Vulkan instance on lavapipe starts in about a second; a hung driver is not waited for

_DEVICE = re.compile(r"^\s*(\S+): (.*) \((\d+) MiB, (\d+) MiB free\)\s*$")
_GPU = re.compile(r"^GPU(\d+):\s*$")
INDEXING_64BIT = "VK_EXT_shader_64bit_indexing"
_FIELD = re.compile(r"^\s+(\w+)\s*=\s*(.*?)\s*$")


@dataclass(frozen=True)
class Device:
    """One device as ``llama-server --list-devices`` prints it."""

    name: str  # Vulkan0, CUDA0
    description: str  # llvmpipe (LLVM 15.0.6, 256 bits)
    total_mib: int
    free_mib: int

    @property
    def backend(self) -> str:
        """``Vulkan``, ``CUDA``: the name without its index."""
        return self.name.rstrip("0123456789")

    def line(self) -> str:
        return f"{self.name}: {self.description} ({self.total_mib} MiB)"


@dataclass(frozen=True)
class VulkanDevice:
    """One physical device as ``vulkaninfo`` lists it (``--summary`` has no limits)."""

    index: int  # GPU<index>: what GGML_VK_VISIBLE_DEVICES names
    name: str
    device_type: str  # CPU, DISCRETE_GPU, INTEGRATED_GPU, VIRTUAL_GPU, OTHER
    driver: str
    max_storage_buffer_range: int | None = None  # bytes; None: not listed
    max_buffer_size: int | None = None  # maintenance4's maxBufferSize, else maxMemoryAllocationSize
    indexing_64bit: bool = False  # VK_EXT_shader_64bit_indexing: llama.cpp then ignores the range

    @property
    def software(self) -> bool:
        """A CPU-type device (lavapipe, SwiftShader): llama.cpp hides it unless named."""
        return self.device_type == "CPU"

    def line(self) -> str:
        return f"GPU{self.index} {self.name} ({self.device_type.lower().replace('_', ' ')}, {self.driver})"


def parse_list_devices(text: str) -> list[Device]:
    """The devices of ``llama-server --list-devices`` output (``(none)``: [])."""
    return [Device(m[1], m[2], int(m[3]), int(m[4])) for line in text.splitlines() if (m := _DEVICE.match(line))]


def parse_vulkaninfo(text: str) -> list[VulkanDevice]:
    """The devices of ``vulkaninfo`` output (whole or ``--summary``), in the loader's order."""
    found: list[dict[str, str]] = []
    for line in text.splitlines():
        if m := _GPU.match(line):
            found.append({"index": m[1]})
        elif found and (m := _FIELD.match(line)):
            found[-1].setdefault(m[1], m[2])
        elif found and line.strip().startswith(INDEXING_64BIT + " "):
            found[-1][INDEXING_64BIT] = "1"
    return [
        VulkanDevice(
            int(d["index"]),
            d.get("deviceName", "?"),
            d.get("deviceType", "").removeprefix("PHYSICAL_DEVICE_TYPE_") or "OTHER",
            d.get("driverName", "?"),
            _number(d.get("maxStorageBufferRange")),
            _number(d.get("maxBufferSize")) or _number(d.get("maxMemoryAllocationSize")),
            INDEXING_64BIT in d,
        )
        for d in found
    ]


def _number(text: str | None) -> int | None:
    """A limit as vulkaninfo prints it (``134217728``, ``0x80000000``), or None."""
    try:
        return int(text, 0) if text else None
    except ValueError:
        return None


def device_env(visible: str | None, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with ``GGML_VK_VISIBLE_DEVICES`` set to
    ``visible`` (``"0"``, ``"0,1"``), or as it was when ``visible`` is None."""
    env = dict(os.environ if base is None else base)
    if visible is not None:
        env[VULKAN_VISIBLE_ENV] = visible
    return env


def list_devices(binary: Path, env: dict[str, str] | None = None) -> list[Device]:
    """The devices ``binary`` (a llama-server) sees in ``env``; one line when it cannot tell."""
    try:
        proc = subprocess.run(
            [str(binary), "--list-devices"], capture_output=True, text=True, timeout=LIST_TIMEOUT_S, env=env
        )
    except subprocess.TimeoutExpired:
        raise BuildError(f"{binary} --list-devices: no answer in {LIST_TIMEOUT_S} s (a hung GPU driver?)") from None
    except OSError as e:
        raise BuildError(f"{binary}: cannot run ({e.strerror})") from None
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise BuildError(f"{binary} --list-devices exited {proc.returncode} ({tail[0][:200]})")
    return parse_list_devices(proc.stdout)


def vulkan_devices() -> list[VulkanDevice] | None:
    """What the Vulkan loader lists (``vulkaninfo``, whole: the summary has no limits), or
    None without vulkaninfo."""
    tool = shutil.which("vulkaninfo")
    if tool is None:
        return None
    try:
        proc = subprocess.run([tool], capture_output=True, text=True, timeout=LIST_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_vulkaninfo(proc.stdout) if proc.returncode == 0 else []


def tensor_limit(device: Device | None, known: list[VulkanDevice] | None = None) -> int | None:
    """The largest tensor ``device``'s backend takes (bytes), None for no limit known: for a
    Vulkan device, as ``ggml-vulkan.cpp``'s ``tensor_size_supported`` decides, its buffer
    size limit and, without 64-bit indexing, its ``maxStorageBufferRange``; CUDA and the CPU
    have none here. ``known``: the loader's devices (default: :func:`vulkan_devices`),
    matched by name."""
    if device is None or device.backend != "Vulkan":
        return None
    known = vulkan_devices() if known is None else known
    match = next((d for d in known or [] if d.name == device.description), None)
    if match is None:
        return None
    limits = [match.max_buffer_size] + ([] if match.indexing_64bit else [match.max_storage_buffer_range])
    return min((x for x in limits if x is not None), default=None)


# ggml-backend.h at 0c1e57098: enum ggml_backend_dev_type; GPU and IGPU are what layers offload to.
_GPU_TYPES = (1, 2)


def _declare_ggml(lib: ctypes.CDLL) -> ctypes.CDLL:
    """``lib``'s ggml device-registry functions given their C types (llama-cpp-python 0.3.36
    binds none of ``ggml_backend_dev_*``; dlsym on libllama finds them in its libggml)."""
    p, size = ctypes.c_void_p, ctypes.c_size_t
    for name, res, args in (
        ("ggml_backend_reg_count", size, []),
        ("ggml_backend_reg_get", p, [size]),
        ("ggml_backend_reg_name", ctypes.c_char_p, [p]),
        ("ggml_backend_dev_count", size, []),
        ("ggml_backend_dev_get", p, [size]),
        ("ggml_backend_dev_name", ctypes.c_char_p, [p]),
        ("ggml_backend_dev_description", ctypes.c_char_p, [p]),
        ("ggml_backend_dev_type", ctypes.c_int, [p]),
        ("ggml_backend_dev_memory", None, [p, ctypes.POINTER(size), ctypes.POINTER(size)]),
    ):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


def ggml_gpu_backends(lib: ctypes.CDLL) -> list[str]:
    """The GPU backends registered in a loaded llama.cpp library (``Vulkan``, ``CUDA``): what
    the bindings were built with, whether or not they see a device."""
    lib = _declare_ggml(lib)
    names = [
        lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(i)).decode() for i in range(lib.ggml_backend_reg_count())
    ]
    return [n for n in names if n not in ("CPU", "BLAS", "RPC")]


def ggml_gpu_devices(lib: ctypes.CDLL) -> list[Device]:
    """The GPU devices a loaded llama.cpp library sees in this process's environment, named as
    ``llama-server --list-devices`` names them."""
    lib = _declare_ggml(lib)
    out = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        if lib.ggml_backend_dev_type(dev) not in _GPU_TYPES:
            continue
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        name, text = lib.ggml_backend_dev_name(dev).decode(), lib.ggml_backend_dev_description(dev).decode()
        out.append(Device(name, text, total.value >> 20, free.value >> 20))
    return out


def software_visible() -> str | None:
    """``GGML_VK_VISIBLE_DEVICES`` naming this machine's CPU-type Vulkan devices (``"0"``), or None."""
    soft = [d.index for d in vulkan_devices() or [] if d.software]
    return ",".join(map(str, soft)) or None


__all__ = [
    "Device",
    "VulkanDevice",
    "device_env",
    "ggml_gpu_backends",
    "ggml_gpu_devices",
    "list_devices",
    "tensor_limit",
    "parse_list_devices",
    "parse_vulkaninfo",
    "software_visible",
    "vulkan_devices",
]

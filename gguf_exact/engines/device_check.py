"""A GPU profile served where llama-server sees no GPU device: refused, never silently the CPU.

llama-server built for Vulkan or CUDA that finds no device of its backend runs every layer on
the CPU and says so only in its log; a CPU-type Vulkan device (Mesa's lavapipe) is hidden by
llama.cpp unless ``GGML_VK_VISIBLE_DEVICES`` names it (:mod:`gguf_exact.builds.devices`).
:func:`require_device` asks the server binary itself, in the environment the server will get
(``--vulkan-devices`` included), before anything starts; no device is one line that says what
the Vulkan loader has and how to use it.
"""

from __future__ import annotations

import re
from pathlib import Path

from gguf_exact.builds import devices
from gguf_exact.engines.launch import Launch, server_env
from gguf_exact.errors import ArgumentError, Param, ServerError

BACKEND_DEVICE = {"vulkan": "Vulkan", "cuda": "CUDA"}  # a build's backend -> its devices' names in --list-devices
SOFTWARE_PROBE_TIMEOUT_S = 600.0
"""serve's probe request on a software device (lavapipe): its first request compiles every
pipeline it meets, measured at tens of seconds to minutes on 2 cores (docs/building-llama-cpp.md)."""


def check_vulkan_devices(value: str | None) -> None:
    """``vulkan_devices``: device indices as ``vulkaninfo`` numbers them, ``0`` or ``0,1``."""
    if value is not None and not re.fullmatch(r"\d+(,\d+)*", value):
        raise ArgumentError(
            Param("vulkan_devices"),
            f" {value!r}: expected Vulkan device indices as vulkaninfo numbers them (GPU0 is 0), e.g. 0 or 0,1",
        )


def is_software(device: devices.Device) -> bool:
    """``device`` is a CPU-type Vulkan device (lavapipe), as vulkaninfo names it."""
    return device.backend == "Vulkan" and device.description in {
        d.name for d in devices.vulkan_devices() or [] if d.software
    }


def refuse_software_flash_attn(launch: Launch, device: devices.Device) -> None:
    """Flash attention on a software device (lavapipe): refused. Mesa 22.3.6's lavapipe (Debian 12)
    dies with SIGSEGV inside ``libvulkan_lvp.so`` on the first request that runs llama.cpp's
    flash-attention shader (the target alone, ``-fa on`` or ``auto``; ``-fa off`` serves), so a
    profile that leaves it on would start, pass ``/health`` and die on its first request."""
    value = launch.settings.config.flash_attn  # llama.cpp's default: auto
    if value != "off":
        raise ServerError(
            f"flash-attn {value} on {device.line()}: this software device crashes (SIGSEGV in libvulkan_lvp.so) on the first request "
            "that runs llama.cpp's flash-attention shader; pass ",
            Param("overrides"),
            " flash-attn=off to serve on it",
        )


def require_device(launch: Launch) -> devices.Device | None:
    """The first device of the profile's GPU backend that llama-server sees with the server's
    environment; None for a CPU build; one line when there is none."""
    build = launch.profile.build
    kind = BACKEND_DEVICE.get(build.rstrip("0123456789"))
    if kind is None:
        return None
    binary = Path(launch.command[0])
    seen = [d for d in devices.list_devices(binary, server_env(launch)) if d.backend == kind]
    if seen:
        return seen[0]
    raise ServerError(
        f"{binary} (profile {launch.profile.name}, build {build}) sees no {kind} device here, so it would run every layer on the CPU; ",
        *_what_to_do(kind, launch),
    )


def _what_to_do(kind: str, launch: Launch) -> tuple:
    if kind != "Vulkan":
        return ("check `nvidia-smi`, or serve with ", Param("profile"), " cpu")
    given = launch.settings.vulkan_devices
    listed = devices.vulkan_devices()
    if listed is None:
        return (
            "vulkaninfo is not installed to say what there is (scripts/install-vulkan-deps.sh); name a device with ",
            Param("vulkan_devices"),
            " or serve with ",
            Param("profile"),
            " cpu",
        )
    soft = [d for d in listed if d.software]
    there = "; ".join(d.line() for d in listed) or "no device"
    if given is not None:
        return (
            Param("vulkan_devices"),
            f" {given} names none it can use (vulkaninfo lists {there}); serve with ",
            Param("profile"),
            " cpu",
        )
    if soft:
        idx = ",".join(str(d.index) for d in soft)
        return (
            f"vulkaninfo lists {there}: a CPU-type device, which llama.cpp hides; pass ",
            Param("vulkan_devices"),
            f" {idx} to serve on it (a software device: slow), or serve with ",
            Param("profile"),
            " cpu",
        )
    return (
        f"vulkaninfo lists {there}; install the GPU's Vulkan driver (Mesa's mesa-vulkan-drivers, NVIDIA's driver), or serve with ",
        Param("profile"),
        " cpu",
    )


__all__ = [
    "SOFTWARE_PROBE_TIMEOUT_S",
    "check_vulkan_devices",
    "is_software",
    "refuse_software_flash_attn",
    "require_device",
]

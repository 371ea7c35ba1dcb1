"""What llama-server and the Vulkan loader say about devices, read without a GPU: the parsers,
serve's check of --vulkan-devices, and how doctor words a probe record (the real runs on
lavapipe are tests/test_vulkan_serve.py, `make test-vulkan`)."""

import pytest

from gguf_exact.builds import devices
from gguf_exact.doctor import describe_probe
from gguf_exact.engines.device_check import check_vulkan_devices
from gguf_exact.errors import ArgumentError

LIST_NONE = "ggml_vulkan: No devices found.\nAvailable devices:\n  (none)\n"
LIST_LAVAPIPE = "Available devices:\n  Vulkan0: llvmpipe (LLVM 15.0.6, 256 bits) (2048 MiB, 2047 MiB free)\n"
VULKANINFO = """==========
VULKANINFO
==========

Devices:
========
GPU0:
	apiVersion         = 1.3.230
	deviceType         = PHYSICAL_DEVICE_TYPE_DISCRETE_GPU
	deviceName         = NVIDIA GeForce GTX 1650 Ti
	driverName         = NVIDIA
GPU1:
	apiVersion         = 1.3.230
	deviceType         = PHYSICAL_DEVICE_TYPE_CPU
	deviceName         = llvmpipe (LLVM 15.0.6, 256 bits)
	driverID           = DRIVER_ID_MESA_LLVMPIPE
	driverName         = llvmpipe
"""


def test_list_devices_output():
    assert devices.parse_list_devices(LIST_NONE) == []
    (d,) = devices.parse_list_devices(LIST_LAVAPIPE)
    assert d == devices.Device("Vulkan0", "llvmpipe (LLVM 15.0.6, 256 bits)", 2048, 2047)
    assert (d.backend, d.line()) == ("Vulkan", "Vulkan0: llvmpipe (LLVM 15.0.6, 256 bits) (2048 MiB)")
    two = devices.parse_list_devices("  CUDA0: NVIDIA GeForce RTX 3050 (7971 MiB, 7800 MiB free)\n" + LIST_LAVAPIPE)
    assert [x.backend for x in two] == ["CUDA", "Vulkan"]


def test_vulkaninfo_summary():
    gpu, cpu = devices.parse_vulkaninfo(VULKANINFO)
    assert gpu == devices.VulkanDevice(0, "NVIDIA GeForce GTX 1650 Ti", "DISCRETE_GPU", "NVIDIA") and not gpu.software
    assert cpu == devices.VulkanDevice(1, "llvmpipe (LLVM 15.0.6, 256 bits)", "CPU", "llvmpipe") and cpu.software
    assert cpu.line() == "GPU1 llvmpipe (LLVM 15.0.6, 256 bits) (cpu, llvmpipe)"
    assert devices.parse_vulkaninfo("ERROR: no Vulkan\n") == []


def test_the_device_environment():
    base = {"PATH": "/bin", "GGML_VK_VISIBLE_DEVICES": "3"}
    assert devices.device_env("0,1", base) == {"PATH": "/bin", "GGML_VK_VISIBLE_DEVICES": "0,1"}
    assert devices.device_env(None, base) == base  # a user's own choice is kept when serve names none


@pytest.mark.parametrize("bad", ["", "gpu0", "0,", "-1", "0 1"])
def test_vulkan_devices_must_be_indices(bad):
    check_vulkan_devices(None)
    check_vulkan_devices("0")
    check_vulkan_devices("0,2")
    with pytest.raises(ArgumentError, match=r"expected Vulkan device indices as vulkaninfo numbers them \(GPU0 is 0\)"):
        check_vulkan_devices(bad)


def test_probe_records_in_words():
    on_device = {
        "ok": True,
        "device": "Vulkan0: llvmpipe (LLVM 15.0.6, 256 bits) (2048 MiB)",
        "visible_devices": "0",
        "gpu_layers": 99,
    }
    assert describe_probe(on_device, "vulkan") == (
        "probe passed on Vulkan0: llvmpipe (LLVM 15.0.6, 256 bits) (2048 MiB) (-ngl 99, GGML_VK_VISIBLE_DEVICES=0)"
    )
    assert (
        describe_probe({"ok": True, "device": "", "gpu_layers": 0}, "vulkan")
        == "probe passed on the CPU: no vulkan device here"
    )
    assert describe_probe({"ok": True}, "vulkan") == (
        "probe passed on the CPU (recorded before probes ran on the device; `gguf-exact build-llama --vulkan --reprobe`)"
    )
    assert describe_probe({"ok": True}, "cpu") == "probe passed"
    assert describe_probe({"ok": None, "note": "no libcuda.so.1"}, "cuda86") == "probe not run here"


# The whole `vulkaninfo` output, abridged to the lines the limits come from (lavapipe's as
# Mesa 22.3 reports them; the card's as NVIDIA's drivers do, with 64-bit indexing).
VULKANINFO_WHOLE = """Device Properties and Extensions:
=================================
GPU0:
VkPhysicalDeviceProperties:
	deviceType        = PHYSICAL_DEVICE_TYPE_CPU
	deviceName        = llvmpipe (LLVM 15.0.6, 256 bits)
VkPhysicalDeviceLimits:
	maxStorageBufferRange                           = 134217728
VkPhysicalDeviceDriverProperties:
	driverName      = llvmpipe
VkPhysicalDeviceMaintenance3Properties:
	maxMemoryAllocationSize = 0x80000000
VkPhysicalDeviceMaintenance4Properties:
	maxBufferSize = 0xffffffff
Device Extensions: count = 2
	VK_EXT_shader_atomic_float                   : extension revision 1
	VK_KHR_maintenance4                          : extension revision 2
GPU1:
VkPhysicalDeviceProperties:
	deviceType        = PHYSICAL_DEVICE_TYPE_DISCRETE_GPU
	deviceName        = NVIDIA GeForce RTX 3050
VkPhysicalDeviceLimits:
	maxStorageBufferRange                           = 4294967295
VkPhysicalDeviceMaintenance3Properties:
	maxMemoryAllocationSize = 0xffffffff000
Device Extensions: count = 1
	VK_EXT_shader_64bit_indexing                 : extension revision 1
"""


def test_vulkaninfo_whole_gives_each_devices_tensor_limit():
    soft, card = devices.parse_vulkaninfo(VULKANINFO_WHOLE)
    assert (soft.name, soft.device_type, soft.driver) == ("llvmpipe (LLVM 15.0.6, 256 bits)", "CPU", "llvmpipe")
    assert (soft.max_storage_buffer_range, soft.max_buffer_size, soft.indexing_64bit) == (2**27, 2**32 - 1, False)
    # no maintenance4: maxMemoryAllocationSize is the buffer limit; 64-bit indexing lifts the range
    assert (card.max_storage_buffer_range, card.max_buffer_size, card.indexing_64bit) == (
        2**32 - 1,
        0xFFFFFFFF000,
        True,
    )
    lavapipe = devices.Device("Vulkan0", soft.name, 2048, 2048)
    assert devices.tensor_limit(lavapipe, [soft, card]) == 2**27  # the smaller of range and buffer size
    assert devices.tensor_limit(devices.Device("Vulkan1", card.name, 8192, 8000), [soft, card]) == 0xFFFFFFFF000
    # a device the loader does not list, CUDA, the CPU: no limit known
    assert devices.tensor_limit(devices.Device("Vulkan0", "another card", 1, 1), [soft, card]) is None
    assert devices.tensor_limit(devices.Device("CUDA0", card.name, 8192, 8000), [soft, card]) is None
    assert devices.tensor_limit(None, [soft, card]) is None
    # the summary has no limits: none is made up
    (gpu, cpu) = devices.parse_vulkaninfo(VULKANINFO)
    assert (cpu.max_storage_buffer_range, cpu.max_buffer_size) == (None, None)
    assert devices.tensor_limit(devices.Device("Vulkan0", cpu.name, 1, 1), [gpu, cpu]) is None

"""Builds that run where they are built: named CPU features (never AMX), the probe, the
bindings built like llama-server, and a llama.cpp crash failing one test only.

The AMX machine of the issue is not this one; its /proc/cpuinfo flags are below, and
what a build would compile there is computed from them exactly as it is here.
"""

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _llama_server import server_binary
from click.testing import CliRunner

from gguf_exact import doctor
from gguf_exact.builds import bindings_build, build_probe, llama_build, source_patches
from gguf_exact.builds.cpu_features import OVERRIDE_ENV, cpu_target, host_cpu, parse_override
from gguf_exact.errors import GgufExactError

REPO = Path(__file__).resolve().parents[1]

# The review's fresh machine (Sapphire Rapids class Xeon), flags as /proc/cpuinfo lists them.
AMX_XEON = (
    "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu vme sse sse2 ssse3 fma cx16 sse4_1 sse4_2 "
    "movbe popcnt aes xsave avx f16c rdrand bmi1 avx2 bmi2 avx512f avx512dq avx512ifma avx512cd "
    "avx512bw avx512vl avx512vbmi avx512_vbmi2 avx512_vnni avx512_bitalg avx512_vpopcntdq avx_vnni "
    "avx512_bf16 amx_bf16 avx512_fp16 amx_tile amx_int8\n"
)
# An AMD EPYC (Zen 1) without AVX-512, like the machine these tests were first run on.
ZEN1 = "flags\t\t: fpu sse sse2 ssse3 fma cx16 sse4_1 sse4_2 movbe popcnt aes xsave avx f16c bmi1 avx2 bmi2 sha_ni\n"


def test_amx_xeon_gets_every_feature_but_amx():
    cpu = cpu_target(AMX_XEON, "x86_64")
    assert cpu.features == (
        "sse42", "avx", "f16c", "fma", "bmi2", "avx2", "avx_vnni", "avx512", "avx512_vbmi", "avx512_vnni", "avx512_bf16",
    )  # fmt: skip
    assert cpu.advertised_amx == ("amx_tile", "amx_int8", "amx_bf16")
    args = cpu.cmake_args()
    assert args[0] == "-DGGML_NATIVE=OFF"
    assert [a for a in args if "AMX" in a] == ["-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]
    assert "-DGGML_AVX512_BF16=ON" in args and "-DGGML_AVX_VNNI=ON" in args
    assert cpu.tag == "avx.avx2.avx512.avx512_bf16.avx512_vbmi.avx512_vnni.avx_vnni.bmi2.f16c.fma.sse42"
    assert cpu.describe().endswith("; AMX advertised (amx_tile, amx_int8, amx_bf16) but not used")


def test_cpu_without_avx512_and_other_arches():
    zen = cpu_target(ZEN1, "x86_64")
    assert zen.tag == "avx.avx2.bmi2.f16c.fma.sse42" and zen.advertised_amx == ()
    assert "-DGGML_AVX512=OFF" in zen.cmake_args() and "-DGGML_AVX2=ON" in zen.cmake_args()
    # AVX-512 extensions without the AVX-512 base ggml compiles them with: none of them
    partial = cpu_target("flags : avx avx2 avx512_vnni avx512_bf16 avx512f\n", "x86_64")
    assert partial.features == ("avx", "avx2")
    arm = cpu_target("Features\t: fp asimd sve\n", "aarch64")
    assert arm.native and arm.cmake_args() == [] and arm.tag.startswith("native-aarch64-")
    assert arm.tag != cpu_target("Features\t: fp asimd\n", "aarch64").tag


def test_builds_for_two_cpus_never_share_a_cache_folder():
    xeon, zen = cpu_target(AMX_XEON, "x86_64"), cpu_target(ZEN1, "x86_64")
    assert llama_build.install_dir("cpu", cpu=xeon) != llama_build.install_dir("cpu", cpu=zen)
    assert bindings_build.wheel_dir("cpu", cpu=xeon) != bindings_build.wheel_dir("cpu", cpu=zen)
    tag = source_patches.patch_tag
    assert llama_build.install_dir("cpu", cpu=zen).name == f"0c1e57098{tag('cpu')}+rpc-cpu-avx.avx2.bmi2.f16c.fma.sse42"
    assert (
        bindings_build.wheel_dir("cpu", cpu=zen).name == f"0c1e57098{tag('cpu', True)}-cpu-avx.avx2.bmi2.f16c.fma.sse42"
    )
    assert (
        bindings_build.wheel_dir("cuda86", cpu=zen).name
        == f"0c1e57098{tag('cuda86', True)}-cuda86-avx.avx2.bmi2.f16c.fma.sse42"
    )
    assert tag("cpu", True).startswith("+24+38m+38n+38o+39f+39g+39h+39i+39j+39m+39n+39o.") and tag("cuda86", True).startswith("+24+27572+38m+38n+38o+39f+39g+39h+39i+39j+39m+39n+39o.")


def test_feature_override(monkeypatch):
    assert parse_override("avx2, FMA,avx", "x86_64").features == ("avx", "fma", "avx2")
    assert parse_override("native", "x86_64").native
    with pytest.raises(GgufExactError) as e:
        parse_override("avx2,amx_int8", "x86_64")
    assert str(e.value) == (
        f"{OVERRIDE_ENV}='avx2,amx_int8': unknown feature 'amx_int8'; use 'native' or a comma list of "
        "sse42, avx, f16c, fma, bmi2, avx2, avx_vnni, avx512, avx512_vbmi, avx512_vnni, avx512_bf16"
    )
    with pytest.raises(GgufExactError, match="need avx512"):
        parse_override("avx2,avx512_vnni", "x86_64")
    monkeypatch.setenv(OVERRIDE_ENV, "sse42,avx")
    assert host_cpu().tag == "avx.sse42" and host_cpu().source == OVERRIDE_ENV


def fake_bench(folder: Path, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "llama-bench"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return folder


def test_a_probe_that_traps_is_one_line_naming_the_features(tmp_path):
    """A binary killed by SIGILL (what the AMX build did) fails the build, saying which
    features it used and which smaller set to build instead."""
    result = build_probe.probe_server_build(fake_bench(tmp_path / "bin", "kill -ILL $$"))
    assert (result.ok, result.returncode, result.signal) == (False, -signal.SIGILL, "SIGILL")
    xeon = cpu_target(AMX_XEON, "x86_64")
    with pytest.raises(GgufExactError) as e:
        build_probe.require_ok(result, xeon, "llama.cpp 0c1e57098-cpu-x", "gguf-exact build-llama")
    assert str(e.value) == (
        "llama.cpp 0c1e57098-cpu-x: the probe (a 64-token Q4_0 prompt through llama-bench) died with SIGILL "
        "(illegal instruction: the build uses a CPU feature this machine cannot run); CPU features built in: "
        f"{xeon.describe()}; the newest feature built in is avx512_bf16; build for fewer with "
        f"`{OVERRIDE_ENV}=sse42,avx,f16c,fma,bmi2,avx2,avx_vnni,avx512,avx512_vbmi,avx512_vnni gguf-exact build-llama --force`"
    )
    failed = build_probe.probe_server_build(
        fake_bench(tmp_path / "bin2", "echo 'error: failed to load model' >&2; exit 1")
    )
    assert (failed.ok, failed.returncode, failed.signal, failed.tail) == (False, 1, "", "error: failed to load model")
    assert build_probe.probe_server_build(fake_bench(tmp_path / "bin3", "exit 0")).ok


def test_probe_model_reaches_the_quantized_matmul(tmp_path):
    from gguf import GGMLQuantizationType, GGUFReader

    path = build_probe.write_probe_model(tmp_path / "p.gguf")
    types = {t.name: t.tensor_type for t in GGUFReader(path).tensors}
    matrices = [n for n in types if n.endswith(("attn_q.weight", "ffn_up.weight", "ffn_down.weight"))]
    assert len(matrices) == 15 and all(types[n] == GGMLQuantizationType.Q4_0 for n in matrices)
    assert types["output_norm.weight"] == GGMLQuantizationType.F32


@pytest.mark.llama_server
def test_the_cpu_server_build_is_probed_and_named_by_its_features():
    binary = server_binary()
    info = json.loads((binary.parent.parent / "build-info.json").read_text())
    cpu = host_cpu()
    assert binary.parent.parent.name == f"0c1e57098{source_patches.patch_tag('cpu')}+rpc-cpu-{cpu.tag}"
    assert [r["id"] for r in info["patches"]] == ["24", *(f"23{c}" for c in "abcdefg"), "22142", "42", "42r", "38", "39", "38p", "38s", "39s", "38e", "39d", "39k", "39t", "39u", "39v", "39w", "39x", "39y", "39z", "39za", "39zb", "39zc", "39zd", "38m", "38n", "38o", "39f", "39g", "39h", "39i", "39j", "39m", "39n", "39o"]
    assert info["patches"] == source_patches.patch_record("cpu")  # the build is of these patches' bytes
    assert info["cpu_features"] == cpu.tag
    # on the CPU: no device, nothing offloaded (a GPU build's probe names its device: builds/build_probe.py)
    assert info["probe"] == {
        "what": "llama-bench", "ok": True, "returncode": 0, "signal": "",
        "device": "", "visible_devices": "", "gpu_layers": 0, "prompt_tokens": 64,
    }  # fmt: skip
    assert [a for a in info["cmake"] if a.startswith("-DGGML_")] == ["-DGGML_RPC=ON", *cpu.cmake_args()]
    # the probe passes on the installed build, not only when it was made
    assert build_probe.probe_server_build(binary.parent).ok


@pytest.mark.bindings
@pytest.mark.llama_server
def test_the_bindings_are_ours_built_like_the_server_and_probed():
    installed = bindings_build.installed_bindings()
    assert installed is not None and installed.version == "0.3.36"
    cpu = host_cpu()
    assert installed.wheel is not None and installed.wheel.parent == bindings_build.wheel_dir("cpu", cpu)
    info = installed.info
    assert (info["backend"], info["cpu_features"], info["probe"]["ok"]) == ("cpu", cpu.tag, True)
    server_info = json.loads((server_binary().parent.parent / "build-info.json").read_text())
    # the same CPU and backend options; GGML_RPC (llama-server --rpc, rpc-server) is the server's alone
    assert "-DGGML_RPC=ON" in server_info["cmake"] and "-DGGML_RPC=ON" not in info["cmake_args"]
    assert [a for a in info["cmake_args"] if a.startswith("-DGGML_")] == [
        a for a in server_info["cmake"] if a.startswith("-DGGML_") and a != "-DGGML_RPC=ON"
    ]
    assert info["sdist_sha256"] == server_info["sdist_sha256"]
    result = build_probe.probe_bindings(sys.executable)
    assert result.ok, result.tail
    # what llama.cpp itself says it was compiled with: no AMX, the features named
    probe = subprocess.run(
        [sys.executable, "-c", "import llama_cpp; print(llama_cpp.llama_print_system_info().decode())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "AMX_INT8 = 1" not in probe
    assert ("AVX2 = 1" in probe) == ("avx2" in cpu.features)


@pytest.mark.bindings
def test_cached_bindings_are_instant():
    wheel = bindings_build.build_bindings(log=lambda m: pytest.fail(f"rebuilt: {m}"))
    assert wheel.wheel == bindings_build.installed_bindings().wheel


@pytest.mark.bindings
@pytest.mark.llama_server
def test_doctor_reports_features_bindings_and_probe():
    rows = {f.name: f for f in doctor.diagnose()}
    cpu = host_cpu()
    assert rows["CPU features"].value == cpu.describe()
    b = rows["bindings"]
    assert b.ok and b.value.startswith(f"llama-cpp-python 0.3.36, backend cpu, CPU features {cpu.tag}, probe passed (")
    assert rows["--engine python"].ok
    assert f"CPU features {cpu.tag}, probe passed" in rows["llama-server (cpu)"].value


@pytest.mark.bindings
def test_gpu_profile_on_cpu_bindings_warns_in_one_line():
    from gguf_exact.engines.python.load import gpu_offload_warning
    from gguf_exact.engines.shared.engine_options import EngineOptions

    gpu = EngineOptions(n_gpu_layers=-1)
    text = gpu_offload_warning("rtx3050", "cuda86", gpu, supports_gpu=False)
    assert text == (
        "profile rtx3050 offloads layers to the GPU, but these llama-cpp-python bindings are CPU-only, so the "
        "Python engine runs on the CPU; build `gguf-exact build-bindings --cuda 86 --install`, or serve with "
        "llama-server instead"
    )
    assert gpu_offload_warning("rtx3050", "cuda86", gpu, supports_gpu=True) is None
    assert gpu_offload_warning("cpu", "cpu", EngineOptions(), supports_gpu=False) is None
    assert "build-bindings --vulkan --install" in gpu_offload_warning("g", "vulkan", gpu, supports_gpu=False)
    # Vulkan bindings that see no device: lavapipe alone, hidden by llama.cpp; a card without its driver
    from gguf_exact.builds.devices import VulkanDevice

    lavapipe = [VulkanDevice(0, "llvmpipe (LLVM 15.0.6, 256 bits)", "CPU", "llvmpipe")]
    assert gpu_offload_warning("gtx1650ti-vulkan", "vulkan", gpu, False, ["Vulkan"], lavapipe) == (
        "profile gtx1650ti-vulkan offloads layers to the GPU, but these llama-cpp-python bindings (Vulkan) see no "
        "Vulkan device, so the Python engine runs on the CPU; vulkaninfo lists GPU0 llvmpipe (LLVM 15.0.6, 256 bits) "
        "(cpu, llvmpipe): a CPU-type device, which llama.cpp hides; set GGML_VK_VISIBLE_DEVICES=0 to run on it "
        "(what serve's vulkan_devices sets; a software device: slow)"
    )
    assert gpu_offload_warning("g", "vulkan", gpu, False, ["Vulkan"], []).endswith(
        "install the GPU's Vulkan driver (vulkaninfo lists no device it can use)"
    )
    assert gpu_offload_warning("rtx3050", "cuda86", gpu, False, ["CUDA"]).endswith(
        "see no CUDA device, so the Python engine runs on the CPU; check `nvidia-smi`, or serve with llama-server"
    )


@pytest.mark.bindings
def test_load_with_a_gpu_profile_warns_here(tiny, caplog):
    from gguf_exact.engines.python.load import gpu_offload_warning, load_with_drafter
    from gguf_exact.engines.shared.engine_options import EngineOptions

    with caplog.at_level("WARNING", logger="gguf_exact.engines.python.engine"):
        llm = load_with_drafter(tiny / "target.gguf", None, profile="rtx3050", n_ctx=256)
        llm.close()
    assert [r.getMessage() for r in caplog.records] == [
        gpu_offload_warning("rtx3050", "cuda86", EngineOptions(n_gpu_layers=-1), supports_gpu=False)
    ]


def test_bindings_cuda_options_keep_values_with_spaces_whole():
    args = ["-DGGML_NATIVE=OFF", "-DCMAKE_CUDA_FLAGS=-isystem /x y/include", "-DCMAKE_EXE_LINKER_FLAGS=-Wl,-rpath,/l"]
    assert bindings_build.config_settings(args) == [
        "-C", "cmake.define.GGML_NATIVE=OFF",
        "-C", "cmake.define.CMAKE_CUDA_FLAGS=-isystem /x y/include",
        "-C", "cmake.define.CMAKE_SHARED_LINKER_FLAGS=-Wl,-rpath,/l",
    ]  # fmt: skip


def test_build_bindings_cli_rejects_bad_arch():
    from gguf_exact.cli import main

    r = CliRunner().invoke(main, ["build-bindings", "--cuda", "sm_86"])
    assert r.exit_code == 1 and "expected a CUDA architecture number" in r.output


def test_a_crash_inside_a_test_fails_that_test_only(tmp_path):
    """`make test`'s pytest options (pyproject's addopts) run tests in a worker process:
    one that dies (as llama.cpp did with SIGILL) is one failure, and the run goes on."""
    (tmp_path / "test_crash.py").write_text(
        textwrap.dedent(
            """
            import os, signal

            def test_dies_in_native_code():
                os.kill(os.getpid(), signal.SIGILL)

            def test_after_it():
                assert 1 + 1 == 2
            """
        )
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            str(REPO / "pyproject.toml"),
            "--rootdir",
            str(tmp_path),
            "-p",
            "no:cacheprovider",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "1 failed, 1 passed" in proc.stdout.strip().splitlines()[-1], out
    assert "worker 'gw0' crashed while running 'test_crash.py::test_dies_in_native_code'" in out, out

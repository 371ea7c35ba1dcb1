"""The packer's kernels compiled ahead of time (issue 25, item 6): the same bytes and counters as
numba's JIT on every path of the kernel, the same plans and errors through ``plan_rows``, loaded
only from a cache entry that matches this machine (a stale or damaged one is passed over and the
JIT is used, never imported), and built so that its wrapper releases the GIL."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gguf_exact import doctor
from gguf_exact.builds import aot_kernels
from gguf_exact.builds.aot_kernels_build import differences, pack_outputs, probe_cases, string_cases
from gguf_exact.core import bf16, kernels
from gguf_exact.core.exact import plan_rows
from gguf_exact.core.kernels import FIRST_BAD_SCALE, FIRST_NON_FINITE, N_EXACT, N_NON_FINITE, N_OFF_GRID
from gguf_exact.errors import InputError


@pytest.fixture
def cache(aot_cache, monkeypatch) -> Path:
    monkeypatch.setenv("GGUF_EXACT_CACHE", str(aot_cache))
    monkeypatch.delenv("GGUF_EXACT_KERNELS", raising=False)
    return aot_cache


@pytest.fixture
def compiled(cache):
    entry = aot_kernels.find_entry()
    assert entry.path is not None, entry.why_not
    return kernels.aot(aot_kernels.import_extension(entry.path))


@pytest.fixture
def own_entry(cache, tmp_path, monkeypatch) -> Path:
    """A writable copy of the built entry in a cache of the test's own."""
    src = aot_kernels.entry_dir(aot_kernels.cache_key())
    monkeypatch.setenv("GGUF_EXACT_CACHE", str(tmp_path / "cache"))
    dst = aot_kernels.entry_dir(aot_kernels.cache_key())
    shutil.copytree(src, dst)
    return dst


def test_both_builds_give_the_same_bytes_and_counters_on_every_case(compiled):
    jit = kernels.jit()
    assert differences(compiled, jit) == []
    cases = probe_cases()
    for name, (bits, score_partial, with_histogram) in cases.items():
        a = pack_outputs(compiled.pack_blocks, bits, score_partial, with_histogram)
        b = pack_outputs(jit.pack_blocks, bits, score_partial, with_histogram)
        assert {k: v.tobytes() for k, v in a.items()} == {k: v.tobytes() for k, v in b.items()}, name

    def run(name):
        return pack_outputs(compiled.pack_blocks, *cases[name])

    qat = run("qat")
    assert qat["counters"][N_OFF_GRID] == 0 and qat["counters"][FIRST_BAD_SCALE] == -1
    d_bits = qat["q4_0"][:, 0].astype(np.uint16) | qat["q4_0"][:, 1].astype(np.uint16) << 8
    assert (d_bits[2048:] & 0x8000).all()  # +8 blocks: a negative scale, level +8 stored as -8
    assert not (d_bits[:2048] & 0x8000).any()
    assert (qat["q4_0"][2048:, 2 + 3] & 0x0F == 0).all()  # column 3 held +8: nibble 0 (level -8 of -d)
    assert qat["histogram"].sum() == 2560 * 32 and qat["histogram"][0] > 0
    zeros = run("zeros")  # +0 and -0 blocks: d 0, every level 0, every value exact
    assert (zeros["q4_0"][:, :2] == 0).all() and (zeros["q4_0"][:, 2:] == 0x88).all()
    assert zeros["counters"][N_EXACT] == 64 * 32
    scored, skipped = run("mixed-scored"), run("mixed-skipped")
    assert scored["counters"][N_OFF_GRID] == skipped["counters"][N_OFF_GRID] == 64
    assert scored["off_blocks"].tolist() == [512, 513, 514, 515, 516] == skipped["off_blocks"].tolist()
    assert (scored["q4_0"][512:576] == 0).all()  # off-grid blocks written as zeros
    assert skipped["counters"][N_EXACT] == qat_exact_of(512)  # nothing scored after the first off block
    assert scored["counters"][N_EXACT] > skipped["counters"][N_EXACT]
    tiny = run("tiny-steps")
    assert tiny["counters"][N_OFF_GRID] == 0 and ((tiny["q4_0"][:, 1] & 0x7C) == 0).all()  # fp16 subnormal d
    assert run("huge-step")["counters"][FIRST_BAD_SCALE] == 0
    bad = run("non-finite")["counters"]
    assert (bad[N_NON_FINITE], bad[FIRST_NON_FINITE]) == (2, 5 * 32 + 7)
    walks = {name: compiled.skip_strings(*args) for name, args in string_cases().items()}
    assert walks == {"whole": sum(8 + k % 50 for k in range(300)), "cut": -1, "huge": -1}


def qat_exact_of(n_blocks: int) -> int:
    """Exact values of the first ``n_blocks`` QAT blocks (the mixed cases start with them)."""
    bits, _, _ = probe_cases()["qat"]
    out = pack_outputs(kernels.jit().pack_blocks, np.ascontiguousarray(bits[:n_blocks]), False, True)
    return int(out["counters"][N_EXACT])


def test_the_probe_fails_a_build_whose_bytes_differ(compiled):
    """The check the build runs before installing, fed a kernel that changes one byte."""

    def one_byte_off(bits, out, *rest):
        compiled.pack_blocks(bits, out, *rest)
        if out.shape[0] > 7:
            out[7, 5] ^= 1

    broken = kernels.aot(type("Broken", (), {"pack_blocks": one_byte_off, "skip_strings": compiled.skip_strings}))
    found = differences(broken)
    assert "qat: q4_0" in found and all(f.endswith(": q4_0") for f in found)
    walk_off = kernels.aot(type("Broken", (), {"pack_blocks": compiled.pack_blocks, "skip_strings": lambda *a: 0}))
    assert differences(walk_off) == ["strings whole", "strings cut", "strings huge"]


def test_plan_rows_gives_the_same_plans_and_errors_with_either_build(compiled, monkeypatch):
    rng = np.random.default_rng(7)
    values = rng.integers(-8, 8, (96, 256)).astype(np.float32) * np.float32(0.013)
    bits = bf16.from_f32(values)
    off = bits.copy()
    off[40, 64:96] = bf16.from_f32(rng.standard_normal(32).astype(np.float32))
    nan = bits.copy()
    nan[3, 9] = 0x7FC0
    plans = {}
    for build in (compiled, kernels.jit()):
        monkeypatch.setattr(kernels, "_active", build)
        with pytest.raises(InputError) as e:
            plan_rows(nan, 10)
        p, q = plan_rows(bits, 0), plan_rows(off, 0, score_partial=False)
        plans[build.kind] = (p.data.tobytes(), p.stats, p.exact_values, p.level_histogram.tolist(),
                             q.off_grid_blocks, q.first_off_grid, str(e.value))  # fmt: skip
    assert plans["aot"] == plans["jit"]
    assert plans["aot"][-1] == "1 values are NaN or Inf (first at row 13, column 9)"
    assert plans["aot"][4:6] == (1, [(40, 64, plans["aot"][5][0][2])])


def test_the_compiled_wrapper_releases_the_gil(cache):
    """pycc's wrappers hold it unless the build sets release_gil: only then does the module
    call PyEval_SaveThread (its helper C code calls PyGILState_* only)."""
    path = aot_kernels.find_entry().path
    assert b"PyEval_SaveThread" in path.read_bytes() and b"PyEval_RestoreThread" in path.read_bytes()


def test_only_a_matching_intact_entry_is_used(own_entry):
    key = aot_kernels.cache_key()
    so = aot_kernels.extension_path(own_entry, key)
    info_path = own_entry / aot_kernels.INFO_FILE
    good = aot_kernels.find_entry()
    assert good.path == so and aot_kernels.load_cached() is not None
    assert aot_kernels.describe()[0] is True

    info = json.loads(info_path.read_text())
    info["key"]["numba"] = "0.0"  # built by another numba: another key
    info_path.write_text(json.dumps(info))
    assert aot_kernels.find_entry().why_not.endswith("built for another key")
    assert aot_kernels.load_cached() is None
    info_path.write_text("{not json")
    assert "unreadable" in aot_kernels.find_entry().why_not and aot_kernels.load_cached() is None
    info["key"]["numba"] = key.numba
    info_path.write_text(json.dumps(info))
    assert aot_kernels.find_entry().path == so

    _damage(so, 4096)  # truncated: never imported (dlopen would fail or worse)
    assert (
        aot_kernels.find_entry().why_not
        == f"{so}: not the extension its build-info.json records (changed or truncated)"
    )
    assert aot_kernels.load_cached() is None
    compiled, what = aot_kernels.describe()
    assert compiled is False and what.startswith("numba JIT; no compiled kernels: ")

    shutil.rmtree(own_entry)
    assert aot_kernels.find_entry().why_not.startswith("not built for this machine")
    assert aot_kernels.load_cached() is None


def _damage(so: Path, size: int) -> None:
    """``so`` cut to ``size`` bytes as a new file: the one this process imported stays mapped
    (writing into a mapped extension would kill the process with SIGBUS)."""
    data = so.read_bytes()[:size]
    so.unlink()
    so.write_bytes(data)


def test_the_jit_setting_passes_over_a_good_entry(cache, monkeypatch):
    monkeypatch.setenv("GGUF_EXACT_KERNELS", "jit")
    assert aot_kernels.find_entry().path is not None
    assert aot_kernels.load_cached() is None
    assert aot_kernels.describe() == (False, "numba JIT (GGUF_EXACT_KERNELS=jit)")
    assert doctor.packer_kernels() == doctor.Finding("packer kernels", "numba JIT (GGUF_EXACT_KERNELS=jit)", False)
    monkeypatch.delenv("GGUF_EXACT_KERNELS")
    found = doctor.packer_kernels()
    assert found.ok and found.value.startswith(f"compiled ahead of time, {aot_kernels.find_entry().path} (built in ")


CONVERT = """
import sys
from gguf_exact.cli import main
main(sys.argv[1:], standalone_mode=False)
from gguf_exact.core import kernels
print("KERNELS", kernels.loaded().kind, "numba" in sys.modules)
"""


def _convert(tiny, out: Path, env: dict) -> tuple[str, str, bool]:
    args = ["convert", tiny / "drafter-bf16", out, "--vocab-from", tiny / "target.gguf"]
    done = subprocess.run([sys.executable, "-c", CONVERT, *map(str, args)], capture_output=True, text=True,
                          timeout=300, env=os.environ | env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    sha = next(line.split()[1] for line in done.stdout.splitlines() if line.startswith("sha256 "))
    _, kind, numba = next(line for line in done.stdout.splitlines() if line.startswith("KERNELS ")).split()
    return sha, kind, numba == "True"


def test_convert_with_a_damaged_entry_uses_the_jit_and_writes_the_same_file(tiny, own_entry, tmp_path):
    env = {"GGUF_EXACT_CACHE": os.environ["GGUF_EXACT_CACHE"]}
    with_aot = _convert(tiny, tmp_path / "aot.gguf", env)
    so = aot_kernels.extension_path(own_entry, aot_kernels.cache_key())
    _damage(so, so.stat().st_size - 1)
    with_jit = _convert(tiny, tmp_path / "jit.gguf", env)
    assert with_aot[1:] == ("aot", False) and with_jit[1:] == ("jit", True)
    assert with_aot[0] == with_jit[0]
    assert (tmp_path / "aot.gguf").read_bytes() == (tmp_path / "jit.gguf").read_bytes()


def test_the_compile_target_is_the_x86_64_level_the_features_reach():
    from gguf_exact.builds.aot_kernels_build import llvm_cpu
    from gguf_exact.builds.cpu_features import cpu_target

    def level(flags: str, arch: str = "x86_64") -> str:
        return llvm_cpu(cpu_target(f"flags\t\t: {flags}\n", arch))

    v3 = "sse4_2 avx f16c fma bmi2 avx2"
    assert level(v3) == "x86-64-v3"  # this machine's (Zen 1)
    assert level(v3 + " avx512f avx512cd avx512vl avx512dq avx512bw amx_tile") == "x86-64-v4"
    assert level("sse4_2 avx") == "x86-64-v2"  # AVX without AVX2 and FMA: not v3
    assert level("sse2") == "x86-64"
    assert level("fp asimd", "aarch64") == "host"  # features not named: keyed by their digest


def _compiled_ir(dispatcher, *args) -> str:
    """The LLVM IR numba makes of ``dispatcher`` for ``args``, compiled afresh (a cached one
    carries no IR) with the dispatcher's own options."""
    import numba

    options = {k: v for k, v in dispatcher.targetoptions.items() if k != "nopython"} | {"cache": False}
    fresh = numba.njit(**options)(dispatcher.py_func)
    fresh(*args)
    return next(iter(fresh.inspect_llvm().values()))


def test_the_packers_loop_calls_neither_the_runtime_nor_a_helper_per_block():
    """What made the kernel 1.76x faster (docs/benchmarks.md, 2026-12-02), held in the code the
    JIT compiles: the loop over blocks takes and drops no reference counts (``NRT_incref``,
    ``NRT_decref``) and calls no per-block helper (the grid fit and scale choice are inlined);
    pack_blocks, which allocates its scratch, does make runtime calls, so the check sees them."""
    from gguf_exact.core.exact_kernel import each_block, pack_blocks

    bits = np.zeros((4, 32), np.uint16)
    outputs = (np.zeros((4, 18), np.uint8), np.zeros(kernels.N_COUNTERS, np.int64), np.zeros(2),
               np.zeros(16, np.int64), np.zeros(5, np.int64), np.zeros(5, np.float32))  # fmt: skip
    x, p, e = (np.zeros(32, np.float32) for _ in range(3))
    scratch = (x, x.view(np.uint32), np.zeros(32, np.float32), p, p.view(np.uint32), e, np.zeros(32, np.int8),
               np.zeros(32, np.uint16))  # fmt: skip
    loop = _compiled_ir(each_block, bits, bits.reshape(-1), outputs, scratch, False, False, kernels.GCD_BY_LEVEL_SET)
    calls = {
        line.split("@")[1].split("(")[0].strip('"') for line in loop.splitlines() if " call " in line and "@" in line
    }
    assert not [c for c in calls if "NRT_" in c]
    assert not [
        c for c in calls if any(h in c for h in ("fit_block", "choose_block_scale", "count_exact", "max_error"))
    ]
    assert "fit_block" in each_block.py_func.__code__.co_names  # it does use them: inlined, not absent
    outer = _compiled_ir(pack_blocks, bits, *outputs, False, False, kernels.GCD_BY_LEVEL_SET)
    assert "NRT_decref" in outer

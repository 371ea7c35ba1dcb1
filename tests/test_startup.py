"""What a command loads before it works (issue 25, item 6): each command's group module is
imported when that command runs, `convert` loads none of what `serve`, `fetch`,
`bench` or the bf16 safetensors reader need, and with the kernels compiled ahead of time
(`gguf-exact build-kernels`) not numba either. The time itself is measured by
`scripts/bench_convert.py` (`make bench`), not here."""

import hashlib
import os
import subprocess
import sys

from gguf_exact.cli import COMMANDS, load_groups

# What `convert` has no use for; each was imported by it before (ml_dtypes alone took
# 1.35 s at version 0.7.0).
NOT_FOR_CONVERT = (
    "ml_dtypes",  # only a BF16 tensor read through safetensors needs it
    "huggingface_hub",
    "gguf_exact.hub.fetch",
    "gguf_exact.engines.shared.settings",
    "gguf_exact.engines.shared.profiles",
    "gguf_exact.builds.llama_build",
    "gguf_exact.cli.serving",
    "gguf_exact.cli.hub",
    "gguf_exact.cli.inprocess",
    "rich.table",  # no table printed, no progress bar off a terminal
    "rich.progress",
    "multiprocessing",  # the chunk pool's process workers: `convert` writes on threads
    "subprocess",  # ctypes.util.find_library ran ldconfig to find glibc's mallopt (malloc_tuning)
)

CONVERT_AND_LIST_MODULES = """
import sys
from gguf_exact.cli import main
main(sys.argv[1:], standalone_mode=False)
print("MODULES", *sorted(sys.modules))
"""


def test_every_command_is_in_the_table_under_its_module():
    commands = load_groups()
    assert {name: c.callback.__module__ for name, c in commands.items()} == {
        name: f"gguf_exact.cli.{module}" for name, module in COMMANDS.items()
    }


def _convert_modules(tiny, out, env: dict) -> set[str]:
    args = ["convert", tiny / "drafter-bf16", out, "--vocab-from", tiny / "target.gguf"]
    proc = subprocess.run(
        [sys.executable, "-c", CONVERT_AND_LIST_MODULES, *map(str, args)],
        capture_output=True, text=True, timeout=300, env=os.environ | env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    printed_sha = next(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("sha256 "))
    assert hashlib.sha256(out.read_bytes()).hexdigest() == printed_sha
    return set(next(line for line in proc.stdout.splitlines() if line.startswith("MODULES ")).split()[1:])


def test_convert_loads_only_what_it_uses(tiny, tmp_path):
    modules = _convert_modules(tiny, tmp_path / "drafter.gguf", {"GGUF_EXACT_KERNELS": "jit"})
    assert "gguf_exact.cli.files" in modules and "numba" in modules  # it did load what it runs
    assert [m for m in NOT_FOR_CONVERT if m in modules] == []


def test_with_the_kernels_compiled_ahead_of_time_convert_never_imports_numba(tiny, tmp_path, aot_cache):
    env = {"GGUF_EXACT_CACHE": str(aot_cache), "GGUF_EXACT_KERNELS": "auto"}
    modules = _convert_modules(tiny, tmp_path / "aot.gguf", env)
    assert "gguf_exact.core.exact" in modules and "gguf_exact.builds.aot_kernels" in modules
    assert [m for m in modules if m.split(".")[0] in ("numba", "llvmlite")] == []
    assert "gguf_exact.builds.aot_kernels_build" not in modules  # the build's module (and numba.pycc) stays out
    assert [m for m in NOT_FOR_CONVERT if m in modules] == []
    _convert_modules(tiny, tmp_path / "jit.gguf", {"GGUF_EXACT_KERNELS": "jit"})
    assert (tmp_path / "aot.gguf").read_bytes() == (tmp_path / "jit.gguf").read_bytes()


# The executable (gguf_exact.cli.run) with os._exit reporting the collector's state first.
RUN_AND_REPORT_GC = """
import gc, os, sys
from gguf_exact.cli import app
before, real_exit = sum(s["collections"] for s in gc.get_stats()), os._exit
def report(code):
    after = sum(s["collections"] for s in gc.get_stats())
    print("GC", gc.isenabled(), after - before, flush=True)
    real_exit(code)
os._exit = report
sys.argv = ["gguf-exact", *sys.argv[1:]]
app.run()
"""


def _gc_after(args) -> tuple[str, str, int]:
    proc = subprocess.run(
        [sys.executable, "-c", RUN_AND_REPORT_GC, *map(str, args)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    _, enabled, collections = next(line for line in proc.stdout.splitlines() if line.startswith("GC ")).split()
    return proc.stdout, enabled, int(collections)


def test_the_executable_converts_without_the_cyclic_gc_and_turns_it_on_for_the_rest(tiny, tmp_path):
    """`convert` (one of app.WITHOUT_CYCLIC_GC) runs with the collector off, never
    collecting, and writes what it writes with it on; any other command turns it on."""
    out = tmp_path / "drafter.gguf"
    stdout, enabled, collections = _gc_after(
        ["convert", tiny / "drafter-bf16", out, "--vocab-from", tiny / "target.gguf"]
    )
    assert (enabled, collections) == ("False", 0)
    printed_sha = next(line.split()[1] for line in stdout.splitlines() if line.startswith("sha256 "))
    assert hashlib.sha256(out.read_bytes()).hexdigest() == printed_sha
    with_gc = tmp_path / "with-gc.gguf"
    done = subprocess.run(
        [sys.executable, "-c", CONVERT_AND_LIST_MODULES, "convert", str(tiny / "drafter-bf16"), str(with_gc),
         "--vocab-from", str(tiny / "target.gguf")], capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert with_gc.read_bytes() == out.read_bytes()
    assert _gc_after(["recipes"])[1] == "True"

"""Same inputs, same bytes: a fixed conversion and a fixed re-pack have pinned sha256s, whatever
numba's thread count, its CPU target (forced generic: no AVX2/FMA code paths) and the
writer's worker count, each in a fresh process (numba compiles, or loads its cache, anew),
and with the kernels compiled ahead of time instead (``builds.aot_kernels``, no numba loaded)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gguf_exact.tiny.main_model import TINY, write_donor, write_main_checkpoint
from gguf_exact.tiny.models import drafter_config, drafter_tensors, write_checkpoint, write_tiny_target

# The tiny drafter (seed 1, fp32 steps) without its ordered-embedding head (use_ordered_embeddings
# false, no masked_embedding.*), converted with the tiny target's vocabulary; the tiny E2B-structured
# main model (seed 0) re-packed from its Google-style donor.
CONVERT_SHA256 = "037f5aadfe6fcd2bb9f22781ae82e53f9b46095305a0c91356dcd1e50b82899e"
REPACK_SHA256 = "58dc8d7be5817055d528ea7d5acb533b8ce80e8a25ae3c58fa2ca676678c8e73"

SCRIPT = """
import sys
from pathlib import Path
from gguf_exact.drafter.convert import convert_drafter
from gguf_exact.repack.pipeline import repack_model
root, out, workers = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
a = convert_drafter(root / "drafter", out / "drafter.gguf", root / "target.gguf", workers=workers)
b = repack_model(root / "donor.gguf", root / "main", out / "main.gguf", workers=workers)
from gguf_exact.core import kernels
print(a.sha256, b.sha256, kernels.loaded().kind, "numba" in sys.modules)
"""


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("same-bytes")
    write_tiny_target(root / "target.gguf", seed=0)
    config = drafter_config() | {"use_ordered_embeddings": False}
    tensors = {
        k: v for k, v in drafter_tensors(seed=1, step_kind="fp32").items() if not k.startswith("masked_embedding.")
    }
    write_checkpoint(root / "drafter", config, tensors)
    write_main_checkpoint(root / "main", TINY, seed=0)
    write_donor(root / "donor.gguf", root / "main", TINY)
    return root


@pytest.mark.parametrize(
    "numba_env, workers",
    [
        ({"NUMBA_NUM_THREADS": "1"}, 1),
        ({"NUMBA_NUM_THREADS": "2"}, 2),
        ({"NUMBA_CPU_NAME": "generic", "NUMBA_NUM_THREADS": "1"}, 2),
    ],
    ids=["numba-1-thread", "numba-2-threads", "numba-generic-cpu"],
)
def test_pinned_sha256_whatever_numba_does(inputs, tmp_path, numba_env, workers):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")} | numba_env
    assert _shas(inputs, tmp_path, workers, env | {"GGUF_EXACT_KERNELS": "jit"}) == ["jit", "True"]


@pytest.mark.parametrize("workers", [1, 2])
def test_pinned_sha256_with_the_kernels_compiled_ahead_of_time(inputs, tmp_path, aot_cache, workers):
    env = os.environ | {"GGUF_EXACT_CACHE": str(aot_cache), "GGUF_EXACT_KERNELS": "auto"}
    assert _shas(inputs, tmp_path, workers, env) == ["aot", "False"]


def _shas(inputs: Path, out: Path, workers: int, env: dict) -> list[str]:
    """Convert and re-pack in a fresh process; the pinned hashes checked, the kernels' kind returned."""
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(inputs), str(out), str(workers)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    words = done.stdout.split()
    assert words[:2] == [CONVERT_SHA256, REPACK_SHA256]
    return words[2:]

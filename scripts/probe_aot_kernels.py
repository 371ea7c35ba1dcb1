#!/usr/bin/env python3
"""Probe: the packer's kernel compiled ahead of time, loaded without numba (issue 25, item 6).

`convert` loads numba and its cached kernels in every process (`scripts/bench_convert.py`'s
"numpy, numba, 2 kernels" row): on this 2-core machine that alone takes about what
llama-quantize's whole run does. This script measures what a kernel loaded without numba
would change, without changing the package: it compiles `core.exact.pack_blocks` (and the
vocabulary walk) with numba's ahead-of-time compiler (`numba.pycc`, pending deprecation
since numba 0.57) for this CPU into a temp folder, then, in fresh processes, times importing
that extension against loading numba's cached kernels, and packs every matrix of the E2B
drafter at its real shapes with both, comparing the Q4_0 bytes, the counters and the sums.
Not a test: nothing asserts. The compiled wrapper holds the GIL (pycc has no nogil), so two
cores would need forked workers (`stream.chunk_pool`'s process kind).

    python scripts/probe_aot_kernels.py [--rounds 3]
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUILD = """
import sys, warnings
warnings.simplefilter("ignore")
from numba.pycc import CC
from gguf_exact.core.exact import pack_blocks
from gguf_exact.formats.string_walk import skip_strings
cc = CC("exact_aot")
cc.output_dir, cc.target_cpu = sys.argv[1], "host"
cc.export("skip_strings", "i8(u1[::1], i8, i8)")(skip_strings.py_func)
cc.export("pack_blocks", "void(u2[:, ::1], u1[:, ::1], i8[::1], f8[::1], i8[::1], i8[::1], f4[::1], b1, b1, i4[::1])")(
    pack_blocks.py_func
)
cc.compile()
"""

LOAD_AOT = """
import gc, sys
gc.disable()
import numpy as np
sys.path.insert(0, sys.argv[1])
import exact_aot
assert "numba" not in sys.modules
"""

LOAD_NUMBA = """
import gc
gc.disable()
import numpy as np
from gguf_exact.core.exact import plan_rows
from gguf_exact.formats.string_walk import skip
skip(bytes(16), 0, 1)
plan_rows(np.zeros((1, 32), np.uint16), 0, histogram=False, score_partial=False)
"""


def pack(fn, bits, gcd):
    import numpy as np

    blocks = np.ascontiguousarray(bits, dtype=np.uint16).reshape(-1, 32)
    n = blocks.shape[0]
    out, counters, sq = np.empty((n, 18), np.uint8), np.empty(6, np.int64), np.empty(2, np.float64)
    fn(
        blocks,
        out,
        counters,
        sq,
        np.empty(16, np.int64),
        np.empty(5, np.int64),
        np.empty(5, np.float32),
        False,
        False,
        gcd,
    )
    return out, counters, sq


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="probe-aot-") as tmp:
        root = Path(tmp)
        tick = time.perf_counter()
        subprocess.run([sys.executable, "-c", BUILD, str(root / "aot")], check=True)
        print(f"compiled ahead of time in {time.perf_counter() - tick:.1f} s")
        times: dict[str, list[float]] = {"aot": [], "numba": []}
        for _ in range(args.rounds):
            for who, code in (("aot", LOAD_AOT), ("numba", LOAD_NUMBA), ("numba", LOAD_NUMBA), ("aot", LOAD_AOT)):
                tick = time.perf_counter()
                subprocess.run([sys.executable, "-c", code, str(root / "aot")], check=True)
                times[who].append(time.perf_counter() - tick)
        for who, label in (
            ("aot", "numpy + the compiled extension"),
            ("numba", "numpy + numba + its 2 cached kernels"),
        ):
            secs = times[who]
            print(f"whole process, {label}: {statistics.median(secs):.2f} s ({min(secs):.2f}-{max(secs):.2f})")

        from gguf_exact.core import bf16
        from gguf_exact.core.exact import pack_blocks
        from gguf_exact.core.grid import GCD_BY_LEVEL_SET
        from gguf_exact.tiny.peers import e2b_drafter_checkpoint

        sys.path.insert(0, str(root / "aot"))
        import exact_aot
        import numpy as np

        from gguf_exact.formats.checkpoint import Checkpoint

        e2b_drafter_checkpoint(root / "drafter-hf", vocab_size=262144)
        with Checkpoint(root / "drafter-hf") as ckpt:
            names = [n for n, t in ckpt.tensors.items() if len(t.shape) == 2 and "masked" not in n]
            matrices = [bf16.from_exact(ckpt.read(n)) for n in names]
        seconds = {"numba": 0.0, "aot": 0.0}
        same = 0
        for bits in matrices:
            outs = {}
            for who, fn in (("numba", pack_blocks), ("aot", exact_aot.pack_blocks)):
                tick = time.perf_counter()
                outs[who] = pack(fn, bits, GCD_BY_LEVEL_SET)
                seconds[who] += time.perf_counter() - tick
            same += all(np.array_equal(a, b) for a, b in zip(outs["numba"], outs["aot"]))
        values = sum(m.size for m in matrices)
        print(
            f"{same} of {len(matrices)} matrices ({values:,} values) packed to the same bytes, counters and sums; "
            f"1 thread: numba {values / seconds['numba'] / 1e6:.1f} M values/s, "
            f"ahead of time {values / seconds['aot'] / 1e6:.1f}"
        )


if __name__ == "__main__":
    main()

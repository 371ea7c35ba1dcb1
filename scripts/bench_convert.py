#!/usr/bin/env python3
"""Benchmark: `gguf-exact convert` against `llama-quantize --pure Q4_0`, whole process
against whole process, on the E2B drafter at its real shapes with a Gemma-4-size
vocabulary; `gguf-exact verify` of the converted file beside `convert` (its bar: under
1.5x convert's time); then the packer's kernel alone on 1 and 2 cores.

Inputs, made once in a temp folder:
- the E2B assistant as a QAT checkpoint (gemma4/sizes.py shapes: 77.2 million matrix
  values, fp32 training steps);
- the E2B target's header and tensor table (its data a hole: tiny/peers.py) carrying a
  262,144-token vocabulary (tiny/vocab.py), which `convert --vocab-from` copies, in
  both forms the issue names: without merges, and with 500,000 (each form one table);
- the same drafter as llama.cpp's converter writes it with `--outtype bf16` (same keys
  and vocabulary): what llama-quantize starts from.

Each round runs the commands in A B C D D C B A order: `gguf-exact convert SRC OUT --vocab-from
TARGET` (reads safetensors, packs, writes, reads back and verifies, sha256), `gguf-exact
verify OUT --source SRC --vocab-from TARGET` (replans every block, judges every key and
tensor, sha256), `llama-quantize --pure BF16.gguf OUT Q4_0 2`, and two Python processes that
only load what every `convert` must before its first value is packed, and exit: the part of
`convert`'s start-up a C++ tool does not have, once with numba's JIT kernels (numpy, numba, the
packer's two kernels from numba's cache) and once with the same kernels compiled ahead of time
(numpy and the cached extension, `gguf-exact build-kernels`; that row is left out where it is
not built). The `convert` and `verify` runs use what this machine has (printed first: `doctor`'s
"packer kernels" line); the packer alone is timed with each build on 1 and 2 threads.
Peak RSS is GNU time's %M (each tool is one process). Bit-exact shares: ours from convert's report, llama-quantize's measured
against the source (gguf_exact.drafter.verify, measured only). Not a test: nothing asserts.

    python scripts/bench_convert.py [--rounds 2] [--vocab 262144] [--merges 0,500000] [--no-peer]
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from measure import load, run  # noqa: E402

from gguf_exact.tiny.vocab import GEMMA4_MERGES, GEMMA4_VOCAB  # noqa: E402

# What `convert` loads before it packs (the executable runs it without the cyclic GC): numpy, the
# packer's wrapper and its two kernels (the vocabulary walk, the packer), each called once, from
# the build argv[1] names: "jit" (numba, its cache hit) or "aot" (the cached extension).
KERNELS_LOADED = """
import gc, sys
gc.disable()
import numpy as np
from gguf_exact.core import kernels
from gguf_exact.core.exact import plan_rows
kernels.active().skip_strings(np.zeros(16, np.uint8), 0, 1)
plan_rows(np.zeros((1, 32), np.uint16), 0, histogram=False, score_partial=False)
assert kernels.active().kind == sys.argv[1] and ("numba" in sys.modules) == (sys.argv[1] == "jit"), sys.argv[1]
"""


def make_inputs(root: Path, vocab: int, merges: int) -> dict[str, Path]:
    from gguf import GGMLQuantizationType

    from gguf_exact.tiny.peers import e2b_drafter_checkpoint, float_drafter_gguf, vocab_target
    from gguf_exact.tiny.vocab import gemma4_vocabulary

    tick = time.perf_counter()
    paths = {"source": root / "drafter-hf", "target": root / "target.gguf", "bf16": root / "drafter-bf16.gguf"}
    e2b_drafter_checkpoint(paths["source"], vocab_size=vocab)
    vocab_target(paths["target"], gemma4_vocabulary(vocab, merges), "E2B")
    float_drafter_gguf(paths["source"], paths["target"], paths["bf16"], GGMLQuantizationType.BF16)
    print(f"inputs made in {time.perf_counter() - tick:.0f} s in {root}", file=sys.stderr)
    return paths


def find_llama_quantize(explicit: str | None) -> Path | None:
    if explicit:
        return Path(explicit)
    from gguf_exact.builds.llama_build import find_build

    build = find_build("cpu")
    return build.binary("llama-quantize") if build else None


def load_matrices(source: Path) -> list:
    from gguf_exact.formats.checkpoint import Checkpoint

    with Checkpoint(source) as ckpt:
        return [ckpt.read(n) for n, t in ckpt.tensors.items() if len(t.shape) == 2 and "masked" not in n]


def published_method(matrices: list) -> tuple[float, float]:
    """The published method (core/published.py, re-implemented in numpy) on the same
    matrices in memory: (M values/s, bit-exact share)."""
    from gguf_exact.core import bf16, q4_0
    from gguf_exact.core.published import published_q4_0

    values = sum(m.size for m in matrices)
    start = time.perf_counter()
    packed = [published_q4_0(m)[0] for m in matrices]
    seconds = time.perf_counter() - start
    exact = sum(
        int(bf16.same_value(bf16.from_f32(q4_0.dequantize(p)).reshape(m.shape), m).sum())
        for p, m in zip(packed, matrices)
    )
    return values / seconds / 1e6, exact / values


def kernel_rates(matrices: list) -> dict[str, dict[int, float]]:
    """M values/s of the packer alone (plan_matrix over every matrix, in memory) on 1 and
    2 threads, after one warm-up, the best of three; with numba's JIT kernels, and with
    the compiled ones where they are built (their wrapper releases the GIL too, or two
    threads would run at one core's speed)."""
    from gguf_exact.builds.aot_kernels import find_entry, import_extension
    from gguf_exact.core import kernels
    from gguf_exact.core.exact import plan_matrix

    entry = find_entry()
    builds = {"jit": None} | ({"aot": import_extension(entry.path)} if entry.path else {})
    values = sum(m.size for m in matrices)
    rates: dict[str, dict[int, float]] = {}
    for kind, module in builds.items():
        kernels.set_provider(lambda module=module: module)
        plan_matrix(matrices[1])
        assert kernels.active().kind == kind
        rates[kind] = {}
        for workers in (1, 2):

            def pack_all(workers: int = workers) -> None:
                for m in matrices:
                    plan_matrix(m, keep_data=False, workers=workers)

            rates[kind][workers] = values / min(_timed(pack_all) for _ in range(3)) / 1e6
    return rates


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_form(args, quantize: Path | None, merges: int, kernel: bool, compiled_built: bool) -> None:
    """One vocabulary form: inputs made, the commands timed, the table printed; with
    ``kernel`` also the packer alone and the published method (the same matrices in
    every form)."""
    gguf_exact = Path(sys.executable).with_name("gguf-exact")
    root = Path(tempfile.mkdtemp(prefix="bench-convert-", dir=args.dir))
    try:
        paths = make_inputs(root, args.vocab, merges)
        report = root / "report.json"
        ours_cmd = [str(gguf_exact), "convert", str(paths["source"]), str(root / "ours.gguf"), "--vocab-from", str(paths["target"]), "--report", str(report)]  # fmt: skip
        peer_cmd = [str(quantize), "--pure", str(paths["bf16"]), str(root / "peer.gguf"), "Q4_0", "2"]
        verify_cmd = [str(gguf_exact), "verify", str(root / "ours.gguf"), "--source", str(paths["source"]), "--vocab-from", str(paths["target"])]  # fmt: skip
        again = root / "again.gguf"  # later converts write here: verify reads the warm-up's file, the same bytes
        commands = {
            "ours": [*ours_cmd[:3], str(again), *ours_cmd[4:]],
            "verify": verify_cmd,
            "peer": peer_cmd,
            "kernels": [sys.executable, "-c", KERNELS_LOADED, "jit"],
            "compiled": [sys.executable, "-c", KERNELS_LOADED, "aot"],
        }
        envs = {"kernels": os.environ | {"GGUF_EXACT_KERNELS": "jit"}}
        loaders = ("kernels", "compiled") if compiled_built else ("kernels",)
        half = ("ours", "verify", *loaders) if quantize is None else ("ours", "peer", "verify", *loaders)
        order = (*half, *reversed(half))
        runs: dict[str, list] = {"ours": [], "peer": [], "verify": [], "kernels": [], "compiled": []}
        run(ours_cmd)  # warm-up: numba's cache, the page cache
        run(verify_cmd)
        if quantize is not None:
            run(peer_cmd)
        for _ in range(args.rounds):
            for who in order:
                {"ours": again, "peer": root / "peer.gguf"}.get(who, root / "none").unlink(missing_ok=True)
                m = run(commands[who], envs.get(who))
                if m.returncode != 0:
                    sys.exit(f"{who} failed: {m.stderr[-2000:]}")
                runs[who].append(m)
        figures = json.loads(report.read_text())
        values = figures["values"]
        matrix_values = sum(t["values"] for t in figures["tensors"] if t["type"] == "Q4_0")
        from gguf_exact.drafter.verify import verify_gguf

        peer_exact = None
        if quantize is not None:
            peer_checks = verify_gguf(root / "peer.gguf", paths["source"], judge=False).tensors
            peer_q4 = [t for t in peer_checks if t.type == "Q4_0"]
            peer_exact = sum(t.exact for t in peer_q4) / sum(t.n_values for t in peer_q4)
        ours_exact = sum(t["exact_values"] for t in figures["tensors"] if t["type"] == "Q4_0") / matrix_values
        if kernel:
            matrices = load_matrices(paths["source"])
            rates = kernel_rates(matrices)
            published = published_method(matrices)
            del matrices
        sizes = {w: (root / f"{w}.gguf").stat().st_size for w in ("ours", "peer") if (root / f"{w}.gguf").exists()}
        verdict = runs["verify"][-1].stdout.strip().splitlines()[-1]
    finally:
        shutil.rmtree(root, ignore_errors=True)

    print(f"\nE2B drafter, full shapes, {args.vocab:,}-token vocabulary and {merges:,} merges; "
          f"{matrix_values:,} matrix values ({values:,} with norms); {args.rounds} rounds {' '.join(order)}; {load()} at the end")  # fmt: skip
    print(
        f"{'whole process':42} {'seconds (median, range)':>26} {'M values/s':>11} {'peak RSS MiB':>13} {'bit-exact':>10} {'bytes':>12}"
    )
    rows = {}
    for who, label, exact in (
        ("ours", "gguf-exact convert (verify + sha256 on)", ours_exact),
        ("verify", "gguf-exact verify (--vocab-from)", None),
        ("peer", "llama-quantize --pure Q4_0 (from BF16)", peer_exact),
        ("kernels", "python: numpy, numba, 2 kernels (no work)", None),
        ("compiled", "python: numpy, 2 compiled kernels (no work)", None),
    ):
        if not runs[who]:
            continue
        secs = [m.seconds for m in runs[who]]
        med = statistics.median(secs)
        rows[who] = med
        rss = max(m.peak_mib for m in runs[who])
        share = f"{exact:>10.4%}" if exact is not None else f"{'-':>10}"
        size = f"{sizes[who]:>12,}" if who in sizes else f"{'-':>12}"
        rate = f"{matrix_values / med / 1e6:>11.1f}" if who not in ("kernels", "compiled") else f"{'-':>11}"
        print(f"{label:42} {med:>8.2f} ({min(secs):.2f}-{max(secs):.2f}){'':>7} {rate} {rss:>13.0f} {share} {size}")
    print(
        f"verify / convert: {rows['verify'] / rows['ours']:.2f}x the time (bar: under 1.5x); verify's verdict: {verdict}"
    )
    if "peer" in rows:
        print(
            f"gguf-exact / llama-quantize: {rows['peer'] / rows['ours']:.2f}x the values/s end to end "
            f"({merges:,} merges; bar: 1.0x); peak RSS {max(m.peak_mib for m in runs['ours']):.0f} vs "
            f"{max(m.peak_mib for m in runs['peer']):.0f} MiB"
        )
        for who, what in (
            ("kernels", "numpy, numba and the 2 kernels"),
            ("compiled", "numpy and the 2 compiled kernels"),
        ):
            if who in rows:
                print(
                    f"loading {what} alone: {rows[who]:.2f} s, {rows[who] / rows['peer']:.2f}x "
                    f"llama-quantize's whole run ({rows[who] / rows['ours']:.2f}x convert's)"
                )
    if kernel:
        for kind, label in (("jit", "numba's JIT"), ("aot", "compiled ahead of time")):
            if kind in rates:
                r = rates[kind]
                print(
                    f"packer kernel alone (in memory), {label}: {r[1]:.1f} M values/s on 1 core, {r[2]:.1f} on 2 "
                    f"({r[2] / r[1]:.2f}x)"
                )
        print(
            f"published method, re-implemented (in memory, 1 core): {published[0]:.1f} M values/s, "
            f"{published[1]:.4%} bit-exact; the packer (JIT) on 1 core is {rates['jit'][1] / published[0]:.1f}x its speed"
        )
    print(f"convert's own timing (last run): {figures['seconds']}; sha256 of its file: {figures['sha256']}")


def compile_bytecode() -> None:
    """The package's modules compiled to bytecode first, as pip does when it installs a
    wheel: a checkout run with PYTHONDONTWRITEBYTECODE=1 would otherwise compile about 40
    modules from source in every `convert` (0.04-0.1 s here), which no installed copy does."""
    import compileall

    import gguf_exact

    compileall.compile_dir(str(Path(gguf_exact.__file__).parent), quiet=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of A B B A")
    parser.add_argument("--vocab", type=int, default=GEMMA4_VOCAB, help="vocabulary size (token_embd rows)")
    parser.add_argument(
        "--merges",
        default=f"0,{GEMMA4_MERGES}",
        help="the vocabulary forms, comma-separated merge counts (default: none, and Gemma 4's 500,000)",
    )
    parser.add_argument("--llama-quantize", help="path to llama-quantize (default: the gguf-exact build cache)")
    parser.add_argument("--dir", type=Path, help="where to make the inputs (default: a temp folder)")
    parser.add_argument("--no-peer", action="store_true", help="convert and verify only, without llama-quantize")
    args = parser.parse_args()

    quantize = None if args.no_peer else find_llama_quantize(args.llama_quantize)
    if not args.no_peer and (quantize is None or not quantize.exists()):
        sys.exit("llama-quantize not found: run `gguf-exact build-llama` (or pass --llama-quantize, or --no-peer)")
    compile_bytecode()
    from gguf_exact.builds.aot_kernels import describe

    compiled_built, what = describe()
    print(f"packer kernels of convert and verify: {what}")
    forms = [int(m) for m in args.merges.split(",")]
    for i, merges in enumerate(forms):
        bench_form(args, quantize, merges, kernel=i == len(forms) - 1, compiled_built=compiled_built)


if __name__ == "__main__":
    main()

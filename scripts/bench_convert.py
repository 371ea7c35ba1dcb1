#!/usr/bin/env python3
"""Benchmark: the exact Q4_0 packer against the published method and llama-quantize.

All on one synthetic QAT tensor set shaped like the E2B drafter (scaled with --scale):
bf16 values on the Q4_0 grid with fp32 training steps. Each method runs in its own
child process; "peak RSS" is what the method adds to the peak beyond its input tensors
(for llama-quantize, its whole process). The figures and ratios print at the end.
Not a test: nothing here asserts.

    python scripts/bench_convert.py [--scale 1.0] [--llama-quantize PATH]
"""

import argparse
import multiprocessing as mp
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from gguf_exact.core import bf16, q4_0
from gguf_exact.tiny.synthetic import qat_matrix

E2B_DRAFTER = [  # (name, rows, cols) of the E2B assistant's matrices
    ("token_embd.weight", 262144, 256),
    ("nextn.pre_projection.weight", 256, 3072),
    ("nextn.post_projection.weight", 1536, 256),
] + [
    (f"blk.{i}.{n}.weight", r, c)
    for i in range(4)
    for n, r, c in (
        ("attn_q", 2048 if i == 3 else 1024, 256),
        ("attn_output", 256, 2048 if i == 3 else 1024),
        ("ffn_gate", 2048, 256),
        ("ffn_up", 2048, 256),
        ("ffn_down", 256, 2048),
    )
]


def tensor_set(scale: float, seed: int = 0) -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for name, rows, cols in E2B_DRAFTER:
        rows = max(32, int(rows * scale) // 32 * 32) if name == "token_embd.weight" else rows
        out.append((name, qat_matrix(rng, rows, cols, step_kind="fp32", plus8_fraction=0.0)))
    return out


def save_tensor_set(scale: float, folder: Path) -> None:
    for name, bits in tensor_set(scale):
        np.save(folder / f"{name}.npy", bits)


def load_tensor_set(folder: Path) -> list[tuple[str, np.ndarray]]:
    """The saved set, memory-mapped: a method's RSS then counts only the pages it reads."""
    return [(name, np.load(folder / f"{name}.npy", mmap_mode="r")) for name, _, _ in E2B_DRAFTER]


def exact_fraction(decoded_blocks: np.ndarray, bits: np.ndarray) -> float:
    return float(bf16.same_value(bf16.from_f32(decoded_blocks.reshape(bits.shape)), bits).mean())


def run_exact(folder, queue):
    from gguf_exact.core.exact import plan_matrix
    from gguf_exact.malloc_tuning import keep_heap_blocks

    keep_heap_blocks()  # as convert_drafter does
    start = time.perf_counter()
    plan_matrix(np.zeros((1, 32), np.uint16))  # numba: compile, or load the cached machine code
    print(f"exact packer: {time.perf_counter() - start:.2f} s to compile or load its kernels (once per process)")
    tensors = load_tensor_set(folder)
    base_rss = peak_rss_mib()
    start = time.perf_counter()
    exact = values = 0
    for _, bits in tensors:
        plan = plan_matrix(bits)
        exact += plan.exact_values
        values += bits.size
    seconds = time.perf_counter() - start
    queue.put(("exact (gguf-exact)", values, seconds, exact / values, peak_rss_mib() - base_rss))


def run_published(folder, queue):
    from gguf_exact.core.published import published_q4_0

    tensors = load_tensor_set(folder)
    base_rss = peak_rss_mib()
    start = time.perf_counter()
    outputs = [(bits, published_q4_0(bits)[0]) for _, bits in tensors]
    seconds = time.perf_counter() - start
    values = sum(b.size for b, _ in outputs)
    exact = sum(exact_fraction(q4_0.dequantize(o), b) * b.size for b, o in outputs)
    queue.put(("published method", values, seconds, exact / values, peak_rss_mib() - base_rss))


def peak_rss_mib() -> float:
    """This process image's peak RSS (VmHWM). Not ru_maxrss: a spawned child inherits its
    parent's figure there."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(fn, folder):
    """Run ``fn`` in a fresh process (spawn: no memory inherited) for its own peak RSS."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=fn, args=(folder, queue))
    proc.start()
    result = queue.get()
    proc.join()
    return result


def find_llama_quantize(explicit: str | None) -> Path | None:
    if explicit:
        return Path(explicit)
    found = shutil.which("llama-quantize")
    if found:
        return Path(found)
    cached = sorted(Path.home().glob(".cache/gguf-exact/llama.cpp/*-cpu/bin/llama-quantize"))
    return cached[-1] if cached else None


def run_llama_quantize(exe: Path, folder: Path):
    """BF16 GGUF of the same tensors -> llama-quantize --pure Q4_0; time the quantize."""
    from gguf import GGMLQuantizationType, GGUFReader

    from gguf_exact.formats.gguf_file import write_gguf
    from gguf_exact.gemma4.assistant import ARCH, AssistantConfig, metadata
    from gguf_exact.tiny.models import drafter_config

    tensors = load_tensor_set(folder)
    cfg_dict = drafter_config()
    cfg_dict["backbone_hidden_size"] = 1536
    cfg_dict["text_config"] |= {"hidden_size": 256, "intermediate_size": 2048, "vocab_size": tensors[0][1].shape[0]}
    fields = metadata(AssistantConfig.from_hf(cfg_dict))
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "bf16.gguf", Path(tmp) / "q4_0.gguf"
        write_gguf(src, ARCH, fields, [(n, b.view(np.uint8), GGMLQuantizationType.BF16) for n, b in tensors])
        cmd = ["/usr/bin/time", "-f", "%M", str(exe), "--pure", str(src), str(dst), "Q4_0", "2"]
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if proc.returncode != 0:
            print(proc.stderr[-2000:], file=sys.stderr)
            return None
        rss_mib = int(proc.stderr.strip().splitlines()[-1]) / 1024
        by_name = {t.name: t for t in GGUFReader(dst).tensors}
        values = exact = 0
        for name, bits in tensors:
            decoded = q4_0.dequantize(np.asarray(by_name[name].data).reshape(-1, 18))
            exact += exact_fraction(decoded, bits) * bits.size
            values += bits.size
    return ("llama-quantize --pure Q4_0", values, seconds, exact / values, rss_mib)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="token_embd rows as a share of E2B's 262144")
    parser.add_argument("--llama-quantize", help="path to llama-quantize (default: PATH or the gguf-exact build cache)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        save_tensor_set(args.scale, folder)
        rows = [child(run_exact, folder), child(run_published, folder)]
        exe = find_llama_quantize(args.llama_quantize)
        if exe and exe.exists():
            result = run_llama_quantize(exe, folder)
            if result:
                rows.append(result)
        else:
            print("llama-quantize not found: run `gguf-exact build-llama` to include it", file=sys.stderr)

    print(f"\n{'method':30} {'values':>12} {'seconds':>9} {'M values/s':>11} {'bit-exact':>10} {'peak RSS MiB':>13}")
    for name, values, seconds, exact, rss in rows:
        print(f"{name:30} {values:>12,} {seconds:>9.2f} {values / seconds / 1e6:>11.1f} {exact:>10.4%} {rss:>13.0f}")
    ours = rows[0][1] / rows[0][2]
    for name, values, seconds, *_ in rows[1:]:
        print(f"exact packer vs {name}: {ours / (values / seconds):.2f}x the values/s")


if __name__ == "__main__":
    main()

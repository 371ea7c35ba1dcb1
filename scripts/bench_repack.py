#!/usr/bin/env python3
"""Benchmark: ``repack`` of a Gemma 4 E2B-shaped model, beside the published method.

Writes a synthetic E2B-shaped QAT checkpoint and a Google-style donor GGUF (Q4_0
with ``max / -8`` steps, Q6_K embeddings, F16 ``per_layer_model_proj``) at scale S:
every matrix keeps its row length and has S times its rows, so 1.0 is full size
(4.63 billion re-packed values, 9.3 GB of bf16 source, 3.2 GB donor). Then, each in
its own child process (its own peak RSS):

- ``gguf-exact repack`` as a whole process: streaming, two worker threads, verified,
  sha256; peak RSS of its whole process tree at once (sampled from /proc);
- the published method, re-implemented (:mod:`gguf_exact.core.published`): each source
  matrix loaded whole, packed per block, every output tensor kept in memory for
  gguf-py's GGUFWriter, as the original does.

Prints values/s, seconds, peak RSS and bit-exact share of each, and the repack's
time extrapolated to full size at the measured rate. Not a test: nothing asserts.
Files go to a temp folder (``--dir``) and are deleted unless ``--keep``.

    python scripts/bench_repack.py --scale 0.02
"""

import argparse
import dataclasses
import json
import multiprocessing as mp
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from measure import run  # noqa: E402

FULL_VALUES = 4.63e9  # E2B's re-packed values at scale 1.0


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_seconds() -> float:
    """This process and its finished children (the forked workers)."""
    return sum(
        r.ru_utime + r.ru_stime
        for r in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
    )


def run_repack(donor: Path, source: Path, out: Path, report: Path, workers: int):
    """`gguf-exact repack` as a whole process: wall time, and peak RSS of the process
    tree at once (threads by default, so one process)."""
    exe = Path(sys.executable).with_name("gguf-exact")
    m = run([str(exe), "repack", "--donor", str(donor), "--source", str(source), str(out), "--report", str(report), "--workers", str(workers)])  # fmt: skip
    if m.returncode:
        sys.exit(f"repack failed: {m.stderr[-2000:]}")
    r = json.loads(report.read_text())
    rep = r["repacked"]
    extra = (
        f"write {r['seconds']['write']:.2f} s, read-back + sha256 {r['seconds']['verify']:.2f} s; "
        f"peak RSS {m.peak_mib:.0f} MiB (GNU time), {m.tree_peak_mib:.0f} MiB for the whole process tree at once"
    )
    return (
        "repack (gguf-exact)",
        rep["values"],
        m.seconds,
        None,
        rep["exact_fraction"],
        m.tree_peak_mib,
        r["bytes"],
        extra,
    )


def run_published(donor, source, out, workers, queue):
    """The published method: whole tensors, packed per block, every output tensor kept
    in memory until the file is written (as the original does with GGUFWriter)."""
    from gguf import GGMLQuantizationType

    from gguf_exact.core import bf16, q4_0
    from gguf_exact.core.published import published_q4_0
    from gguf_exact.formats.checkpoint import Checkpoint
    from gguf_exact.formats.gguf_stream import write_gguf
    from gguf_exact.repack.donor import open_donor
    from gguf_exact.repack.tensor_map import build_map
    from gguf_exact.stream.source_rows import locate

    start, cpu0 = time.perf_counter(), cpu_seconds()
    typed = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16}
    with open_donor(donor) as d, Checkpoint(source) as ckpt:
        jobs = build_map(Path(donor), d.architecture, d.tensors, locate(ckpt), Path(source)).jobs
        kv_raw = [kv.raw for kv in d.header.kv]
        tensors = []
        values = exact = 0
        exact_seconds = 0.0
        for job in jobs:
            t = job.entry
            if job.exact and job.source.part is None:
                bits = ckpt.read(job.hf_name)  # the whole tensor
                bits = bits[: t.rows] if bits.ndim == 2 else bits
                packed, _ = published_q4_0(bits.reshape(-1, t.cols))
                tensors.append((t.name, packed.reshape(*t.shape[:-1], -1), GGMLQuantizationType.Q4_0))
                tick = time.perf_counter()  # the bit-exact figure is not the method's work
                decoded = bf16.from_f32(q4_0.dequantize(packed)).reshape(-1)
                exact += int(bf16.same_value(decoded, bits.reshape(-1)).sum())
                values += bits.size
                exact_seconds += time.perf_counter() - tick
            else:
                raw = d.read_rows(t, 0, t.rows)
                data = raw.view(typed[t.type]).reshape(t.shape) if t.type in typed else raw.reshape(*t.shape[:-1], -1)
                tensors.append((t.name, data, t.type))
        write_gguf(Path(out), kv_raw, tensors)
    seconds = time.perf_counter() - start - exact_seconds
    size = Path(out).stat().st_size
    queue.put(
        (
            "published method",
            values,
            seconds,
            cpu_seconds() - cpu0,
            exact / values,
            peak_rss_mib(),
            size,
            "whole tensors in memory",
        )
    )


def child(fn, *args):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=fn, args=(*args, queue))
    proc.start()
    result = queue.get()
    proc.join()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--scale", type=float, default=0.02, help="rows of every matrix as a share of E2B's (1.0 = full size)"
    )
    parser.add_argument("--dir", type=Path, help="where to write the synthetic files (default: a temp folder)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="keep the files")
    parser.add_argument("--skip-published", action="store_true")
    args = parser.parse_args()

    from gguf_exact.tiny.main_model import E2B, write_donor, write_main_checkpoint

    spec = dataclasses.replace(E2B, row_scale=args.scale)
    root = Path(tempfile.mkdtemp(prefix="bench-repack-", dir=args.dir))
    try:
        tick = time.perf_counter()
        write_main_checkpoint(root / "src", spec, seed=0)
        write_donor(root / "donor.gguf", root / "src", spec)
        src_bytes = sum(f.stat().st_size for f in (root / "src").iterdir())
        print(f"scale {args.scale}: source {src_bytes:,} bytes, donor {(root / 'donor.gguf').stat().st_size:,} bytes "
              f"(made in {time.perf_counter() - tick:.0f} s) in {root}", file=sys.stderr)  # fmt: skip
        rows = [
            run_repack(root / "donor.gguf", root / "src", root / "repacked.gguf", root / "report.json", args.workers)
        ]
        (root / "repacked.gguf").unlink()
        if not args.skip_published:
            rows.append(child(run_published, root / "donor.gguf", root / "src", root / "published.gguf", args.workers))
            (root / "published.gguf").unlink()
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)

    load = os.getloadavg()[0]
    print(f"\nE2B-shaped model at scale {args.scale} ({os.cpu_count()} CPUs, load average {load:.1f} at the end)")
    print(
        f"{'method':22} {'values':>13} {'seconds':>8} {'CPU s':>7} {'M values/s':>11} {'bit-exact':>10} {'peak RSS MiB':>13} {'output bytes':>14}"
    )
    for name, values, seconds, cpu, exact, rss, size, _ in rows:
        cpu_text = "-" if cpu is None else f"{cpu:.2f}"
        print(
            f"{name:22} {values:>13,} {seconds:>8.2f} {cpu_text:>7} {values / seconds / 1e6:>11.1f} {exact:>10.4%} {rss:>13.0f} {size:>14,}"
        )
    for name, *_, extra in rows:
        print(f"  {name}: {extra}")
    ours = rows[0]
    rate = ours[1] / ours[2]
    print(f"repack at full size (4.63e9 values) at this rate: {FULL_VALUES / rate:.0f} s")
    if len(rows) > 1:
        print(
            f"repack vs published method: {rate / (rows[1][1] / rows[1][2]):.2f}x the values/s, {rows[1][5] / ours[5]:.1f}x less peak RSS"
        )


if __name__ == "__main__":
    main()

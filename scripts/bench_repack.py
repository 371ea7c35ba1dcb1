#!/usr/bin/env python3
"""Benchmark: ``repack`` of a Gemma 4 E2B-shaped model, beside the published method.

Writes a synthetic E2B-shaped QAT checkpoint and a Google-style donor GGUF (Q4_0
with ``max / -8`` steps, Q6_K embeddings, F16 ``per_layer_model_proj``) at scale S:
every matrix keeps its row length and has S times its rows, so 1.0 is full size
(4.63 billion re-packed values, 9.3 GB of bf16 source, 3.2 GB donor). Then, each in
its own child process (its own peak RSS):

- ``repack`` (gguf-exact): streaming, two worker threads, verified, sha256;
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
import multiprocessing as mp
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

FULL_VALUES = 4.63e9  # E2B's re-packed values at scale 1.0


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_seconds() -> float:
    """This process and its finished children (the forked workers)."""
    return sum(
        r.ru_utime + r.ru_stime
        for r in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
    )


def run_repack(donor, source, out, workers, queue):
    from gguf_exact.repack.pipeline import repack_model

    start, cpu0 = time.perf_counter(), cpu_seconds()
    result = repack_model(donor, source, out, workers=workers)
    seconds = time.perf_counter() - start
    rep = result.report["repacked"]
    worker_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    extra = (
        f"write {result.seconds['write']:.2f} s, read-back + sha256 {result.seconds['verify']:.2f} s; "
        f"peak RSS of each forked worker {worker_rss:.0f} MiB (pages shared with the parent counted in both)"
    )
    queue.put(
        (
            "repack (gguf-exact)",
            rep["values"],
            seconds,
            cpu_seconds() - cpu0,
            rep["exact_fraction"],
            peak_rss_mib(),
            result.size,
            extra,
        )
    )


def run_published(donor, source, out, workers, queue):
    """The published method: whole tensors, packed per block, kept for GGUFWriter."""
    from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter

    from gguf_exact.core import bf16, q4_0
    from gguf_exact.core.published import published_q4_0
    from gguf_exact.formats.checkpoint import Checkpoint
    from gguf_exact.formats.vocab import copy_field
    from gguf_exact.repack.donor import open_donor
    from gguf_exact.repack.tensor_map import build_map
    from gguf_exact.stream.source_rows import locate

    start, cpu0 = time.perf_counter(), cpu_seconds()
    reader = GGUFReader(donor)
    with open_donor(donor) as d:
        arch, entries = d.architecture, d.tensors
    with Checkpoint(source) as ckpt:
        jobs = build_map(Path(donor), arch, entries, locate(ckpt), Path(source)).jobs
        writer = GGUFWriter(out, arch)
        for name, field in reader.fields.items():
            if name.startswith("GGUF.") or name == "general.architecture":
                continue
            f = copy_field(field)
            writer.add_key_value(f.key, f.value, f.vtype, f.sub_type)
        data = {t.name: t for t in reader.tensors}
        values = exact = 0
        exact_seconds = 0.0
        for job in jobs:
            t = data[job.entry.name]
            if job.exact and job.source.part is None:
                bits = ckpt.read(job.hf_name)  # the whole tensor
                bits = bits[: job.entry.rows] if bits.ndim == 2 else bits
                packed, _ = published_q4_0(bits.reshape(-1, job.entry.cols))
                writer.add_tensor(t.name, packed.reshape(job.entry.rows, -1), raw_dtype=GGMLQuantizationType.Q4_0)
                tick = time.perf_counter()  # the bit-exact figure is not the method's work
                decoded = bf16.from_f32(q4_0.dequantize(packed)).reshape(-1)
                exact += int(bf16.same_value(decoded, bits.reshape(-1)).sum())
                values += bits.size
                exact_seconds += time.perf_counter() - tick
            else:
                plain = t.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16)
                writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=None if plain else t.tensor_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
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
        rows = [child(run_repack, root / "donor.gguf", root / "src", root / "repacked.gguf", args.workers)]
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
        print(
            f"{name:22} {values:>13,} {seconds:>8.2f} {cpu:>7.2f} {values / seconds / 1e6:>11.1f} {exact:>10.4%} {rss:>13.0f} {size:>14,}"
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

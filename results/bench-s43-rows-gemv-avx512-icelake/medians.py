"""Per row count: each arm's median (ms), the ratio of medians (rows / gemm) and each alternation's ratio.

    python3 medians.py llama-bench-e2b-abba-8.txt
"""

import collections
import statistics
import sys

times: dict[int, dict[str, list[float]]] = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    _, arm, *fields = line.split()
    for field in fields:
        rows, ms = field.split(":")
        times[int(rows)][arm].append(float(ms))
for rows in sorted(times):
    gemm, gemv = times[rows]["gemm"], times[rows]["rows"]
    ratios = " ".join(f"{b / a:.2f}" for a, b in zip(gemm, gemv))
    print(f"{rows:4d} rows: gemm {statistics.median(gemm):7.1f} ms, rows {statistics.median(gemv):7.1f} ms, "
          f"{statistics.median(gemv) / statistics.median(gemm):.2f}x; by alternation {ratios}")

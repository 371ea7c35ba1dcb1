"""The exact Q4_0 core: pure functions on numpy arrays (per-block loops compiled by numba), no I/O.

- ``bf16``, ``q4_0``, ``q6_k``: data layouts, each stated once
- ``grid``: QAT grid detection (levels and a step per block of 32)
- ``scale``: the fp16 scale per block that decodes to the source bits
- ``exact_kernel``: both, the bytes and the error in one pass over a chunk (the fused kernel);
  ``string_walk``: the end of a GGUF string array
- ``kernels``: which build of those two kernels runs (numba's JIT, or the same source compiled
  ahead of time, :mod:`gguf_exact.builds.aot_kernels`), their arrays and counters
- ``exact``: the kernel's wrapper, over a whole matrix chunked over two cores
- ``error_stats``: bit-exact share, largest error in bf16 ULPs, relative error
- ``published``: the published method, kept as the benchmark baseline
"""

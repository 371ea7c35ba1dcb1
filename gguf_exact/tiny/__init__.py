"""Tiny Gemma 4 models made on the spot and synthetic QAT data, for tests, the demo
and the benchmarks: ``models`` (target GGUF, drafter checkpoint), ``pairs`` (target and
drafter pairs for speculation), ``main_model`` (a Google-style donor and its QAT
source), ``synthetic`` (bf16 matrices on the Q4_0 grid)."""

"""Gemma 4 in GGUF: one table per architecture.

- ``assistant``: the MTP drafter (``gemma4-assistant``): config keys, tensor names, rope_freqs
- ``names``: the main models (``gemma4``): HF tensor names to GGUF names, dense and MoE
"""

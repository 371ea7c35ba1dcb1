"""Gemma 4 in GGUF: one table per architecture.

- ``hparams``: the text-stack keys both architectures share, as llama.cpp's converter writes them
- ``assistant``: the MTP drafter (``gemma4-assistant``): config keys, tensor names, rope_freqs
- ``names``: the main models (``gemma4``): HF tensor names to GGUF names, dense and MoE
- ``sizes``: the real E2B, E4B, 26B-A4B and 31B hyperparameters and their assistants', with sources
"""

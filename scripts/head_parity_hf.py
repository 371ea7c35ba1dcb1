#!/usr/bin/env python3
"""transformers' side of the ordered-head parity (``tests/test_head_parity.py``), run in the
parity venv (``make parity``: torch, transformers 5.24.0).

Loads the HF checkpoint as transformers' own ``Gemma4AssistantForCausalLM`` (float32) and runs
its ``masked_embedding`` (``Gemma4AssistantMaskedEmbedder``) on the drafter's final hidden
states that llama.cpp computed, with the model's own ``lm_head`` (tied to ``embed_tokens``):

    head_parity_hf.py HF_DIR IN.npz OUT.npz     # IN: hidden (steps, width); OUT: logits (steps, vocab)
"""

import sys

import numpy as np
import torch
from transformers import Gemma4AssistantForCausalLM


def main(hf_dir: str, src: str, out: str) -> int:
    model = Gemma4AssistantForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    if model.masked_embedding is None:
        print(f"error: {hf_dir}: the config does not use ordered embeddings", file=sys.stderr)
        return 1
    hidden = torch.from_numpy(np.load(src)["hidden"].astype(np.float32))
    with torch.no_grad():
        logits = model.masked_embedding(hidden[:, None, :], model.lm_head.weight)[:, 0, :]
    np.savez(out, logits=logits.numpy(), top_k=model.masked_embedding.centroid_intermediate_top_k)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))

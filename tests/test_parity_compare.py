"""The comparison behind ``make parity`` (scripts/parity.py) sees each kind of difference.

``make parity`` itself runs llama.cpp's converter and is not part of CI; its comparison is,
on files gguf-exact writes and on hand-made differences.
"""

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import parity  # noqa: E402

from gguf_exact.drafter.convert import convert_drafter  # noqa: E402
from gguf_exact.tiny.structural import write_structural_pair  # noqa: E402

A = "gemma4-assistant"


def test_a_file_equals_itself_and_each_difference_is_reported(tmp_path):
    pair = write_structural_pair(tmp_path, "31B")
    path = convert_drafter(pair.drafter_hf, tmp_path / "d.gguf", vocab_from=pair.target).path
    ours = parity.read_side(path, A)
    assert ours.keys[f"{A}.attention.head_count_kv"] == ("[INT32]", (16, 16, 16, 4))
    assert ours.keys[f"{A}.attention.key_length"] == ("UINT32", 64)
    same = parity.compare("31B", ours, ours)
    assert same.ok and same.tensor_rows == 49 and same.f32_compared == 26 and same.rope_freqs == "same"

    keys = dict(ours.keys)
    keys[f"{A}.attention.head_count_kv"] = ("UINT32", 16)  # what gguf-exact wrote before per-layer arrays
    del keys[f"{A}.nextn_predict_layers"]
    tensors = dict(ours.tensors)
    shape, qtype, data = tensors["rope_freqs.weight"]
    tensors["rope_freqs.weight"] = (shape, qtype, np.where(data > 1, np.float32(1e4), data))
    shape, qtype, data = tensors["blk.0.attn_q.weight"]
    tensors["blk.0.attn_q.weight"] = ((shape[0], shape[1] // 2), qtype, data)
    del tensors["blk.1.ffn_norm.weight"]
    broken = parity.compare("31B", ours, replace(ours, keys=keys, tensors=tensors))

    assert broken.key_diffs == [f"{A}.attention.head_count_kv", f"{A}.nextn_predict_layers"]
    assert broken.keys[f"{A}.attention.head_count_kv"][:2] == ("[16, 16, 16, 4] [INT32]", "16 UINT32")
    assert broken.keys[f"{A}.nextn_predict_layers"][1] == "(absent)"
    assert broken.tensor_diffs == [
        "blk.0.attn_q.weight: shape [64, 1024] upstream, [64, 512] gguf-exact",
        "blk.1.ffn_norm.weight: only upstream has it",
        "rope_freqs.weight: F32 values differ (max |diff| 1e+30)",
    ]
    assert broken.rope_freqs == "DIFFERS" and not broken.ok


def test_names_a_mapping_would_write_are_checked_against_upstreams():
    up = parity.Side({}, {"token_embd.weight": ((8, 4), "F32", None), "rope_freqs.weight": ((2,), "F32", None)})
    c = parity.compare("t", up, up, names_only={"token_embd.weight", "blk.0.attn_v.weight"})
    assert c.tensor_diffs == [
        "blk.0.attn_v.weight: the repack table maps a source tensor to it, upstream does not write it",
        "rope_freqs.weight: the repack table has no source for it, upstream writes it",
    ]

"""Gemma 4 GGUFs with a real size's header and tensor table and no weights.

The header holds the size's hyperparameters exactly as llama.cpp's converter writes
them (:data:`gguf_exact.gemma4.sizes.SIZES`, :func:`gguf_exact.gemma4.hparams.text_fields`)
and a 262,144-token vocabulary; the tensor table lists every tensor at its real shape
and type (the target as Google's QAT GGUFs store it, :mod:`.main_model`; the drafter as
``gguf-exact convert`` writes it: Q4_0 matrices, F32 norms); the data region is a hole
(a sparse file: no disk space, reads as zeros). Everything that works from the header
alone (serve's checks, the size of a target, the memory plan, the drafter lookup)
sees a real E2B or E4B pair, for tests, without the 3 GB download.
"""

from __future__ import annotations

import os
from pathlib import Path

from gguf import GGMLQuantizationType, GGUFValueType

from gguf_exact.formats.gguf_layout import Field, TensorEntry, encode_header, layout_offsets
from gguf_exact.formats.safe_write import atomic_output
from gguf_exact.formats.vocab import read_target
from gguf_exact.gemma4.assistant import ARCH as ASSISTANT
from gguf_exact.gemma4.assistant import (
    CENTROIDS,
    LAYER_TENSORS,
    ORDERING,
    ROPE_FREQS,
    AssistantConfig,
    expected_shape,
    metadata,
)
from gguf_exact.gemma4.sizes import SIZES
from gguf_exact.tiny.main_model import MainSpec, donor_kv, model_tensors

ALIGNMENT = 32
VERSION = 3
Q4_0, F32 = GGMLQuantizationType.Q4_0, GGMLQuantizationType.F32


def write_sparse(path: str | Path, kv_raw: list[bytes], tensors: list[TensorEntry]) -> Path:
    """A GGUF of ``kv_raw`` and ``tensors`` whose data region is a hole of the right length."""
    path = Path(path)
    tensors = layout_offsets(tensors, ALIGNMENT)
    head = encode_header(VERSION, kv_raw, tensors, ALIGNMENT)
    end = len(head) + (tensors[-1].offset + tensors[-1].nbytes if tensors else 0)
    with atomic_output(path, end) as tmp:
        tmp.write_bytes(head)
        os.truncate(tmp, end)
    return path


def write_full_size_target(path: str | Path, size: str = "E2B") -> Path:
    """``size``'s target (a key of SIZES without MoE: E2B, E4B, 31B) as a sparse GGUF."""
    spec = MainSpec.from_shape(SIZES[size].target)
    tensors = [TensorEntry(t.gguf_name, tuple(reversed(t.shape)), t.donor_type) for t in model_tensors(spec)]
    return write_sparse(path, donor_kv(spec), tensors)


def assistant_tensors(cfg: AssistantConfig) -> list[TensorEntry]:
    """The drafter's tensor table as ``gguf-exact convert`` writes it (every matrix Q4_0)."""
    names = ["token_embd.weight", "output_norm.weight", "nextn.pre_projection.weight", "nextn.post_projection.weight"]
    names += [f"blk.{il}.{part}.weight" for il in range(cfg.num_hidden_layers) for part in LAYER_TENSORS.values()]
    out = []
    for name in names:
        shape = expected_shape(name, cfg)
        assert shape is not None, name
        out.append(TensorEntry(name, tuple(reversed(shape)), Q4_0 if len(shape) == 2 else F32))
    out.append(TensorEntry(ROPE_FREQS, (cfg.text.head_dim_full // 2,), F32))
    if cfg.head is not None:  # the ordered-embedding head (its centroids taken to be on the grid)
        centroids = expected_shape(CENTROIDS, cfg)
        assert centroids is not None  # cfg.head is set
        out.append(TensorEntry(CENTROIDS, tuple(reversed(centroids)), Q4_0))
        out.append(TensorEntry(ORDERING, (cfg.vocab_size,), GGMLQuantizationType.I32))
    return out


def write_full_size_drafter(path: str | Path, size: str, vocab_from: str | Path) -> Path:
    """``size``'s MTP assistant as a sparse GGUF, with ``vocab_from``'s tokenizer keys."""
    cfg = AssistantConfig.from_hf(SIZES[size].assistant.config())
    u32 = GGUFValueType.UINT32
    fields = [
        Field("general.architecture", ASSISTANT, GGUFValueType.STRING),
        Field("general.file_type", 2, u32),  # MOSTLY_Q4_0
        Field("general.quantization_version", 2, u32),
        *metadata(cfg),
    ]
    kv = [f.encode() for f in fields] + list(read_target(vocab_from).tokenizer.pairs)
    return write_sparse(path, kv, assistant_tensors(cfg))


__all__ = ["assistant_tensors", "write_full_size_drafter", "write_full_size_target", "write_sparse"]

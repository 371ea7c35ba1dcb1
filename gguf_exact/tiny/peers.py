"""Full-size inputs and the files other tools would make of them, for benchmarks and tests.

- :func:`e2b_drafter_checkpoint`: the E2B assistant at its real shapes
  (:data:`gguf_exact.gemma4.sizes.SIZES`), QAT on the 4-bit grid with fp32 steps;
- :func:`vocab_target`: a size's target GGUF (its real header and tensor table, the data
  a hole) carrying a given vocabulary: a Gemma-4-size vocabulary's cost is in its
  metadata, and that is what ``convert --vocab-from`` and the serve checks read;
- :func:`float_drafter_gguf`: a drafter as llama.cpp's own converter writes it
  (``--outtype bf16``, ``f16`` or ``q8_0``: matrices in that type, norms F32, the
  target's tokenizer), the input ``llama-quantize`` starts from.
"""

from dataclasses import replace
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

from gguf_exact.formats.checkpoint import Checkpoint
from gguf_exact.formats.gguf_file import encode
from gguf_exact.formats.gguf_layout import TensorEntry
from gguf_exact.formats.gguf_stream import write_gguf
from gguf_exact.formats.vocab import read_target
from gguf_exact.gemma4.assistant import AssistantConfig
from gguf_exact.gemma4.sizes import SIZES
from gguf_exact.tiny.models import TinyDrafter, drafter_config, drafter_tensors, write_checkpoint
from gguf_exact.tiny.vocab import Vocabulary

F32, Q4_0 = GGMLQuantizationType.F32, GGMLQuantizationType.Q4_0


def e2b_drafter_spec(vocab_size: int | None = None) -> TinyDrafter:
    """The E2B assistant's real shapes (``vocab_size`` to shrink its vocabulary)."""
    spec = TinyDrafter.from_shape(SIZES["E2B"].assistant)
    return spec if vocab_size is None else TinyDrafter.from_shape(SIZES["E2B"].assistant, vocab_size=vocab_size)


def e2b_drafter_checkpoint(folder: str | Path, vocab_size: int | None = None, seed: int = 0) -> Path:
    """The E2B assistant as a QAT checkpoint (fp32 training steps, every block on the grid)."""
    spec = e2b_drafter_spec(vocab_size)
    tensors = drafter_tensors(spec, seed=seed, step_kind="fp32", zero_fraction=0.0)
    return write_checkpoint(folder, drafter_config(spec), tensors)


def vocab_target(path: str | Path, vocab: Vocabulary, size: str = "E2B") -> Path:
    """``size``'s target GGUF with ``vocab``: its real header (every key llama.cpp's
    converter writes) and tensor table, the data a hole (a sparse file). Everything that
    reads headers (``convert --vocab-from``, the serve checks, the memory plan) sees the
    real thing; nothing can run it."""
    from gguf_exact.gemma4.sizes import SIZES
    from gguf_exact.tiny.full_size import write_sparse
    from gguf_exact.tiny.main_model import MainSpec, donor_kv, model_tensors
    from gguf_exact.tiny.vocab import vocabulary_pairs

    spec = replace(MainSpec.from_shape(SIZES[size].target), n_vocab=len(vocab.tokens))
    kv = [pair for pair in donor_kv(spec) if not pair[8:].startswith(b"tokenizer.")] + vocabulary_pairs(vocab)
    tensors = [TensorEntry(t.gguf_name, tuple(reversed(t.shape)), t.donor_type) for t in model_tensors(spec)]
    return write_sparse(path, kv, tensors)


def float_drafter_gguf(
    source: str | Path, target: str | Path, out: str | Path, matrix_type: GGMLQuantizationType
) -> Path:
    """The drafter at ``source`` as llama.cpp's converter writes it: every matrix in
    ``matrix_type`` (BF16, F16 or Q8_0), norms F32, the keys and tokenizer ``convert``
    writes (so only the tensor types differ)."""
    from gguf_exact.drafter.convert import drafter_jobs, drafter_kv

    with Checkpoint(source) as ckpt:
        cfg = AssistantConfig.from_hf(ckpt.config).full_head()  # upstream drops the ordered head
        jobs = drafter_jobs(ckpt, cfg)
    tensors = []
    for j in jobs:
        shape = j.entry.shape
        if j.data is not None:
            tensors.append((j.entry.name, j.data.view(np.float32).reshape(shape), F32))
            continue
        values = j.source_rows.read(0, j.entry.rows).reshape(shape)
        qtype = matrix_type if j.entry.type == Q4_0 else F32
        data = encode(values, qtype)
        tensors.append(
            (j.entry.name, data if qtype == F32 or data.dtype != np.uint8 else data.reshape(*shape[:-1], -1), qtype)
        )
    n_matrices = sum(j.entry.type == Q4_0 for j in jobs)
    write_gguf(Path(out), drafter_kv(cfg, read_target(target), [matrix_type] * n_matrices), tensors)
    return Path(out)

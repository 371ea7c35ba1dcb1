"""Read a written GGUF back and compare every tensor with its source.

The figures (bit-exact values, largest error in bf16 ULPs, relative error) come from
:func:`gguf_exact.core.error_stats.compare_chunk`, the pure part; :func:`verify_gguf`
does the reading. A Q4_0 tensor whose bytes differ from the planned bytes fails
verification outright.
"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

from gguf_exact.core import bf16
from gguf_exact.core.error_stats import ErrorStats, compare_chunk
from gguf_exact.errors import GgufExactError
from gguf_exact.formats.checkpoint import Checkpoint
from gguf_exact.formats.gguf_file import decode
from gguf_exact.formats.vocab import open_gguf
from gguf_exact.gemma4.assistant import (
    ROPE_FREQS,
    AssistantConfig,
    gguf_tensor_name,
    rope_freqs,
)

ROW_CHUNK_VALUES = 1 << 22


@dataclass
class TensorCheck(ErrorStats):
    """:class:`ErrorStats` of one GGUF tensor against its source tensor."""

    name: str = ""  # GGUF name
    source: str = ""  # HF name
    type: str = ""  # GGML type of the stored tensor

    def as_dict(self) -> dict:
        return {"name": self.name, "source": self.source, "type": self.type} | super().as_dict()


@dataclass
class Verification:
    path: Path
    tensors: list[TensorCheck]

    @property
    def total(self) -> TensorCheck:
        total = TensorCheck(name="(all)")
        for t in self.tensors:
            total.add(t)
        return total


def source_bits(ckpt: Checkpoint, name: str, rows: slice | None = None) -> np.ndarray:
    """A source tensor (or row slice) as bf16 bits; F16/F32 are rounded to bf16."""
    data = ckpt.read(name, rows)
    if ckpt.tensors[name].dtype == "BF16":
        return data
    return bf16.from_f32(data.astype(np.float32))


def verify_gguf(path: str | Path, ckpt: Checkpoint, planned: dict[str, np.ndarray] | None = None) -> Verification:
    """Compare every tensor of the GGUF at ``path`` with ``ckpt``.

    ``planned`` maps GGUF names to the Q4_0 bytes the converter meant to write.
    Raises :class:`GgufExactError` on a missing or extra tensor, a shape mismatch, or a
    Q4_0 tensor whose bytes differ from its plan.
    """
    cfg = AssistantConfig.from_hf(ckpt.config, str(ckpt.folder / "config.json"))
    reader = open_gguf(path)
    by_gguf = {}
    for hf_name in ckpt.tensors:
        gguf_name = gguf_tensor_name(hf_name)
        if gguf_name is not None:
            by_gguf[gguf_name] = hf_name
    found = {t.name: t for t in reader.tensors}
    missing = sorted(set(by_gguf) - set(found))
    if missing:
        raise GgufExactError(f"{path}: verification failed: tensor {missing[0]} is missing ({len(missing)} in all)")
    checks = []
    for t in reader.tensors:
        qtype = GGMLQuantizationType(t.tensor_type)
        if t.name == ROPE_FREQS:
            if not np.array_equal(np.asarray(t.data, dtype=np.float32), rope_freqs(cfg)):
                raise GgufExactError(f"{path}: verification failed: {ROPE_FREQS} differs from the config's rope")
            continue
        if t.name not in by_gguf:
            raise GgufExactError(f"{path}: verification failed: tensor {t.name} has no source tensor")
        hf_name = by_gguf[t.name]
        shape = ckpt.tensors[hf_name].shape
        if tuple(int(x) for x in reversed(t.shape)) != (tuple(shape) or (1,)):
            raise GgufExactError(
                f"{path}: verification failed: tensor {t.name} has shape {list(t.shape)}, source {list(shape)}"
            )
        if planned and t.name in planned and not np.array_equal(np.asarray(t.data).ravel(), planned[t.name].ravel()):
            bad = np.flatnonzero(np.asarray(t.data).ravel() != planned[t.name].ravel())[0] // 18
            raise GgufExactError(
                f"{path}: verification failed: tensor {t.name}: Q4_0 block {bad} differs from the plan"
            )
        check = TensorCheck(name=t.name, source=hf_name, type=qtype.name)
        rows = shape[0] if len(shape) > 1 else 1
        data = np.asarray(t.data).reshape(rows, -1)
        step = max(1, ROW_CHUNK_VALUES // max(1, int(np.prod(shape)) // rows))
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            sub_shape = (r1 - r0, *shape[1:]) if len(shape) > 1 else shape
            decoded = decode(data[r0:r1], qtype, sub_shape)
            check.add(compare_chunk(decoded, source_bits(ckpt, hf_name, slice(r0, r1) if len(shape) > 1 else None)))
        checks.append(check)
    return Verification(Path(path), checks)

"""How a rebuilt drafter compares with the published one: ``reproduced``, ``same levels``,
``same levels, less exact`` or ``differs``.

- ``reproduced``: the two files have the same sha256.
- ``same levels``: the same tensors (names, types, shapes); every Q4_0 block holds the
  same levels as the published file's (proportional level vectors, see
  :mod:`gguf_exact.core.same_levels`) and only scales differ; every other tensor is
  byte for byte the same. Scales are judged too: each published block is held to the
  rebuilt one (the plan) by ``verify``'s block rule
  (:mod:`gguf_exact.core.block_exactness`), and every one is as exact.
- ``same levels, less exact``: as above, but some published blocks decode fewer values
  bit-exactly than the plan's (or a value further off): their scales are worse. Counted
  per tensor.
- ``differs``: anything else, named by the first differing tensor and block.

Both files' bit-exact share against the source is measured; metadata keys that differ
are listed. A drafter published by another scale rule (the published method,
:mod:`gguf_exact.core.published`) comes out ``same levels, less exact``.
Both files are read in row chunks with :func:`gguf_exact.repack.donor.open_donor`.
"""

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

from gguf_exact.core import bf16, q4_0
from gguf_exact.core.block_exactness import judge_blocks
from gguf_exact.core.error_stats import ErrorStats, compare_chunk
from gguf_exact.core.same_levels import same_levels
from gguf_exact.formats.checkpoint import Checkpoint
from gguf_exact.formats.gguf_file import decode, sha256_file
from gguf_exact.gemma4.assistant import gguf_tensor_name
from gguf_exact.repack.donor import Donor, open_donor

CHUNK_VALUES = 1 << 22  # values read per tensor per step, from each file

REPRODUCED, SAME_LEVELS, LESS_EXACT, DIFFERS = "reproduced", "same levels", "same levels, less exact", "differs"


@dataclass
class TensorScales:
    """One Q4_0 tensor of the published file, its blocks held to the rebuilt file's."""

    name: str
    blocks: int = 0
    as_exact: int = 0  # the plan's bytes, or as exact with another scale
    less_exact: int = 0


@dataclass
class Outcome:
    kind: str  # REPRODUCED, SAME_LEVELS, LESS_EXACT or DIFFERS
    built: Path
    published: Path
    q4_0_blocks: int = 0  # Q4_0 blocks compared
    other_scale_blocks: int = 0  # of those, stored with other bytes (same levels)
    difference: str | None = None  # DIFFERS: where, e.g. "tensor blk.0.ffn_up.weight, Q4_0 block 17 ..."
    metadata_keys: list[str] = field(default_factory=list)  # keys whose values differ, or in one file only
    built_exact: ErrorStats | None = None  # bit-exact share against the source (SAME_LEVELS)
    published_exact: ErrorStats | None = None
    scales: list[TensorScales] = field(default_factory=list)  # per Q4_0 tensor (SAME_LEVELS, LESS_EXACT)

    @property
    def less_exact_blocks(self) -> int:
        return sum(t.less_exact for t in self.scales)


def compare_with_published(built: str | Path, published: str | Path, source_dir: str | Path) -> Outcome:
    """Compare the GGUF ``built`` with ``published``; on ``same levels`` also measure
    both against the source checkpoint in ``source_dir``."""
    built, published = Path(built), Path(published)
    if sha256_file(built) == sha256_file(published):
        return Outcome(REPRODUCED, built, published)
    with open_donor(built) as a, open_donor(published) as b, Checkpoint(source_dir) as ckpt:
        outcome = Outcome(SAME_LEVELS, built, published, metadata_keys=_metadata_differences(a, b))
        outcome.difference = _layout_difference(a, b)
        if outcome.difference:
            outcome.kind = DIFFERS
            return outcome
        sources = {g: hf for hf in ckpt.tensors if (g := gguf_tensor_name(hf)) is not None}
        outcome.built_exact, outcome.published_exact = ErrorStats(), ErrorStats()
        for t in a.tensors:
            difference = _compare_tensor(a, b, t.name, ckpt, sources.get(t.name), outcome)
            if difference:
                outcome.kind, outcome.difference = DIFFERS, difference
                outcome.built_exact = outcome.published_exact = None
                outcome.scales = []
                return outcome
    if outcome.less_exact_blocks:
        outcome.kind = LESS_EXACT
    return outcome


def _metadata_differences(a: Donor, b: Donor) -> list[str]:
    keys = list(dict.fromkeys([*a.header.fields, *b.header.fields]))
    return [
        k
        for k in keys
        if k not in a.header.fields or k not in b.header.fields or a.header.fields[k].raw != b.header.fields[k].raw
    ]


def _layout_difference(a: Donor, b: Donor) -> str | None:
    """The first tensor missing from one file, or stored with another type or shape."""
    theirs = {t.name: t for t in b.tensors}
    ours = {t.name for t in a.tensors}
    for t in a.tensors:
        other = theirs.get(t.name)
        if other is None:
            return f"tensor {t.name} is in the built file only"
        if other.type != t.type or other.ne != t.ne:
            return (
                f"tensor {t.name} is {t.type.name} {list(t.shape)} in the built file, "
                f"{other.type.name} {list(other.shape)} in the published one"
            )
    extra = [t.name for t in b.tensors if t.name not in ours]
    return f"tensor {extra[0]} is in the published file only" if extra else None


def _compare_tensor(
    a: Donor, b: Donor, name: str, ckpt: Checkpoint, source: str | None, outcome: Outcome
) -> str | None:
    """Compare one tensor chunk by chunk; the first difference, or None (figures added to ``outcome``)."""
    ta, tb = a.tensor(name), b.tensor(name)
    step = max(1, CHUNK_VALUES // max(1, ta.cols))
    per_row = ta.cols // q4_0.BLOCK_SIZE
    scales = TensorScales(name)
    if ta.type == GGMLQuantizationType.Q4_0:
        outcome.scales.append(scales)
    for r0 in range(0, ta.rows, step):
        r1 = min(ta.rows, r0 + step)
        raw_a, raw_b = a.read_rows(ta, r0, r1), b.read_rows(tb, r0, r1)
        values = None
        if source is not None:
            rows = slice(r0, r1) if len(ckpt.tensors[source].shape) > 1 else None
            values = ckpt.read(source, rows)  # in the source's own precision
        if ta.type == GGMLQuantizationType.Q4_0:
            blocks_a, blocks_b = raw_a.reshape(-1, q4_0.BLOCK_BYTES), raw_b.reshape(-1, q4_0.BLOCK_BYTES)
            same = same_levels(blocks_a, blocks_b)
            if not same.all():
                i = int(np.flatnonzero(~same)[0])
                levels_a, _ = q4_0.unpack(blocks_a[i])
                levels_b, _ = q4_0.unpack(blocks_b[i])
                row, column = r0 + i // per_row, i % per_row * q4_0.BLOCK_SIZE
                return (
                    f"tensor {name}, Q4_0 block {r0 * per_row + i} (row {row}, columns {column}..{column + 31}): "
                    f"levels {levels_a[0].tolist()} built, {levels_b[0].tolist()} published"
                )
            outcome.q4_0_blocks += len(same)
            outcome.other_scale_blocks += int(np.count_nonzero((blocks_a != blocks_b).any(axis=1)))
            bits = bf16.from_exact(values) if values is not None else None
            if bits is not None:  # the built file is the plan: hold the published blocks to it
                judged = judge_blocks(blocks_b, blocks_a, bits, keep=0)
                scales.blocks += judged.n_blocks
                scales.as_exact += judged.n_blocks - judged.less_exact
                scales.less_exact += judged.less_exact
        elif not np.array_equal(raw_a, raw_b):
            byte = int(np.flatnonzero(raw_a.ravel() != raw_b.ravel())[0])
            row = r0 + byte // raw_a.shape[1]
            return f"tensor {name} ({ta.type.name}): row {row} differs (byte {byte % raw_a.shape[1]} of the row)"
        if values is not None:
            for raw, stats in ((raw_a, outcome.built_exact), (raw_b, outcome.published_exact)):
                if stats is not None:  # set before the first tensor
                    stats.add(compare_chunk(decode(raw, ta.type, (r1 - r0, ta.cols)), values, ulps=False))
    return None

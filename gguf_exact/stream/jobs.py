"""What each output tensor is made of: the plan a streamed write follows.

One :class:`TensorJob` per output tensor, decided from names, shapes and configs alone
(no tensor data): ``repack`` derives them from a donor GGUF
(:mod:`gguf_exact.repack.tensor_map`), ``convert`` from a drafter checkpoint
(:mod:`gguf_exact.drafter.convert`). :mod:`.writer` then carries them out chunk by chunk.

Roles:

- ``qat``: a weight matrix trained onto the 4-bit grid: exact Q4_0 from the source; a
  block off the grid stops the write unless an off-grid policy says otherwise (or the job
  names a ``lossless`` type to store such a source in);
- ``probe``: exact Q4_0 when the source happens to be on the grid, else the donor's
  tensor (the MoE router, which QAT may leave in full precision);
- ``encode``: the source stored as ``entry.type`` (a drafter's norms, as F32);
- ``copy``, ``generated``, ``unmapped``: the donor's bytes (compared with the source
  when there is one);
- ``data``: bytes made here (a drafter's ``rope_freqs``);
- ``source``: the source's own bytes in its own dtype (BF16 for a bf16 checkpoint): the
  matrices of a bf16 reference (``convert --bf16``, ``repack --bf16``), which keeps the
  exact file's header and tensor order so that the two differ only in how weights are
  stored (:func:`reference_jobs`).
"""

from dataclasses import dataclass, replace

import numpy as np
from gguf import GGMLQuantizationType

from gguf_exact.formats.gguf_layout import TensorEntry
from gguf_exact.stream.source_rows import RowSource

QAT, PROBE, COPY, ENCODE, DATA, SOURCE = "qat", "probe", "copy", "encode", "data", "source"
GENERATED, UNMAPPED = "generated", "unmapped"
FROM_DONOR = (COPY, GENERATED, UNMAPPED)


@dataclass
class TensorJob:
    """One output tensor and how it is made.

    ``entry`` is the tensor as planned: with a donor, the donor's own entry (its type is
    what a copy keeps); without, the type to write (Q4_0 for ``qat``)."""

    entry: TensorEntry
    role: str
    kind: str  # the report row it belongs to
    hf_name: str | None = None
    source: RowSource | None = None
    note: str = ""
    data: np.ndarray | None = None  # role data: (rows, row bytes) uint8
    # qat: the type an off-grid source is stored as whatever the off-grid policy says, keeping
    # every source bit (the drafter's ordered-head centroids, which no one promises are QAT)
    lossless: GGMLQuantizationType | None = None

    @property
    def source_rows(self) -> RowSource:
        """``source``, for a job that has one (exact, probed, encoded, a source's copy)."""
        if self.source is None:
            raise ValueError(f"tensor {self.entry.name}: planned without a source")
        return self.source

    @property
    def exact(self) -> bool:
        """Planned as exact Q4_0 (subject to the grid)."""
        return self.role in (QAT, PROBE) and self.source is not None

    @property
    def stored_type(self) -> GGMLQuantizationType:
        """The type this job writes when nothing falls back: Q4_0 for an exact matrix,
        the source's dtype for ``source``, else the planned entry's type."""
        if self.exact:
            return GGMLQuantizationType.Q4_0
        if self.role == SOURCE:
            return GGMLQuantizationType[self.source_rows.loc.dtype]
        return self.entry.type


def reference_jobs(jobs: list[TensorJob]) -> list[TensorJob]:
    """The bf16 reference of a plan: every matrix with a source (exact, probed or copied)
    holds the source's own bytes; everything else (norms, generated and unmapped
    tensors) is written as the plan says, so keys, names and order stay the exact file's."""
    return [
        replace(j, role=SOURCE, note=f"{j.source_rows.loc.dtype}: the source's bytes") if is_source_matrix(j) else j
        for j in jobs
    ]


def llama_q8_0_jobs(jobs: list[TensorJob]) -> list[TensorJob]:
    """The plan of :func:`reference_jobs` with every matrix stored as llama.cpp's converter
    stores it for ``convert_hf_to_gguf.py --outtype q8_0``: gguf-py's
    ``quants.quantize(values, Q8_0)`` of the source's values as float32 (``encode``).

    The rule followed is upstream's ``ModelBase.prepare_tensors`` (``conversion/base.py`` in
    the pinned llama.cpp; ``Gemma4AssistantModel`` adds no ``tensor_force_quant``): 1-D
    tensors and names ending ``_norm.weight`` stay F32, names not ending ``.weight`` stay
    F32, every other tensor is Q8_0 (F16 where a row is not whole blocks). Here every matrix is a 2-D ``.weight``; the 1-D tensors
    keep their plan (F32 norms and scalars, ``rope_freqs``) and so do the tensors without a
    source (the ordered head's I32 ``masked_embd_ordering``, which upstream drops with the
    centroids: kept here, with the centroids as Q8_0, so the file drafts as the bf16
    reference and the exact file do and differs from them only in how weights are stored)."""
    out = []
    for j in jobs:
        if not is_source_matrix(j):
            out.append(j)
            continue
        # a row that is not whole Q8_0 blocks: gguf-py's QuantError, on which upstream stores F16
        qtype = GGMLQuantizationType.F16 if j.entry.cols % 32 else GGMLQuantizationType.Q8_0
        entry = replace(j.entry, type=qtype)
        note = f"{qtype.name.lower()}: llama.cpp's converter's way"
        out.append(replace(j, entry=entry, role=ENCODE, note=note, lossless=None))
    return out


def is_llama_q8_0(jobs: list[TensorJob], stored: dict[str, GGMLQuantizationType]) -> bool:
    """True when a file (``stored``: tensor name -> type) holds the matrices of ``jobs`` as
    :func:`llama_q8_0_jobs` plans them (every one Q8_0, or F16 where a row is not whole blocks)."""
    planned = {j.entry.name: j.entry.type for j in llama_q8_0_jobs(jobs) if is_source_matrix(j)}
    held = {name: t for name, t in planned.items() if name in stored}
    return bool(held) and all(stored[name] == t for name, t in held.items())


def is_source_matrix(job: TensorJob) -> bool:
    """A matrix with a source: what a reference stores in another way (and what
    ``general.file_type`` counts)."""
    return job.source is not None and len(job.entry.ne) >= 2


def is_reference(jobs: list[TensorJob], stored: dict[str, GGMLQuantizationType]) -> bool:
    """True when a file (``stored``: tensor name -> type) holds the matrices of ``jobs`` as a
    bf16 reference does: no planned exact matrix is Q4_0, and every matrix with a source
    that the file has is stored in the source's dtype."""
    matrices = [j for j in jobs if j.source is not None and len(j.entry.ne) >= 2 and j.entry.name in stored]
    return bool(matrices) and all(stored[j.entry.name].name == j.source_rows.loc.dtype for j in matrices)

"""Checking an existing GGUF against the source its tensors must come from.

The file's tensors are matched with the jobs its source implies (the jobs a ``convert``
or ``repack`` would carry out, :mod:`.jobs`) and read in row chunks beside the source.
Verification fails, naming the tensor and the first bad block or value, when a tensor

- is missing, extra, or of another shape;
- should be exact Q4_0 (its source matrix is on the 4-bit grid) but is stored otherwise;
- has a Q4_0 block whose levels are not the source grid's
  (:func:`gguf_exact.core.same_levels.same_levels`: equal up to one factor);
- has a Q4_0 block that decodes further from the source than the exact packer's own
  choice for that block, by more than :data:`SLACK_ULPS` bf16 ULP (so files made by
  another exact scale rule pass, and a wrong scale does not);
- is a float tensor (F32, F16, BF16) whose values are not the source's rounded once to
  that type (for F32, the source itself);
- was generated (``rope_freqs``) and differs from what the config gives.

A source matrix with blocks off the grid has no exact form: whatever the file holds
there is measured, not judged. Every tensor with a source gets its error figures
(:class:`TensorCheck`) whether or not it is judged.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
from gguf import GGMLQuantizationType

from gguf_exact.core import bf16, q4_0
from gguf_exact.core.error_stats import ErrorStats, compare_chunk
from gguf_exact.core.exact import plan_rows
from gguf_exact.core.same_levels import same_levels
from gguf_exact.errors import GgufExactError
from gguf_exact.formats.gguf_file import decode, encode
from gguf_exact.formats.gguf_layout import TensorEntry
from gguf_exact.formats.gguf_reader import GgufFile
from gguf_exact.stream.jobs import DATA, TensorJob

CHUNK_VALUES = 1 << 20
SLACK_ULPS = 1
Q4_0 = GGMLQuantizationType.Q4_0
FLOATS = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16)


@dataclass
class TensorCheck(ErrorStats):
    """:class:`ErrorStats` of one GGUF tensor against its source tensor."""

    name: str = ""  # GGUF name
    source: str = ""  # HF name
    type: str = ""  # GGML type of the stored tensor
    note: str = ""  # how it was judged

    def as_dict(self) -> dict:
        return {"name": self.name, "source": self.source, "type": self.type, "note": self.note} | super().as_dict()


@dataclass
class Verification:
    path: Path
    tensors: list[TensorCheck]
    unchecked: list[str] = field(default_factory=list)  # tensors with no source to check against

    @property
    def total(self) -> TensorCheck:
        total = TensorCheck(name="(all)")
        for t in self.tensors:
            total.add(t)
        return total


class VerificationError(GgufExactError):
    """The file does not hold what its source implies."""


def verify_tensors(
    gguf: GgufFile,
    jobs: list[TensorJob],
    judge: bool = True,
    progress: Callable[[str], None] | None = None,
) -> Verification:
    """Check every tensor of ``gguf`` against its job; raise :class:`VerificationError`
    at the first failure. ``judge=False`` only measures (``compare``): tensors missing
    on either side are skipped and nothing fails."""
    path = gguf.path
    by_name = {t.name: t for t in gguf.tensors}
    planned = {j.entry.name for j in jobs}
    missing = [j.entry.name for j in jobs if j.entry.name not in by_name]
    extra = [t.name for t in gguf.tensors if t.name not in planned]
    if judge and missing:
        raise _fail(path, f"tensor {missing[0]} is missing ({len(missing)} in all)")
    if judge and extra:
        raise _fail(path, f"tensor {extra[0]} has no source tensor ({len(extra)} in all)")
    checks, unchecked = [], list(extra)
    for job in jobs:
        t = by_name.get(job.entry.name)
        if t is None:
            continue
        if t.ne != job.entry.ne:
            raise _fail(path, f"tensor {t.name} has shape {list(t.shape)}, the source {list(job.entry.shape)}")
        if progress:
            progress(t.name)
        if job.role == DATA:
            same = t.type == job.entry.type and np.array_equal(
                gguf.read_rows(t, 0, t.rows).reshape(-1), job.data.reshape(-1)
            )
            if judge and not same:
                raise _fail(path, f"tensor {t.name} differs from what the config gives ({job.note})")
            continue
        if job.source is None:
            unchecked.append(t.name)
            continue
        checks.append(_check_tensor(gguf, t, job, judge))
    return Verification(path, checks, unchecked)


def _fail(path: Path, what: str) -> VerificationError:
    return VerificationError(f"{path}: verification failed: {what}")


def _check_tensor(gguf: GgufFile, t: TensorEntry, job: TensorJob, judge: bool) -> TensorCheck:
    check = TensorCheck(name=t.name, source=job.hf_name or "", type=t.type.name)
    step = max(1, CHUNK_VALUES // max(t.cols, 1))
    exact_expected = job.exact and judge
    on_grid = exact_expected
    first_failure: str | None = None
    for r0 in range(0, t.rows, step):
        r1 = min(t.rows, r0 + step)
        values = job.source.read(r0, r1)
        raw = gguf.read_rows(t, r0, r1)
        check.add(compare_chunk(decode(raw, t.type, (r1 - r0, t.cols)), values))
        if exact_expected and on_grid:
            bits = bf16.from_exact(values)
            plan = plan_rows(bits, r0, histogram=False, score_partial=False) if bits is not None else None
            if plan is None or plan.data is None:
                on_grid = False  # no exact form: measured, not judged
            elif first_failure is None and t.type == Q4_0:
                first_failure = _q4_0_failure(t, r0, raw, plan.data, bits)
        elif judge and not job.exact and t.type in FLOATS and first_failure is None:
            first_failure = _float_failure(t, r0, raw, values)
    if exact_expected and on_grid and t.type != Q4_0:
        raise _fail(
            gguf.path,
            f"tensor {t.name} is {t.type.name}, but its source {job.hf_name} is on the 4-bit grid: exact Q4_0 expected",
        )
    if first_failure is not None and (on_grid or not exact_expected):
        raise _fail(gguf.path, f"tensor {t.name}: {first_failure}")
    if not judge:
        check.note = "measured only"
    elif exact_expected:
        check.note = "exact Q4_0: levels and scales checked" if on_grid else "source off the grid: measured only"
    else:
        check.note = "values checked" if t.type in FLOATS else "measured only"
    return check


def _q4_0_failure(t: TensorEntry, r0: int, raw: np.ndarray, planned: np.ndarray, bits: np.ndarray) -> str | None:
    """The first block of a chunk that holds other levels than the plan's, or decodes
    further from the source than the plan (plus the slack); None when all agree."""
    if np.array_equal(raw, planned):
        return None
    file_blocks, plan_blocks = raw.reshape(-1, q4_0.BLOCK_BYTES), planned.reshape(-1, q4_0.BLOCK_BYTES)
    source = bits.reshape(-1, q4_0.BLOCK_SIZE)
    per_row = t.cols // q4_0.BLOCK_SIZE
    same = same_levels(plan_blocks, file_blocks)

    def ulps(blocks: np.ndarray) -> np.ndarray:
        return bf16.ulp_distance(bf16.from_f32(q4_0.dequantize(blocks)), source).max(axis=1)

    too_far = ulps(file_blocks) > np.maximum(ulps(plan_blocks), SLACK_ULPS)
    bad = np.flatnonzero(~same | too_far)
    if not bad.size:
        return None
    b = int(bad[0])
    where = f"Q4_0 block {r0 * per_row + b} (row {r0 + b // per_row}, column {b % per_row * q4_0.BLOCK_SIZE})"
    if not same[b]:
        return f"{where} holds levels {q4_0.effective_levels(file_blocks[b : b + 1])[0].tolist()}, not the source grid's {q4_0.effective_levels(plan_blocks[b : b + 1])[0].tolist()}"
    return f"{where} decodes up to {int(ulps(file_blocks[b : b + 1])[0])} bf16 ULP from the source; the exact packer's scale gives {int(ulps(plan_blocks[b : b + 1])[0])}"


def _float_failure(t: TensorEntry, r0: int, raw: np.ndarray, values: np.ndarray) -> str | None:
    """The first value of a float tensor that is not the source rounded once to its type."""
    want = np.ascontiguousarray(encode(values, t.type)).view(np.uint8).reshape(raw.shape)
    if np.array_equal(raw, want):
        return None
    item = raw.shape[1] // t.cols
    first = int(np.flatnonzero((raw != want).reshape(-1))[0]) // item
    row, col = r0 + first // t.cols, first % t.cols
    got = float(decode(raw.reshape(-1)[first * item : (first + 1) * item], t.type, (1,))[0])
    expected = float(decode(want.reshape(-1)[first * item : (first + 1) * item], t.type, (1,))[0])
    return f"value at row {row}, column {col} is {got!r}, the source's is {expected!r} ({t.type.name} holds it {'exactly' if t.type == GGMLQuantizationType.F32 else 'rounded once'})"

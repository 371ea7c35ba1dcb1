"""What ``verify`` found: :class:`Verification` (the file's verdict), :class:`TensorCheck` (one
tensor's), :class:`OffGridRule` (what ``--off-grid`` allows for a matrix off the grid), and
the words of a failed block or value.

The result model of :mod:`.verify` (which judges a file against its plan and re-exports
these names), kept apart so that each module is one concept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
from gguf import GGMLQuantizationType

from gguf_exact.core import q4_0
from gguf_exact.core.block_exactness import BlockJudgement
from gguf_exact.core.error_stats import ErrorStats, sum_stats
from gguf_exact.core.same_levels import same_levels
from gguf_exact.errors import ArgumentError, Message, NotExactError, Param, param_name, render
from gguf_exact.formats.gguf_file import TYPES, decode
from gguf_exact.formats.gguf_layout import TensorEntry
from gguf_exact.formats.kv_judge import KeyJudgement

T = GGMLQuantizationType
FLOATS = (T.F32, T.F16, T.BF16)

FALLBACK_TYPES = (T.Q8_0, T.F16, T.BF16, T.F32)  # what --off-grid may store an off-grid matrix as
PASS, FAIL, NOT_JUDGED = "pass", "FAIL", "not judged"
REFERENCE = "the source's bytes, every bit (a bf16 reference)"  # the note of a reference's matrix
LLAMA_WAY = "gguf-py's quantize of the source's values (llama.cpp's converter's way)"  # a Q8_0 peer's matrix
ALLOW = Param("allow_unchecked", api="allow_unchecked=True")
DONOR = Param("donor", value="DONOR.gguf")
KEEP = Param("off_grid", value="keep")


@dataclass(frozen=True)
class OffGridRule:
    """How the writer stores a matrix whose source is off the grid: as one of ``types``
    (the source encoded, from the type the file records or the one ``--off-grid``
    names), or, with ``keep``, as the donor has it."""

    types: tuple[GGMLQuantizationType, ...] = FALLBACK_TYPES
    keep: bool = False
    choice: str | None = None  # the --off-grid value given, for messages

    @classmethod
    def of(cls, choice: str | None, keep_allowed: bool) -> "OffGridRule":
        if choice is None:
            return cls(FALLBACK_TYPES, keep_allowed)
        if choice == "keep":
            if not keep_allowed:
                raise ArgumentError(
                    Param("off_grid"),
                    " keep keeps a donor's tensor: only a re-pack (with ",
                    Param("donor"),
                    ") has one",
                )
            return cls((), True, choice)
        if choice not in TYPES or TYPES[choice] not in FALLBACK_TYPES:
            raise ArgumentError(Param("off_grid"), f" {choice}: expected one of q8_0, f16, bf16, f32")
        return cls((TYPES[choice],), False, choice)

    def words(self) -> str:
        names = [t.name for t in self.types] + (["the donor's tensor (keep)"] if self.keep else [])
        return " or ".join(names)


@dataclass
class TensorCheck(ErrorStats):
    """One tensor of the file: how it was judged, its figures against the source."""

    name: str = ""  # GGUF name
    source: str = ""  # HF name
    type: str = ""  # GGML type stored
    planned: str = ""  # GGML type the plan stores (or what it allows)
    status: str = PASS  # PASS, FAIL or NOT_JUDGED
    note: str = ""  # how it was judged, or why not (a Message where it names a parameter)
    failure: str = ""  # the first failure, with its figures (likewise)
    blocks: BlockJudgement | None = None  # Q4_0 tensors judged block by block
    measured: bool = False  # figures against the source were taken

    def as_dict(self, name: Callable[[Param], str] = param_name) -> dict:
        """``name``: how parameters named in the note and failure are spelled."""
        out: dict[str, object] = {
            "name": self.name, "source": self.source or None, "type": self.type, "planned": self.planned,
            "status": self.status, "note": render(self.note, name),
        }  # fmt: skip
        if self.failure:
            out["failure"] = render(self.failure, name)
        if self.blocks is not None:
            b = self.blocks
            out["blocks"] = {
                "total": b.n_blocks, "as_planned": b.as_planned, "equally_exact": b.equally_exact,
                "more_exact": b.more_exact, "less_exact": b.less_exact,
            }  # fmt: skip
        return out | (super().as_dict() if self.measured else {})


@dataclass
class Verification:
    """The file held to its plan: every tensor's check, every failure, everything that
    could not be judged, and the header's judgement. Lines are ``str``, in the Python
    API's words; those that name a parameter are :class:`~gguf_exact.errors.Message`,
    which a front end renders in its own (``name=`` of :meth:`verdict` and :meth:`as_dict`)."""

    path: Path
    source: Path | None = None
    writer: str = "convert"
    tensors: list[TensorCheck] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)
    keys: KeyJudgement = field(default_factory=KeyJudgement)
    sha256: str | None = None  # the file's, when the caller hashed it (:func:`gguf_exact.verify.verify_file`)

    @property
    def total(self) -> TensorCheck:
        total = TensorCheck(name="(all)", measured=True)
        for t in self.tensors:
            if t.measured:
                total.add(t)
        return total

    @property
    def blocks(self) -> BlockJudgement:
        total = BlockJudgement()
        for t in self.tensors:
            if t.blocks is not None:
                total.add(t.blocks, 0, 0)
        return total

    def ok(self, allow_unchecked: bool = False) -> bool:
        return not self.failures and (allow_unchecked or not self.unchecked)

    def verdict(self, allow_unchecked: bool = False, name: Callable[[Param], str] = param_name) -> str:
        """The one line that ends ``verify``'s output: ``verify: PASS — ...``,
        ``verify: FAIL — ...`` or ``verify: INCOMPLETE — ...``. ``name``: how parameters
        are spelled (default: the Python API's ``allow_unchecked=True``)."""
        return self._verdict(allow_unchecked).render(name)

    def _verdict(self, allow_unchecked: bool) -> Message:
        name = str(self.path)
        if self.failures:
            more = f" ({len(self.failures) - 1} more listed)" if len(self.failures) > 1 else ""
            return Message(
                f"verify: FAIL — {name}: {_count(len(self.failures), 'failure')}; first: ", self.failures[0], more
            )
        judged = [t for t in self.tensors if t.status == PASS]
        q4 = [t for t in judged if t.blocks is not None]
        values = sum_stats(t for t in q4 if t.measured) or ErrorStats()
        b = self.blocks
        line = f"{name}: {_count(len(judged), 'tensor')} and {_count(self.keys.judged, 'key')} judged against {self.source}; "
        source_bytes = [t for t in judged if t.note.endswith(REFERENCE)]
        llama_way = [t for t in judged if t.note.endswith(LLAMA_WAY)]
        if source_bytes and not q4:
            held = sum(t.n_values for t in source_bytes)
            line += f"a bf16 reference: {_count(len(source_bytes), 'matrix', 'matrices')}, {held:,} values, the source's bytes"
        elif llama_way and not q4:
            held = sum(t.n_values for t in llama_way)
            line += f"llama.cpp's Q8_0 way: {_count(len(llama_way), 'matrix', 'matrices')}, {held:,} values, gguf-py's quantize of the source's values"
        else:
            line += (
                f"{_count(len(q4), 'Q4_0 matrix', 'Q4_0 matrices')}, {values.exact_fraction:.4%} of "
                f"{values.n_values:,} values bit-exact, every block as exact as the plan"
            )
        if b.equally_exact or b.more_exact:
            line += f" ({b.equally_exact:,} equally exact with another scale, {b.more_exact:,} more exact)"
        off = [t for t in judged if t.blocks is None and t.note.startswith("off the grid")]
        if off:
            line += f"; {_count(len(off), 'matrix', 'matrices')} off the grid, stored as {self.writer} defines"
        if not self.unchecked:
            return Message(f"verify: PASS — {line}")
        what = Message.joined("; ", self.unchecked)
        if allow_unchecked:
            return Message(f"verify: PASS — {line}; not judged (", ALLOW, "): ", what)
        return Message(
            f"verify: INCOMPLETE — {name}: everything judged passes, but not judged: ", what, "; ", ALLOW,
            " accepts that",
        )  # fmt: skip

    def error(self, allow_unchecked: bool = False) -> NotExactError | None:
        """The error for a file that does not pass (its first failure, or what was not
        judged); None when it passes."""
        if self.failures:
            more = f" (and {_count(len(self.failures) - 1, 'more failure')})" if len(self.failures) > 1 else ""
            return NotExactError(f"{self.path}: verification failed: ", self.failures[0], more)
        if self.unchecked and not allow_unchecked:
            return NotExactError(
                f"{self.path}: not verified: not judged: ", Message.joined("; ", self.unchecked), "; pass ", ALLOW,
                " to accept that",
            )  # fmt: skip
        return None

    def as_dict(self, allow_unchecked: bool = False, name: Callable[[Param], str] = param_name) -> dict:
        """The verdict and every line, for JSON; ``name``: how parameters are spelled."""
        b = self.blocks
        return {
            "ok": self.ok(allow_unchecked),
            "verdict": self.verdict(allow_unchecked, name),
            "path": str(self.path),
            "source": str(self.source) if self.source else None,
            "failures": [render(f, name) for f in self.failures],
            "unchecked": [render(u, name) for u in self.unchecked],
            "keys": {"judged": self.keys.judged, "not_judged": self.keys.unchecked_keys},
            "blocks": {
                "total": b.n_blocks,
                "as_planned": b.as_planned,
                "equally_exact": b.equally_exact,
                "more_exact": b.more_exact,
                "less_exact": b.less_exact,
            },  # fmt: skip
            "total": self.total.as_dict(),
            "tensors": [t.as_dict(name) for t in self.tensors],
        }


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n:,} {one if n == 1 else (many or one + 's')}"


# --- what a failure says -------------------------------------------------------------------


def _block_failure(t: TensorEntry, r0: int, raw: np.ndarray, planned: np.ndarray, judgement: BlockJudgement) -> str:
    """The first less exact block of a chunk, with its true figures."""
    b = judgement.first_less_exact[0]
    per_row = t.cols // q4_0.BLOCK_SIZE
    stored = raw.reshape(-1, q4_0.BLOCK_BYTES)[b.index : b.index + 1]
    plan = planned.reshape(-1, q4_0.BLOCK_BYTES)[b.index : b.index + 1]
    column = b.index % per_row * q4_0.BLOCK_SIZE
    where = f"Q4_0 block {r0 * per_row + b.index} (row {r0 + b.index // per_row}, columns {column}..{column + 31})"
    figures = (
        f"{b.exact} of 32 values bit-exact, the plan's {b.plan_exact}; "
        f"worst {b.worst} bf16 ULP from the source, the plan's {b.plan_worst}"
    )
    if same_levels(stored, plan)[0]:
        d, plan_d = float(q4_0.unpack(stored)[1][0]), float(q4_0.unpack(plan)[1][0])
        how = f"same levels, scale {d!r}, the plan's {plan_d!r}"
    else:
        levels, plan_levels = q4_0.effective_levels(stored)[0].tolist(), q4_0.effective_levels(plan)[0].tolist()
        how = f"levels {levels} are not the source grid's {plan_levels}"
    return f"{where} is less exact than the plan: {figures}; {how}"


def _value_failure(t: TensorEntry, r0: int, raw: np.ndarray, want: np.ndarray) -> str:
    """The first stored value (or block) that differs from the bytes planned for it."""
    if t.type not in FLOATS:
        row = int(np.flatnonzero((raw != want).any(axis=1))[0])
        byte = int(np.flatnonzero(raw[row] != want[row])[0])
        return f"row {r0 + row} differs from the source encoded as {t.type.name} (byte {byte} of the row)"
    item = raw.shape[1] // t.cols
    first = int(np.flatnonzero((raw != want).reshape(-1))[0]) // item
    row, col = r0 + first // t.cols, first % t.cols
    got = float(decode(raw.reshape(-1)[first * item : (first + 1) * item], t.type, (1,))[0])
    expected = float(decode(want.reshape(-1)[first * item : (first + 1) * item], t.type, (1,))[0])
    held = "exactly" if t.type == T.F32 else "rounded once"
    return f"value at row {row}, column {col} is {got!r}; the source's, {held} as {t.type.name}, is {expected!r}"


__all__ = [
    "ALLOW",
    "DONOR",
    "FAIL",
    "FALLBACK_TYPES",
    "FLOATS",
    "KEEP",
    "NOT_JUDGED",
    "PASS",
    "OffGridRule",
    "TensorCheck",
    "Verification",
]

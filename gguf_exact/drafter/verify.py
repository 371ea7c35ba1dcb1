"""``verify`` for a drafter: a gemma4-assistant GGUF held to what ``convert`` writes for
its checkpoint, header to last block.

The checkpoint gives the plan: the tensors a conversion writes
(:func:`gguf_exact.drafter.convert.drafter_jobs`) and every key/value pair
(:func:`gguf_exact.drafter.convert.drafter_kv`), compared as bytes; a file without the
ordered-embedding head is held to ``convert --full-head``'s plan. The ``tokenizer.*``
pairs are the target's, copied by ``--vocab-from``: with the target given they are
compared as bytes too; without it they cannot be judged and are named as such.
:func:`gguf_exact.stream.verify.verify_tensors` judges the tensors. A bf16 reference
(``convert --bf16``: every matrix in the source's dtype) is held to the reference plan,
every matrix the source's bytes; llama.cpp's Q8_0 peer (``convert --llama-q8-0``: every
matrix Q8_0) to that plan as :func:`~gguf_exact.stream.jobs.llama_q8_0_jobs` makes it, every
matrix gguf-py's Q8_0 of the source's values. ``compare`` measures files made any other way with
``judge=False``.
"""

from pathlib import Path
from typing import Callable

from gguf_exact.drafter.convert import GGUF_VERSION, check_target, drafter_jobs, drafter_kv
from gguf_exact.errors import Message, Param
from gguf_exact.formats.checkpoint import Checkpoint
from gguf_exact.formats.gguf_reader import GgufFile, opened
from gguf_exact.formats.kv_judge import KeyJudgement, judge_keys
from gguf_exact.formats.vocab import TargetInfo, Tokenizer, read_target
from gguf_exact.gemma4.assistant import CENTROIDS, AssistantConfig
from gguf_exact.stream.jobs import (
    TensorJob,
    is_llama_q8_0,
    is_reference,
    is_source_matrix,
    llama_q8_0_jobs,
    reference_jobs,
)
from gguf_exact.stream.verify import OffGridRule, TensorCheck, Verification, measure_tensors, verify_tensors

__all__ = ["TensorCheck", "Verification", "verify_gguf"]

NO_TARGET = Message(
    "copied from the target GGUF by convert",
    Param("vocab_from", aside=" {}"),
    "; give ",
    Param("vocab_from", value="TARGET.gguf"),
    " to compare them as bytes",
)


def verify_gguf(
    path: str | Path | GgufFile,
    source_dir: str | Path,
    judge: bool = True,
    progress: Callable[[str], None] | None = None,
    vocab_from: str | Path | None = None,
    off_grid: str | None = None,
    workers: int | None = None,
) -> Verification:
    """Hold the drafter GGUF at ``path`` (or open as a :class:`GgufFile`) to what ``convert`` writes for ``source_dir``
    (``judge=False``: only measure it, for ``compare``). ``vocab_from``: the target
    whose tokenizer the file must carry; ``off_grid``: the ``--off-grid`` choice of the
    conversion (None: the type the file records for an off-grid matrix)."""
    rule = OffGridRule.of(off_grid, keep_allowed=False)
    with opened(path) as gguf:
        with Checkpoint(source_dir) as ckpt:
            cfg = AssistantConfig.from_hf(ckpt.config, str(ckpt.folder / "config.json"))
            if not any(t.name == CENTROIDS for t in gguf.tensors):
                cfg = cfg.full_head()  # convert --full-head's file (or upstream's): judged as that
            jobs = drafter_jobs(ckpt, cfg)
        target = None
        if vocab_from is not None:
            target = read_target(vocab_from)
            check_target(target, cfg, Path(vocab_from))
        if not judge:
            return measure_tensors(gguf, jobs, progress)
        writer = "convert"
        stored = {t.name: t.type for t in gguf.tensors}
        if is_reference(jobs, stored):
            jobs, writer = reference_jobs(jobs), "convert --bf16"
        elif is_llama_q8_0(jobs, stored):
            jobs, writer = llama_q8_0_jobs(jobs), "convert --llama-q8-0"
        keys = judge_drafter_keys(gguf, cfg, jobs, target)
        return verify_tensors(gguf, jobs, keys, rule, None, writer, Path(source_dir), progress, workers)


def judge_drafter_keys(
    gguf: GgufFile, cfg: AssistantConfig, jobs: list[TensorJob], target: TargetInfo | None
) -> KeyJudgement:
    """Every pair of the file against ``drafter_kv``: ``general.file_type`` from the
    matrix types the file holds (a wrong type is the tensor check's failure), the
    tokenizer from ``target`` when given."""
    stored = {t.name: t.type for t in gguf.tensors}
    matrix_types = [stored.get(j.entry.name, j.stored_type) for j in jobs if is_source_matrix(j)]
    no_vocab = TargetInfo(Path(), "", None, Tokenizer((), None, None, None, 0, ""))
    expected = drafter_kv(cfg, target or no_vocab, matrix_types)
    return judge_keys(
        gguf.header.kv,
        expected,
        "convert",
        lambda key: NO_TARGET if target is None and key.startswith("tokenizer.") else None,
        (gguf.header.version, GGUF_VERSION),
    )

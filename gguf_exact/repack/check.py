"""``verify`` for a re-packed file: a ``gemma4`` GGUF (or a re-packed drafter) held to
what ``repack`` writes, header to last block.

With the donor (``--donor``) the plan is the re-pack's own: the donor's tensor list
mapped onto the source (:func:`gguf_exact.repack.tensor_map.build_map`), every tensor a
re-pack copies compared with the donor's bytes, and every donor key carried byte for
byte but ``general.file_type``, which is the file's matrix types'
(:func:`gguf_exact.repack.pipeline.output_kv`).

Without the donor the plan comes from the source alone, as llama.cpp's converter lays
the model out (:func:`planned_entries`): one tensor per text-model source tensor, norms
F32 holding the source's values, ``rope_freqs`` from the config, the hyperparameter keys
(:func:`gguf_exact.gemma4.hparams.text_fields`) as bytes. The donor's own keys
(tokenizer, chat template, name) and tensors a re-pack keeps from it cannot be judged
then: they are named, and ``verify`` fails unless told to allow them. A tensor the plan
does not know fails as extra; a planned one the file lacks, as missing.
"""

from pathlib import Path
from typing import Callable

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType

from gguf_exact.errors import InputError, Message, Param
from gguf_exact.formats.checkpoint import Checkpoint
from gguf_exact.formats.gguf_file import file_type
from gguf_exact.formats.gguf_layout import TensorEntry, encode_kv
from gguf_exact.formats.gguf_reader import GgufFile, opened
from gguf_exact.formats.kv_judge import NUMERIC, KeyJudgement, judge_keys
from gguf_exact.formats.vocab import TOKENS_KEY
from gguf_exact.gemma4 import names as gemma4_names
from gguf_exact.gemma4.hparams import TextHparams, rope_freqs, text_fields
from gguf_exact.repack.donor import open_donor
from gguf_exact.repack.pipeline import output_kv
from gguf_exact.repack.tensor_map import _by_gguf_name, _text, build_map, check_same_model
from gguf_exact.stream.jobs import DATA, GENERATED, TensorJob, is_reference, reference_jobs
from gguf_exact.stream.source_rows import TensorLocation, locate
from gguf_exact.stream.verify import OffGridRule, Verification, measure_tensors, verify_tensors

T = GGMLQuantizationType
NO_DONOR = Message(
    "repack copies them from the donor; give ", Param("donor", value="DONOR.gguf"), " to compare them as bytes"
)


def verify_model(
    path: str | Path | GgufFile,
    source_dir: str | Path,
    judge: bool = True,
    progress: Callable[[str], None] | None = None,
    donor: str | Path | None = None,
    off_grid: str | None = None,
    workers: int | None = None,
) -> Verification:
    """Hold the GGUF at ``path`` (or open as a :class:`GgufFile`) to what ``repack`` writes from ``source_dir`` (and
    ``donor`` when given); ``judge=False`` only measures the tensors that have a source."""
    source_dir = Path(source_dir)
    rule = OffGridRule.of(off_grid, keep_allowed=True)
    with opened(path) as gguf, Checkpoint(source_dir) as ckpt:
        config_path = ckpt.folder / "config.json"
        locations = locate(ckpt)
        config = ckpt.config
        if donor is not None:
            with open_donor(donor, "donor") as d:
                check_same_model(d.path, d.header.value, d.architecture, config, config_path)
                jobs = build_map(d.path, d.architecture, d.tensors, locations, source_dir).jobs
                if not judge:
                    return measure_tensors(gguf, jobs, progress)
                jobs, writer = _as_written(gguf, jobs)
                expected = output_kv(d, _written_types(gguf, jobs))[0]
                keys = judge_keys(gguf.header.kv, expected, writer, version=(gguf.header.version, d.header.version))
                return verify_tensors(gguf, jobs, keys, rule, d, writer, source_dir, progress, workers)
        archs = config.get("architectures")
        if not isinstance(archs, list) or not any(a in gemma4_names.SUPPORTED_ARCHITECTURES for a in archs):
            raise InputError(
                f"{config_path}: architectures {archs} is not supported; expected one of "
                f"{', '.join(gemma4_names.SUPPORTED_ARCHITECTURES)} (a drafter is verified as convert writes it, "
                "or with ",
                Param("donor"),
                " as repack writes it)",
            )
        hp = TextHparams.from_hf(_text(config), str(config_path))
        entries = planned_entries(gguf, locations)
        jobs = build_map(gguf.path, gemma4_names.ARCH, entries, locations, source_dir).jobs
        jobs = [_generated(j, hp) if j.role == GENERATED else j for j in jobs]
        if not judge:
            return measure_tensors(gguf, jobs, progress)
        jobs, writer = _as_written(gguf, jobs)
        keys = judge_model_keys(gguf, hp)
        return verify_tensors(gguf, jobs, keys, rule, None, writer, source_dir, progress, workers)


def _as_written(gguf: GgufFile, jobs: list[TensorJob]) -> tuple[list[TensorJob], str]:
    """The plan the file is held to, and its writer's name: a bf16 reference (every matrix
    in the source's dtype) is held to ``repack --bf16``'s, any other file to ``repack``'s."""
    if is_reference(jobs, {t.name: t.type for t in gguf.tensors}):
        return reference_jobs(jobs), "repack --bf16"
    return jobs, "repack"


def _written_types(gguf: GgufFile, jobs: list[TensorJob]) -> list[tuple[TensorEntry, GGMLQuantizationType]]:
    """(planned entry, type the file holds it as) for ``general.file_type``; a missing
    tensor counts as planned (its absence is the tensor check's failure)."""
    stored = {t.name: t.type for t in gguf.tensors}
    return [(j.entry, stored.get(j.entry.name, j.stored_type)) for j in jobs]


def _generated(job: TensorJob, hp: TextHparams) -> TensorJob:
    """``rope_freqs`` as the config gives it (the donor's bytes are what a re-pack keeps;
    without the donor they must be what llama.cpp's converter computes)."""
    freqs = rope_freqs(hp)
    entry = TensorEntry(job.entry.name, freqs.shape, T.F32)
    return TensorJob(entry, DATA, job.kind, note="generated from config.json", data=freqs.view(np.uint8).reshape(1, -1))


def planned_entries(gguf: GgufFile, locations: dict[str, TensorLocation]) -> list[TensorEntry]:
    """The tensors llama.cpp's converter writes for the source, with the types a re-pack
    stores them in (Q4_0 for matrices, subject to the grid; F32 for the rest), in the
    file's order where it has them. Two choices a donor makes are read from the file:
    expert banks fused or split into gate and up halves, and ``token_embd`` cut to the
    tokenizer's length (upstream drops rows past the vocabulary)."""
    by_gguf, _ = _by_gguf_name(gemma4_names.ARCH, list(locations))
    names = {t.name for t in gguf.tensors}
    n_tokens = gguf.array_length(TOKENS_KEY)
    entries = {}
    for gguf_name, (hf_name, role) in by_gguf.items():
        shape = locations[hf_name].shape or (1,)
        qtype = T.Q4_0 if role in (gemma4_names.QAT, gemma4_names.PROBE) and len(shape) >= 2 else T.F32
        if gguf_name.endswith(".ffn_gate_up_exps.weight"):
            layer = gguf_name.rsplit(".ffn_gate_up_exps.weight", 1)[0]
            halves = [f"{layer}.{half}" for half in gemma4_names.SPLIT_EXPERTS]
            if any(h in names for h in halves) and len(shape) == 3:
                for h in halves:
                    entries[h] = TensorEntry(h, (shape[2], shape[1] // 2, shape[0]), qtype)
                continue
        if gguf_name == "token_embd.weight" and n_tokens and n_tokens < shape[0]:
            shape = (n_tokens, *shape[1:])
        entries[gguf_name] = TensorEntry(gguf_name, tuple(reversed(shape)), qtype)
    entries.setdefault(gemma4_names.GENERATED[0], TensorEntry(gemma4_names.GENERATED[0], (0,), T.F32))
    order = {t.name: i for i, t in enumerate(gguf.tensors)}
    return sorted(entries.values(), key=lambda e: order.get(e.name, len(order)))


def judge_model_keys(gguf: GgufFile, hp: TextHparams) -> KeyJudgement:
    """The keys a re-pack's output must hold whatever its donor: the architecture, the
    hyperparameters the config gives (as upstream's converter writes them, compared as
    bytes) and ``general.file_type`` of the file's matrices (in the donor's value type);
    every other key is the donor's and is named as not judged."""
    matrices = [t.type for t in gguf.tensors if len(t.ne) >= 2]
    stored = gguf.header.fields.get("general.file_type")
    vtype = stored.vtype if stored is not None and stored.vtype in NUMERIC else GGUFValueType.UINT32
    expected = [
        encode_kv("general.architecture", GGUFValueType.STRING, gemma4_names.ARCH),
        encode_kv("general.file_type", vtype, file_type(matrices)),
        *(f.encode() for f in text_fields(gemma4_names.ARCH, hp)),
    ]
    return judge_keys(gguf.header.kv, expected, "repack", lambda key: NO_DONOR)

"""Checks on a target and drafter before llama-server sees them.

Each failure is one line that names the file and field: both files must be GGUF, the
target ``gemma4`` and the drafter ``gemma4-assistant``, the drafter's
``embedding_length_out`` equal to the target's ``embedding_length``, their
vocabularies the same, and each file's sha256 equal to the one in ``checksums/``
when its name is listed there.
"""

import hashlib
from dataclasses import dataclass
from pathlib import Path

from gguf import GGUFReader

from gguf_exact.errors import GgufExactError
from gguf_exact.formats.gguf_file import sha256_file
from gguf_exact.formats.vocab import field_value, open_gguf
from gguf_exact.hub import checksums as pins

TARGET_ARCH = "gemma4"
DRAFTER_ARCH = "gemma4-assistant"
CHECKSUM_DIR = pins.CHECKSUMS_DIR
VOCAB_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id")


@dataclass(frozen=True)
class ModelFile:
    """What serving needs to know about one GGUF."""

    path: Path
    architecture: str
    embedding_length: int | None
    embedding_length_out: int | None
    weight_bytes: int
    n_tensors: int
    vocab: tuple  # (model, bos, eos, n_tokens, tokens digest)
    sha256: str | None = None  # set when the file is listed in checksums/ (and matched)


@dataclass(frozen=True)
class ServePair:
    target: ModelFile
    drafter: ModelFile | None


def _tokens_digest(reader: GGUFReader) -> tuple[str, int]:
    field = reader.fields.get("tokenizer.ggml.tokens")
    if field is None:
        return "", 0
    h = hashlib.sha256()
    for i in field.data:
        piece = bytes(field.parts[i])
        h.update(len(piece).to_bytes(4, "little") + piece)
    return h.hexdigest(), len(field.data)


def read_model(path: str | Path, role: str) -> ModelFile:
    """Architecture, widths, weight bytes and vocabulary of one GGUF (``role``: target/drafter)."""
    path = Path(path)
    if not path.is_file():
        raise GgufExactError(f"{role} {path}: no such file")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise GgufExactError(f"{role} {path}: not a GGUF file (starts with {magic!r}); pass a .gguf model")
    reader = open_gguf(path)
    arch = field_value(reader, "general.architecture") or "?"
    digest, n_tokens = _tokens_digest(reader)
    vocab = tuple(field_value(reader, k) for k in VOCAB_KEYS) + (n_tokens, digest)
    return ModelFile(
        path=path,
        architecture=arch,
        embedding_length=field_value(reader, f"{arch}.embedding_length"),
        embedding_length_out=field_value(reader, f"{arch}.embedding_length_out"),
        weight_bytes=int(sum(int(t.n_bytes) for t in reader.tensors)),
        n_tensors=len(reader.tensors),
        vocab=vocab,
    )


def listed_checksums(checksum_dir: Path | None = None) -> dict[str, str]:
    """File name -> sha256 from every ``*.sha256`` file in ``checksums/`` (read with
    :mod:`gguf_exact.hub.checksums`; entries are ``<repo>/<file>`` or bare names, matched by base name)."""
    checksum_dir = CHECKSUM_DIR if checksum_dir is None else checksum_dir
    listed: dict[str, str] = {}
    for file in sorted(Path(checksum_dir).glob("*.sha256")):
        for entry in pins.read(file).entries:
            listed[entry.path.rsplit("/", 1)[-1]] = entry.sha256
    return listed


def check_listed_sha256(model: ModelFile, role: str, listed: dict[str, str]) -> ModelFile:
    """Hash the file when its name is listed; stop on a mismatch."""
    expected = listed.get(model.path.name)
    if expected is None:
        return model
    actual = sha256_file(model.path)
    if actual != expected:
        raise GgufExactError(
            f"{role} {model.path}: sha256 {actual} differs from {expected} listed in checksums/ for "
            f"{model.path.name}; the file is damaged or not the published one, download it again"
        )
    return ModelFile(**{**model.__dict__, "sha256": actual})


def check_pair(
    target: str | Path, drafter: str | Path | None = None, checksums: dict[str, str] | None = None
) -> ServePair:
    """Read and check a target (and drafter) for draft-mtp serving; see the module doc."""
    listed = listed_checksums() if checksums is None else checksums
    t = read_model(target, "target")
    if t.architecture != TARGET_ARCH:
        hint = " (that is a drafter: pass it as --draft)" if t.architecture == DRAFTER_ARCH else ""
        raise GgufExactError(
            f"target {t.path}: general.architecture is {t.architecture!r}, expected {TARGET_ARCH!r}{hint}"
        )
    t = check_listed_sha256(t, "target", listed)
    if drafter is None:
        return ServePair(t, None)
    d = read_model(drafter, "drafter")
    if d.architecture != DRAFTER_ARCH:
        hint = (
            "; that is a target model, --draft takes its MTP assistant (gguf-exact convert makes one)"
            if d.architecture == TARGET_ARCH
            else ""
        )
        raise GgufExactError(
            f"drafter {d.path}: general.architecture is {d.architecture!r}, expected {DRAFTER_ARCH!r}{hint}"
        )
    if d.embedding_length_out != t.embedding_length:
        raise GgufExactError(
            f"drafter {d.path}: {DRAFTER_ARCH}.embedding_length_out is {d.embedding_length_out} but the target's "
            f"{TARGET_ARCH}.embedding_length is {t.embedding_length} ({t.path}); use the assistant made for this target size"
        )
    if d.vocab != t.vocab:
        names = ("tokenizer model", "BOS id", "EOS id", "token count", "token list")
        which = next(n for n, a, b in zip(names, d.vocab, t.vocab) if a != b)
        raise GgufExactError(
            f"drafter {d.path}: vocabulary differs from the target's ({which}); convert it again with --vocab-from {t.path}"
        )
    d = check_listed_sha256(d, "drafter", listed)
    return ServePair(t, d)

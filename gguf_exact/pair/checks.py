"""Checks on a target and drafter before llama-server sees them.

Each failure is one line that names the file and field: both files must be GGUF, the
target ``gemma4`` and the drafter ``gemma4-assistant``, the drafter's
``embedding_length_out`` equal to the target's ``embedding_length``, each drafter
layer's K and V rows as wide as the target cache it reads (llama.cpp views it
unchecked), their vocabularies the same, and each file's sha256 equal to the one in
``checksums/`` when its name is listed there.
"""

from dataclasses import dataclass, field, replace
from pathlib import Path

from gguf_exact.errors import InputError, NotExactError, PairError, Param
from gguf_exact.formats.gguf_file import sha256_file
from gguf_exact.formats.gguf_layout import TensorEntry
from gguf_exact.formats.gguf_reader import GgufFile, open_gguf
from gguf_exact.formats.vocab import Tokenizer, tokenizer_of
from gguf_exact.gemma4.assistant import ARCH as DRAFTER_ARCH
from gguf_exact.gemma4.names import ARCH as TARGET_ARCH
from gguf_exact.hub import checksums as pins

CHECKSUM_DIR = pins.CHECKSUMS_DIR


@dataclass(frozen=True)
class ModelFile:
    """What serving needs to know about one GGUF, read from its header once; pass it
    along (:func:`check_pair`, :func:`~gguf_exact.engines.shared.memory_plan.plan_memory`) instead
    of the path, and the header is not read again."""

    path: Path
    architecture: str
    embedding_length: int | None
    embedding_length_out: int | None
    weight_bytes: int
    n_tensors: int
    tokenizer: Tokenizer
    sha256: str | None = None  # set when the file is listed in checksums/ (and matched)
    digest: str | None = field(default=None, repr=False, compare=False)  # its sha256, once computed for any check
    header: GgufFile | None = field(default=None, repr=False, compare=False)  # parsed header, closed (no fd)

    def geometry(self):
        """The text stack's :class:`~gguf_exact.pair.geometry.Geometry`, from the header read before."""
        from gguf_exact.pair.geometry import Geometry

        return Geometry.from_gguf(self.header)

    @property
    def tensors(self) -> list[TensorEntry]:
        """The tensor table of the header read before (every ModelFile :func:`read_model` makes has one)."""
        if self.header is None:
            raise InputError(f"{self.path}: its header was not read")
        return self.header.tensors


@dataclass(frozen=True)
class ServePair:
    target: ModelFile
    drafter: ModelFile | None


def read_model(path: "str | Path | ModelFile", role: str) -> ModelFile:
    """Architecture, widths, weight bytes and vocabulary of one GGUF (``role``: target/drafter);
    a :class:`ModelFile` already read is returned as it is."""
    if isinstance(path, ModelFile):
        return path
    with open_gguf(path, role) as gguf:
        return ModelFile(
            path=Path(path),
            architecture=gguf.architecture or "?",
            embedding_length=gguf.arch_value("embedding_length"),
            embedding_length_out=gguf.arch_value("embedding_length_out"),
            weight_bytes=sum(t.nbytes for t in gguf.tensors),
            n_tensors=len(gguf.tensors),
            tokenizer=tokenizer_of(gguf),
            header=GgufFile(gguf.path, gguf.header, gguf.size, -1),
        )


def listed_checksums(checksum_dir: Path | None = None) -> dict[str, str]:
    """File name -> sha256 from every ``*.sha256`` file in ``checksums/`` (read with
    :mod:`gguf_exact.hub.checksums`; entries are ``<repo>/<file>`` or bare names, matched by base name)."""
    checksum_dir = CHECKSUM_DIR if checksum_dir is None else Path(checksum_dir)
    listed: dict[str, str] = {}
    # the project's folder comes with the user's pins (`gguf-exact pin` of an installed gguf-exact)
    for file in pins.checksum_files(None if checksum_dir == pins.CHECKSUMS_DIR else checksum_dir):
        for entry in pins.read(file).entries:
            listed[entry.path.rsplit("/", 1)[-1]] = entry.sha256
    return listed


def hashed(model: ModelFile) -> ModelFile:
    """``model`` with its sha256 computed (:attr:`ModelFile.digest`), once."""
    return model if model.digest else replace(model, digest=sha256_file(model.path))


def listed_sizes(checksum_dir: Path | None = None) -> dict[str, int]:
    """File name -> size in bytes, where ``checksums/`` records one (as :func:`listed_checksums`)."""
    checksum_dir = CHECKSUM_DIR if checksum_dir is None else Path(checksum_dir)
    files = pins.checksum_files(None if checksum_dir == pins.CHECKSUMS_DIR else checksum_dir)
    return {path.rsplit("/", 1)[-1]: size for file in files for path, size in pins.read(file).sizes.items()}


def check_listed_sha256(
    model: ModelFile, role: str, listed: dict[str, str], sizes: dict[str, int] | None = None
) -> ModelFile:
    """Hash the file when its name is listed, after its size where one is listed (a file
    of another size is refused unhashed); stop on a mismatch."""
    expected = listed.get(model.path.name)
    if expected is None:
        return model
    size, pinned = model.path.stat().st_size, (sizes or {}).get(model.path.name)
    if pinned is not None and size != pinned:
        raise NotExactError(
            f"{role} {model.path}: {size:,} bytes, {pinned:,} listed in checksums/ for {model.path.name}; "
            "the file is cut short, damaged or not the published one, download it again"
        )
    actual = model.digest or sha256_file(model.path)  # hashed before: not again
    if actual != expected:
        raise NotExactError(
            f"{role} {model.path}: sha256 {actual} differs from {expected} listed in checksums/ for "
            f"{model.path.name}; the file is damaged or not the published one, download it again"
        )
    return replace(model, sha256=actual, digest=actual)


def kv_mismatch(target: "str | Path | ModelFile", drafter: "str | Path | ModelFile") -> str | None:
    """Where the drafter would read the target's KV cache with rows of another width, or
    None. llama.cpp gives each ``gemma4-assistant`` sliding layer the target's layer
    ``n_layer - 2`` cache and each full layer ``n_layer - 1``'s (``llama-model.cpp``, the
    ``share`` callback) and views it with the drafter's own K/V widths."""
    tg = read_model(target, "target").geometry()
    dg = read_model(drafter, "drafter").geometry()
    for il in range(dg.n_layer):
        src = tg.n_layer - (2 if dg.swa[il] else 1)
        kind = "sliding" if dg.swa[il] else "full-attention"
        for what, mine, theirs in (("K", dg.k_width(il), tg.k_width(src)), ("V", dg.v_width(il), tg.v_width(src))):
            if mine != theirs:
                return (
                    f"layer {il} ({kind}) reads the target's layer {src} KV cache, whose {what} rows are {theirs} wide, "
                    f"with {what} rows {mine} wide (head_count_kv x key/value length)"
                )
    return None


def check_pair(
    target: "str | Path | ModelFile",
    drafter: "str | Path | ModelFile | None" = None,
    checksums: dict[str, str] | None = None,
) -> ServePair:
    """Read and check a target (and drafter) for draft-mtp serving; see the module doc.
    Files given as :class:`ModelFile` are not read again, nor hashed again once hashed."""
    listed = listed_checksums() if checksums is None else checksums
    sizes = listed_sizes() if checksums is None else {}
    t = read_model(target, "target")
    if t.architecture != TARGET_ARCH:
        hint = (" (that is a drafter: pass it as ", Param("draft"), ")") if t.architecture == DRAFTER_ARCH else ()
        raise PairError(f"target {t.path}: general.architecture is {t.architecture!r}, expected {TARGET_ARCH!r}", *hint)
    t = check_listed_sha256(t, "target", listed, sizes)
    if drafter is None:
        return ServePair(t, None)
    d = read_model(drafter, "drafter")
    if d.architecture != DRAFTER_ARCH:
        hint = (
            ("; that is a target model, ", Param("draft"), " takes its MTP assistant (gguf-exact convert makes one)")
            if d.architecture == TARGET_ARCH
            else ()
        )
        raise PairError(
            f"drafter {d.path}: general.architecture is {d.architecture!r}, expected {DRAFTER_ARCH!r}", *hint
        )
    if d.embedding_length_out != t.embedding_length:
        raise PairError(
            f"drafter {d.path}: {DRAFTER_ARCH}.embedding_length_out is {d.embedding_length_out} but the target's "
            f"{TARGET_ARCH}.embedding_length is {t.embedding_length} ({t.path}); use the assistant made for this target size"
        )
    mismatch = kv_mismatch(t, d)
    if mismatch is not None:
        raise PairError(f"drafter {d.path}: {mismatch} ({t.path}); use the assistant made for this target size")
    which = t.tokenizer.first_difference(d.tokenizer)
    if which is not None:
        raise PairError(
            f"drafter {d.path}: vocabulary differs from the target's ({which}); convert it again with ",
            Param("vocab_from"),
            f" {t.path}",
        )
    d = check_listed_sha256(d, "drafter", listed, sizes)
    return ServePair(t, d)

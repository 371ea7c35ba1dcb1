"""The vocabulary a drafter borrows from its target GGUF (``tokenizer.*`` keys).

Speculation in llama.cpp checks that drafter and target share vocabulary type,
tokens and BOS/EOS, so the drafter carries the target's keys byte for byte.
"""

from dataclasses import dataclass
from pathlib import Path

from gguf import GGUFReader, GGUFValueType

from gguf_exact.errors import GgufExactError
from gguf_exact.gemma4.assistant import Field


@dataclass(frozen=True)
class TargetInfo:
    path: Path
    architecture: str
    embedding_length: int | None
    vocab_size: int
    tokenizer_fields: list[Field]


def open_gguf(path: str | Path) -> GGUFReader:
    """GGUFReader with one-line errors for files that are not GGUF."""
    path = Path(path)
    if not path.is_file():
        raise GgufExactError(f"{path}: no such file")
    try:
        return GGUFReader(path)
    except Exception as err:  # gguf-py raises ValueError, struct.error, IndexError...
        raise GgufExactError(f"{path}: not a readable GGUF file ({err})") from None


def field_value(reader: GGUFReader, key: str):
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def copy_field(field) -> Field:
    """A reader field as a writable :class:`Field`, strings kept as raw bytes."""
    vtype = field.types[0]
    if vtype == GGUFValueType.ARRAY:
        sub = field.types[-1]
        if sub == GGUFValueType.STRING:
            value = [bytes(field.parts[i]) for i in field.data]
        else:
            value = [v for i in field.data for v in field.parts[i].tolist()]
        return Field(field.name, value, vtype, sub)
    if vtype == GGUFValueType.STRING:
        return Field(field.name, bytes(field.parts[field.data[0]]), vtype)
    return Field(field.name, field.contents(), vtype)


def read_target(path: str | Path) -> TargetInfo:
    """Read the target's architecture, width and tokenizer keys."""
    reader = open_gguf(path)
    arch = field_value(reader, "general.architecture") or "?"
    fields = [copy_field(f) for name, f in reader.fields.items() if name.startswith("tokenizer.")]
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if not fields or tokens is None:
        raise GgufExactError(f"{path}: has no tokenizer.* keys (tokenizer.ggml.tokens); pass the target model's GGUF")
    return TargetInfo(
        path=Path(path),
        architecture=arch,
        embedding_length=field_value(reader, f"{arch}.embedding_length"),
        vocab_size=len(tokens.data),
        tokenizer_fields=fields,
    )

"""The vocabulary a drafter borrows from its target GGUF (its ``tokenizer.*`` keys).

Speculation in llama.cpp checks that drafter and target share vocabulary type, tokens
and BOS/EOS, so the drafter carries the target's keys byte for byte. They are handled
as the raw bytes of their key/value pairs (:meth:`GgufFile.raw_pairs`): a Gemma 4
vocabulary is 262,144 tokens plus merges, and no per-token object is ever made, to
copy it or to compare two of them.
"""

import hashlib
import struct
from dataclasses import dataclass
from pathlib import Path

from gguf_exact.errors import InputError
from gguf_exact.formats.gguf_reader import GgufFile, open_gguf

TOKENS_KEY = "tokenizer.ggml.tokens"


@dataclass(frozen=True)
class Tokenizer:
    """A GGUF's ``tokenizer.*`` keys: the raw pairs, and what is compared between files."""

    pairs: tuple[bytes, ...]  # every tokenizer.* pair as stored, in file order
    model: str | None  # tokenizer.ggml.model
    bos: int | None
    eos: int | None
    n_tokens: int
    tokens_sha256: str  # of the stored tokenizer.ggml.tokens pair: equal digests, equal token lists

    @property
    def identity(self) -> tuple:
        """What must match between a drafter and its target."""
        return (self.model, self.bos, self.eos, self.n_tokens, self.tokens_sha256)

    def first_difference(self, other: "Tokenizer") -> str | None:
        """The first way ``other`` differs from this one, in words (a token list that
        differs names the first token, ``other``'s text first); None when they match."""
        names = ("tokenizer model", "BOS id", "EOS id", "token count", "token list")
        which = next((n for n, a, b in zip(names, self.identity, other.identity) if a != b), None)
        if which == "token list":  # only now are tokens read one by one, to name the first
            ours, theirs = self.tokens(), other.tokens()
            i = next(i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b)
            which = f"token {i} is {theirs[i]!r}, not {ours[i]!r}"
        return which

    def tokens(self) -> list[bytes]:
        """The token texts, as bytes (a Python object each: for error messages, not checks)."""
        pair = next((p for p in self.pairs if p[8 : 8 + len(TOKENS_KEY)] == TOKENS_KEY.encode()), None)
        if pair is None:
            return []
        pos = 8 + len(TOKENS_KEY) + 4 + 4  # key, type (array), element type (string)
        (count,) = struct.unpack_from("<Q", pair, pos)
        pos += 8
        out = []
        for _ in range(count):
            (n,) = struct.unpack_from("<Q", pair, pos)
            out.append(pair[pos + 8 : pos + 8 + n])
            pos += 8 + n
        return out


def tokenizer_of(gguf: GgufFile) -> Tokenizer:
    """The ``tokenizer.*`` keys of an open GGUF (no tokens: an empty :class:`Tokenizer`)."""
    tokens = next((kv for kv in gguf.header.kv if kv.key == TOKENS_KEY), None)
    return Tokenizer(
        pairs=tuple(gguf.raw_pairs("tokenizer.")),
        model=gguf.value("tokenizer.ggml.model"),
        bos=gguf.value("tokenizer.ggml.bos_token_id"),
        eos=gguf.value("tokenizer.ggml.eos_token_id"),
        n_tokens=gguf.array_length(TOKENS_KEY) or 0,
        tokens_sha256=hashlib.sha256(tokens.raw).hexdigest() if tokens is not None else "",
    )


@dataclass(frozen=True)
class TargetInfo:
    path: Path
    architecture: str
    embedding_length: int | None
    tokenizer: Tokenizer

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.n_tokens


def read_target(path: str | Path) -> TargetInfo:
    """The target's architecture, width and tokenizer keys (header only); a drafter's GGUF gives
    the width of the target it drafts for."""
    with open_gguf(path) as gguf:
        tokenizer = tokenizer_of(gguf)
        if not tokenizer.n_tokens:
            raise InputError(f"{path}: has no tokenizer.* keys ({TOKENS_KEY}); pass the target model's GGUF")
        # a drafter's GGUF lends its vocabulary as well: the width it drafts for is embedding_length_out
        width = "embedding_length_out" if gguf.architecture == "gemma4-assistant" else "embedding_length"
        return TargetInfo(Path(path), gguf.architecture or "?", gguf.arch_value(width), tokenizer)

"""Vocabularies for test and benchmark GGUFs.

:func:`gemma4_vocabulary`: one the size of Gemma 4's (262,144 tokens, BPE merges on
top, tokenizer model ``gemma4``), with the same kinds of keys and value types as a real
Gemma 4 GGUF; the pieces are made up. What real-size metadata costs to read, copy and
compare is measured on it (``scripts/bench_convert.py``, ``scripts/bench_checks.py``).
"""

from dataclasses import dataclass, field

import numpy as np
from gguf import TokenType

GEMMA4_VOCAB = 262_144
GEMMA4_MERGES = 500_000
# A Gemma-style chat template (the turn markers of Gemma's own), for llama-cpp-python's Jinja formatter.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "<start_of_turn>{{ role }}\n{{ message['content'] | trim }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


@dataclass
class Vocabulary:
    """The ``tokenizer.*`` content of a GGUF."""

    model: str
    tokens: list[str]
    scores: list[float]
    types: list[int]
    merges: list[str] = field(default_factory=list)
    bos: int = 1
    eos: int = 2
    unk: int = 0
    pad: int | None = None
    chat_template: str | None = None


def gemma4_vocabulary(n_tokens: int = GEMMA4_VOCAB, n_merges: int = GEMMA4_MERGES, seed: int = 0) -> Vocabulary:
    """A made-up vocabulary of Gemma 4's size and key types: specials, 256 byte tokens,
    unique pieces of 1-12 letters (half with the ``▁`` word mark), and ``n_merges``
    merges ``"left right"`` of existing pieces."""
    rng = np.random.default_rng(seed)
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
    tokens = specials + [f"<0x{b:02X}>" for b in range(256)]
    types = [TokenType.CONTROL] * len(specials) + [TokenType.BYTE] * 256
    seen = set(tokens)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyzáéíóúñçøåæ"))
    while len(tokens) < n_tokens:
        need = n_tokens - len(tokens)
        lengths = rng.integers(1, 13, need)
        marks = rng.random(need) < 0.5
        picks = rng.integers(0, letters.size, int(lengths.sum()))
        pos = 0
        for n, mark in zip(lengths.tolist(), marks.tolist()):
            piece = ("▁" if mark else "") + "".join(letters[picks[pos : pos + n]])
            pos += n
            if piece not in seen:
                seen.add(piece)
                tokens.append(piece)
    types += [TokenType.NORMAL] * (n_tokens - len(types))
    scores = (-np.arange(n_tokens, dtype=np.float32)).tolist()
    left = rng.integers(len(specials) + 256, n_tokens, n_merges)
    right = rng.integers(len(specials) + 256, n_tokens, n_merges)
    merges = [f"{tokens[a]} {tokens[b]}" for a, b in zip(left.tolist(), right.tolist())]
    return Vocabulary(
        "gemma4",
        tokens,
        scores,
        [int(t) for t in types],
        merges,
        bos=2,
        eos=1,
        unk=3,
        pad=0,
        chat_template=CHAT_TEMPLATE,
    )


def add_vocabulary(writer, vocab: Vocabulary) -> None:
    """Write ``vocab`` as ``tokenizer.*`` keys with gguf-py's ``GGUFWriter``."""
    writer.add_tokenizer_model(vocab.model)
    writer.add_token_list(vocab.tokens)
    writer.add_token_scores(vocab.scores)
    writer.add_token_types(vocab.types)
    if vocab.merges:
        writer.add_token_merges(vocab.merges)
    writer.add_unk_token_id(vocab.unk)
    writer.add_bos_token_id(vocab.bos)
    writer.add_eos_token_id(vocab.eos)
    if vocab.pad is not None:
        writer.add_pad_token_id(vocab.pad)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    if vocab.chat_template:
        writer.add_chat_template(vocab.chat_template)


def vocabulary_pairs(vocab: Vocabulary) -> list[bytes]:
    """``vocab`` as ``tokenizer.*`` key/value pairs, as bytes (what a GGUF header holds)."""
    from gguf import GGUFValueType as T

    from gguf_exact.formats.gguf_layout import Field

    fields = [
        Field("tokenizer.ggml.model", vocab.model, T.STRING),
        Field("tokenizer.ggml.tokens", vocab.tokens, T.ARRAY, T.STRING),
        Field("tokenizer.ggml.scores", vocab.scores, T.ARRAY, T.FLOAT32),
        Field("tokenizer.ggml.token_type", vocab.types, T.ARRAY, T.INT32),
    ]
    if vocab.merges:
        fields.append(Field("tokenizer.ggml.merges", vocab.merges, T.ARRAY, T.STRING))
    fields += [
        Field("tokenizer.ggml.unknown_token_id", vocab.unk, T.UINT32),
        Field("tokenizer.ggml.bos_token_id", vocab.bos, T.UINT32),
        Field("tokenizer.ggml.eos_token_id", vocab.eos, T.UINT32),
    ]
    if vocab.pad is not None:
        fields.append(Field("tokenizer.ggml.padding_token_id", vocab.pad, T.UINT32))
    fields += [
        Field("tokenizer.ggml.add_bos_token", True, T.BOOL),
        Field("tokenizer.ggml.add_eos_token", False, T.BOOL),
    ]
    if vocab.chat_template:
        fields.append(Field("tokenizer.chat_template", vocab.chat_template, T.STRING))
    return [f.encode() for f in fields]

"""The hand-written GGUF header reader: the same pairs as gguf-py's reader, by either
string walk, and the tokenizer compared and copied as bytes."""

import struct

import numpy as np
import pytest
from gguf import GGUFReader, GGUFWriter

from gguf_exact.core import kernels
from gguf_exact.formats import gguf_layout
from gguf_exact.formats.gguf_reader import open_gguf
from gguf_exact.formats.vocab import read_target
from gguf_exact.tiny.vocab import add_vocabulary, gemma4_vocabulary


@pytest.fixture(scope="module")
def vocab_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "v.gguf"
    w = GGUFWriter(path, "gemma4")
    w.add_uint32("gemma4.embedding_length", 64)
    add_vocabulary(w, gemma4_vocabulary(5000, 8000, seed=2))
    w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_pairs_and_values_agree_with_gguf_py(vocab_gguf):
    reader = GGUFReader(vocab_gguf)
    with open_gguf(vocab_gguf) as g:
        assert [kv.key for kv in g.header.kv] == [k for k in reader.fields if not k.startswith("GGUF.")]
        assert g.array_length("tokenizer.ggml.tokens") == 5000 and g.array_length("tokenizer.ggml.merges") == 8000
        assert g.value("tokenizer.ggml.model") == "gemma4" and g.arch_value("embedding_length") == 64
        for kv in g.header.kv:  # every pair's bytes are the file's bytes at that place
            field = reader.fields[kv.key]
            assert kv.raw == b"".join(bytes(p) for p in field.parts), kv.key
    target = read_target(vocab_gguf)
    assert target.vocab_size == 5000 and target.tokenizer.model == "gemma4"


@pytest.mark.parametrize("walk", ["compiled", "python"])
def test_string_walks_find_the_end_and_refuse_what_runs_past_it(vocab_gguf, monkeypatch, walk):
    compiled = kernels.active()  # loaded: the compiled walk is taken
    if walk == "python":
        monkeypatch.setattr(kernels, "_active", None)  # as in `serve`, where no packer has loaded them
    raw = vocab_gguf.read_bytes()
    tokens_at = raw.index(b"tokenizer.ggml.tokens") + len(b"tokenizer.ggml.tokens") + 4 + 4 + 8
    expected = tokens_at
    for _ in range(5000):
        expected += 8 + struct.unpack_from("<Q", raw, expected)[0]
    cursor = gguf_layout._Cursor(raw, tokens_at)
    cursor.skip_strings(5000)
    assert cursor.pos == expected
    with pytest.raises(EOFError):  # cut short
        gguf_layout._Cursor(raw[: expected - 3], tokens_at).skip_strings(5000)
    huge = bytearray(raw)
    huge[tokens_at : tokens_at + 8] = struct.pack("<Q", 1 << 62)  # a length past the end
    with pytest.raises(EOFError):
        gguf_layout._Cursor(bytes(huge), tokens_at).skip_strings(5000)
    assert compiled.skip_strings(np.frombuffer(raw, np.uint8), tokens_at, 5000) == expected


def test_drafter_and_target_vocabularies_compare_as_bytes(vocab_gguf, tmp_path):
    from gguf_exact.formats.vocab import tokenizer_of

    other = tmp_path / "o.gguf"
    w = GGUFWriter(other, "gemma4")
    vocab = gemma4_vocabulary(5000, 8000, seed=2)
    vocab.tokens[4321] = vocab.tokens[4321] + "x"
    add_vocabulary(w, vocab)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    with open_gguf(vocab_gguf) as a, open_gguf(other) as b:
        ta, tb = tokenizer_of(a), tokenizer_of(b)
    assert ta.first_difference(ta) is None
    assert ta.first_difference(tb) == f"token 4321 is {tb.tokens()[4321]!r}, not {ta.tokens()[4321]!r}"
    assert tb.tokens()[4321] == ta.tokens()[4321] + b"x" and len(ta.tokens()) == 5000

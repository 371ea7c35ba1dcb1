"""Token pieces looked up once: ``detokenize`` without a llama.cpp call per token.

llama-cpp-python's ``create_completion`` detokenizes the whole completion after every
new token (to find stop strings and split UTF-8), and its tokenizer asks llama.cpp
for each token's piece every time: per token a ctypes call, per completion a
quadratic number of them. :class:`PieceCache` is the same tokenizer (llama-cpp-python's
``tokenizer=`` hook) with each piece fetched once, so the same bytes come back at a
dictionary lookup each.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

import llama_cpp
from llama_cpp.llama_tokenizer import LlamaTokenizer

if TYPE_CHECKING:  # the engine imports this module
    from gguf_exact.engines.python.engine import MtpLlama


class PieceCache(LlamaTokenizer):
    """``LlamaTokenizer`` whose ``detokenize`` reads pieces from a cache."""

    def __init__(self, llama: MtpLlama) -> None:
        super().__init__(llama)
        self.vocab = llama.vocab_handle
        self.bos = llama.token_bos()
        self._pieces: tuple[dict[int, bytes], dict[int, bytes]] = ({}, {})  # special off, on

    def piece(self, token: int, special: bool = False) -> bytes:
        cache = self._pieces[bool(special)]
        piece = cache.get(token)
        if piece is None:
            vocab = self.vocab
            size = 32
            while True:
                buf = (ctypes.c_char * size)()
                n = llama_cpp.llama_token_to_piece(vocab, llama_cpp.llama_token(token), buf, size, 0, special)
                if n >= 0:
                    break
                size = -n
            piece = cache[token] = buf.raw[:n]
        return piece

    def detokenize(self, tokens: list[int], prev_tokens: list[int] | None = None, special: bool = False) -> bytes:
        cache = self._pieces[bool(special)]
        try:
            output = b"".join([cache[t] for t in tokens])
        except KeyError:
            output = b"".join([self.piece(t, special) for t in tokens])
        # as llama-cpp-python's LlamaModel.detokenize: a BOS first drops the space it leaves
        if tokens and tokens[0] == self.bos and output[:1] == b" ":
            return output[1:]
        return output


__all__ = ["PieceCache"]
